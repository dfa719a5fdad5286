-- inspect: a lock's live holders, its limit and its live waiter count.
-- Reads only: expired holders and dead waiters are left out here and
-- purged by the next write.
-- Returns {now, limit, waiters, {{holder, expires_at, grant record}, ...}}
local now = redis_now()
load_lock()

-- 1. Live holders: leases that end after now, earliest first.
local holders = {}
for _, grant in ipairs(all_grants()) do
  if grant[2] > now then
    table.insert(holders, grant)
  end
end
table.sort(holders, function(a, b)
  return a[2] < b[2] or (a[2] == b[2] and a[1] < b[1])
end)

-- 2. The limit only means something while someone holds the lock.
local limit = #holders > 0 and L.limit or 0
local waiters = redis.call('ZCOUNT', DEADLINES, '(' .. int(now), '+inf')
return {now, limit, waiters, holders}
