-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- waits: one page of the live edges of a namespace's wait-for registry
-- (decisions 0077, 0081), for the dashboard's chains. Edges past their end
-- are left out here (the next wait_for sweeps them, or the registry
-- expires).
-- KEYS[1] the namespace's registry (see wait_for.lua)
-- ARGV: the HSCAN cursor to go on from ('0' first), the most fields to
--   scan, the most bytes of edges to return
-- Returns {now, next cursor ('0' at the end), {holder, expiry, {lock,
--   {holder, ...}}, ...}, ...}
local registry = KEYS[1]
local cursor, most, most_bytes = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = clock_ms()

-- 1. One HSCAN step (COUNT bounds the fields it reads, and the hash's own
-- size bounds a compact one read whole).
local scan = redis.call('HSCAN', registry, cursor, 'COUNT', most)
local fields = scan[2]

-- 2. Every edge of the page whose liveness has not ended, within the bytes.
local edges, bytes = {}, 0
for i = 1, #fields, 2 do
  local holder, text = fields[i], fields[i + 1]
  if holder ~= WAITS_BYTES and bytes + #text <= most_bytes then
    bytes = bytes + #text
    local e, _, waits = waits_edge(text)
    if e > now then
      edges[#edges + 1] = {holder, int(e), cjson.decode(waits)}
    end
  end
end
return {now, scan[1], edges}
