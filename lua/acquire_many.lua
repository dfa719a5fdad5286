-- acquire_many: take one permit of each of several locks for one holder,
-- all or nothing (a multi-lock, decision 0076). Nothing is queued for a
-- grant: a caller that waits leaves a wake-up place at the tail of each
-- busy lock's queue (behind every priority, so nobody queues behind it),
-- and calls again when a call on that lock wakes it.
-- KEYS: per lock its keys, as acquire declares them (lock, queue,
--       fence[, live locks]), lock after lock
-- ARGV: holder, ttl_ms, answer_by (Redis ms; '0' = none), limit, kind,
--       metadata (JSON; '' = none), flags (events only: shared/lock.lua
--       `events`), keys per lock (3 or 4), max_locks (0 = no limit),
--       lease_ms (the lease given now: ttl_ms, or a short reservation
--       that the caller extends once every part is held), queue_ttl_ms
--       ('' = not waiting), max_waiters (per lock)
-- Returns {status, now, a, b, c, ...}:
--   OK / HELD (every lock already the holder's): a = n, then per lock its
--     holders and the holder's grant record;
--   BUSY / QUEUED (a wake-up place left), QUEUE_FULL, LIMIT_MISMATCH
--     (c: the lock's limit), MODE_MISMATCH: a = the first refused lock's
--     index (1-based), b = its holders, c = when the first lease of a busy
--     lock ends;
--   LATE, NAMESPACE_FULL: nothing changed;
--   then the events noted (event, kind, ...), every lock's.
local holder, ttl, answer_by, limit_s, kind, metadata, flags, per_s, max_locks_s, lease, queue_ttl, max_waiters =
  unpack(ARGV, 1, 12)
local per, limit, max_locks = num(per_s), num(limit_s), num(max_locks_s)
local waiting = queue_ttl ~= nil and queue_ttl ~= ''
local now, now_us = clock()

-- 1. Past the caller's answer-by time nothing happens: it was told no.
if late(answer_by, now_us) then
  return {LATE, now, 0, 0, 0}
end

-- 2. Every lock read, its lapsed leases purged (dead waiters too, where a
--    permit is free).
local locks = {}
for i = 1, #KEYS / per do
  local L = load(lock_at({unpack(KEYS, (i - 1) * per + 1, i * per)}), holder, flags)
  L.now, L.now_us = now, now_us
  local changed = purge_expired(L, now) > 0
  if room(L, false, limit, 1) then
    changed = purge_dead_waiters(L, now) > 0 or changed
  end
  L.changed = changed
  locks[i] = L
end

-- The reply's events: every lock's, after its fixed part.
local function reply(head)
  return with_events(head, locks)
end

-- Each lock's purges written (and whom they let in woken), then the reply.
local function refuse(status, i, c)
  for _, L in ipairs(locks) do
    settle_purged(L, L.changed)
  end
  return reply({status, now, i, locks[i] and locks[i].holders or 0, c or 0})
end

-- 3. A lock in use under another rule refuses the set: a read/write lock,
--    another limit, a namespace at its lock limit.
for i, L in ipairs(locks) do
  local used = L.holders > 0 or queue_head(L)
  if used and L.mode then
    return refuse(MODE_MISMATCH, i, 1)
  end
  if used and L.limit ~= limit then
    return refuse(LIMIT_MISMATCH, i, L.limit)
  end
  if not room_for_lock(L, max_locks, now) then
    return refuse(NAMESPACE_FULL, i)
  end
end

-- 4. Which locks are busy: held by others to their limit (a lock the
--    holder holds already counts as taken).
local busy, first, next_expiry = {}, nil, 0
for i, L in ipairs(locks) do
  if not L.mine_text and not room(L, false, limit, 1) then
    busy[#busy + 1] = L
    first = first or i
    if next_expiry == 0 or L.earliest < next_expiry then
      next_expiry = L.earliest
    end
  end
end

-- 5. Busy, trying once: nothing changes but the purges.
if first and not waiting then
  return refuse(BUSY, first, next_expiry)
end

-- 6. Busy, waiting: a wake-up place at the tail of each busy lock's queue
--    (a record that names no request: hand-over wakes it, never grants
--    it), alive for queue_ttl_ms. Nothing is held meanwhile.
if first then
  local deadline = now + num(queue_ttl)
  for _, L in ipairs(busy) do
    local record
    if redis.call('ZSCORE', L.queue, holder) then
      record = select(2, split_waiter(waiter_of(L, holder)))
    else
      if redis.call('ZCARD', L.queue) >= num(max_waiters) then
        return refuse(QUEUE_FULL, first)
      end
      L.queue_fresh = L.arrivals == 0
      redis.call('ZADD', L.queue, int((2 * PRIORITY_MAX + 1) * ARRIVALS + L.arrivals + 1), holder)
      L.arrivals, L.dirty, L.queue_known, L.queued = L.arrivals + 1, true, false, true
    end
    record = record or encode_waiter('0', string.sub(now_us, 1, -4), '1', '0', kind)
    change(L, waiter_field(holder), stored_waiter(int(deadline), record))
    keep_keys_until(L, deadline)
    L.changed = true
  end
  return refuse(QUEUED, first, next_expiry)
end

-- 7. Every lock has room: each grants a permit with a fresh token (its
--    shard's counter), its wake-up place dropped, its event told.
local all_held, out = true, {OK, now, #locks, 0, 0}
for _, L in ipairs(locks) do
  if L.mine_text then
    settle_purged(L, L.changed)
    out[#out + 1], out[#out + 2] = L.holders, L.mine_text
  else
    all_held = false
    if queue_head(L) and redis.call('ZSCORE', L.queue, holder) then
      drop_waiters(L, {holder})
    end
    local grant = {
      slot = false, slots = false, permits = 1, expires = now + num(lease), token = false,
      acquired_s = string.sub(now_us, 1, -4), ttl = ttl, kind = kind, holder = holder, metadata = metadata,
      epoch = '',
    }
    L.limit = limit
    local fields = take_slots(L, grant, 1)
    grant.token = next_token(L.fence, now_us)
    put_grant(L, grant)
    name_slots(L, fields, holder)
    settle(L)
    emit(L, 'acquired', holder, grant, now, HOLDER)
    -- A permit left over goes to the next waiter in line.
    if any_room(L) or L.changed then
      wake_eligible(L)
    end
    out[#out + 1], out[#out + 2] = L.holders, grant.text
  end
end
if all_held then
  out[1] = HELD
end
return reply(out)
