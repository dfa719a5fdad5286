-- session_touch: the replica serving a session keeps its record alive,
-- and learns whether another stream has resumed the session meanwhile.
-- KEYS[1] the session's record
-- ARGV: epoch (the serving stream's), keep_ms
-- Returns 1 (still this stream's, kept), 0 (resumed elsewhere) or -1 (the
-- record is gone: Redis lost it, or an admin cleared it).
local epoch, keep = unpack(ARGV, 1, 2)
local found = redis.call('HGET', KEYS[1], 'epoch')
if not found then
  return -1
end
if found ~= epoch then
  return 0
end
redis.call('HSET', KEYS[1], 'seen', int(clock_ms()))
redis.call('PEXPIRE', KEYS[1], keep)
return 1
