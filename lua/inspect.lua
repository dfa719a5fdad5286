-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- inspect: a lock's live holders, its limit, its live waiter count and its
-- mode (decision 0074).
-- Reads only: expired holders and dead waiters are left out here and
-- purged by the next write.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- Returns {now, limit, waiters, {{holder, grant}, ...} (live holders), mode}
--   (mode: '' a plain lock, 'r' read-held or only waited for, 'w' write-held;
--   a write-held lock whose writer's lease has passed reads 'r')
local now = clock_ms()
local L = load(lock_at(KEYS))

-- 1. Live holders: leases that end after now.
local holders = {}
for _, grant in ipairs(all_grants(L)) do
  if grant.expires > now then
    holders[#holders + 1] = {grant.holder, grant.text}
  end
end

-- 2. The limit only means something while someone holds the lock.
local limit = #holders > 0 and L.limit or 0
local waiters = live_waiters(L, now)
-- 3. The lock's rule: a writer whose lease passed no longer holds it.
local mode = L.mode or ''
if mode == 'w' and #holders == 0 then
  mode = 'r'
end
if #holders == 0 and waiters == 0 then
  mode = ''
end
return {now, limit, waiters, holders, mode}
