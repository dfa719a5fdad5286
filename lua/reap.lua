-- reap: clean up some locks of one shard now (the replica found their keys
-- with SCAN): expired leases and dead waiters go; with a cutoff, grants
-- acquired and requests queued before it go too (clear_old_locks,
-- clear_dead_requests).
-- KEYS[1] the shard's fence key (a shard function)
-- ARGV: older than (ms; '' = no cutoff), event flags ('0' = none; shared/lock.lua `events`),
--       live ('1' = the shard's live locks are counted), then lock names
-- Returns {expired leases, dead waiters, locks gone already, old grants,
--          old waiters, locks visited, events...}
local older_than, watched, live = unpack(ARGV, 1, 3)
local now = clock_ms()
local cutoff = older_than ~= '' and now - tonumber(older_than) or nil
local shard = split_key(KEYS[1])
local expired, dead, gone, old_grants, old_waiters = 0, 0, 0, 0, 0
local events = {}

for k = 4, #ARGV do
  local L = load(lock_of(shard, ARGV[k], live == '1'), nil, watched)
  if not L.exists then
    -- 1. Its key expired (or was released) since the scan saw it.
    gone = gone + 1
  else
    -- 2. Leases that passed and waiters whose replica went quiet.
    expired = expired + purge_expired(L, now)
    dead = dead + sweep_dead_waiters(L, now)
    -- 3. With a cutoff: grants and requests older than it, live or not.
    if cutoff then
      for _, grant in ipairs(all_grants(L)) do
        if tonumber(grant.acquired_s) < cutoff then
          drop_grant(L, grant.holder, grant.slots)
          note(L, 'reaped', grant.kind)
          emit(L, 'reaped', grant.holder, grant, now, REAPER, now)
          old_grants = old_grants + 1
        end
      end
      old_waiters = old_waiters + drop_waiters_where(L, function(_, record)
        return waiter_enqueued(record) < cutoff
      end, 'reaped', 'reaped', now, REAPER)
    end
    -- 4. Keys and wake-ups follow.
    settle(L)
    wake_eligible(L)
    for _, item in ipairs(L.events) do
      table.insert(events, item)
    end
  end
end

return {expired, dead, gone, old_grants, old_waiters, #ARGV - 3, unpack(events)}
