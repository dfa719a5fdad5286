-- shared/held.lua: what Release and Extend do to a held grant, for one lock
-- (release.lua, extend.lua) and for each lock of a held set
-- (release_many.lua, extend_many.lua), and a set's call checked.

-- A held set's call (release_many, extend_many: decision 0079) checked
-- before it writes: `per` keys per lock (3 or 4), at least one lock, one
-- token ('' or digits) per lock from ARGV[first] on, each lock once.
-- Returns the locks' count, or nil and what is wrong.
local function set_call(keys, argv, per, first)
  if per ~= 3 and per ~= 4 then
    return nil, 'keys per lock must be 3 or 4'
  end
  local n = #keys / per
  if n < 1 or n ~= math.floor(n) then
    return nil, 'KEYS must be whole locks'
  end
  if #argv ~= first - 1 + n then
    return nil, 'one token per lock'
  end
  local seen = {}
  for i = 1, n do
    local token, key = argv[first - 1 + i], keys[(i - 1) * per + 1]
    if token ~= '' and not string.match(token, '^%d+$') then
      return nil, 'token ' .. i .. ' is not a number'
    end
    if seen[key] then
      return nil, 'lock ' .. i .. ' named twice'
    end
    seen[key] = true
  end
  return n
end

-- A held set's lock `i`: its keys out of `keys`, loaded for `holder`,
-- its lapsed leases and dead waiters purged (`changed`: purge's answer).
local function set_lock(keys, i, per, holder, flags, now, now_us)
  local L = load(lock_at({unpack(keys, (i - 1) * per + 1, i * per)}), holder, flags)
  L.now, L.now_us = now, now_us
  return L, purge(L, now)
end

-- The holder's live grant of L when it carries `token` ('' = any): the
-- decoded grant (or true when it needs no decoding: release.lua's own
-- shortcut), else false.
local function held_with(L, token, decode)
  local record = L.mine_text
  if not record then
    return false
  end
  local grant = (decode or token ~= '' or L.limit > 1 or L.watched) and mine(L)
  if token ~= '' and grant.token ~= token then
    return false
  end
  return grant or true
end

-- Release's step 4 (release.lua, and each lock of release_many.lua):
-- the holder's grant dropped (`grant`: decoded, or true when the call
-- had no need to decode it), the permit handed to the next waiter in
-- line, the lock settled.
local function give_back(L, grant, now)
  drop_grant(L, L.holder, grant ~= true and grant.slots)
  if grant ~= true then
    emit(L, 'released', L.holder, grant, now, HOLDER, now)
  end
  hand_over(L)
  settle(L)
end

-- Extend.lua's steps 5-6 for a live grant of L: the new lease runs from
-- now, with `ttl` ('' = the grant's own); the key's TTL follows it; whom
-- the call's purge let in (`changed`) is woken.
local function renew_grant(L, grant, ttl, now, changed)
  if ttl ~= '' then
    grant.ttl = ttl
  end
  grant.expires, grant.expires_s = now + tonumber(grant.ttl), nil
  put_grant(L, grant)
  settle(L)
  emit(L, 'extended', L.holder, grant, now, HOLDER)
  if changed then
    wake_eligible(L)
  end
end

-- `head` (a set's reply) with every lock's events appended, lock after lock.
local function with_events(head, locks)
  for _, L in ipairs(locks) do
    for _, v in ipairs(L.events) do
      head[#head + 1] = v
    end
  end
  return head
end
