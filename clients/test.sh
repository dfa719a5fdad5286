#!/usr/bin/env bash
# Tests the clients in other languages: installs what is missing (Debian
# packages for Go and Ruby, PyPI packages for Python, npm packages for Node),
# builds the server if target/debug/tumbler is missing, then runs the
# cross-language conformance scenario (clients/conformance/driver.py), which
# ends with a line "N passed, M failed" and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: Go and Ruby toolchains with their gRPC libraries, protoc
# and its Go plugins, and Redis for `tumbler dev`.
debs=(redis-server protobuf-compiler
      golang-go golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc
      ruby ruby-grpc ruby-google-protobuf ruby-grpc-tools)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${missing[*]} (Debian package names); install them with your package manager" >&2
    exit 1
  fi
  echo "==> installing Debian packages: ${missing[*]}"
  need_root apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi

# Python: grpcio and grpcio-tools (protoc as a library) from PyPI.
if ! python3 -c "import grpc, grpc_tools" 2>/dev/null; then
  echo "==> installing grpcio grpcio-tools (PyPI)"
  python3 -m pip install -q -r clients/python/requirements.txt
fi

# Node: @grpc/grpc-js and @grpc/proto-loader, as locked in package-lock.json.
if [ ! -d clients/node/node_modules/@grpc/proto-loader ] ||
   [ clients/node/package-lock.json -nt clients/node/node_modules/.package-lock.json ]; then
  echo "==> npm ci (clients/node)"
  (cd clients/node && npm ci --no-audit --no-fund --loglevel=error)
fi

if [ ! -x target/debug/tumbler ]; then
  echo "==> building the server (cargo build --bin tumbler)"
  cargo build --locked --bin tumbler
fi

echo "==> python $(python3 -c 'import grpc; print("grpcio", grpc.__version__)'), node $(node --version), $(go version | cut -d' ' -f3), ruby $(ruby -e 'require "grpc"; print RUBY_VERSION, " grpc ", GRPC::VERSION')"
exec python3 clients/conformance/driver.py
