-- inspect: a lock's live holders, its limit and its waiter count. Reads
-- only: expired holders are left out here and purged by the next write.
-- KEYS: 1 holders, 2 info, 3 queue
-- Returns {now, limit, waiters, {{holder, expires_at, grant record}, ...}}
local holders_key, info_key, queue_key = KEYS[1], KEYS[2], KEYS[3]
local now = redis_now()

-- 1. Live holders: leases that end after now, earliest first.
local live = redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf', 'WITHSCORES')

-- 2. The limit only means something while someone holds the lock.
local limit = 0
if #live > 0 then
  limit = tonumber(redis.call('HGET', info_key, 'limit') or '0')
end

-- 3. Each holder with its lease expiry and grant record.
local holders = {}
for k = 1, #live, 2 do
  local holder = live[k]
  local record = redis.call('HGET', info_key, 'g:' .. holder) or ''
  table.insert(holders, {holder, tonumber(live[k + 1]), record})
end
return {now, limit, redis.call('ZCARD', queue_key), holders}
