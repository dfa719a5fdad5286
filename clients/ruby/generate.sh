#!/usr/bin/env bash
# Generates the Ruby stubs from the repository's proto/tumbler/v1/lock.proto
# into lib/tumbler/v1 (not committed); `gem build` runs it (see the gemspec).
# Needs grpc_tools_ruby_protoc (Debian: ruby-grpc-tools; rubygems: grpc-tools).
set -euo pipefail
cd "$(dirname "$0")"
proto_dir="${TUMBLER_PROTO_DIR:-../../proto}"
protoc="${GRPC_TOOLS_RUBY_PROTOC:-grpc_tools_ruby_protoc}"
if ! command -v "$protoc" >/dev/null 2>&1; then
  echo "generate.sh: $protoc not found: building the gem generates its gRPC stubs with it;" \
    "install Debian's ruby-grpc-tools (sudo apt-get install -y ruby-grpc-tools) or the grpc-tools gem" >&2
  exit 1
fi
"$protoc" -I "$proto_dir" --ruby_out=lib --grpc_out=lib tumbler/v1/lock.proto
mkdir -p proto/tumbler/v1 && cp "$proto_dir/tumbler/v1/lock.proto" proto/tumbler/v1/
