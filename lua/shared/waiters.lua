-- shared/waiters.lua: the lock's waiting requests. Each is a member of
-- the queue (ZSET '...:q:<name>', in grant order) and a field of the
-- lock's hash ('w:<id>': its liveness deadline, then its record; layout
-- v4, decision 0090). Here they leave the queue, dead ones are purged at
-- the front (every call that may grant) or swept from anywhere (the
-- reaper), and walks read the whole queue.

-- Remove waiting requests from the queue, with their records (their
-- fields in the lock's hash go in settle's HDEL; a change to one made
-- earlier in this call is dropped with it). The head alone leaving keeps
-- the queue known (the next one was read with it).
local function drop_waiters(L, ids)
  local gone = {}
  for first = 1, #ids, BATCH do
    local last = math.min(first + BATCH - 1, #ids)
    redis.call('ZREM', L.queue, unpack(ids, first, last))
  end
  for _, id in ipairs(ids) do
    local field = waiter_field(id)
    gone[field] = true
    append(L, 'removed', field)
  end
  if #L.changes > 0 then
    local kept = {}
    for i = 1, #L.changes, 2 do
      if not gone[L.changes[i]] then
        kept[#kept + 1], kept[#kept + 2] = L.changes[i], L.changes[i + 1]
      end
    end
    L.changes = kept
  end
  L.head_alive = false
  if #ids == 1 and L.queue_known and L.head == ids[1] and L.second ~= nil then
    -- The next one is the head now (the one after it is not known yet).
    if L.second then
      L.head, L.second = L.second, nil
    else
      L.head = false
    end
  else
    L.queue_known = false
  end
end

-- The stored fields of waiting requests `ids`, in their order (a false
-- where a request has none).
local function waiters_stored(L, ids)
  local fields = {}
  for i, id in ipairs(ids) do
    fields[i] = waiter_field(id)
  end
  return on_fields(L.key, 'HMGET', fields)
end

-- A waiting request of `record` leaves: counted as `counted` for the
-- replica's per-minute counters, told to watchers as `told` by `actor`.
local function waiter_leaves(L, id, record, counted, told, now, actor)
  local kind = waiter_kind(record)
  note(L, counted, kind)
  if L.watched then
    emit(L, told, id, {kind = kind, mode = waiter_mode(record)}, now, actor)
  end
end

-- Waiting requests whose replica stopped refreshing them (crashed, cut
-- off) are dead: they leave the queue instead of holding it up (each
-- noted as 'reaped', told to watchers as 'skipped'). Only the front of
-- the queue is looked at (layout v4: a waiter's deadline is in its
-- record): the head's one read, and when it is dead, the run of dead
-- requests at the front, a batch at a time. A dead request further back
-- leaves when it reaches the front, or with the reaper (reap.lua).
-- L.head_alive keeps the live head's stored field for the hand-over.
local function purge_dead_waiters(L, now)
  local head = queue_head(L)
  if not head or L.head_alive then
    return 0
  end
  local stored = waiter_of(L, head)
  if split_waiter(stored) > now then
    L.head_alive = stored
    return 0
  end
  local dropped = 0
  repeat
    local ids = redis.call('ZRANGE', L.queue, '0', int(BATCH - 1))
    local values = waiters_stored(L, ids)
    local dead = {}
    for i, id in ipairs(ids) do
      local deadline, record = split_waiter(values[i] or nil)
      if deadline > now then
        break
      end
      dead[#dead + 1] = id
      waiter_leaves(L, id, record, 'reaped', 'skipped', now, REAPER)
    end
    if #dead > 0 then
      drop_waiters(L, dead)
    end
    dropped = dropped + #dead
  until #dead < #ids or #ids == 0
  L.queue_known = false
  return dropped
end

-- Every waiting request of the lock in queue order, each {id, liveness
-- deadline (0 when it has no record: dead), record}. It reads the whole
-- queue: for walks and admin calls (list, inspect, queue, clear, reap),
-- never a lock's own hot path.
local function all_waiters(L)
  local out = {}
  if L.arrivals == 0 then
    return out
  end
  local ids = redis.call('ZRANGE', L.queue, '0', '-1')
  local values = waiters_stored(L, ids)
  for i, id in ipairs(ids) do
    local deadline, record = split_waiter(values[i] or nil)
    out[i] = {id, deadline, record}
  end
  return out
end

-- How many waiting requests are alive at `now`.
local function live_waiters(L, now)
  local live = 0
  for _, w in ipairs(all_waiters(L)) do
    if w[2] > now then
      live = live + 1
    end
  end
  return live
end

-- Every waiting request that `leaves(deadline, record)` picks leaves,
-- wherever it is in the queue, counted and told as `waiter_leaves` says.
-- Returns how many left.
local function drop_waiters_where(L, leaves, counted, told, now, actor)
  local gone = {}
  for _, w in ipairs(all_waiters(L)) do
    if leaves(w[2], w[3]) then
      gone[#gone + 1] = w[1]
      waiter_leaves(L, w[1], w[3], counted, told, now, actor)
    end
  end
  if #gone > 0 then
    drop_waiters(L, gone)
  end
  return #gone
end

-- Every dead waiting request leaves, wherever it is in the queue (the
-- reaper's sweep: purge_dead_waiters looks at the front only). Returns
-- how many left.
local function sweep_dead_waiters(L, now)
  return drop_waiters_where(L, function(deadline)
    return deadline <= now
  end, 'reaped', 'skipped', now, REAPER)
end
