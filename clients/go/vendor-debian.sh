#!/usr/bin/env bash
# Builds vendor/ from Debian's Go packages (/usr/share/gocode: grpc-go 1.33,
# protobuf 1.28, x/net …) so the module builds with no network: go build
# uses vendor/ (-mod=vendor) and never asks a module proxy. With a module
# proxy at hand, delete vendor/ and run `go mod tidy` instead.
set -euo pipefail
cd "$(dirname "$0")"
gocode=${GOCODE:-/usr/share/gocode/src}
[ -d "$gocode/google.golang.org/grpc" ] || { echo "$gocode lacks grpc-go: apt-get install golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev" >&2; exit 1; }
rm -rf vendor && mkdir vendor
# Every package the module imports, transitively, that lives in $gocode.
pkgs=$(GO111MODULE=off GOPATH="${gocode%/src}" go list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' \
  google.golang.org/grpc google.golang.org/grpc/codes google.golang.org/grpc/credentials google.golang.org/grpc/metadata \
  google.golang.org/grpc/status google.golang.org/protobuf/proto google.golang.org/protobuf/reflect/protoreflect \
  google.golang.org/protobuf/runtime/protoimpl | sort -u)
# The module each package belongs to (its version as go.mod requires it).
module_of() { local p=$1; while [ "$p" != "." ] && [ ! -f "$gocode/$p/go.mod" ]; do p=$(dirname "$p"); done; echo "$p"; }
declare -A by_module
for p in $pkgs; do
  m=$(module_of "$p")
  mkdir -p "vendor/$p"
  find "$gocode/$p" -maxdepth 1 -type f \( -name '*.go' ! -name '*_test.go' -o -name '*.s' -o -name '*.h' -o -name '*.c' \) \
    -exec cp {} "vendor/$p/" \;
  by_module[$m]+="$p"$'\n'
done
for m in $(printf '%s\n' "${!by_module[@]}" | sort); do
  v=$(awk -v m="$m" '$1 == m { print $2 }' go.mod)
  [ -n "$v" ] || { echo "go.mod does not require $m" >&2; exit 1; }
  # The module's own go version: vendored code compiles at that language level.
  gov=$(awk '$1 == "go" { print "; go " $2 }' "$gocode/$m/go.mod")
  printf '# %s %s\n## explicit%s\n%s' "$m" "$v" "$gov" "${by_module[$m]}"
done > vendor/modules.txt
echo "vendor/: $(printf '%s\n' "${!by_module[@]}" | wc -l) modules, $(echo "$pkgs" | wc -l) packages from $gocode" >&2
