#!/usr/bin/env bash
# pairs-curl.sh TARGET ADDR CALLERS PAIRS SECS
#
# The reference arms of bench/clients/run.sh, from the shell. TARGET
# `tumbler`: Connect JSON Acquire+Release pairs from one curl process on
# one kept-alive connection (`--next` reuses it), as
# clients/perl/bench/curl-pairs.sh; `redis`: the plain lock from one
# redis-cli process (SET key token NX PX ttl, then EVALSHA of the
# compare-and-delete, each command sent when the last was answered).
# CALLERS > 1 runs that many processes side by side. The count is fixed
# up front (PAIRS in all; SECS is not used), and the time includes each
# process's start and its connection. Prints "pairs=N secs=S"; a pair not
# granted and released fails the run.
set -euo pipefail
target=$1 addr=$2 callers=$3 pairs=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
unlock="if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0"
if [ "$target" = redis ]; then
  sha=$(redis-cli -h "${addr%:*}" -p "${addr##*:}" SCRIPT LOAD "$unlock")
fi
for ((i = 0; i < callers; i++)); do
  n=$(( pairs / callers + (i < pairs % callers ? 1 : 0) ))
  name=bench-curl-$$-$i
  if [ "$target" = tumbler ]; then
    u=http://$addr/tumbler.v1.LockService
    for ((k = 1; k <= n; k++)); do
      printf 'url = "%s/Acquire"\nheader = "content-type: application/json"\ndata = "{\\"name\\":\\"%s\\",\\"holder\\":\\"%s-%d\\",\\"ttlMs\\":\\"10000\\"}"\nnext\n' "$u" "$name" "$name" "$k"
      printf 'url = "%s/Release"\nheader = "content-type: application/json"\ndata = "{\\"name\\":\\"%s\\",\\"holder\\":\\"%s-%d\\"}"\n' "$u" "$name" "$name" "$k"
      if [ "$k" -lt "$n" ]; then printf 'next\n'; fi
    done > "$dir/$i.cfg"
  else
    for ((k = 1; k <= n; k++)); do
      tok=$(printf '%08x%08x' "$RANDOM$RANDOM" "$k")
      printf 'SET %s %s NX PX 10000\nEVALSHA %s 1 %s %s\n' "$name" "$tok" "$sha" "$name" "$tok"
    done > "$dir/$i.cmds"
  fi
done
start=$(date +%s%N)
for ((i = 0; i < callers; i++)); do
  if [ "$target" = tumbler ]; then
    curl -sS --fail-with-body -K "$dir/$i.cfg" > "$dir/$i.out" &
  else
    redis-cli -h "${addr%:*}" -p "${addr##*:}" < "$dir/$i.cmds" > "$dir/$i.out" &
  fi
done
wait_failed=0
for job in $(jobs -p); do wait "$job" || wait_failed=1; done
end=$(date +%s%N)
[ $wait_failed = 0 ] || { echo "a $target process failed" >&2; exit 1; }
if [ "$target" = tumbler ]; then
  granted=$(cat "$dir"/*.out | grep -o '"ACQUIRE_STATUS_ACQUIRED"' | wc -l)
  released=$(cat "$dir"/*.out | grep -o '"RELEASE_STATUS_RELEASED"' | wc -l)
else
  granted=$(cat "$dir"/*.out | grep -cx 'OK' || true)
  released=$(cat "$dir"/*.out | grep -cx '1' || true)
fi
if [ "$granted" -ne "$pairs" ] || [ "$released" -ne "$pairs" ]; then
  echo "curl $target: $granted granted and $released released of $pairs pairs" >&2
  head -c 600 "$dir/0.out" >&2
  exit 1
fi
awk -v n="$pairs" -v ns=$((end - start)) 'BEGIN { printf "pairs=%d secs=%.6f\n", n, ns / 1e9 }'
