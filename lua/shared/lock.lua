-- shared/lock.lua: a lock as one call sees it: the lock table, read once
-- (`load`: one HMGET), its bookkeeping (changes, removed fields, events),
-- the queue's head read at most once, and written once (`settle`: one
-- HDEL, one HSET, a TTL only when a lease nears it).

-- The empty list every lock table starts with for its changes, removed
-- fields and events (most calls have none of some): never appended to;
-- the first append gives the lock a list of its own.
local NONE = {}

-- A lock table: every field a step may set is named here, so the table is
-- made at its full size once.
local function new_lock(key, queue, fence, live)
  return {
    key = key, queue = queue, fence = fence,
    live = live, shard = false, name = false,
    holder = false, watched = false, exists = false,
    limit = 1, holders = 0, earliest = 0, top_slot = 0, arrivals = 0, key_expiry = 0, mode = false,
    held_mode = false,
    earliest_s = false, key_expiry_s = false,
    mine_text = false, mine_grant = false,
    changes = NONE, removed = NONE, events = NONE, keep_until = 0, dirty = false,
    head = false, second = false, queue_known = false, queue_fresh = false, queued = false,
    head_alive = false, alive = false,
    now = false, now_us = false,
  }
end

-- A lock of the shard `shard`, before it is read. `live`: the deployment
-- has a per-namespace lock limit, so the shard's live locks are counted in
-- '...:n' (only then: nobody else pays for it).
local function lock_of(shard, name, live)
  local L = new_lock(shard .. ':l:' .. name, shard .. ':q:' .. name, shard .. ':fence', live or false)
  L.shard, L.name = shard, name
  return L
end

-- The lock a function on one lock was called for, from its declared keys
-- (lock, queue, fence, and '...:n' when live locks are counted). Its
-- shard and name are worked out only when needed (names).
local function lock_at(keys)
  return new_lock(keys[1], keys[2], keys[3], keys[4] ~= nil)
end

-- The lock's shard prefix and name (from its key, once).
local function names(L)
  if not L.name then
    local shard, rest = split_key(L.key)
    L.shard, L.name = shard, string.sub(rest, 3)
  end
  return L.shard, L.name
end

-- What the lock's events do, from the caller's event flags (read only when
-- some flag is set: the default costs nothing): '1' or 'e' = publish them
-- (some replica watches the namespace); 'c<size>:<retention_ms>' = record
-- them in the shard's changelog; acquire's flags may also hold 'f'.
-- L.watched: the lock has events at all (callers build them only then).
-- L.publish, L.log, L.log_ttl are set only here (not by new_lock), so a
-- lock without events carries none of them.
local function events(L, flags)
  if flags == '1' or flags == 'e' then
    L.watched, L.publish = true, true
    return
  end
  L.publish = string.find(flags, 'e', 1, true) ~= nil
  local size, ttl = string.match(flags, 'c(%d+):(%d+)')
  if size then
    L.log, L.log_ttl = size, ttl
  end
  L.watched = L.publish or L.log ~= false
end

