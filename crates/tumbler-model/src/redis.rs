//! Redis as the model sees it: one atomic state machine holding one lock,
//! the shard's fencing counter and the sessions' records, and the Lua
//! functions of `lua/` as pure functions on that state. Each function here
//! is named after the Lua file it mirrors, and its steps are numbered as
//! that file's comments number them (steps that only matter for encoding,
//! events, metrics or key TTLs are left out: they decide nothing).
//!
//! What is abstracted: one lock of one shard (so `clear`, `list` and the
//! namespace lock limit are not modelled); slots (1..limit) are not kept,
//! only how many permits each grant holds (decision 75: one slot each);
//! metadata (an election's value), kinds and events are gone.
//! Time is a tick of the Redis clock (one millisecond); a fencing token is
//! `tick * 1000 + k`, the Redis clock in microseconds (`next_token`).
//! Read/write locks (decision 74) and the hand-over (decision 68) are in
//! [`crate::hand_over`]: who fits, and what a call that frees a permit
//! does with it.

use crate::hand_over::{Hand, Mode, Wake, hand_over, hand_over_from};

/// A client's holder id (and, for a waiting request, its request id: the
/// functions queue a request under its holder).
pub type Id = u8;

/// Microseconds per tick: `next_token` reads the clock in microseconds.
pub const US_PER_TICK: u32 = 1000;

/// A grant in the lock's hash (`'h:<holder>'`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub holder: Id,
    pub token: u32,
    /// Lease expiry, Redis ticks.
    pub expires: u8,
    /// The end of the lease asked, counted from the grant: after
    /// `expires` only for a provisional handed grant (decision 89), which
    /// the answer that claims it (HELD) extends to this.
    pub full: u8,
    /// The session stream's epoch that acquired or renewed it; 0 when the
    /// grant is not a session's (shared/records.lua `stale`, `claim_epoch`).
    pub epoch: u8,
    /// The request it was handed to (the lock's `r:<holder>`), until an
    /// answer claims it (HELD clears it): only that request's replica may
    /// give it back (release.lua `handed`).
    pub handed: Option<u8>,
    /// Permits it holds (decision 75: its slot field names one slot each).
    pub permits: u8,
}

/// A waiting request (the queue, deadlines and waiters keys together).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waiter {
    /// Queue order: `(PRIORITY_MAX - priority, arrival)`, smaller first.
    pub order: (u8, u8),
    pub id: Id,
    /// The request that holds the place (the record's request id): a
    /// later request of the holder that finds the place takes it over.
    pub req: u8,
    /// Liveness deadline (`...:d:<name>`): dead at or past it.
    pub deadline: u8,
    /// Read/write: the mode it waits for (the record's `fair` field `r`/`w`).
    pub mode: Option<Mode>,
    /// What a handed grant is made of; `None`: its replica calls again.
    pub hand: Option<Hand>,
    /// Permits it asks (the record's fair field's digits, decision 75).
    pub permits: u8,
}

/// The highest priority the model uses (the Lua's is 1000).
pub const PRIORITY_MAX: u8 = 2;

/// One lock: its header, grants and queue. `None` in [`Data`] when nobody
/// holds or waits: then no key exists (invariant 6, `settle`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lock {
    pub limit: u8,
    /// The header's mode letter: `None` for a plain lock; a read/write
    /// lock's `r` (held by readers, or only waited for) or `w` (held by
    /// its writer). A grant's mode is read off it.
    pub mode: Option<Mode>,
    /// Sorted by holder.
    pub holders: Vec<Grant>,
    /// Sorted by order: the head is first.
    pub queue: Vec<Waiter>,
    /// The header's arrival counter (reset when the queue empties).
    pub arrivals: u8,
}

/// A session's record (`session_*.lua`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionRecord {
    pub epoch: u8,
    /// When its serving stream last said it lives (ticks).
    pub seen: u8,
}

/// Everything Redis stores that the model keeps.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Data {
    pub lock: Option<Lock>,
    /// A second lock, for multi-locks (`crate::multi`): the functions of
    /// one lock run on `lock`, so a call on this one swaps it in first
    /// ([`Data::select`]).
    pub second: Option<Lock>,
    /// The shard's fencing counter (`...:fence`).
    pub fence: Option<u32>,
    /// One record per client (only session clients have one).
    pub sessions: Vec<Option<SessionRecord>>,
}

