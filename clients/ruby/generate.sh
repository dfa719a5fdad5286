#!/usr/bin/env bash
# Generates the Ruby stubs from ../../proto into lib/tumbler/v1 (gitignored).
# Needs grpc_tools_ruby_protoc (Debian: ruby-grpc-tools).
set -euo pipefail
cd "$(dirname "$0")"
proto_dir="${TUMBLER_PROTO_DIR:-../../proto}"
grpc_tools_ruby_protoc -I "$proto_dir" --ruby_out=lib --grpc_out=lib tumbler/v1/lock.proto