-- Reads a lock (one HMGET: its header and the holder's grant) into L:
--   limit, mode (false: a plain lock; 'r' / 'w': a read/write lock, read-held
--   or only waited for / write-held), holders (how many), earliest (no lease ends before), top_slot
--   (highest slot that may be taken), arrivals (> 0 exactly while someone
--   may wait), key_expiry (when the keys expire; 0 for a fresh lock), exists,
--   mine_text: the stored grant of `holder` (false when it holds none;
--   `mine` decodes it, only for the calls that need its parts),
-- and the bookkeeping settle works from:
--   changes (fields to HSET), removed (fields to HDEL), dirty (header),
--   keep_until (the keys must live until then), events (what happened,
--   for the replica's counters: event, kind, event, kind, ...).
-- `read`: that HMGET's reply when the caller made it already.
local function load(L, holder, watched, read)
  local header, record
  if holder then
    local v = read or redis.call('HMGET', L.key, '_', 'h:' .. holder)
    header, record = v[1], v[2]
  else
    header = redis.call('HGET', L.key, '_')
  end
  L.holder = holder or false
  if watched and watched ~= '0' and watched ~= '' and watched ~= 'f' then
    events(L, watched)
  end
  if header then
    local mode, limit, holders, earliest, top_slot, arrivals, x = decode_header(header)
    L.exists, L.mode = true, mode ~= '' and mode
    L.held_mode = L.mode
    L.limit, L.holders, L.top_slot, L.arrivals = num(limit), num(holders), num(top_slot), num(arrivals)
    L.earliest, L.earliest_s = tonumber(earliest), earliest
    if x == '' then
      L.key_expiry = L.earliest + KEY_TTL_MS
    else
      L.key_expiry, L.key_expiry_s = tonumber(x), x
    end
  end
  L.mine_text = record or false
  return L
end

-- The holder's grant, decoded (false when it holds none).
local function mine(L)
  if L.mine_text and not L.mine_grant then
    L.mine_grant = parse_grant(L.holder, L.mine_text)
  end
  return L.mine_text and L.mine_grant
end

-- Append to one of the lock's lists (changes, removed, events), giving it
-- a list of its own first.
local function append(L, list, a, b)
  local items = L[list]
  if items == NONE then
    items = {}
    L[list] = items
  end
  items[#items + 1] = a
  if b then
    items[#items + 1] = b
  end
end

-- Queue a field for settle's one HSET.
local function change(L, field, value)
  append(L, 'changes', field, value)
end

-- Note an event for the replica's per-minute counters.
local function note(L, event, kind)
  append(L, 'events', event, kind)
end

-- The keys must outlive a new lease or waiter deadline by the grace.
local function keep_keys_until(L, at)
  if at + KEY_GRACE_MS > L.keep_until then
    L.keep_until = at + KEY_GRACE_MS
  end
end

-- A command on many fields of a hash (HMGET, HDEL), in batches; returns
-- the replies' elements in field order (HMGET's values; nil kept in place,
-- so `count` says how many there are).
local function on_fields(key, command, fields)
  local values = {}
  for first = 1, #fields, BATCH do
    local last = math.min(first + BATCH - 1, #fields)
    local part = redis.call(command, key, unpack(fields, first, last))
    if type(part) == 'table' then
      for i = 1, last - first + 1 do
        values[first + i - 1] = part[i]
      end
    end
  end
  return values
end

-- The id of the first waiting request, or nil when nobody waits (no call
-- at all unless 'seq' says someone may; then remembered until the queue
-- changes). The one after it is read in the same call, so a hand-over
-- that takes the head knows the next one without reading again.
local function queue_head(L)
  if L.arrivals == 0 then
    return nil
  end
  if not L.queue_known then
    local ids = redis.call('ZRANGE', L.queue, '0', '1')
    L.head, L.second, L.head_alive = ids[1] or false, ids[2] or false, false
    L.queue_known = true
  end
  return L.head or nil
end

-- A waiting request's stored field in the lock's hash (its liveness
-- deadline, then its record: shared/records.lua `stored_waiter`), or nil.
-- A field this call changed already is read from the change.
local function waiter_of(L, id)
  local field = waiter_field(id)
  for i = #L.changes - 1, 1, -2 do
    if L.changes[i] == field then
      return L.changes[i + 1]
    end
  end
  return redis.call('HGET', L.key, field) or nil
end

-- With a per-namespace lock limit (max_locks > 0), the shard's live locks
-- are counted in '...:n' (name -> key expiry); without one, nothing is.
local function room_for_lock(L, max_locks, now)
  if max_locks == 0 or not L.live or L.exists then
    return true
  end
  local shard = names(L)
  return redis.call('ZCOUNT', shard .. ':n', '(' .. int(now), '+inf') < max_locks
end

-- After any change: a lock nobody holds or waits for leaves no key behind.
-- Otherwise the dropped fields go in one HDEL, the changed ones (header
-- included) in one HSET, and the keys' TTL moves later only when a lease
-- or waiter deadline came within the grace of it (TTLs are set with twice
-- the grace, so most extends and renewals leave them alone).
-- A lock whose live locks are counted (L.live) keeps its entry in '...:n'.
local function settle(L)
  local head = L.queued or queue_head(L)
  if L.holders == 0 and not head then
    if L.exists then
      if L.arrivals > 0 then
        redis.call('DEL', L.key, L.queue)
      else
        redis.call('DEL', L.key)
      end
      if L.live then
        local shard, name = names(L)
        redis.call('ZREM', shard .. ':n', name)
      end
    end
    L.exists = false
    return
  end
  -- An empty queue drops its arrival counter: 'seq' says someone may wait.
  if not head and L.arrivals > 0 then
    L.arrivals, L.dirty = 0, true
  end
  if #L.removed > 0 then
    on_fields(L.key, 'HDEL', L.removed)
    L.removed = NONE
  end
  local expire = L.keep_until > L.key_expiry
  if expire then
    L.key_expiry, L.dirty = L.keep_until + KEY_GRACE_MS, true
    L.key_expiry_s = int(L.key_expiry)
  end
  if L.dirty then
    if not L.earliest_s then
      L.earliest_s = int(L.earliest)
    end
    -- The keys' expiry is left out when it is the usual one (a lease's
    -- end plus twice the grace): 13 bytes fewer per lock.
    local x_s = ''
    if L.key_expiry ~= L.earliest + KEY_TTL_MS then
      L.key_expiry_s = L.key_expiry_s or int(L.key_expiry)
      x_s = L.key_expiry_s
    end
    local limit_s = L.mode and L.mode .. int(L.limit) or int(L.limit)
    change(L, '_', encode_header(limit_s, int(L.holders), L.earliest_s, int(L.top_slot), int(L.arrivals), x_s))
    L.dirty = false
  end
  if #L.changes > 0 then
    redis.call('HSET', L.key, unpack(L.changes))
    L.changes = NONE
  end
  if expire then
    local at = L.key_expiry_s
    redis.call('PEXPIREAT', L.key, at)
    if L.live then
      local shard, name = names(L)
      redis.call('ZADD', shard .. ':n', at, name)
      redis.call('PEXPIREAT', shard .. ':n', at, 'GT')
      redis.call('PEXPIREAT', shard .. ':n', at, 'NX')
    end
  end
  -- The queue expires with the lock (a new queue gets the TTL now).
  if head and (expire or L.queue_fresh) then
    if not L.key_expiry_s then
      L.key_expiry_s = int(L.key_expiry)
    end
    redis.call('PEXPIREAT', L.queue, L.key_expiry_s)
    L.queue_fresh = false
  end
  L.exists = true
end
