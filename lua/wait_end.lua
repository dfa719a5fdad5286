-- wait_end: a holder's wait is over (granted, timed out, cancelled or
-- refused): its edges leave the namespace's wait-for registry
-- (decision 0077), unless a newer request of the same holder wrote them.
-- KEYS[1] the namespace's registry (see wait_for.lua)
-- ARGV: the holder, the request whose wait ended
-- Returns 1 when its edges were removed, 0 when none were its request's.
local registry = KEYS[1]
local holder, request = ARGV[1], ARGV[2]

-- 1. Only the request that wrote the edges removes them.
local text = redis.call('HGET', registry, holder)
if not text or cjson.decode(text).r ~= request then
  return 0
end
redis.call('HDEL', registry, holder)
return 1
