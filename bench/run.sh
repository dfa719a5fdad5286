#!/usr/bin/env bash
# Runs every tumbler benchmark in one go and prints their tables (markdown,
# ready for BENCHMARKS.md). Each benchmark starts its own redis-server (and
# etcd, for the peer comparison) on free loopback ports and stops them by
# pid when it ends; nothing is left running.
#
# Installs what is missing from Debian's packages: redis-server, etcd-server
# for the etcd baseline (the load benchmark skips etcd without it), and
# valgrind for script_cost's instruction counts (skipped without it).
#
#   bench/run.sh            # full size, about 10-15 minutes on 2 cores
#   bench/run.sh --quick    # the smoke sizes, seconds (what CI runs via cargo test)
set -euo pipefail
cd "$(dirname "$0")/.."

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v callgrind_control >/dev/null 2>&1 || missing+=(valgrind)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "==> installing ${missing[*]} (Debian packages)"
    need_root apt-get update -qq
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]}; install Redis 7 (and etcd 3.4 for the peer baseline, valgrind for instruction counts)" >&2
    command -v redis-server >/dev/null 2>&1 || exit 1
  fi
fi

out="$(mktemp -d)"
echo "==> $(redis-server --version | cut -d' ' -f1-3); $(command -v etcd >/dev/null && etcd --version | head -1 || echo 'no etcd'); $(nproc) cores"
echo "==> results also in $out"
# Each benchmark's tables go to the terminal and $out/<name>.md; cargo's
# output and any panic to $out/<name>.log, shown when it fails.
if [ "${1:-}" = "--quick" ]; then
  bench() { cargo test --release --locked --bench "$1" -- --nocapture; }
else
  bench() { cargo bench --locked --bench "$1"; }
fi
run() {
  if ! bench "$1" 2>"$out/$1.log" | tee "$out/$1.md"; then
    echo "==> benchmark $1 failed:" >&2
    tail -n 30 "$out/$1.log" >&2
    return 1
  fi
}
started=$(date +%s)
for bench in handover election script_cost load front connect read_write weighted session_renewal scale; do
  echo
  echo "## $bench"
  run "$bench"
done
echo; echo "## clients"; bench/clients/run.sh "$@" | tee "$out/clients.md"  # every language's client beside its plain Redis lock
echo
echo "==> all benchmarks done in $(( $(date +%s) - started )) s"
