-- common.lua: the shared part of tumbler's Redis function library (key
-- layout v3). It runs once, when the library loads; each operation's file
-- then becomes the body of one function (crates/tumbler-engine/src/scripts.rs) that gets
-- `KEYS` and `ARGV` as locals, names its arguments in one place (`local
-- holder, token = unpack(ARGV, 1, 2)`), and calls the steps below with a
-- lock table of its own: nothing here is repointed from one call to the
-- next.
--
-- One file of ~700 lines on purpose: Redis loads a function library as one
-- unit, and the steps every operation shares (clock, records, purge,
-- queue, settle, events) live here once, so each operation's file stays a
-- short list of steps.
--
-- Key layout v3 (docs/concepts.md has the whole table). A lock `name` of
-- namespace `ns` lives in shard `s`; every key of the shard starts with
-- '<prefix>:{<ns>:<s>}', so one function call touches one cluster slot.
--   ...:l:<name>  HASH, the lock; exists while someone holds or waits:
--                   '_'          header 'limit|holders|earliest|top_slot|arrivals|key_expiry'
--                                (holders: permits in use, one per grant unless
--                                a grant holds several, decision 0075)
--                                (key_expiry empty: earliest + twice KEY_GRACE_MS;
--                                limit 'r<n>'/'w<n>' for a read/write lock, decision 0074)
--                   'h:<holder>' grant 'slot|expires|token|acquired|ttl|kind[|epoch][\nmetadata]'
--                                (slot 's1,s2,…' ascending for a grant of several permits)
--                                (acquired empty: the token's milliseconds;
--                                epoch: only a session's grant, its stream's)
--                   '<slot>'     holder of a slot, for limit > 1 only (one per permit)
--   ...:q:<name>  ZSET waiting request -> order (priority, arrival); only while someone waits
--   ...:d:<name>  ZSET waiting request -> liveness deadline (ms); with the queue
--   ...:w:<name>  HASH waiting request -> 'priority|enqueued|wait_ms|fair|kind'; with the queue
--                 (fair: '0'/'1' plain, 'r'/'w' fair read/write, 'R' a barging reader;
--                 then the weight's digits when it asks several permits: '13')
--   ...:fence     STRING the shard's last fencing token
--   ...:n         ZSET lock name -> key expiry; only with a per-namespace lock limit
--   ...:m:<minute> HASH 'kind|event' -> count (written by the replicas, shard 0 only)
--   ...:c         LIST the shard's latest lock events, newest first; only for
--                 namespaces with a changelog (capped and expiring: emit)
-- An uncontended mutex is one key of two fields; nothing else is written
-- per lock. Every value stays within 64 bytes for holders up to 64 bytes
-- and no metadata, so the lock's hash keeps Redis' compact (listpack)
-- encoding; the lock's hash holds no waiter, so reading all of its grants
-- (HGETALL) costs what its holders cost, however long its queue.
--
-- A function on one lock declares its keys (KEYS: lock, queue, deadlines,
-- waiters, fence, and '...:n' with a lock limit), so Redis Cluster checks
-- them all before it runs. One that walks a shard (list, reap, clear,
-- renew) gets the shard's fence key and derives the lock keys from it
-- (same hash tag, same slot).
--
-- Numbers cross into Redis as decimal text made here (int): a Lua number
-- handed to redis.call is printed with '%.14g', which is slow and, past 14
-- digits, wrong. Text read back is turned into numbers only where a step
-- computes with it (tonumber runs the C library's strtod: one of the
-- dearest steps of a call).

-- Reply statuses, shared by every function (crates/tumbler-engine/src/ops/ has the twins).
local OK = 1            -- acquired, released, extended
local HELD = 2          -- acquire: the holder already holds this grant
local BUSY = 0          -- acquire: every permit taken (or someone goes first)
local QUEUED = 3        -- acquire: waiting in the queue
local QUEUE_FULL = 4    -- acquire: the lock's queue holds its maximum
local NAMESPACE_FULL = 5 -- acquire: no room for another lock of the namespace here
local LIMIT_MISMATCH = 6 -- acquire: the lock is in use with another limit
local LATE = 7          -- a granting call ran past its caller's answer-by time
local NOT_HELD = 8      -- release, extend: no live grant of this holder (and token)
local MOVED = 9         -- a session stream's call: a newer stream of its session owns the grant
local MODE_MISMATCH = 10 -- acquire: a read/write request on a plain lock, or the reverse
local UPGRADE = 11      -- acquire: a reader asked WRITE (refused: nothing changed)
local NOT_YOURS = 12    -- release, proclaim: an election's grant, and the caller did not prove it leads
local ELECTION = 13     -- acquire: a mode or permits on an election's name, or a campaign on a lock of another rule

-- How long a lock's keys outlive its last lease or waiter deadline, so that
-- the reaper (or the next call) sees, counts and cleans up an expiry
-- nobody released; after it, Redis drops the keys by itself. Key TTLs are
-- set with twice this slack so that most extends and renewals need none.
local KEY_GRACE_MS = 60 * 1000
local KEY_TTL_MS = 2 * KEY_GRACE_MS

-- How long an idle shard keeps its fencing counter. Losing it is safe:
-- tokens never fall below the Redis clock in microseconds (next_token).
local FENCE_IDLE_TTL_MS = '604800000'

-- Queue order: higher priority first, then arrival. Priorities span
-- -1000..1000 and arrivals stay below 2^42, so scores stay exact doubles.
local PRIORITY_MAX = 1000
local ARRIVALS = 4398046511104 -- 2^42

-- Fields per HMGET/HDEL/ZREM call when a step works on many, to keep
-- argument lists well inside Lua's stack.
local BATCH = 500

-- Small integers as text and back, made once (by the first call: the
-- string library is not there while the library loads), so counts, slots
-- and limits need no formatting or strtod per call.
local SMALL, SMALL_NUM

local function small_tables()
  SMALL, SMALL_NUM = {}, {}
  for i = 0, 127 do
    local text = string.format('%d', i)
    SMALL[i], SMALL_NUM[text] = text, i
  end
end

-- Integers as exact decimal text (Lua's own tostring keeps 14 digits).
local function int(n)
  if not SMALL then
    small_tables()
  end
  return SMALL[n] or string.format('%d', n)
end

-- Texts of larger numbers that calls repeat (lease and queue TTLs),
-- remembered as numbers once read, up to MEMO_MAX of them.
local MEMO, MEMO_SIZE, MEMO_MAX = {}, 0, 256

-- Decimal text as a number; small and repeated ones without strtod.
local function num(text)
  if not SMALL then
    small_tables()
  end
  local n = SMALL_NUM[text] or MEMO[text]
  if n then
    return n
  end
  n = tonumber(text)
  if MEMO_SIZE < MEMO_MAX then
    MEMO[text], MEMO_SIZE = n, MEMO_SIZE + 1
  end
  return n
end

-- The keys' TTL (text, ms) for a new lock whose lease is `ttl` (text):
-- the lease and twice the grace, remembered per lease TTL like `num`.
local KEYS_TTL, KEYS_TTL_SIZE = {}, 0

local function keys_ttl(ttl)
  local text = KEYS_TTL[ttl]
  if not text then
    text = int(num(ttl) + KEY_TTL_MS)
    if KEYS_TTL_SIZE < MEMO_MAX then
      KEYS_TTL[ttl], KEYS_TTL_SIZE = text, KEYS_TTL_SIZE + 1
    end
  end
  return text
end

-- True when decimal text `a` is the larger number (no strtod: digits of
-- equal length compare as the numbers do).
local function above(a, b)
  return #a > #b or (#a == #b and a > b)
end

-- The empty list every lock table starts with for its changes, removed
-- fields and events (most calls have none of some): never appended to;
-- the first append gives the lock a list of its own.
local NONE = {}

-- Zeros that pad TIME's microseconds to six digits.
local PAD = {'00000', '0000', '000', '00', '0', ''}

-- The second TIME gave last, as text and in milliseconds: it changes once
-- a second, so its strtod runs once a second rather than once a call (a
-- cache, not state: it holds what that text means).
local SECOND, SECOND_MS = false, 0

-- Group commit (lua/batch.lua runs many operations in one call): while a
-- batch runs, BATCH_TIME holds the one TIME reply all its operations read
-- (`clock`), BATCH_LATE the milliseconds below which an answer-by time is
-- checked against the clock anew (`late`), and FENCES the last token
-- handed out per fence key, with FENCES_DUE the ones still to be written
-- (`next_token`; written once, the highest, by `batch_end`). Library
-- globals outlive a call, so `batch_end` clears them and every call that
-- is not a batch finds them false.
local BATCH_TIME, BATCH_LATE, FENCES, FENCES_DUE = false, false, false, false

-- How far ahead of the batch's TIME an answer-by time must lie to be
-- judged on that TIME: a batch runs for well under this, so nearer ones
-- are judged on a fresh TIME (no grant past its caller's answer-by).
local BATCH_LATE_MS = 50

-- The Redis clock: milliseconds since the epoch (a number), and the same
-- instant as text in microseconds (TIME's own digits, no formatting).
-- In a batch, the batch's one TIME.
local function clock()
  local t = BATCH_TIME or redis.call('TIME')
  local seconds, micros = t[1], PAD[#t[2]] .. t[2]
  if seconds ~= SECOND then
    SECOND, SECOND_MS = seconds, tonumber(seconds) * 1000
  end
  local a, b, c = string.byte(micros, 1, 3)
  return SECOND_MS + a * 100 + b * 10 + c - 5328, seconds .. micros
end

-- The Redis clock in milliseconds only.
local function clock_ms()
  return (clock())
end

-- True when a granting call runs after its caller's answer-by time
-- (Redis clock, ms; absent or '0': no bound): the replica has answered
-- the caller already (deadline, timeout), so nothing may be granted.
-- `now_us` is the clock as text in microseconds (`clock`'s second value),
-- compared as text: no strtod.
local function late(answer_by, now_us)
  if not answer_by or answer_by == '0' then
    return false
  end
  if above(string.sub(now_us, 1, -4), answer_by) then
    return true
  end
  -- In a batch `now_us` is the batch's TIME, which later operations of it
  -- run after: an answer-by within BATCH_LATE_MS of it meets the clock now.
  if BATCH_TIME and not above(answer_by, BATCH_LATE) then
    local t = redis.call('TIME')
    return above(t[1] .. string.sub(PAD[#t[2]] .. t[2], 1, 3), answer_by)
  end
  return false
end

-- The shard of a key ('<prefix>:{<ns>:<s>}') and what follows it. Neither
-- the prefix nor a namespace holds a brace, so the first '}' ends the tag.
local function split_key(key)
  local close = string.find(key, '}', 1, true)
  return string.sub(key, 1, close), string.sub(key, close + 2)
end

-- The lock header '_': 'limit|holders|earliest|top_slot|arrivals|key_expiry',
-- all decimal text; key_expiry is '' when it is the usual one (earliest
-- plus KEY_TTL_MS). A read/write lock's limit carries a letter (decision
-- 0074): 'r<limit>' while readers hold it or it is only waited for,
-- 'w<limit>' while its writer holds it; a plain lock's has none. Its
-- decoder (the letter first: '' for a plain lock), one question answered
-- cheaper, and its encoder (the letter goes with the limit).
local function decode_header(header)
  return string.match(header, '^([rw]?)(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d*)$')
end

-- The header's `earliest` when it says one holder and no arrivals (the
-- release fast path's question, answered with one capture); else nil.
local function sole_holder_until(header)
  return string.match(header, '^%d+|1|(%d+)|%d+|0|')
end

local function encode_header(limit, holders, earliest, top_slot, arrivals, key_expiry)
  return limit .. '|' .. holders .. '|' .. earliest .. '|' .. top_slot .. '|' .. arrivals .. '|' .. key_expiry
end

-- A grant as stored, in the field 'h:<holder>':
-- 'slot|expires|token|acquired|ttl|kind[|epoch][\nmetadata]', the kind left
-- empty when it is 'default'. `epoch` is there only for a session's grant:
-- the epoch of the session's stream that last acquired or renewed it (see
-- `stale`); other grants pay nothing for it. The holder lives in the field's name, so with no
-- metadata every part stays short: at most 64 bytes each keeps the lock's
-- hash in Redis' compact encoding (hash-max-listpack-value).
-- Its numbers stay text (the token is compared as text: no float
-- rounding); `slot` and `expires` are also numbers. `acquired` is left
-- empty when it is the token's own milliseconds (a token made from the
-- clock at the grant: nearly always), 13 bytes fewer per grant.
-- A grant of `k` permits (decision 0075) holds `k` slots: its slot part
-- is 's1,s2,…,sk' (ascending), a grant of one permit's is its one slot;
-- `slots` keeps that text, `slot` is the first, `permits` their count.
-- The grant record's one decoder (`encode_grant` writes it).
local function parse_grant(holder, text)
  local slots, expires, token, acquired, ttl, kind, epoch, metadata =
    string.match(text, '^([%d,]+)|(%d+)|(%d+)|(%d*)|(%d+)|([^\n|]*)|?(%d*)\n?(.*)$')
  if acquired == '' then
    acquired = string.sub(token, 1, -4)
  end
  local slot, permits = slots, 1
  if string.find(slots, ',', 1, true) then
    slot = string.match(slots, '^(%d+)')
    permits = select(2, string.gsub(slots, ',', ',')) + 1
  end
  return {
    slot = num(slot), slots = slots, permits = permits, expires = tonumber(expires), expires_s = expires,
    token = token, acquired_s = acquired, ttl = ttl, kind = kind ~= '' and kind or 'default',
    holder = holder, metadata = metadata, epoch = epoch, text = text,
  }
end

-- The grant record's one encoder: the parts as text (`kind` by name,
-- `epoch` and `metadata` '' when absent; `acquired` '' when it is the
-- token's own milliseconds).
local function encode_grant(slot, expires, token, acquired, ttl, kind, epoch, metadata)
  local text = slot .. '|' .. expires .. '|' .. token .. '|' .. acquired .. '|' .. ttl .. '|'
    .. (kind ~= 'default' and kind or '')
  if epoch ~= '' then
    text = text .. '|' .. epoch
  end
  if metadata ~= '' then
    text = text .. '\n' .. metadata
  end
  return text
end

-- The stored text of a decoded grant (its `expires` may have moved).
local function format_grant(g)
  if not g.expires_s then
    g.expires_s = int(g.expires)
  end
  local acquired = g.acquired_s
  if acquired == string.sub(g.token, 1, -4) then
    acquired = ''
  end
  g.text = encode_grant(g.slots or int(g.slot), g.expires_s, g.token, acquired, g.ttl, g.kind, g.epoch, g.metadata)
  return g.text
end

-- An election's grant (decision 0082) carries, in its metadata entry
-- '\1' (a key Acquire refuses: no control characters), the SHA-256 digest
-- of the secret its winning Campaign was told (or of its session's resume
-- secret). Only the one that knows the secret may release or proclaim
-- it; a session's stream proves itself by its epoch. The mark is found
-- with one plain search of the record, without decoding it.
local OWNER_MARK = '"\\u0001":'

local function owned(text)
  return string.find(text, OWNER_MARK, 1, true) ~= nil
end

-- The metadata of a grant record, decoded ({} when it has none).
local function record_metadata(text)
  local json = string.match(text, '\n(.*)$')
  if not json or json == '' then
    return {}
  end
  return cjson.decode(json)
end

-- Whether `proof` (a digest) is the one the owned grant `text` carries.
local function proven(text, proof)
  return proof ~= nil and proof ~= '' and record_metadata(text)['\1'] == proof
end

-- A grant record's fencing token, read without decoding the rest.
local function grant_token(text)
  return string.match(text, '^[%d,]+|%d+|(%d+)|')
end

-- Session epochs. A session's grants are held by the session id; its
-- record (session_*.lua) counts the streams that served it, and a resume
-- moves that epoch on. Every call a session's stream makes on a grant
-- (acquire, release, extend, renew) carries its epoch and is refused
-- (MOVED, nothing changed) when the grant already carries a later one:
-- a stream that was superseded can neither keep, renew nor release what
-- the newer stream now holds. A call with a later epoch than the grant's
-- takes the grant over (`claim_epoch`). Calls without an epoch (not a
-- session's) neither check nor stamp.
local function stale(g, epoch)
  return epoch ~= nil and g.epoch ~= '' and above(g.epoch, epoch)
end

-- Stamps the grant with the caller's epoch when it is a later one; true
-- when the grant changed (it must be put back).
local function claim_epoch(g, epoch)
  if epoch == nil or g.epoch == epoch then
    return false
  end
  g.epoch = epoch
  return true
end

-- A waiter record 'priority|enqueued|wait_ms|fair|kind[|request|answer_by|ttl|epoch][\nmetadata]'
-- (kind empty: 'default'). The bracketed part is there when the replica
-- that waits names its request (a hand-over waiter, decision 0068):
-- `request` is that RPC's own id (a later request of the same holder that
-- takes the place over writes its own), `answer_by` the Redis ms after
-- which its caller is told no, `ttl`, `epoch` (a session's stream, else
-- empty) and the metadata are what its grant is made of when a freed
-- permit is handed to it. Its encoder, then the decoders of the parts the
-- steps need.
-- `fair` is the field's one character: '0'/'1' a plain request (barging,
-- fair), 'r'/'w' a read/write request (fair), 'R' a reader with
-- prefer_readers (barging; decision 0074); for a plain request of `k > 1`
-- permits the weight's digits follow it ('13': fair, three permits;
-- decision 0075), so a one-permit waiter's record is what it was.
local function encode_waiter(priority, enqueued, wait_ms, fair, kind, request, answer_by, ttl, epoch, metadata)
  local text = priority .. '|' .. enqueued .. '|' .. wait_ms .. '|' .. fair .. '|'
    .. (kind ~= 'default' and kind or '')
  if request and request ~= '' then
    text = text .. '|' .. request .. '|' .. (answer_by or '') .. '|' .. ttl .. '|' .. (epoch or '')
    if metadata ~= '' then
      text = text .. '\n' .. metadata
    end
  end
  return text
end

local function waiter_kind(record)
  local kind = string.match(record or '', '^[^|]*|[^|]*|[^|]*|[^|]*|([^|\n]*)')
  return (kind and kind ~= '') and kind or 'default'
end

local function waiter_enqueued(record)
  return tonumber(string.match(record or '', '^%-?%d+|(%d+)|') or '0')
end

-- The request a waiter record names ('' for a record without one).
local function waiter_request(record)
  return string.match(record or '', '^[^|]*|[^|]*|[^|]*|[^|]*|[^|\n]*|([^|\n]+)') or ''
end

-- What a waiter asks for, from its fair field: 'r' (read), 'w' (write),
-- or false (a plain request).
local WAITER_MODE = {['0'] = false, ['1'] = false, r = 'r', R = 'r', w = 'w'}

-- A waiter record's fair field, as stored.
local function waiter_fair(record)
  return string.match(record or '', '^[^|]*|[^|]*|[^|]*|([^|]*)')
end

local function waiter_mode(record)
  return WAITER_MODE[string.sub(waiter_fair(record) or '', 1, 1)] or false
end

-- How many permits a waiter asks for, from its fair field.
local function waiter_permits(fair)
  if fair and #fair > 1 then
    return num(string.sub(fair, 2))
  end
  return 1
end

-- A hand-over waiter's record decoded (nil for a record that names no
-- request or no answer-by time: its replica is woken to call again).
local function parse_waiter(record)
  local priority, enqueued, wait_ms, fair, kind, request, answer_by, ttl, epoch, metadata = string.match(
    record or '', '^(%-?%d+)|(%d+)|(%d+)|([01rwR]%d*)|([^|\n]*)|([^|\n]+)|(%d*)|(%d+)|(%d*)\n?(.*)$')
  if not request or answer_by == '' then
    return nil
  end
  local first = string.sub(fair, 1, 1)
  return {
    priority = priority, enqueued = enqueued, wait_ms = wait_ms,
    fair = first == '1' or first == 'r' or first == 'w', mode = WAITER_MODE[first], permits = waiter_permits(fair),
    kind = kind ~= '' and kind or 'default', request = request, answer_by = answer_by,
    ttl = ttl, epoch = epoch, metadata = metadata,
  }
end

-- A lock table: every field a step may set is named here, so the table is
-- made at its full size once.
local function new_lock(key, queue, deadlines, waiters, fence, live)
  return {
    key = key, queue = queue, deadlines = deadlines, waiters = waiters, fence = fence,
    live = live, shard = false, name = false,
    holder = false, watched = false, exists = false,
    limit = 1, holders = 0, earliest = 0, top_slot = 0, arrivals = 0, key_expiry = 0, mode = false,
    held_mode = false,
    earliest_s = false, key_expiry_s = false,
    mine_text = false, mine_grant = false,
    changes = NONE, removed = NONE, events = NONE, keep_until = 0, dirty = false,
    head = false, second = false, queue_known = false, queue_fresh = false, queued = false,
    now = false, now_us = false,
  }
end

-- A lock of the shard `shard`, before it is read. `live`: the deployment
-- has a per-namespace lock limit, so the shard's live locks are counted in
-- '...:n' (only then: nobody else pays for it).
local function lock_of(shard, name, live)
  local L = new_lock(shard .. ':l:' .. name, shard .. ':q:' .. name, shard .. ':d:' .. name,
    shard .. ':w:' .. name, shard .. ':fence', live or false)
  L.shard, L.name = shard, name
  return L
end

-- The lock a function on one lock was called for, from its declared keys
-- (lock, queue, deadlines, waiters, fence, and '...:n' when live locks are
-- counted). Its shard and name are worked out only when needed (names).
local function lock_at(keys)
  return new_lock(keys[1], keys[2], keys[3], keys[4], keys[5], keys[6] ~= nil)
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

-- Every grant of the lock, lapsed or not: {grant, ...} in no set order.
-- One HGETALL: the lock's hash holds its header, its grants and (for a
-- semaphore) its slots, never its waiters.
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
    L.head, L.second = ids[1] or false, ids[2] or false
    L.queue_known = true
  end
  return L.head or nil
end

-- Remove waiting requests from the queue, with their records. The head
-- alone leaving keeps the queue known (the next one was read with it).
local function drop_waiters(L, ids)
  for first = 1, #ids, BATCH do
    local last = math.min(first + BATCH - 1, #ids)
    redis.call('ZREM', L.queue, unpack(ids, first, last))
    redis.call('ZREM', L.deadlines, unpack(ids, first, last))
    redis.call('HDEL', L.waiters, unpack(ids, first, last))
  end
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

-- Waiting requests whose replica stopped refreshing them (crashed, cut
-- off) are dead: they leave the queue instead of holding it up (each
-- noted as 'reaped', told to watchers as 'skipped').
local function purge_dead_waiters(L, now)
  if not queue_head(L) then
    return 0
  end
  local dead = redis.call('ZRANGEBYSCORE', L.deadlines, '-inf', int(now))
  if #dead == 0 then
    return 0
  end
  local records = on_fields(L.waiters, 'HMGET', dead)
  for i, id in ipairs(dead) do
    local kind = waiter_kind(records[i])
    note(L, 'reaped', kind)
    if L.watched then
      emit(L, 'skipped', id, {kind = kind, mode = waiter_mode(records[i])}, now, REAPER)
    end
  end
  drop_waiters(L, dead)
  return #dead
end

-- Expired leases and dead waiters stop counting before anything else.
-- Returns true when anything changed.
local function purge(L, now)
  return purge_expired(L, now) + purge_dead_waiters(L, now) > 0
end

-- The next fencing token of the shard: one more than the last one, and
-- never below the Redis clock in microseconds. A lost counter (restart
-- without persistence, failover to a lagging replica) therefore resumes
-- above every token it handed out, as long as the clock moves forward.
-- Usually one call: the clock is ahead of the last token (both are
-- 16-digit text then, which compares as the numbers do).
-- In a batch, the shard's counter is read and set once (the first grant's
-- SET … GET); the batch's later grants count on from the last token it
-- handed out, and `batch_end` writes the highest once.
local function next_token(fence, now_us)
  local given = FENCES and FENCES[fence]
  if given then
    local token = int(tonumber(given) + 1)
    FENCES[fence], FENCES_DUE[fence] = token, true
    return token
  end
  local last = redis.call('SET', fence, now_us, 'GET', 'PX', FENCE_IDLE_TTL_MS)
  local token = now_us
  if last and not ((#last == #now_us and last < now_us) or #last < #now_us) then
    token = int(tonumber(last) + 1)
    if FENCES then
      FENCES_DUE[fence] = true
    else
      redis.call('SET', fence, token, 'PX', FENCE_IDLE_TTL_MS)
    end
  end
  if FENCES then
    FENCES[fence] = token
  end
  return token
end

-- A batch's start: its one TIME (and the answer-by bound it judges on).
local function batch_begin()
  BATCH_TIME = redis.call('TIME')
  BATCH_LATE = BATCH_TIME[1] .. string.sub(PAD[#BATCH_TIME[2]] .. BATCH_TIME[2], 1, 3)
  BATCH_LATE = int(tonumber(BATCH_LATE) + BATCH_LATE_MS)
  FENCES, FENCES_DUE = {}, {}
end

-- A batch's end: each shard counter a later grant moved is written once,
-- with the highest token, and the batch's state is cleared.
local function batch_end()
  for fence in pairs(FENCES_DUE) do
    redis.call('SET', fence, FENCES[fence], 'PX', FENCE_IDLE_TTL_MS)
  end
  BATCH_TIME, BATCH_LATE, FENCES, FENCES_DUE = false, false, false, false
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
        redis.call('DEL', L.key, L.queue, L.deadlines, L.waiters)
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
  -- The queue's keys expire with the lock's (a new queue gets the TTL now).
  if head and (expire or L.queue_fresh) then
    if not L.key_expiry_s then
      L.key_expiry_s = int(L.key_expiry)
    end
    redis.call('PEXPIREAT', L.queue, L.key_expiry_s)
    redis.call('PEXPIREAT', L.deadlines, L.key_expiry_s)
    redis.call('PEXPIREAT', L.waiters, L.key_expiry_s)
    L.queue_fresh = false
  end
  L.exists = true
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
    local head = queue_head(L)
    if not head then
      return
    end
    local record = redis.call('HGET', L.waiters, head)
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
    if not L.now_us then
      L.now, L.now_us = clock()
    end
    drop_waiters(L, {head})
    if not late(w.answer_by, L.now_us) then
      local grant = {
        slot = false, slots = false, permits = k, expires = L.now + num(w.ttl), token = false,
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

-- A held set's call (release_many, extend_many: decision 0079) checked
-- before it writes: `per` keys per lock (5 or 6), at least one lock, one
-- token ('' or digits) per lock from ARGV[first] on, each lock once.
-- Returns the locks' count, or nil and what is wrong.
local function set_call(keys, argv, per, first)
  if per ~= 5 and per ~= 6 then
    return nil, 'keys per lock must be 5 or 6'
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

-- A namespace's wait-for registry (decision 0077, bounded by decision 0081):
-- a HASH of waiting holder -> edge (waits_edge), whose field '' (never a
-- holder: a holder is not empty) keeps the bytes of every other field and
-- value, so the budget is checked in O(1).
local WAITS_BYTES = ''

-- The registry's bytes once `holder`'s edge is `text` (nil: removed).
local function waits_bytes_with(registry, holder, text)
  local used = tonumber(redis.call('HGET', registry, WAITS_BYTES) or '0')
  local old = redis.call('HSTRLEN', registry, holder)
  if old > 0 then
    used = used - old - #holder
  end
  return used + (text and #text + #holder or 0), old
end

-- `holder`'s edge written (`text`) or removed (nil), the byte count kept
-- (`used` and `old`: what waits_bytes_with answered for it, when known).
local function waits_put(registry, holder, text, used, old)
  if not used then
    used, old = waits_bytes_with(registry, holder, text)
  end
  if text then
    redis.call('HSET', registry, holder, text, WAITS_BYTES, int(math.max(used, 0)))
  elseif old > 0 then
    redis.call('HDEL', registry, holder)
    if redis.call('HLEN', registry) <= 1 then
      redis.call('DEL', registry) -- nobody waits: no key stays
    else
      redis.call('HSET', registry, WAITS_BYTES, int(math.max(used, 0)))
    end
  end
end

-- An edge is '<end ms>|<request id>|<waits as JSON>': its end and request
-- are read without decoding its waits (renewals and sweeps never decode).
local function waits_edge(text)
  local e, request, waits = string.match(text, '^(%d+)|([^|]*)|(.*)$')
  return tonumber(e), request, waits
end

local function waits_encode(e, request, waits)
  return int(e) .. '|' .. request .. '|' .. waits
end

-- `n` random edges of the registry removed when their liveness is over (a
-- replica that crashed, or stopped renewing them).
local function waits_sweep(registry, n, now)
  for _, holder in ipairs(redis.call('HRANDFIELD', registry, n)) do
    if holder ~= WAITS_BYTES then
      local e = waits_edge(redis.call('HGET', registry, holder))
      if e <= now then
        waits_put(registry, holder, nil)
      end
    end
  end
end

-- The operation's own steps follow, as the body of its function.