/// Replies, as the functions' status constants name them (`lua/shared/numbers.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// acquire OK: a new grant.
    Acquired {
        token: u32,
        expires: u8,
    },
    /// acquire HELD: the holder's live grant, again (invariant 4).
    Held {
        token: u32,
        expires: u8,
    },
    Busy,
    /// acquire OK for a writer that asked READ: the same grant, now a
    /// reader's (decision 74).
    Downgraded {
        token: u32,
        expires: u8,
    },
    /// acquire QUEUED; `retry_at`: the earliest lease expiry the waiter's
    /// timer wakes it at (0: none).
    Queued {
        retry_at: u8,
    },
    LimitMismatch,
    /// A plain request on a read/write lock, or the reverse, while anyone
    /// holds or waits (decision 74: FAILED_PRECONDITION).
    ModeMismatch,
    /// A reader asked WRITE for its grant (decision 74: refused).
    UpgradeRefused,
    Late,
    NotHeld,
    Moved,
    /// release/extend/renew OK (extend, renew: the new expiry).
    Ok {
        expires: u8,
    },
    /// acquire_many OK: per lock of the model its token (0: not in the
    /// call), and the earliest lease's end.
    AcquiredMany {
        tokens: [u32; 2],
        expires: u8,
    },
    /// acquire_many HELD: every lock of the call was the holder's already.
    HeldMany {
        tokens: [u32; 2],
        expires: u8,
    },
    /// release_many: the call's locks and those released (OK), a bit
    /// each of the model's locks; a lock of the call without its bit in
    /// `released` answered NOT_HELD, and so did the call unless all were.
    ReleasedMany {
        locks: u8,
        released: u8,
    },
}

impl Lock {
    pub(crate) fn new(limit: u8, mode: Option<Mode>) -> Lock {
        Lock {
            limit,
            // A read/write lock nobody holds yet says `r`.
            mode: mode.map(|_| Mode::Read),
            holders: Vec::new(),
            queue: Vec::new(),
            arrivals: 0,
        }
    }

    pub(crate) fn mine(&self, holder: Id) -> Option<usize> {
        self.holders.iter().position(|g| g.holder == holder)
    }

    pub(crate) fn queued(&self, id: Id) -> Option<usize> {
        self.queue.iter().position(|w| w.id == id)
    }

    /// The earliest lease expiry (the header's `earliest`), 0 with no holder.
    pub(crate) fn earliest(&self) -> u8 {
        self.holders.iter().map(|g| g.expires).min().unwrap_or(0)
    }

    /// shared/permits.lua `purge`: `purge_expired` and `purge_dead_waiters`.
    /// True when anything changed.
    pub fn purge(&mut self, now: u8) -> bool {
        let expired = self.purge_expired(now);
        self.purge_dead_waiters(now) || expired
    }

    /// shared/permits.lua `purge_expired`: expired leases stop counting.
    pub fn purge_expired(&mut self, now: u8) -> bool {
        let before = self.holders.len();
        self.holders.retain(|g| g.expires > now);
        self.vacate();
        before != self.holders.len()
    }

    /// shared/permits.lua `purge_dead_waiters`: waiters past their deadline leave.
    pub fn purge_dead_waiters(&mut self, now: u8) -> bool {
        let before = self.queue.len();
        self.queue.retain(|w| w.deadline > now);
        before != self.queue.len()
    }
}

/// shared/lock.lua `settle`: a lock nobody holds or waits for leaves no key; an
/// empty queue drops its arrival counter.
pub(crate) fn settle(lock: Lock) -> Option<Lock> {
    if lock.holders.is_empty() && lock.queue.is_empty() {
        return None;
    }
    let mut lock = lock;
    if lock.queue.is_empty() {
        lock.arrivals = 0;
    }
    Some(lock)
}

/// shared/numbers.lua `next_token`: one more than the shard's last token, never
/// below the Redis clock in microseconds.
pub fn next_token(fence: &mut Option<u32>, now: u8) -> u32 {
    let now_us = u32::from(now) * US_PER_TICK;
    let token = match *fence {
        Some(last) if last >= now_us => last + 1,
        _ => now_us,
    };
    *fence = Some(token);
    token
}

/// The arguments of one acquire call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AcquireArgs {
    pub holder: Id,
    /// The request's number (its RPC's id, named in the waiter record).
    pub req: u8,
    pub ttl: u8,
    /// Redis tick past which nothing may be granted (0: none).
    pub answer_by: u8,
    pub limit: u8,
    pub fair: bool,
    pub priority: u8,
    /// `Some(queue_ttl)` when the caller waits.
    pub queue_ttl: Option<u8>,
    /// A session stream's epoch (flag `s<epoch>`).
    pub epoch: Option<u8>,
    /// Read/write: READ or WRITE (flag `r`/`w`, or `R`: a reader that
    /// prefers readers, barging); `None`: a plain request.
    pub mode: Option<Mode>,
    /// Permits asked (flag `p<k>` when k > 1; decision 75).
    pub permits: u8,
    /// With the hand-over: what its record says (answer-by, replica).
    pub hand: Option<Hand>,
}

