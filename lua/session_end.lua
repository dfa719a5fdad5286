-- session_end: a session is over (closed by its client, or its client is
-- dead): its record goes, unless another stream has resumed it.
-- KEYS[1] the session's record
-- ARGV: epoch (the ending stream's)
-- Returns 1 (ended: release its grants), 0 (resumed elsewhere: keep them).
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
