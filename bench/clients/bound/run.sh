#!/usr/bin/env bash
# The bounds under the Python, Ruby and Perl clients (issue 50 item 4), in one
# run against one server: each language's bare round trips (bound.py, bound.pl,
# bound.rb: the transport library alone, requests built once), beside the
# Rust bench client and the clients themselves (bench/clients/pairs.*,
# one caller), and the clients' own per-call work with the transport
# replaced by canned answers (breakdown.py, breakdown.rb); then the clients
# again, taking turns in ROUNDS (default 6) short rounds so that every row
# meets the same load, with each one's µs per call ÷ the Rust client's.
# Prints one line per row; compare rows within one run (the machine is shared).
#
#   bench/clients/bound/run.sh [PAIRS]      # default 2000 pairs per row
#   BOUND_TURNS_ONLY=1 bench/clients/bound/run.sh 6000   # only the clients taking turns
#
# Starts its own redis-server and `tumbler serve --no-auth` on free
# loopback ports ($TUMBLER_BIN, default target/release/tumbler) and stops
# both by pid. Needs: $PYTHON (default python3) with tumbler_client,
# grpcio-health-checking and redis importable; Ruby with the tumbler gem
# (GEM_HOME, or RUBYLIB=clients/ruby/lib after clients/ruby/generate.sh);
# Perl: Tumbler::Client from $TUMBLER_PERL5LIB (default clients/perl/lib;
# bound.pl: core modules, Cpanel::JSON::XS when installed);
# $RUST_PAIRS (default target/release/tumbler-client-bench, built by
# bench/clients/run.sh). A row whose tool is missing says so and is skipped.
set -euo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
pairs=${1:-2000}
server=${TUMBLER_BIN:-$root/target/release/tumbler}
python=${PYTHON:-python3}
perl5lib=${TUMBLER_PERL5LIB:-$root/clients/perl/lib}   # Tumbler::Client for the perl rows (bound.pl needs none)
rust=${RUST_PAIRS:-$root/target/release/tumbler-client-bench}
here=$root/bench/clients
work=$(mktemp -d "${TMPDIR:-/tmp}/tumbler-bound.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --logfile "$work/redis.log" &
pids+=($!)
wait_port "$redis_port"
port=$(free_port)
"$server" serve --listen "127.0.0.1:$port" --http-listen off --no-auth --shutdown-drain-ms 0 \
  --redis-url "redis://127.0.0.1:$redis_port" --log-level warn >"$work/tumbler.log" 2>&1 &
pids+=($!)
wait_port "$port"
addr=127.0.0.1:$port
echo "server $server on $addr; $pairs pairs per row; load average $(cut -d' ' -f1-3 /proc/loadavg)"

# µs per call (half a pair) from "pairs=N secs=S".
per_call() { awk -v r="$1" 'BEGIN { split(r, a, /[= ]/); printf "%.0f", a[4] / a[2] / 2 * 1e6 }'; }
row() {
  local label=$1; shift
  local out
  if out=$("$@" 2>"$work/err.log"); then
    case $out in
      pairs=*) echo "$label: $(per_call "$out") µs per call" ;;
      *) echo "$label: ${out#*: }" ;;
    esac
  else
    echo "$label: FAILED ($(tail -n 1 "$work/err.log"))"
  fi
}
if [ -x "$rust" ]; then row "rust client (tonic)" "$rust" tumbler "$addr" 1 "$pairs" 60; else echo "rust: $rust missing (skipped)"; fi
for round in $( [ -n "${BOUND_TURNS_ONLY:-}" ] || echo 1 2); do
  echo "-- round $round"
  for m in grpc-health grpc-pairs connect-pairs aio-pairs aconnect-pairs; do row "python bare $m" "$python" "$here/bound/bound.py" "$m" "$addr" "$pairs"; done
  for t in tumbler tumbler-grpc tumbler-async tumbler-grpc-async; do row "python client $t" "$python" "$here/pairs.py" "$t" "$addr" 1 "$pairs" 60; done
  for m in own client; do row "python breakdown $m" "$python" "$here/bound/breakdown.py" "$m" "$addr" "$pairs"; done
  for m in grpc-health grpc-pairs nethttp-pairs connect-pairs; do row "ruby bare $m" ruby "$here/bound/bound.rb" "$m" "$addr" "$pairs"; done
  for t in tumbler tumbler-grpc; do row "ruby client $t" ruby "$here/pairs.rb" "$t" "$addr" 1 "$pairs" 60; done
  for m in own client; do row "ruby breakdown $m" ruby "$here/bound/breakdown.rb" "$m" "$addr" "$pairs"; done
  for m in connect-pairs httptiny-pairs; do row "perl bare $m" perl "$here/bound/bound.pl" "$m" "$addr" "$pairs"; done; row "perl client tumbler" env PERL5LIB="$perl5lib" perl "$here/pairs.pl" tumbler "$addr" 1 "$pairs" 60
  if [ -x "$rust" ]; then row "rust client (tonic)" "$rust" tumbler "$addr" 1 "$pairs" 60; fi
done
# The clients side by side, taking turns: ROUNDS rounds of PAIRS/ROUNDS
# pairs per row, so each row meets the same load; the sum per row.
rounds=${ROUNDS:-6}
declare -A done_pairs secs_sum
turn_rows=("rust client|$rust tumbler" "python client (Connect)|$python $here/pairs.py tumbler"
           "python client (grpcio)|$python $here/pairs.py tumbler-grpc"
           "python asyncio client (Connect)|$python $here/pairs.py tumbler-async"
           "python asyncio client (grpc.aio)|$python $here/pairs.py tumbler-grpc-async"
           "ruby client (Connect)|ruby $here/pairs.rb tumbler" "ruby client (grpc gem)|ruby $here/pairs.rb tumbler-grpc"
           "perl client (Connect)|env PERL5LIB=$perl5lib perl $here/pairs.pl tumbler")
echo "-- taking turns: $rounds rounds of $((pairs / rounds)) pairs per row"
for _ in $(seq "$rounds"); do
  for entry in "${turn_rows[@]}"; do
    label=${entry%%|*}
    [[ $label == rust* && ! -x $rust ]] && continue
    # shellcheck disable=SC2086
    out=$(${entry#*|} "$addr" 1 $((pairs / rounds)) 60 2>>"$work/err.log") || { echo "$label: FAILED"; continue; }
    done_pairs[$label]=$(( ${done_pairs[$label]:-0} + $(echo "$out" | sed 's/pairs=\([0-9]*\).*/\1/') ))
    secs_sum[$label]=$(awk -v a="${secs_sum[$label]:-0}" -v b="${out#*secs=}" 'BEGIN { print a + b }')
  done
done
rust_us=
for entry in "${turn_rows[@]}"; do
  label=${entry%%|*}
  [ -n "${done_pairs[$label]:-}" ] || continue
  us=$(awk -v p="${done_pairs[$label]}" -v s="${secs_sum[$label]}" 'BEGIN { printf "%.0f", s / p / 2 * 1e6 }')
  [[ $label == rust* ]] && rust_us=$us
  ratio=$( [ -n "$rust_us" ] && awk -v a="$us" -v b="$rust_us" 'BEGIN { printf " (%.2f x rust)", a / b }')
  echo "$label: $us µs per call$ratio"
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
