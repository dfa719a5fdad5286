-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- waits: the live edges of a namespace's wait-for registry (decision 0077),
-- for the dashboard's chains. Edges past their end are left out here (the
-- next wait_for sweeps them, or the registry expires).
-- KEYS[1] the namespace's registry (see wait_for.lua)
-- ARGV: most edges to return
-- Returns {now, {holder, expiry, {lock, {holder, ...}}, ...}, ...}
local registry, most = KEYS[1], tonumber(ARGV[1])
local now = clock_ms()

-- 1. Every waiting holder's edge whose wait has not ended.
local edges = {}
local fields = redis.call('HGETALL', registry)
for i = 1, #fields, 2 do
  local edge = cjson.decode(fields[i + 1])
  if edge.e > now and #edges < most then
    edges[#edges + 1] = {fields[i], int(edge.e), edge.w}
  end
end
return {now, edges}
