-- inspect: a lock's live holders, its limit and its live waiter count.
-- Reads only: expired holders and dead waiters are left out here and
-- purged by the next write.
-- Returns {now, limit, waiters, {{holder, expires_at, grant record}, ...}}
local now = redis_now()

-- 1. Live holders: leases that end after now, earliest first.
local live = redis.call('ZRANGEBYSCORE', HOLDERS, '(' .. int(now), '+inf', 'WITHSCORES')

-- 2. The limit only means something while someone holds the lock.
local limit = 0
if #live > 0 then
  limit = tonumber(redis.call('HGET', INFO, 'limit') or '0')
end

-- 3. Each holder with its lease expiry and grant record.
local holders = {}
for k = 1, #live, 2 do
  local holder = live[k]
  local record = redis.call('HGET', INFO, 'g:' .. holder) or ''
  table.insert(holders, {holder, tonumber(live[k + 1]), record})
end
local waiters = redis.call('ZCOUNT', DEADLINES, '(' .. int(now), '+inf')
return {now, limit, waiters, holders}