/// What a call did besides its reply: whom to wake, what it handed over
/// (its PUBLISHes).
pub struct Effects {
    pub reply: Reply,
    pub wake: Wake,
}

/// The reply, and a wake-up (or hand-over) when the call purged something.
pub(crate) fn done(
    reply: Reply,
    lock: &mut Lock,
    fence: &mut Option<u32>,
    now: u8,
    changed: bool,
) -> Effects {
    Effects {
        reply,
        wake: if changed {
            hand_over(lock, fence, now)
        } else {
            Wake::none()
        },
    }
}

pub(crate) fn answer(reply: Reply) -> Effects {
    Effects {
        reply,
        wake: Wake::none(),
    }
}

impl Data {
    /// Makes lock `i` (0 or 1) the one the single-lock functions run on;
    /// selecting the same lock again swaps back.
    pub fn select(&mut self, i: u8) {
        if i == 1 {
            std::mem::swap(&mut self.lock, &mut self.second);
        }
    }

    /// lua/acquire.lua.
    pub fn acquire(&mut self, now: u8, a: AcquireArgs) -> Effects {
        // 1. Past the caller's answer-by time nothing happens.
        if a.answer_by != 0 && now > a.answer_by {
            return answer(Reply::Late);
        }
        // 2. (the fast path decides as the steps below would)
        let mut lock = (self.lock.take()).unwrap_or_else(|| Lock::new(a.limit, a.mode));
        // 3. Expired leases stop counting, and dead waiters when the
        //    request fits or when the call frees a permit (an expired
        //    lease, a downgrade), whose hand-over must not reach a dead
        //    head (finding 8); a request that can only queue leaves them
        //    to the call that frees a permit (the dead entry of its own
        //    holder keeps its place).
        let expired = lock.purge_expired(now);
        let downgrade = a.mode == Some(Mode::Read)
            && lock.mode == Some(Mode::Write)
            && lock.mine(a.holder).is_some();
        let dead =
            (expired || downgrade || lock.room(a.mode, a.permits)) && lock.purge_dead_waiters(now);
        let out = self.acquire_steps(now, a, &mut lock, expired || dead);
        self.lock = settle(lock);
        out
    }

