-- reap: clean up one shard now. Without a cutoff it visits the locks whose
-- next expiry has passed (the expiry index says which); with a cutoff it
-- walks every lock in name order and also drops grants acquired and
-- requests queued before the cutoff (clear_old_locks, clear_dead_requests).
-- KEYS: 1 index, 2 names, 3 fence (a shard script)
-- ARGV: 2 wake channel, 3 shard key prefix, 4 most locks to visit,
--       5 older than (ms; '' = no cutoff), 6 resume after this name
-- Returns {expired leases, dead waiters, stale index entries, old grants,
--          old waiters, locks visited, last name visited ('' = done)}
local shard, most, after = ARGV[3], tonumber(ARGV[4]), ARGV[6]
local now = redis_now()
local cutoff = ARGV[5] ~= '' and now - tonumber(ARGV[5]) or nil
local expired, dead, stale, old_grants, old_waiters = 0, 0, 0, 0, 0

-- 1. Which locks: overdue ones, or (cutoff) the next ones by name.
local names
if cutoff then
  names = redis.call('ZRANGE', NAMES, after == '' and '-' or ('(' .. after), '+', 'BYLEX', 'LIMIT', '0', ARGV[4])
else
  names = redis.call('ZRANGEBYSCORE', INDEX, '-inf', int(now), 'LIMIT', '0', ARGV[4])
end

for _, name in ipairs(names) do
  use_lock(shard, name)
  load_lock(nil, true)
  -- 2. An index entry whose lock's key already expired is stale.
  if not L.exists then
    stale = stale + 1
  end
  -- 3. Leases that passed and waiters whose replica went quiet.
  expired = expired + purge_expired(now)
  dead = dead + purge_dead_waiters(now)
  -- 4. With a cutoff: grants and requests older than it, live or not.
  if cutoff then
    for _, grant in ipairs(all_grants()) do
      local holder, record = grant[1], grant[3]
      if tonumber(string.match(record, '^%d+|%d+|(%d+)|')) < cutoff then
        drop_grant(holder, record)
        count(record_kind(record), 'reaped')
        old_grants = old_grants + 1
      end
    end
    if queue_head() then
      for _, id in ipairs(redis.call('ZRANGE', QUEUE, '0', '-1')) do
        local record = redis.call('HGET', LOCK, 'w:' .. id) or ''
        local enqueued = tonumber(string.match(record, '^%-?%d+|(%d+)|') or '0')
        if enqueued < cutoff then
          drop_waiter(id)
          count(waiter_kind(record), 'reaped')
          old_waiters = old_waiters + 1
        end
      end
    end
  end
  -- 5. Keys, indexes (a stale entry included) and wake-ups follow.
  settle()
  wake_eligible()
end

local last = ''
if #names == most then
  last = names[#names]
end
return {expired, dead, stale, old_grants, old_waiters, #names, last}
