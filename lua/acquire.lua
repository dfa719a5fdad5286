-- acquire: take one of `limit` permits of a lock for a holder, or, when the
-- caller waits, hold its place in the lock's queue.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: holder, ttl_ms, answer_by (Redis ms; '0' = none), then as far as
--       any is not its default (each argument costs Redis ~1,000
--       instructions): limit (1), kind ('default'), metadata (JSON; '' = none),
--       flags ('' ; 'f' = fair: takes its turn in the queue; first, for a
--       read/write lock (decision 0074), 'r' = read, 'w' = write (both
--       fair), 'R' = read with prefer_readers (barging); 'p<k>' = take k
--       permits (only when k > 1; decision 0075); 'e' = publish
--       events; 'c<size>:<retention_ms>' = record them in the changelog;
--       's<epoch>' = a session's stream of that epoch: shared/records.lua `stale`),
--       priority (0), max_locks (of the namespace in this shard; 0 = no limit),
--       and, only when waiting (all of the above then sent): wait_ms (left),
--       queue_ttl_ms, max_waiters (per lock), then optionally request (its
--       RPC's id: finding 6) and hand_answer_by (Redis ms after which its
--       caller is told no; '' = not a hand-over waiter, decision 0068)
-- Returns {status, now, holders, next_expiry, position or the lock's limit,
--          holder, grant, events...}
--   OK / HELD: the holder and its grant record; BUSY, QUEUED (position),
--   QUEUE_FULL, NAMESPACE_FULL, LIMIT_MISMATCH (the lock's limit), LATE,
--   MOVED (a newer stream of the session holds the grant; nothing changed),
--   MODE_MISMATCH (1: the lock is a read/write lock, 0: a plain one),
--   UPGRADE (a reader asked WRITE; nothing changed). A writer that asks
--   READ is downgraded: OK with its grant, and 1 where a position goes.
local holder, ttl, answer_by, limit_s, kind, metadata, flags = unpack(ARGV, 1, 7)
limit_s, kind, metadata, flags = limit_s or '1', kind or 'default', metadata or '', flags or ''
local now, now_us = clock()

-- 1. Past the caller's answer-by time nothing happens: it was told no.
if late(answer_by, now_us) then
  return {LATE, now, 0, 0, 0}
end

-- 2. The common case, decided on one read: a lock that does not exist
--    (nobody holds or waits), in a namespace nobody watches and with no
--    lock limit, is granted at once with slot 1, in the writes the steps
--    below would make for it (one HSET, the keys' TTL: PEXPIRE from the
--    same clock, so the header may leave the keys' expiry out).
local lock_key, grant_field = KEYS[1], 'h:' .. holder
-- (A waiting call reads the holder's place too, which step 10 renews.)
local read = ARGV[10] and redis.call('HMGET', lock_key, '_', grant_field, waiter_field(holder))
  or redis.call('HMGET', lock_key, '_', grant_field)
if not read[1] and (flags == '' or flags == 'f') and not KEYS[4] then
  local token = next_token(KEYS[3], now_us)
  local expires_s = int(now + num(ttl))
  local acquired = token == now_us and '' or string.sub(now_us, 1, -4)
  local record = encode_grant('1', expires_s, token, acquired, ttl, kind, '', metadata)
  local header = encode_header(limit_s, '1', expires_s, '1', '0', '')
  if limit_s == '1' then
    redis.call('HSET', lock_key, '_', header, grant_field, record)
  else
    redis.call('HSET', lock_key, '_', header, grant_field, record, '1', holder)
  end
  redis.call('PEXPIRE', lock_key, keys_ttl(ttl))
  return {OK, now, 1, expires_s, 0, holder, record}
end

-- The rest of the arguments, for the steps below.
local priority_s, max_locks_s, wait_ms, queue_ttl, max_waiters, request, hand_answer_by = unpack(ARGV, 8, 14)
local limit, max_locks = num(limit_s), num(max_locks_s or '0')
-- A read/write request's mode ('r', 'w'; false: plain) and its waiter
-- record's fair field ('r', 'w', 'R'; plain: '1' or '0').
local rw = string.match(flags, '^[rwR]')
local want = rw and (rw == 'w' and 'w' or 'r') or false
local fair
if rw then
  fair = rw ~= 'R'
else
  fair = string.find(flags, 'f', 1, true) ~= nil
end
-- A request of k > 1 permits (decision 0075) says so in its flags and
-- in its waiter record's fair field, after the character ('13').
local weight = string.match(flags, 'p(%d+)')
local permits = weight and num(weight) or 1
local fair_field = rw or (fair and '1' or '0')
if weight then
  fair_field = fair_field .. weight
end
local waiting, priority = wait_ms ~= nil, num(priority_s or '0')
local epoch = string.match(flags, 's(%d+)')
local now_s = string.sub(now_us, 1, -4)
local L = load(lock_at(KEYS), holder, flags, read)
L.now, L.now_us = now, now_us

-- 3. Expired leases stop counting before anything is decided, and dead
--    waiters when a permit is free (they could be ahead of it) or when
--    this call frees one (an expired lease, a writer's downgrade): its
--    hand-over must not reach a dead head (SAFETY.md, finding 8). A
--    request that can only queue leaves them to the call that frees a
--    permit.
local changed = purge_expired(L, now) > 0
if changed or room(L, want, limit, permits) or (want == 'r' and L.mode == 'w' and L.mine_text) then
  changed = purge_dead_waiters(L, now) > 0 or changed
end

-- 3b. The lock's mode rule belongs to it while anyone holds or waits: a
--    plain request on a read/write lock, or the reverse, is refused (its
--    holder's too). The reply says what the lock is.
if (L.holders > 0 or queue_head(L)) and (L.mode ~= false) ~= (want ~= false) then
  settle_purged(L, changed)
  return {MODE_MISMATCH, now, L.holders, 0, L.mode and 1 or 0, unpack(L.events)}
end

-- 4. A holder with a live grant gets that same grant back (idempotent
--    retry); a session's stream only when no newer stream took it over,
--    and a newer stream takes it over. A reader that asks WRITE is
--    refused (two such upgraders would wait for each other forever); a
--    writer that asks READ is downgraded: the lock turns read-held, its
--    grant and token stay, and the readers behind it come in.
if L.mine_text and want == 'w' and L.mode == 'r' then
  settle_purged(L, changed)
  return {UPGRADE, now, L.holders, 0, 0, unpack(L.events)}
end
if L.mine_text then
  -- A grant handed over to another request of this holder is this
  -- answer's now: that request's replica may no longer give it back.
  -- A handed lease cut short at the waiter's liveness deadline
  -- (shared/permits.lua `hand_over`) is taken up: it runs to the end
  -- of the lease asked, counted from the hand-over.
  local claimed = redis.call('HDEL', L.key, 'r:' .. holder) == 1
  local grant = (epoch or claimed) and mine(L)
  if grant and stale(grant, epoch) then
    settle_purged(L, changed)
    return {MOVED, now, L.holders, 0, 0, unpack(L.events)}
  end
  local taken_up = false
  if claimed then
    local full = num(grant.acquired_s) + num(grant.ttl)
    if grant.expires < full then
      grant.expires, grant.expires_s, taken_up = full, false, true
    end
  end
  local downgrade = want == 'r' and L.mode == 'w'
  if downgrade then
    L.mode, L.dirty = 'r', true
    -- Told as its own event (not 'acquired': no new grant), before the
    -- readers it lets in.
    if L.watched then
      emit(L, 'downgraded', holder, mine(L), now, HOLDER)
    end
  end
  if grant and (claim_epoch(grant, epoch) or taken_up) then
    put_grant(L, grant)
    settle(L)
    if changed or downgrade then
      wake_eligible(L)
    end
  elseif downgrade then
    settle(L)
    wake_eligible(L)
  else
    settle_purged(L, changed)
  end
  return {downgrade and OK or HELD, now, L.holders, downgrade and L.earliest or 0, downgrade and 1 or 0, holder,
    grant and grant.text or L.mine_text, unpack(L.events)}
end

-- 5. The limit belongs to the lock while anyone holds or waits.
if (L.holders > 0 or queue_head(L)) and L.limit ~= limit then
  settle_purged(L, changed)
  return {LIMIT_MISMATCH, now, L.holders, 0, L.limit, unpack(L.events)}
end

-- 6. A lock the shard does not have yet counts against the namespace's
--    lock limit (only when there is one).
if not room_for_lock(L, max_locks, now) then
  return {NAMESPACE_FULL, now, 0, 0, 0}
end

-- 7. Its place: how many live requests go before it. Fair requests queue
--    behind everyone of their priority or higher; barging ones do not.
--    With no permit free nobody is counted, and whether it is queued
--    already is learnt when it queues (step 10), unless the queue may be
--    full.
local fits = room(L, want, limit, permits)
local known = fits or (waiting and L.arrivals >= tonumber(max_waiters))
local queued_order = known and queue_head(L) and redis.call('ZSCORE', L.queue, holder)
local ahead = 1
if fits then
  ahead = 0
  if fair and queued_order then
    ahead = redis.call('ZCOUNT', L.queue, '-inf', '(' .. queued_order)
  elseif fair and queue_head(L) then
    ahead = redis.call('ZCOUNT', L.queue, '-inf', '(' .. int((PRIORITY_MAX - priority + 1) * ARRIVALS))
  end
end

-- 8. Free permits enough and nobody ahead: grant, with a fresh token and
--    the smallest free slots (one per permit). Only the head of the queue
--    is granted, so grants follow queue order.
if fits and ahead == 0 then
  if queued_order then
    drop_waiters(L, {holder})
  end
  local grant = {
    slot = false, slots = false, permits = permits, expires = now + tonumber(ttl), token = false,
    acquired_s = now_s, ttl = ttl, kind = kind, holder = holder, metadata = metadata,
    epoch = epoch or '',
  }
  L.limit = limit
  local fields = take_slots(L, grant, permits)
  grant.token = next_token(L.fence, now_us)
  L.mode = want
  put_grant(L, grant)
  name_slots(L, fields, holder)
  settle(L)
  emit(L, 'acquired', holder, grant, now, HOLDER)
  -- A permit left over goes to the next waiter in line.
  if any_room(L) or changed then
    wake_eligible(L)
  end
  return {OK, now, L.holders, L.earliest, 0, holder, grant.text, unpack(L.events)}
end

-- 9. Not granted, trying once: nothing is queued.
if not waiting then
  settle_purged(L, changed)
  return {BUSY, now, L.holders, L.holders > 0 and L.earliest or 0, 0, unpack(L.events)}
end

-- 10. Not granted, waiting: join the queue once (arrival order from the
--    lock's counter), then keep the request alive for queue_ttl_ms. The
--    record names the request (a hand-over waiter); a later request of
--    the holder that finds its place takes it over with its own name, so
--    the earlier request's late dequeue leaves it alone (finding 6).
local function record(enqueued)
  return encode_waiter(priority_s or '0', enqueued, wait_ms, fair_field, kind, request, hand_answer_by, ttl, epoch,
    metadata)
end
-- Its liveness deadline goes with its record, in the lock's hash.
local deadline = now + tonumber(queue_ttl)
local deadline_s = int(deadline)
-- (arrivals is 0 exactly while nobody waits: settle resets it.)
local fresh, position = L.arrivals == 0, nil
if known and not queued_order and queue_head(L)
  and redis.call('ZCARD', L.queue) >= tonumber(max_waiters) then
  settle_purged(L, changed)
  return {QUEUE_FULL, now, L.holders, 0, 0, unpack(L.events)}
end
-- A new arrival (ZADD NX adds it only if it is not queued yet).
local added = false
if not queued_order then
  local order = int((PRIORITY_MAX - priority) * ARRIVALS + L.arrivals + 1)
  added = redis.call('ZADD', L.queue, 'NX', order, holder) == 1
end
if added then
  L.queue_fresh = fresh
  L.arrivals, L.limit, L.dirty = L.arrivals + 1, limit, true
  -- The first request of a lock nobody holds sets its rule: a read/write
  -- lock only waited for reads 'r' (the mode rule kept any other out).
  if L.holders == 0 then
    L.mode = want and 'r'
  end
  change(L, waiter_field(holder), stored_waiter(deadline_s, record(now_s)))
  L.queue_known, L.queued = false, true
  if L.watched then
    emit(L, 'queued', holder, {kind = kind, metadata = metadata, mode = want}, now, HOLDER)
  end
  -- First in an empty queue, or behind others of its priority: no need
  -- to ask where it is (only the head's place matters to its replica).
  if fresh then
    position = 1
  elseif priority == 0 then
    position = 0
  end
else
  L.queued = true
end
-- A read/write or weighted request that keeps its place says what it
-- asks now (a waiting reader that asks WRITE waits as a writer).
-- An earlier request of the holder that lands late (its replica may be
-- gone) leaves a later one's name and answer-by in place: the record
-- keeps the request whose caller waits longest, so the hand-over never
-- drops the holder's place as late while its later request still waits.
-- Either way its liveness deadline moves on (its record read with the
-- lock, step 2).
local handing = request and request ~= ''
if not added then
  local _, old = split_waiter(read[3] or nil)
  local new = old
  if old and (handing or rw or weight) then
    local old_fair = waiter_fair(old)
    local later = handing and hand_answer_by and hand_answer_by ~= '' and parse_waiter(old)
    if (handing and waiter_request(old) ~= request and not (later and above(later.answer_by, hand_answer_by)))
      or ((rw or weight or #(old_fair or '') > 1) and old_fair ~= fair_field) then
      new = record(int(waiter_enqueued(old)))
    end
  end
  change(L, waiter_field(holder), stored_waiter(deadline_s, new or record(now_s)))
end
keep_keys_until(L, deadline)

-- 11. Keys and their TTLs, and a wake-up when expiries freed permits.
settle(L)
if changed then
  wake_eligible(L)
end
position = position or redis.call('ZRANK', L.queue, holder) + 1
return {QUEUED, now, L.holders, L.holders > 0 and L.earliest or 0, position, unpack(L.events)}
