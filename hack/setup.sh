#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for building and testing:
# etcd (real members in tests and the demo), etcdctl (the benchmark baseline)
# and protoc (etcd-client's build). Safe to run any number of times.
set -euo pipefail

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "hack/setup.sh: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  # Debian starts an etcd service on install; our tests and demo run their own.
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop etcd >/dev/null 2>&1 || true; fi
fi
echo "hack/setup.sh: etcd $(etcd --version | head -1 | awk '{print $3}'), $(protoc --version)"
