-- renew: keep the grants of sessions alive, many locks of one shard per
-- call (a replica renews all its session grants with one call per shard).
-- KEYS: 1 index, 2 names, 3 fence (a shard script)
-- ARGV: 3 shard key prefix, 4.. groups of (lock name, holder, fencing token, ttl_ms)
-- Returns the 1-based group numbers whose grant is gone (not renewed).
local shard = ARGV[3]
local now = redis_now()
local lost = {}

for k = 4, #ARGV, 4 do
  local name, holder, token, ttl = ARGV[k], ARGV[k + 1], ARGV[k + 2], tonumber(ARGV[k + 3])
  use_lock(shard, name)
  load_lock(holder)
  -- 1. A lease that already passed is not brought back.
  purge_expired(now)
  -- 2. Only the same grant (holder and token) is renewed; its record keeps
  --    the ttl it was granted with.
  local record = L.mine
  if record and record_token(record) == token then
    put_grant(holder, now + ttl, record)
    settle()
  else
    table.insert(lost, (k - 4) / 4 + 1)
    settle()
    wake_eligible()
  end
end
return lost
