#!/usr/bin/env bash
# Runs tumbler's whole test suite against real redis-server processes that
# the tests start themselves on free loopback ports. Installs what is
# missing first: redis-server and redis-cli from Debian's packages (apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# redis-server also runs the tests' sentinels (--sentinel); redis-cli
# (redis-tools) joins their Redis Clusters.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "==> installing redis-server and redis-tools (Debian packages)"
    need_root apt-get update -qq
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "redis-server is missing: install Redis 7 (e.g. 'brew install redis' or your distribution's redis package)" >&2
    exit 1
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs)" >&2
  exit 1
fi

# Each phase's wall time, and the whole, at the end (docs/contributing.md
# keeps the figures).
phase_start=$SECONDS
timings=()
timed() { timings+=("$1: $((SECONDS - phase_start)) s"); phase_start=$SECONDS; }

echo "==> $(redis-server --version | cut -d' ' -f1-3), $(cargo --version)"
# The workspace includes crates/tumbler-model: the protocol model checked
# in bounded configurations (tests/check.rs, about a minute).
cargo test --locked --all-targets --workspace "$@"

timed "rust tests"

echo "==> Helm chart checks"
helm/tests/run.sh
timed "helm"

echo "==> Dashboard in a browser"
dashboard-tests/run.sh
timed "dashboard"

echo "==> Clients in other languages"
clients/test.sh
timed "clients"
echo "==> wall time: ${timings[*]}; all: $SECONDS s"
