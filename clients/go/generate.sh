#!/usr/bin/env bash
# Generates the Go stubs from ../../proto into src/tumbler/tumblerv1 (gitignored).
# Needs protoc, protoc-gen-go and protoc-gen-go-grpc (Debian: protobuf-compiler
# protoc-gen-go protoc-gen-go-grpc).
set -euo pipefail
cd "$(dirname "$0")"
proto_dir="${TUMBLER_PROTO_DIR:-../../proto}"
out=src/tumbler/tumblerv1
mkdir -p "$out"
map="Mtumbler/v1/lock.proto=tumbler/tumblerv1"
protoc -I "$proto_dir" \
  --go_out="$out" --go_opt=paths=source_relative --go_opt="$map" \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative --go-grpc_opt="$map" \
  tumbler/v1/lock.proto
# paths=source_relative keeps the proto's directories: flatten them.
mv "$out"/tumbler/v1/*.go "$out"/ && rm -rf "$out"/tumbler
