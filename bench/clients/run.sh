#!/usr/bin/env bash
# The client bench: every language's tumbler client against one tumbler
# server, each beside that language's plain Redis lock on the same Redis,
# in one run. Prints one table (markdown, ready for BENCHMARKS.md).
#
#   bench/clients/run.sh            # full size: up to 5,000 pairs or 8 s per row, a few minutes
#   bench/clients/run.sh --quick    # the smoke size (200 pairs or 2 s per row): what CI runs
#
# Per language, acquire+release pairs, try-once (wait 0), lease 10 s, each
# caller on its own lock name (so nothing contends): pairs/s and µs per
# call (a call is one acquire or one release: half a pair) with 1 caller,
# and pairs/s with 16 concurrent callers (threads, tasks or goroutines
# sharing one client; Perl and curl: 16 processes). Beside each, the plain
# Redis lock that language's users write today, through its usual Redis
# client: SET key token NX PX ttl, then compare-and-delete
# (`if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0`,
# by EVALSHA). "price" is tumbler's µs per pair over the Redis lock's, at
# 1 caller; "÷ Rust" is a client's µs per call over the Rust client's.
#
# It starts its own redis-server and one `tumbler serve --no-auth` on free
# loopback ports and stops both by pid at the end. The server is
# $TUMBLER_BIN, else target/release/tumbler (built with `cargo build
# --release --locked --bin tumbler` when missing); --quick takes
# target/debug/tumbler when there is no release build (CI builds that one).
# Each client is installed into a temporary directory the way its
# ecosystem does, as clients/test.sh does (pip wheel into a venv, npm pack,
# go generate with Debian's grpc-go, gem build, perl Makefile.PL,
# clients/java/build.sh); the Redis clients: PyPI redis, npm ioredis,
# Debian's redigo, ruby-redis and libredis-perl, the redis crate, and for
# Java a small RESP client over a socket in bench/clients/java/Pairs.java
# (Debian packages no Java Redis client: no Jedis, no Lettuce). Missing
# Debian packages are installed.
#
# Environment: BENCH_PAIRS, BENCH_SECS (size of each row), BENCH_ONLY (a
# space-separated subset of: rust python python-async node go ruby perl java curl).
# Any row that fails (a pair not granted or not released, a client that
# does not install) fails the run, after the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ $quick = 1 ]; then pairs=${BENCH_PAIRS:-200}; secs=${BENCH_SECS:-2}; else pairs=${BENCH_PAIRS:-5000}; secs=${BENCH_SECS:-8}; fi
only=" ${BENCH_ONLY:-rust python python-async node go ruby perl java curl} "
wants() { [[ "$only" == *" $1 "* ]]; }
step() { echo "==> $*" >&2; }
started=$SECONDS

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
debs=(redis-server redis-tools curl protobuf-compiler
      golang-go golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc
      golang-github-gomodule-redigo-dev
      ruby ruby-grpc ruby-google-protobuf ruby-grpc-tools ruby-redis ruby-connection-pool
      libredis-perl openjdk-17-jdk-headless libcpanel-json-xs-perl)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || { echo "missing: ${missing[*]} (Debian package names)" >&2; exit 1; }
  step "installing Debian packages: ${missing[*]}"
  need_root apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi

server=${TUMBLER_BIN:-}
if [ -z "$server" ]; then
  if [ -x target/release/tumbler ]; then
    server=$root/target/release/tumbler
  elif [ $quick = 1 ]; then
    [ -x target/debug/tumbler ] || { step "building the server (cargo build --locked --bin tumbler)"; cargo build --locked --bin tumbler; }
    server=$root/target/debug/tumbler
  else
    step "building the release server (cargo build --release --locked --bin tumbler; minutes)"
    cargo build --release --locked --bin tumbler
    server=$root/target/release/tumbler
  fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tumbler-client-bench.XXXXXX")
