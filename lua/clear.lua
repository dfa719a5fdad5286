-- clear: release every lock of some of one shard's locks and drop their
-- queues (an admin operation; the replica found their keys with SCAN).
-- KEYS[1] the shard's fence key (a shard function)
-- ARGV: event flags ('0' = none; shared/lock.lua `events`), then lock names
-- Returns {locks cleared, grants released, requests dropped, events...}
--   (events: 'cleared', kind pairs for the per-minute counters, one per
--   grant and per request)
local watched = ARGV[1]
local now = clock_ms()
local shard = split_key(KEYS[1])
local locks, grants, requests = 0, 0, 0
-- The reply, its events appended as they come (never unpacked: a lock of
-- thousands of grants notes more than Lua can unpack at once).
local reply = {0, 0, 0}

for k = 2, #ARGV do
  local L = load(lock_of(shard, ARGV[k]), nil, watched)
  if L.exists then
    -- 1. Count what goes, per kind (and tell watchers), then delete the
    --    lock's keys.
    --    (The header's holders count permits in use, decision 0075: the
    --    grants are counted one by one.)
    for _, grant in ipairs(all_grants(L)) do
      note(L, 'cleared', grant.kind)
      emit(L, 'cleared', grant.holder, grant, now, ADMIN, now)
      grants = grants + 1
    end
    local waiting = all_waiters(L)
    for _, w in ipairs(waiting) do
      waiter_leaves(L, w[1], w[3], 'cleared', 'cleared', now, ADMIN)
    end
    requests = requests + #waiting
    redis.call('DEL', L.key, L.queue)
    redis.call('ZREM', shard .. ':n', L.name)
    locks = locks + 1
    for _, item in ipairs(L.events) do
      reply[#reply + 1] = item
    end
  end
end
reply[1], reply[2], reply[3] = locks, grants, requests
return reply
