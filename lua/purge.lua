-- purge: a watched lock at the end of a lease (a replica with a watcher
-- on the lock calls it when the lease it scheduled is due): expired
-- leases and dead waiters go, each told once ('expired', 'skipped'); a
-- second replica's call for the same lease finds nothing left to do.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: event flags ('0' = none; shared/lock.lua `events`)
-- Returns {now, next lease end (0: nobody holds), events...}
local watched = ARGV[1]
local now = clock_ms()
local L = load(lock_at(KEYS), nil, watched)

-- 1. What has passed goes, and whoever may now be granted is woken.
settle_purged(L, purge(L, now))

-- 2. When the next lease may end (exact after a purge that looked at
--    every grant; otherwise a bound no lease ends before).
return {now, L.holders > 0 and L.earliest or 0, unpack(L.events)}