pids=()
cleanup() {
  if [ -n "${rust_build:-}" ]; then kill "$rust_build" 2>/dev/null || true; fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
src=$work/src
mkdir -p "$src" "$work/dist" "$work/logs"
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -- clients/python clients/node clients/go clients/ruby clients/perl clients/java proto |
    tar -cf - -T - | tar -xf - -C "$src"
else
  cp -r clients proto "$src/"
fi
here=$root/bench/clients

# Installs: each writes its log to $work/logs/<lang>-install.log; a failed
# install marks the language failed (its rows say so) and the run fails.
declare -A broken
install() {
  local lang=$1; shift
  wants "$lang" || return 0
  local t0=$SECONDS
  step "install: $lang"
  if "$@" >"$work/logs/$lang-install.log" 2>&1; then
    echo "    $lang: installed in $((SECONDS - t0)) s" >&2
  else
    broken[$lang]=1
    echo "    $lang: install failed; last lines:" >&2
    tail -n 20 "$work/logs/$lang-install.log" >&2
  fi
}

install_rust() {
  # A workspace of its own (bench/clients/rust), built into the repository's
  # target/. Its Cargo.lock is a pruned copy of the repository's: when
  # clients/rust gains a dependency it falls behind, and the build updates
  # it (commit the change) rather than failing the bench.
  local profile=() dir=release
  [ $quick = 1 ] && dir=debug || profile=(--release)
  CARGO_TARGET_DIR=$root/target cargo build "${profile[@]}" --locked --manifest-path "$here/rust/Cargo.toml" ||
    { echo "bench/clients/rust/Cargo.lock is behind: building with it updated"
      CARGO_TARGET_DIR=$root/target cargo build "${profile[@]}" --manifest-path "$here/rust/Cargo.toml"; }
  ln -sf "$root/target/$dir/tumbler-client-bench" "$work/rust-pairs"
}
# clients/test.sh exports where it installed each client (TUMBLER_PYTHON,
# TUMBLER_NODE_APP, TUMBLER_GO_MODULE, GEM_HOME, TUMBLER_PERL5LIB); when it
# runs this bench, those installs are used (with the Redis clients added
# to its venv and app) rather than made again.
install_python() {
  if [ -n "${TUMBLER_PYTHON:-}" ]; then
    ln -s "$(dirname "$TUMBLER_PYTHON")/.." "$work/venv"
  else
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" wheel -q --no-deps -w "$work/dist" "$src/clients/python"
    "$work/venv/bin/pip" install -q "$work"/dist/tumbler_client-*.whl
  fi
  "$work/venv/bin/pip" install -q redis
  "$work/venv/bin/python" -c 'import tumbler_client, redis'
}
install_node() {
  if [ -n "${TUMBLER_NODE_APP:-}" ]; then
    ln -s "$TUMBLER_NODE_APP" "$work/node-app"
    (cd "$work/node-app" && npm install --no-audit --no-fund --loglevel=error ioredis)
  else
    (cd "$src/clients/node" && npm ci --no-audit --no-fund --loglevel=error &&
      npm pack --pack-destination "$work/dist" --loglevel=error >/dev/null)
    mkdir -p "$work/node-app"
    (cd "$work/node-app" && npm init -y >/dev/null &&
      npm install --no-audit --no-fund --loglevel=error "$work"/dist/tumbler-client-*.tgz ioredis)
  fi
}
install_go() {
  # GOPATH mode (GO111MODULE=off) over Debian's /usr/share/gocode: grpc-go
  # for the client, redigo for the plain lock; no module proxy needed.
  local module=${TUMBLER_GO_MODULE:-$src/clients/go}
  [ -n "${TUMBLER_GO_MODULE:-}" ] || (cd "$module" && go generate ./...)
  mkdir -p "$work/gopath/src/tumbler" "$work/gopath/src/tumbler-bench"
  cp -r "$module" "$work/gopath/src/tumbler/client"
  rm -rf "$work/gopath/src/tumbler/client/vendor"
  cp "$here/go/main.go" "$work/gopath/src/tumbler-bench/"
  (cd "$work/gopath/src/tumbler-bench" &&
    GO111MODULE=off GOPATH="$work/gopath:/usr/share/gocode" GOFLAGS= go build -o "$work/go-pairs" .)
}
gems=$work/gems
install_ruby() {
  if [ -n "${GEM_HOME:-}" ] && GEM_HOME=$GEM_HOME ruby -e 'require "tumbler"' 2>/dev/null; then
    gems=$GEM_HOME
  else
    (cd "$src/clients/ruby" && gem build -q tumbler-client.gemspec &&
      GEM_HOME="$gems" gem install -q --local --no-document tumbler-client-*.gem)
  fi
  GEM_HOME="$gems" ruby -e 'require "tumbler"; require "redis"; require "connection_pool"'
}
perl5lib=${TUMBLER_PERL5LIB:-$work/perl5/lib/perl5}
install_perl() {
  if [ -z "${TUMBLER_PERL5LIB:-}" ]; then
    (cd "$src/clients/perl" && perl Makefile.PL INSTALL_BASE="$work/perl5" && make && make install)
  fi
  PERL5LIB="$perl5lib" perl -MTumbler::Client -MRedis -e 1
}
# Java: the jars clients/test.sh built ($TUMBLER_JAVA_CP), else
# clients/java/build.sh into the work directory; then javac of Pairs.java.
java_cp=${TUMBLER_JAVA_CP:-$work/java/tumbler-client.jar}
install_java() {
  [ -n "${TUMBLER_JAVA_CP:-}" ] || OUT="$work/java" "$src/clients/java/build.sh"
  mkdir -p "$work/java-bench"
  javac -d "$work/java-bench" -cp "$java_cp" "$here/java/Pairs.java"
}
# --quick (CI) compiles the Rust arm in the background while the other
# languages install and run (their smoke figures are not kept), and runs
# Rust last; the full size compiles it first, so nothing else competes
# for the cores while anything is measured.
rust_build=
if [ $quick = 1 ] && wants rust; then
  step "install: rust (in the background)"
  install_rust >"$work/logs/rust-install.log" 2>&1 &
  rust_build=$!
else
  install rust install_rust
fi
install python install_python
install python-async true   # the same venv
install node install_node
install go install_go
install ruby install_ruby
install perl install_perl
install java install_java
[ -n "${broken[python]:-}" ] && broken[python-async]=1

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
  local port=$1 pid=$2
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --logfile "$work/logs/redis.log" &
pids+=($!)
wait_port "$redis_port" "${pids[-1]}" || { echo "redis-server did not start" >&2; cat "$work/logs/redis.log" >&2; exit 1; }
grpc_port=$(free_port)
"$server" serve --listen "127.0.0.1:$grpc_port" --http-listen off --no-auth --shutdown-drain-ms 0 \
  --redis-url "redis://127.0.0.1:$redis_port" --log-level warn >"$work/logs/tumbler.log" 2>&1 &
pids+=($!)
wait_port "$grpc_port" "${pids[-1]}" || { echo "tumbler serve did not start" >&2; cat "$work/logs/tumbler.log" >&2; exit 1; }
tumbler=127.0.0.1:$grpc_port
redis=127.0.0.1:$redis_port

# One row's command per language and target (tumbler | redis); arguments
# CALLERS PAIRS SECS follow.
arm() {
  local lang=$1 target=$2
  case $lang in
    rust) echo "$work/rust-pairs $target" ;;
    python) echo "$work/venv/bin/python $here/pairs.py $target" ;;
    python-async) echo "$work/venv/bin/python $here/pairs.py $target-async" ;;
    node) echo "env NODE_PATH=$work/node-app/node_modules node $here/pairs.js $target" ;;
    go) echo "$work/go-pairs $target" ;;
    ruby) echo "env GEM_HOME=$gems ruby $here/pairs.rb $target" ;;
    perl) echo "env PERL5LIB=$perl5lib perl $here/pairs.pl $target" ;;
    curl) echo "$here/pairs-curl.sh $target" ;;
    # A JVM compiles its hot code as it runs: each caller warms up 3 s (--quick: 0.5 s) before it is measured.
    java) echo "env WARM_SECS=$([ $quick = 1 ] && echo 0.5 || echo 3) java -XX:+UseSerialGC -cp $java_cp:$work/java-bench Pairs $target" ;;
  esac
}

