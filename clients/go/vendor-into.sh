#!/usr/bin/env bash
# Vendors this module, and what it needs, into your module at $1, so your
# module builds with `go build -mod=vendor` and no module proxy (a plain
# `require` plus `replace` fails offline: `missing go.sum entry`). Run
# ./vendor-debian.sh and `go generate ./...` here first. It adds to your
# go.mod the require and replace lines, and this module's requirements as
# `// indirect`; run it again after either module changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
app=$(cd "${1:?usage: vendor-into.sh /path/to/your/module}" && pwd)
[ -f "$app/go.mod" ] || { echo "$app has no go.mod" >&2; exit 1; }
[ -f "$here/vendor/modules.txt" ] || { echo "run $here/vendor-debian.sh first" >&2; exit 1; }
ls "$here"/tumblerv1/*.go >/dev/null 2>&1 || { echo "run 'go generate ./...' in $here first" >&2; exit 1; }
rm -rf "$app/vendor" && cp -r "$here/vendor" "$app/vendor"
mkdir -p "$app/vendor/tumbler/client/tumblerv1"
find "$here" -maxdepth 1 -name '*.go' ! -name '*_test.go' -exec cp {} "$app/vendor/tumbler/client/" \;
cp "$here"/tumblerv1/*.go "$app/vendor/tumbler/client/tumblerv1/"
gov=$(awk '$1 == "go" { print $2 }' "$here/go.mod")
printf '# tumbler/client v0.2.0 => %s\n## explicit; go %s\ntumbler/client\ntumbler/client/tumblerv1\n# tumbler/client => %s\n' \
  "$here" "$gov" "$here" >> "$app/vendor/modules.txt"
grep -q '^replace tumbler/client ' "$app/go.mod" || {
  printf '\nrequire tumbler/client v0.2.0\n\nreplace tumbler/client => %s\n\nrequire (\n' "$here"
  awk '/^require \(/ { f = 1; next } f && /^\)/ { f = 0 } f { print $0 " // indirect" }' "$here/go.mod"
  printf ')\n'
} >> "$app/go.mod"
echo "vendored tumbler/client into $app/vendor: go build -mod=vendor" >&2
