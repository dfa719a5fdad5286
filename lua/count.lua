-- count: add a replica's counts to one per-minute counters hash of a
-- namespace, where every replica's counts meet (the Metrics RPC reads it).
-- KEYS[1] the namespace's counters of one minute ('...:m:<minute ms>')
-- ARGV: retention (ms), most distinct fields, then pairs of ('kind|event', n)
-- A field past the cap is counted as 'other|event': kinds are metrics
-- labels, so their number stays bounded.
-- Returns the number of fields counted as 'other'.
local retention, max_fields_s = unpack(ARGV, 1, 2)
local key, max_fields = KEYS[1], tonumber(max_fields_s)
local fresh = redis.call('EXISTS', key) == 0
local others = 0

for k = 3, #ARGV, 2 do
  local field, n = ARGV[k], ARGV[k + 1]
  -- Most counts add to a field the minute already has: one call. Only a
  -- new field needs the cap check.
  if redis.call('HINCRBY', key, field, n) == tonumber(n) and redis.call('HLEN', key) > max_fields then
    redis.call('HDEL', key, field)
    redis.call('HINCRBY', key, 'other|' .. string.match(field, '|([^|]*)$'), n)
    others = others + 1
  end
end
if fresh then
  redis.call('PEXPIRE', key, retention)
end
return others
