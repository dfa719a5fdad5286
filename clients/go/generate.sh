#!/usr/bin/env bash
# Generates the Go stubs (package tumblerv1) from the repository's
# proto/tumbler/v1/lock.proto; run by `go generate` before a build.
# Needs protoc, protoc-gen-go and protoc-gen-go-grpc (Debian:
# protobuf-compiler protoc-gen-go protoc-gen-go-grpc).
set -euo pipefail
cd "$(dirname "$0")"
proto_dir="${TUMBLER_PROTO_DIR:-../../proto}"
out=tumblerv1
map="Mtumbler/v1/lock.proto=tumbler/client/tumblerv1"
rm -rf "$out.tmp" && mkdir -p "$out.tmp" "$out"
protoc -I "$proto_dir" \
  --go_out="$out.tmp" --go_opt=paths=source_relative --go_opt="$map" \
  --go-grpc_out="$out.tmp" --go-grpc_opt=paths=source_relative --go-grpc_opt="$map" \
  tumbler/v1/lock.proto
mv "$out.tmp"/tumbler/v1/*.go "$out"/ && rm -rf "$out.tmp"
