-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- list: the live state of some locks of one shard (the replica found their
-- keys with SCAN). Reads only: a lock with nothing live left is skipped
-- here and removed by the next write, the reaper, or its key's TTL.
-- KEYS[1] the shard's fence key (a shard function)
-- ARGV: lock names
-- Returns {now, {{name, holders, limit, waiters, next lease expiry, mode}, ...}}
--   holders: the permits the live grants hold (decision 0075); mode: the
--   header's letter ('' for a plain lock; 'w' while a writer holds, 'r'
--   while readers hold or the lock is only waited for)
local now = clock_ms()
local shard = split_key(KEYS[1])

local locks = {}
for _, name in ipairs(ARGV) do
  local L = load(lock_of(shard, name))
  local holders, first = 0, nil
  for _, grant in ipairs(all_grants(L)) do
    local expires = grant.expires
    if expires > now then
      holders = holders + grant.permits
      first = math.min(first or expires, expires)
    end
  end
  local waiters = live_waiters(L, now)
  if holders > 0 or waiters > 0 then
    -- (A writer whose lease passed leaves a read/write lock only waited for.)
    local mode = L.mode and (holders > 0 and L.mode or 'r') or ''
    table.insert(locks, {name, holders, holders > 0 and L.limit or 0, waiters, first or 0, mode})
  end
end
return {now, locks}