    fn acquire_steps(
        &mut self,
        now: u8,
        a: AcquireArgs,
        lock: &mut Lock,
        changed: bool,
    ) -> Effects {
        let fence = &mut self.fence;
        // 3b. Whether it is a read/write lock belongs to the lock while
        //     anyone holds or waits (its holder's requests too).
        let in_use = !lock.holders.is_empty() || !lock.queue.is_empty();
        if in_use && lock.mode.is_some() != a.mode.is_some() {
            return done(Reply::ModeMismatch, lock, fence, now, changed);
        }
        // 4. A live grant of this holder comes back (idempotent retry); a
        //    superseded session stream gets MOVED; a newer one claims it.
        //    An answer claims a handed grant (`r:<holder>` goes). A reader
        //    asking WRITE is refused; the writer asking READ is downgraded
        //    (decision 74): OK with the same grant and token, and the
        //    readers behind it come in.
        if let Some(i) = lock.mine(a.holder) {
            if a.mode == Some(Mode::Write) && lock.mode == Some(Mode::Read) {
                return done(Reply::UpgradeRefused, lock, fence, now, changed);
            }
            let grant = &mut lock.holders[i];
            let claimed = grant.handed.take().is_some();
            if let Some(epoch) = a.epoch {
                if grant.epoch > epoch {
                    return done(Reply::Moved, lock, fence, now, changed);
                }
                grant.epoch = epoch;
            }
            // A provisional handed grant is taken up: the lease asked.
            if claimed {
                grant.expires = grant.expires.max(grant.full);
            }
            let (token, expires) = (grant.token, grant.expires);
            if a.mode == Some(Mode::Read) && lock.mode == Some(Mode::Write) {
                lock.mode = Some(Mode::Read);
                return done(Reply::Downgraded { token, expires }, lock, fence, now, true);
            }
            return done(Reply::Held { token, expires }, lock, fence, now, changed);
        }
        // 5. The limit belongs to the lock while anyone holds or waits.
        if in_use && lock.limit != a.limit {
            return done(Reply::LimitMismatch, lock, fence, now, changed);
        }
        if !in_use {
            // Its last grant and waiter just went: the request's rules.
            *lock = Lock::new(a.limit, a.mode);
        }
        // 7. Its place: fair requests go behind every live request of their
        //    priority or higher; barging ones do not (read/write requests
        //    are fair unless a reader prefers readers: a fair reader behind
        //    a waiting writer waits).
        let fits = lock.room(a.mode, a.permits);
        let queued = lock.queued(a.holder);
        let ahead = match (a.fair, queued) {
            (true, Some(i)) => i,
            (true, None) => {
                let mine = PRIORITY_MAX - a.priority;
                lock.queue.iter().filter(|w| w.order.0 <= mine).count()
            }
            (false, _) => 0,
        };
        // 8. Free permits enough and nobody ahead: grant with a fresh token.
        if fits && ahead == 0 {
            if let Some(i) = queued {
                lock.queue.remove(i);
            }
            let token = next_token(fence, now);
            let expires = now + a.ttl;
            let grant = Grant {
                holder: a.holder,
                token,
                expires,
                full: expires,
                epoch: a.epoch.unwrap_or(0),
                handed: None,
                permits: a.permits,
            };
            lock.holders.push(grant);
            lock.holders.sort();
            lock.limit = a.limit;
            lock.mode = a.mode;
            // A permit left over goes to the next waiter in line.
            let wake = if lock.any_room() || changed {
                hand_over(lock, fence, now)
            } else {
                Wake::none()
            };
            return Effects {
                reply: Reply::Acquired { token, expires },
                wake,
            };
        }
        // 9. Not granted, trying once: nothing is queued.
        let Some(queue_ttl) = a.queue_ttl else {
            return done(Reply::Busy, lock, fence, now, changed);
        };
        // 10. Waiting: join the queue once, keep the request alive (a
        //     later request of the holder writes its own record).
        let deadline = now + queue_ttl;
        match queued {
            Some(i) => {
                let w = &mut lock.queue[i];
                w.deadline = deadline;
                // An earlier request landing late leaves a later one's
                // name and answer-by (the hand-over must not drop the
                // holder's place as late while that one still waits).
                let later = match (w.hand, a.hand) {
                    (Some(was), Some(now)) => was.answer_by > now.answer_by,
                    _ => false,
                };
                if !later {
                    w.req = a.req;
                    w.hand = a.hand;
                }
                // A read/write or weighted request that keeps its place
                // says what it asks now.
                w.mode = a.mode;
                w.permits = a.permits;
            }
            None => {
                lock.arrivals += 1;
                lock.limit = a.limit;
                let order = (PRIORITY_MAX - a.priority, lock.arrivals);
                lock.queue.push(Waiter {
                    order,
                    id: a.holder,
                    req: a.req,
                    deadline,
                    mode: a.mode,
                    hand: a.hand,
                    permits: a.permits,
                });
                lock.queue.sort();
            }
        }
        // 11. A wake-up when expiries freed permits.
        let retry_at = lock.earliest();
        done(Reply::Queued { retry_at }, lock, fence, now, changed)
    }

    /// lua/release.lua (`token`: 0 = any; `handed`: a replica giving back
    /// a grant handed to its request `handed`, which is gone).
    pub fn release(
        &mut self,
        now: u8,
        holder: Id,
        token: u32,
        epoch: Option<u8>,
        handed: Option<u8>,
        alive: Option<u8>,
    ) -> Effects {
        let Some(mut lock) = self.lock.take() else {
            return answer(Reply::NotHeld);
        };
        let fence = &mut self.fence;
        // 2. Expired leases and dead waiters go first.
        let changed = lock.purge(now);
        // 3. Only a live grant of this holder (with this token, if given;
        //    a give-back only while the grant is still that request's).
        let mine = (lock.mine(holder)).filter(|&i| {
            let g = &lock.holders[i];
            (token == 0 || g.token == token) && (handed.is_none() || g.handed == handed)
        });
        let out = match mine {
            Some(i) => {
                if epoch.is_some_and(|e| lock.holders[i].epoch > e) {
                    done(Reply::Moved, &mut lock, fence, now, changed)
                } else {
                    // 4. Drop the grant; the permit goes to the next
                    //    waiter in line (woken, or handed over).
                    let expires = lock.holders.remove(i).expires;
                    lock.vacate();
                    Effects {
                        reply: Reply::Ok { expires },
                        wake: hand_over_from(&mut lock, fence, now, alive),
                    }
                }
            }
            None => done(Reply::NotHeld, &mut lock, fence, now, changed),
        };
        self.lock = settle(lock);
        out
    }