declare -A result
failed=0
measure() {
  local lang=$1 target=$2 callers=$3 addr out
  [ "$target" = tumbler ] && addr=$tumbler || addr=$redis
  if [ -n "${broken[$lang]:-}" ]; then result[$lang,$target,$callers]=failed; failed=1; return; fi
  # shellcheck disable=SC2046
  if out=$(timeout $((secs * 3 + 60)) $(arm "$lang" "$target") "$addr" "$callers" "$pairs" "$secs" \
      2>"$work/logs/$lang-$target-$callers.log"); then
    result[$lang,$target,$callers]=$(echo "$out" | tail -n 1)
    echo "    $lang $target x$callers: ${result[$lang,$target,$callers]}" >&2
  else
    result[$lang,$target,$callers]=failed
    failed=1
    echo "    $lang $target x$callers: FAILED; last lines:" >&2
    tail -n 20 "$work/logs/$lang-$target-$callers.log" >&2
  fi
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
langs=(rust python python-async node go ruby perl java curl)
order=("${langs[@]}")
[ -n "$rust_build" ] && order=(python python-async node go ruby perl java curl rust)
for lang in "${order[@]}"; do
  wants "$lang" || continue
  if [ "$lang" = rust ] && [ -n "$rust_build" ]; then
    if wait "$rust_build"; then
      echo "    rust: built (in the background)" >&2
    else
      broken[rust]=1
      echo "    rust: install failed; last lines:" >&2
      tail -n 20 "$work/logs/rust-install.log" >&2
    fi
  fi
  step "run: $lang"
  for callers in 1 16; do
    for target in tumbler redis; do measure "$lang" "$target" "$callers"; done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# pairs/s and µs per call (half a pair) of a result "pairs=N secs=S".
rate() { awk -v r="$1" 'BEGIN { split(r, a, /[= ]/); if (a[4] > 0 && a[2] > 0) printf "%.0f", a[2] / a[4]; else print "" }'; }
per_call() { awk -v r="$1" 'BEGIN { split(r, a, /[= ]/); if (a[2] > 0) printf "%.0f", a[4] / a[2] / 2 * 1e6; else print "" }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else print "—" }'; }
commas() { echo "$1" | sed ':a; s/\B[0-9]\{3\}\>/,&/; ta'; }
cell() { if [ "$1" = failed ]; then echo FAILED; elif [ -z "$1" ]; then echo —; else commas "$(rate "$1")"; fi; }

label() {
  case $1 in
    rust) echo "Rust | tumbler-client (tonic) | redis crate 1.8, multiplexed" ;;
    python) echo "Python | tumbler_client.Client (Connect, kept-alive HTTP/1.1) | redis-py $("$work/venv/bin/python" -c 'import redis; print(redis.__version__)' 2>/dev/null), threads" ;;
    python-async) echo "Python asyncio | tumbler_client.AsyncClient (Connect, kept-alive HTTP/1.1) | redis.asyncio" ;;
    node) echo "Node | tumbler-client (${TUMBLER_NODE_TRANSPORT:-Connect, kept-alive HTTP/1.1}) | ioredis $(cd "$work/node-app" 2>/dev/null && node -p 'require("ioredis/package.json").version' 2>/dev/null)" ;;
    go) echo "Go | tumbler/client (grpc-go 1.33) | redigo $(dpkg-query -W -f='${Version}' golang-github-gomodule-redigo-dev 2>/dev/null | sed 's/^1://; s/-.*//')" ;;
    ruby) echo "Ruby | tumbler-client (Connect, kept-alive HTTP/1.1) | redis-rb $(ruby -e 'require "redis"; print Redis::VERSION' 2>/dev/null), ConnectionPool" ;;
    perl) echo "Perl | Tumbler::Client (Connect JSON, kept-alive HTTP/1.1, $(PERL5LIB="$perl5lib" perl -MTumbler::Client -e 'print $Tumbler::Client::JSON_CLASS' 2>/dev/null)) | Redis.pm $(perl -MRedis -e 'print $Redis::VERSION' 2>/dev/null)" ;;
    curl) echo "curl (reference) | curl, Connect JSON, one kept-alive connection | redis-cli" ;;
    java) echo "Java | tumbler-client (Connect JSON, kept-alive HTTP/1.1), JDK $(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p') | RESP over a socket (no Java Redis client in Debian)" ;;
  esac
}

