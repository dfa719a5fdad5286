-- shared/events.lua: lock events for watchers (PUBLISH) and the changelog
-- (a capped list per shard), built only when the caller says someone
-- watches or keeps a changelog.

-- Actors of lock events: who made the change.
local HOLDER, REAPER, ADMIN = 'holder', 'reaper', 'admin'

-- Lock events for watchers go to '<prefix>:events', one message each
-- (and, for a namespace with a changelog, to the shard's capped list
-- '...:c', newest first, the same message):
--   'namespace\nname\nevent\nholder\ntoken\ntime_ms\nslot\nkind\nttl_ms\n
--    expires_at\nacquired_at\nhold_ms\nactor[:mode]\nmetadata'
-- (the metadata last: it is JSON, so it holds no raw newline), and only
-- while some replica has a watcher for the namespace (the caller says so):
-- an unwatched lock publishes nothing and builds nothing. `g` is the
-- grant (or, for a waiter, a small table with its kind and metadata, made
-- by callers only when L.watched); `ended`, when the grant ended
-- (released, expired, reaped, cleared), gives its hold time.
-- The changelog's copy keeps at most LOG_METADATA_BYTES of the metadata's
-- JSON (cut before a UTF-8 character, never inside one), followed by a
-- newline and the whole metadata's size in bytes, which marks the cut;
-- watchers get the whole message. A shard's list holds at most `size`
-- entries and about `size` * LOG_BYTES_PER_EVENT bytes as Redis counts
-- them (MEMORY USAGE, every LOG_BYTES_CHECK-th push).
-- An event of a read/write lock (decision 0074) carries a mode as a suffix
-- of its actor: ':r' (READ) or ':w' (WRITE). It is the mode of the grant
-- the event is about (the header's letter; for a grant that ended in this
-- call, the letter it was held under, L.held_mode, as drop_grant may turn
-- 'w' into 'r'), or for a waiter's event the mode it asks (the caller
-- sets g.mode; false: none). A plain lock's message is byte for byte what
-- it was, and a message without a suffix (a plain lock's, or one an older
-- replica stored in a changelog) still parses, as it did: no line is
-- added (the metadata stays last, and a cut metadata's size line after
-- it), and an older reader shows 'holder:r' as the actor and reads on.
local LOG_METADATA_BYTES = 256
local LOG_BYTES_PER_EVENT = 256
local LOG_BYTES_CHECK = 8
local function emit(L, event, holder, g, now, actor, ended)
  if not L.watched then
    return
  end
  local shard, name = names(L)
  local prefix, namespace = string.match(shard, '^(.*):{(.*):%d+}$')
  g = g or NONE
  local hold = '0'
  if ended and g.acquired_s then
    hold = int(math.max(0, ended - tonumber(g.acquired_s)))
  end
  local expires = g.expires_s or (g.expires and int(g.expires)) or '0'
  local mode = g.mode
  if mode == nil then
    -- A grant (a waiter's or a lost grant's table has no expiry).
    mode = g.expires and (ended and L.held_mode or L.mode)
  end
  local message = table.concat({
    namespace, name, event, holder, g.token or '0', int(now),
    g.slot and int(g.slot) or '0', g.kind or 'default', g.ttl or '0', expires,
    g.acquired_s or '0', hold, mode and actor .. ':' .. mode or actor, g.metadata or '',
  }, '\n')
  if L.publish then
    redis.call('PUBLISH', prefix .. ':events', message)
  end
  if L.log then
    local metadata, logged = g.metadata, message
    if metadata and #metadata > LOG_METADATA_BYTES then
      local cut = LOG_METADATA_BYTES
      -- Back off over UTF-8 continuation bytes (0x80..0xBF).
      while cut > 0 and string.byte(metadata, cut + 1) >= 128 and string.byte(metadata, cut + 1) < 192 do
        cut = cut - 1
      end
      logged = string.sub(message, 1, #message - #metadata + cut) .. '\n' .. int(#metadata)
    end
    -- Trimmed back to its size once it is an eighth over (one LTRIM per
    -- size/8 events, not one per event). Every LOG_BYTES_CHECK-th push
    -- also asks Redis what the list takes (SAMPLES 0: every node, exact;
    -- a few µs); past the byte budget it is trimmed back to seven eighths
    -- of it, keeping the newest entries in proportion.
    local log, size = shard .. ':c', tonumber(L.log)
    local n = redis.call('LPUSH', log, logged)
    if n > size + math.floor(size / 8) then
      redis.call('LTRIM', log, '0', int(size - 1))
    elseif n % LOG_BYTES_CHECK == 0 then
      local budget = size * LOG_BYTES_PER_EVENT
      local used = redis.call('MEMORY', 'USAGE', log, 'SAMPLES', '0')
      if used > budget then
        local keep = math.max(1, math.floor(n * budget * 7 / 8 / used))
        redis.call('LTRIM', log, '0', int(keep - 1))
      end
    end
    redis.call('PEXPIRE', log, L.log_ttl)
  end
end
