#!/usr/bin/env bash
# Builds the controller image without a registry: a release binary (the
# k3s-control-plane-shipped package, hack/shipped: no `sandbox` feature) plus exactly
# the shared libraries ldd reports, copied onto `FROM scratch`.
#
#   hack/image.sh [tag]                              # release build, k3s-control-plane:dev
#   IMAGE_BINARY=target/debug/k3s-control-plane-shipped hack/image.sh k3s-control-plane:test
#
# IMAGE_BINARY stages an already built binary instead (tests/cli/controller_image.rs
# stages a debug build of the shipped binary: a cold release build takes
# minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-k3s-control-plane:dev}"

bin="${IMAGE_BINARY:-}"
if [ -z "$bin" ]; then
  # The shipped controller: no test API server, no simulated world, no demo.
  cargo build --release -p k3s-control-plane-shipped
  bin=target/release/k3s-control-plane-shipped
fi
root=target/image-root
rm -rf "$root" && mkdir -p "$root/etc/ssl/certs"
cp "$bin" "$root/k3s-control-plane"
# The binary and its libraries, with the dynamic loader, at their own paths.
ldd "$bin" | grep -oE '/[^ ]+' | sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
echo "nonroot:x:65532:65532::/:/sbin/nologin" > "$root/etc/passwd"
docker build -q -t "$tag" .
docker run --rm "$tag" --version