rust_call=$(per_call "${result[rust,tumbler,1]:-}")
echo
echo "Server: $server ($( [[ "$server" == */debug/* ]] && echo debug || echo release ) build), $(redis-server --version | cut -d' ' -f1-3), $(nproc) cores;"
echo "up to $pairs pairs or ${secs} s per row after a warm-up of 20 pairs per caller; load average $load_before before, $load_after after."
echo
echo "| language | tumbler client | plain Redis lock | tumbler pairs/s | tumbler µs/call | Redis pairs/s | Redis µs/call | price (tumbler ÷ Redis) | tumbler µs/call ÷ Rust's | tumbler pairs/s, 16 callers | Redis pairs/s, 16 callers |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for lang in "${langs[@]}"; do
  wants "$lang" || continue
  t1=${result[$lang,tumbler,1]:-}; r1=${result[$lang,redis,1]:-}
  t16=${result[$lang,tumbler,16]:-}; r16=${result[$lang,redis,16]:-}
  tc=$( [ "$t1" = failed ] || per_call "$t1"); rc=$( [ "$r1" = failed ] || per_call "$r1")
  echo "| $(label "$lang") | $(cell "$t1") | ${tc:-—} | $(cell "$r1") | ${rc:-—} | $(div "$tc" "$rc") | $(div "$tc" "$rust_call") | $(cell "$t16") | $(cell "$r16") |"
done
echo
echo "Bench run in $((SECONDS - started)) s."
if [ $failed = 1 ]; then
  echo "==> some rows FAILED (logs above)" >&2
  exit 1
fi
