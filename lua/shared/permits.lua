-- shared/permits.lua: who holds and who gets a permit: grants dropped and
-- stored, lapsed leases purged (dead waiters: shared/waiters.lua), a
-- semaphore's slots, the room rule (read/write, weighted permits), and
-- the hand-over of freed permits to the queue's head.

-- Every grant of the lock, lapsed or not: {grant, ...} in no set order.
-- One HGETALL: the lock's hash holds its header, its grants, (for a
-- semaphore) its slots, and its waiters' records (layout v4), which are
-- passed over.
local function all_grants(L)
  if L.holders == 0 then
    return {}
  end
  local grants = {}
  local fields = redis.call('HGETALL', L.key)
  for i = 1, #fields, 2 do
    local field = fields[i]
    if string.sub(field, 1, 2) == 'h:' then
      grants[#grants + 1] = parse_grant(string.sub(field, 3), fields[i + 1])
    end
  end
  return grants
end

-- Remove one grant (its fields go in settle, with the whole key when
-- nothing is left). `slots` (the grant's slot text: one slot, or
-- 's1,s2,…' for a grant of several permits) matters for a semaphore only:
-- each of its slot fields goes, and the permits in use drop by as many.
local function drop_grant(L, holder, slots)
  append(L, 'removed', 'h:' .. holder, 'r:' .. holder)
  local permits = 1
  if L.limit > 1 then
    if string.find(slots, ',', 1, true) then
      permits = 0
      for slot in string.gmatch(slots, '%d+') do
        append(L, 'removed', slot)
        permits = permits + 1
      end
    else
      append(L, 'removed', slots)
    end
  end
  L.holders, L.dirty = L.holders - permits, true
  if L.holders == 0 then
    L.earliest, L.earliest_s = 0, '0'
    -- A read/write lock nobody holds stays one while anyone waits.
    if L.mode == 'w' then
      L.mode = 'r'
    end
  end
  if holder == L.holder then
    L.mine_text, L.mine_grant = false, false
  end
end

-- Store a grant with its lease (L.holders already counts it): `earliest` stays a bound
-- no lease ends before (exact for a sole holder), and the keys outlive the
-- lease.
local function put_grant(L, grant)
  change(L, 'h:' .. grant.holder, format_grant(grant))
  if L.holders == 1 or grant.expires < L.earliest then
    L.earliest, L.earliest_s = grant.expires, grant.expires_s
  end
  L.dirty = true
  keep_keys_until(L, grant.expires)
end

-- Holders whose lease has passed stop counting now: their grants go
-- (each noted as 'expired'). Nothing to do while the earliest possible
-- expiry 'e' lies ahead; otherwise every grant is looked at once and 'e'
-- becomes exact again (and 'top' the highest slot still taken).
local function purge_expired(L, now)
  if L.holders == 0 or L.earliest > now then
    return 0
  end
  local dropped, earliest, top = 0, nil, 0
  for _, grant in ipairs(all_grants(L)) do
    if grant.expires <= now then
      drop_grant(L, grant.holder, grant.slots)
      note(L, 'expired', grant.kind)
      emit(L, 'expired', grant.holder, grant, now, REAPER, grant.expires)
      dropped = dropped + 1
    else
      earliest = math.min(earliest or grant.expires, grant.expires)
      top = math.max(top, num(string.match(grant.slots, '(%d+)$')))
    end
  end
  L.earliest, L.earliest_s, L.top_slot, L.dirty = earliest or 0, false, top, true
  return dropped
end

-- Expired leases and dead waiters stop counting before anything else.
-- Returns true when anything changed.
local function purge(L, now)
  return purge_expired(L, now) + purge_dead_waiters(L, now) > 0
end

-- The `k` smallest free slots of a semaphore (with n slots taken, k of
-- 1..n+k are free): the slot map ('<slot>' -> holder) says which are
-- taken; slots freed by this very call are free too, and slots given by
-- it (not written yet) are taken, though both go in only at settle.
-- Returns the first slot (a number), the slots as the grant record
-- writes them ('s' or 's1,s2,…'), their fields in a list and the last one.
local function free_slots(L, k)
  if L.limit == 1 or (L.holders == 0 and k == 1) then
    return 1, '1', {'1'}, 1
  end
  local freed = {}
  for _, field in ipairs(L.removed) do
    freed[field] = true
  end
  for i = 1, #L.changes, 2 do
    freed[L.changes[i]] = false
  end
  local slots = {}
  for s = 1, L.holders + k do
    slots[s] = int(s)
  end
  local taken = L.holders > 0 and on_fields(L.key, 'HMGET', slots) or NONE
  local found = {}
  for s = 1, L.holders + k do
    local f = freed[slots[s]]
    if (not taken[s] and f ~= false) or f == true then
      found[#found + 1] = slots[s]
      if #found == k then
        return num(found[1]), table.concat(found, ','), found, s
      end
    end
  end
  -- Unreachable while the header counts the slots taken; never reuse one.
  error('tumbler: no free slot')
end

-- Give a new grant its `k` slots: the header counts them (the caller
-- then stores the grant, put_grant, and names its slots, name_slots).
-- Returns the slots' fields.
local function take_slots(L, grant, k)
  local slot, slots, fields, last = free_slots(L, k)
  grant.slot, grant.slots, grant.permits = slot, slots, k
  L.holders, L.top_slot = L.holders + k, math.max(L.top_slot, last)
  return fields
end

-- Each slot field of a new grant names its holder (a semaphore only).
local function name_slots(L, fields, holder)
  if L.limit > 1 then
    for _, field in ipairs(fields) do
      change(L, field, holder)
    end
  end
end

-- The wake-up channel of the lock's deployment.
local function wake_channel(L)
  local prefix = string.match(L.queue, '^(.-):{')
  return prefix .. ':wake'
end

-- Room for a request of `mode` (false: plain; 'r', 'w') and `k` permits
-- (absent: one) under a limit (the lock's, unless the request brings its
-- own): a writer needs no grant held; a reader needs no writer and fewer
-- than `limit` grants (decision 0074); a plain request `k` free permits,
-- holders + k <= limit (decision 0075).
local function room(L, mode, limit, k)
  if mode == 'w' then
    return L.holders == 0
  end
  return L.holders + (k or 1) <= (limit or L.limit) and (not mode or L.mode ~= 'w')
end

-- Room for anyone at all (a reader or a plain request: a writer needs
-- more), the question before looking at the queue's head.
local function any_room(L)
  return L.holders < L.limit and L.mode ~= 'w'
end

-- Hand-over (decision 0068): permits that are free go straight to the
-- head of the queue, in queue order (priority, then arrival), inside the
-- call that freed them, so the waiter need not call again. The head's
-- record says what its grant is made of; a head whose caller is past its
-- answer-by time is told no (or about to be) and leaves instead; a head
-- whose replica calls again itself (its record names no request) is
-- woken as before and the hand-over stops there. The grant is published
-- to the waiters' replicas as '+<queue key>\n<id>\n<request>\n<holders>\n<grant>':
-- the replica whose request it names answers it; a replica whose request
-- is gone gives it back at once, unless another request of the holder
-- was answered with it meanwhile (HELD clears the lock's 'r:<holder>'). Dead waiters left the queue before (purge).
-- A head that does not fit (a writer while readers hold, a request of
-- more permits than are free: decision 0075) stops it, woken or not:
-- those behind it wait behind it (golang's rule). A run of readers or
-- small requests at the head is granted one after the other while they fit.
-- Runs before settle (its writes go with the call's own).
local function hand_over(L)
  while any_room(L) do
    if not L.now_us then
      L.now, L.now_us = clock()
    end
    purge_dead_waiters(L, L.now)
    local head = queue_head(L)
    if not head then
      return
    end
    -- Its replica is known alive only until the request's liveness
    -- deadline (read with its record: the head is alive, purge above).
    local alive_until, record = split_waiter(L.head_alive)
    local mode = L.mode and waiter_mode(record)
    local k = L.limit > 1 and waiter_permits(waiter_fair(record)) or 1
    if not room(L, mode, nil, k) then
      -- A writer that waits for readers to leave, or a request of more
      -- permits than are free: a barging request behind it (prefer_readers,
      -- fair = false) may still take the free permits, so the waiters'
      -- replicas wake their barging ones (no id named).
      if L.mode == 'r' or k > 1 then
        redis.call('PUBLISH', wake_channel(L), L.queue)
      end
      return
    end
    local w = parse_waiter(record)
    if not w then
      redis.call('PUBLISH', wake_channel(L), L.queue .. '\n' .. head)
      return
    end
    -- A lease that ends after the head's liveness deadline is provisional
    -- up to it (decision 0089). Its replica takes it up (an acquire of the
    -- holder answered HELD extends it to the lease asked) before it
    -- answers, so a waiter whose replica died keeps the lock no longer
    -- than its request TTL. A request of the calling replica (L.alive:
    -- its part of its request ids, decision 0090) is known alive now: its
    -- grant is whole, as a grant of its own call would be.
    drop_waiters(L, {head})
    if not late(w.answer_by, L.now_us) then
      local expires = L.now + num(w.ttl)
      if alive_until < expires and not (L.alive and string.sub(w.request, 1, #L.alive) == L.alive) then
        expires = alive_until
      end
      local grant = {
        slot = false, slots = false, permits = k, expires = expires, token = false,
        acquired_s = string.sub(L.now_us, 1, -4), ttl = w.ttl, kind = w.kind, holder = head,
        metadata = w.metadata, epoch = w.epoch,
      }
      local fields = take_slots(L, grant, k)
      grant.token = next_token(L.fence, L.now_us)
      if mode then
        L.mode = mode
      end
      put_grant(L, grant)
      name_slots(L, fields, head)
      -- Which request it was handed to, until an answer claims it: only
      -- that request's replica may give it back (release.lua `handed`).
      change(L, 'r:' .. head, w.request)
      emit(L, 'acquired', head, grant, L.now, HOLDER)
      redis.call('PUBLISH', wake_channel(L),
        '+' .. L.queue .. '\n' .. head .. '\n' .. w.request .. '\n' .. int(L.holders) .. '\n' .. grant.text)
    end
  end
end

-- After settle, when a call freed permits: hand them over (and settle
-- what that changed).
local function wake_eligible(L)
  if any_room(L) and queue_head(L) then
    hand_over(L)
    settle(L)
  end
end

-- settle when a call that changes nothing else purged something, and
-- wake whoever may now be granted.
local function settle_purged(L, changed)
  if changed then
    settle(L)
    wake_eligible(L)
  end
end
