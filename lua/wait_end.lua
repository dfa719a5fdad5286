-- wait_end: a holder's wait is over (granted, timed out, cancelled or
-- refused): its edge leaves the namespace's wait-for registry
-- (decision 0077), unless a newer request of the same holder wrote it.
-- KEYS[1] the namespace's registry (see wait_for.lua)
-- ARGV: the holder, the request whose wait ended
-- Returns 1 when its edge was removed, 0 when none was its request's.
local registry = KEYS[1]
local holder, request = ARGV[1], ARGV[2]

-- 1. Only the request that wrote the edge removes it.
local text = redis.call('HGET', registry, holder)
if not text or select(2, waits_edge(text)) ~= request then
  return 0
end

-- 2. Removed, the registry's byte count kept (no key once nobody waits).
waits_put(registry, holder, nil)
return 1
