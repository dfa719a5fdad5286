-- shared/records.lua: the records a lock's keys hold, each with its one
-- encoder and its decoders: the header, a grant, the owner mark of an
-- election's grant, a session's epoch, a waiter. The engine's twin reader
-- is crates/tumbler-engine/src/records.rs.
--
-- Key layout v4 (docs/concepts.md has the whole table; decision 0090). A
-- lock `name` of namespace `ns` lives in shard `s`; every key of the shard
-- starts with '<prefix>:{<ns>:<s>}', so one function call touches one
-- cluster slot.
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
--                   'w:<id>'     a waiting request: 'deadline|priority|enqueued|wait_ms|fair|kind…'
--                                (its liveness deadline, then its record: `stored_waiter`;
--                                fair: '0'/'1' plain, 'r'/'w' fair read/write, 'R' a
--                                barging reader, then the weight's digits for several permits)
--                   'r:<holder>' the request a handed grant went to, until claimed
--   ...:q:<name>  ZSET waiting request -> order (priority, arrival); only while someone waits
--   ...:fence     STRING the shard's last fencing token
--   ...:n         ZSET lock name -> key expiry; only with a per-namespace lock limit
--   ...:m:<minute> HASH 'kind|event' -> count (written by the replicas, shard 0 only)
--   ...:c         LIST the shard's latest lock events, newest first; only for
--                 namespaces with a changelog (capped and expiring: emit)
-- An uncontended mutex is one key of two fields; nothing else is written
-- per lock. Every value stays within 64 bytes for holders up to 64 bytes
-- and no metadata, so a lock nobody waited for keeps Redis' compact
-- (listpack) encoding. A waiter's record and liveness deadline live in the
-- lock's hash (layout v4): joining the queue, leaving it and handing the
-- lock over write the one hash the call writes anyway. Reading every grant
-- (HGETALL, only when a lease lapsed) reads the waiters' fields too.
--
-- A function on one lock declares its keys (KEYS: lock, queue, fence, and
-- '...:n' with a lock limit), so Redis Cluster checks them all before it
-- runs. One that walks a shard (list, reap, clear, renew) gets the shard's
-- fence key and derives the lock keys from it (same hash tag, same slot).

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

-- A waiting request's field in the lock's hash, and what it holds (layout
-- v4): its liveness deadline (Redis ms), then its record. The deadline
-- goes first so a refresh rewrites it without decoding the record.
local function waiter_field(id)
  return 'w:' .. id
end

local function stored_waiter(deadline, record)
  return deadline .. '|' .. record
end

-- A stored waiter's liveness deadline (a number; 0 when absent: dead)
-- and its record (nil when absent).
local function split_waiter(stored)
  if not stored then
    return 0, nil
  end
  local bar = string.find(stored, '|', 1, true)
  return tonumber(string.sub(stored, 1, bar - 1)), string.sub(stored, bar + 1)
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
