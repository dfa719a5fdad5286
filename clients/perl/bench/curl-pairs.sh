#!/usr/bin/env bash
# bench/curl-pairs.sh PORT PAIRS: sequential Acquire+Release pairs as Connect JSON
# on one kept-alive curl connection (--next reuses it); µs per call.
P=$1; N=${2:-1000}; u=http://127.0.0.1:$P/tumbler.v1.LockService
args=()
for i in $(seq "$N"); do
  args+=(-H 'content-type: application/json' -d "{\"name\":\"curl-bench\",\"holder\":\"curl-$i\",\"ttlMs\":\"10000\"}" "$u/Acquire" --next -o /dev/null
         -H 'content-type: application/json' -d "{\"name\":\"curl-bench\",\"holder\":\"curl-$i\"}" "$u/Release" --next -o /dev/null)
done
s=$(date +%s%N)
curl -s -o /dev/null "${args[@]}" -H 'content-type: application/json' -d '{"name":"curl-bench"}' "$u/Inspect"
e=$(date +%s%N)
echo "curl: $N pairs, $(( (e - s) / 1000 / (2 * N + 1) )) µs per call"
