#!/usr/bin/env bash
# Builds the controller image without a registry: a release binary plus exactly
# the shared libraries ldd reports, copied onto `FROM scratch`.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-k3s-control-plane:dev}"

cargo build --release --bin k3s-control-plane
root=target/image-root
rm -rf "$root" && mkdir -p "$root/etc/ssl/certs"
cp target/release/k3s-control-plane "$root/"
# The binary and its libraries, with the dynamic loader, at their own paths.
ldd target/release/k3s-control-plane | grep -oE '/[^ ]+' | sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
echo "nonroot:x:65532:65532::/:/sbin/nologin" > "$root/etc/passwd"
docker build -t "$tag" .
docker run --rm "$tag" --version