    /// lua/extend.lua: a new lease from now, only for the holder.
    pub fn extend(&mut self, now: u8, holder: Id, token: u32, ttl: u8, answer_by: u8) -> Effects {
        // 1. Past the caller's answer-by time nothing happens.
        if answer_by != 0 && now > answer_by {
            return answer(Reply::Late);
        }
        let Some(mut lock) = self.lock.take() else {
            return answer(Reply::NotHeld);
        };
        let fence = &mut self.fence;
        // 2. An expired lease cannot be extended.
        let changed = lock.purge(now);
        // 3. Only a live grant of this holder (with this token, if given).
        let out = match lock.mine(holder) {
            Some(i) if token == 0 || lock.holders[i].token == token => {
                // 5. The new lease runs from now.
                lock.holders[i].expires = now + ttl;
                let reply = Reply::Ok { expires: now + ttl };
                done(reply, &mut lock, fence, now, changed)
            }
            _ => done(Reply::NotHeld, &mut lock, fence, now, changed),
        };
        self.lock = settle(lock);
        out
    }

    /// lua/proclaim.lua: the leader of an election (the holder, its term
    /// the grant's token) replaces its value (not modelled: only whether
    /// it is applied). The lease does not move.
    pub fn proclaim(&mut self, now: u8, holder: Id, term: u32) -> Effects {
        let Some(mut lock) = self.lock.take() else {
            return answer(Reply::NotHeld);
        };
        let fence = &mut self.fence;
        // 1. A lapsed lease goes first: its term is over.
        let changed = lock.purge(now);
        // 2. Only the live grant of this holder with exactly this term, on
        //    a lock of limit 1.
        let out = match lock.mine(holder) {
            Some(i) if lock.holders[i].token == term && lock.limit == 1 => {
                // 3–4. The value replaced; keys as they were.
                let expires = lock.holders[i].expires;
                done(Reply::Ok { expires }, &mut lock, fence, now, changed)
            }
            _ => done(Reply::NotHeld, &mut lock, fence, now, changed),
        };
        self.lock = settle(lock);
        out
    }

    /// lua/refresh.lua: one replica's waiting requests get new deadlines;
    /// returns those no longer queued (their place was lost), and always
    /// wakes whoever may be granted (a lost notification is made good).
    pub fn refresh(&mut self, now: u8, ids: &[Id], queue_ttl: u8) -> (Vec<Id>, Wake) {
        let Some(mut lock) = self.lock.take() else {
            return (ids.to_vec(), Wake::none());
        };
        // 1. Expired leases and dead waiters (other replicas' too) leave.
        lock.purge(now);
        // 2. Each live request gets a new deadline (ZADD XX: never re-added).
        let mut lost = Vec::new();
        for &id in ids {
            match lock.queued(id) {
                Some(i) => lock.queue[i].deadline = now + queue_ttl,
                None => {
                    lost.push(id);
                    // A grant handed to the holder and not yet claimed
                    // lives on with its liveness (decision 89): the
                    // replica that renews is alive, and wakes its request
                    // to take it up (named lost, it calls again).
                    if let Some(g) =
                        (lock.holders.iter_mut()).find(|g| g.holder == id && g.handed.is_some())
                    {
                        g.expires = g.expires.max(now + queue_ttl);
                    }
                }
            }
        }
        // 3. A wake-up (or hand-over) for whoever may be granted.
        let wake = hand_over(&mut lock, &mut self.fence, now);
        self.lock = settle(lock);
        (lost, wake)
    }

    /// lua/dequeue.lua: a waiting request leaves (timed out, cancelled),
    /// only if the place is still its own (finding 6).
    pub fn dequeue(&mut self, now: u8, id: Id, req: u8) -> Wake {
        let Some(mut lock) = self.lock.take() else {
            return Wake::none();
        };
        lock.purge(now);
        if let Some(i) = lock.queued(id).filter(|&i| lock.queue[i].req == req) {
            lock.queue.remove(i);
        }
        let wake = hand_over(&mut lock, &mut self.fence, now);
        self.lock = settle(lock);
        wake
    }

    /// lua/reap.lua (no cutoff): expired leases and dead waiters go.
    pub fn reap(&mut self, now: u8) -> Wake {
        let Some(mut lock) = self.lock.take() else {
            return Wake::none();
        };
        lock.purge(now);
        let wake = hand_over(&mut lock, &mut self.fence, now);
        self.lock = settle(lock);
        wake
    }
}
