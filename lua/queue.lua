-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- queue: a lock's live waiting requests in grant order. Reads only: dead
-- requests are left out here and purged by the next write.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: most entries to return
-- Returns {now, live waiters, {{id, liveness deadline, waiter record}, ...}}
local most = tonumber(ARGV[1])
local now = clock_ms()
local L = load(lock_at(KEYS))

-- 1. Walk the queue in order, skipping requests whose replica went quiet.
local entries, live = {}, 0
for _, w in ipairs(all_waiters(L)) do
  if w[2] > now then
    live = live + 1
    if #entries < most then
      entries[#entries + 1] = {w[1], w[2], w[3] or ''}
    end
  end
end
return {now, live, entries}
