//! Multi-locks (invariant 15, decision 76): a client asks the set of the
//! model's two locks for one holder, all or nothing.
//!
//! `Data::acquire_many` is lua/acquire_many.lua, steps numbered as its
//! comments number them: every lock read and purged, the set refused
//! whole (a wake-up place at the tail of each busy lock's queue when the
//! caller waits: a record naming no request, behind every priority) or
//! granted whole, one permit per lock. On one server it is one call for
//! the set. On the Cluster path (`Config::reservation` > 0) each lock is
//! its own slot group, taken in order (lock 0, then lock 1), each call
//! granting a reservation; once both are held each is extended to the
//! lease (extend.lua pinned to its token); a refused group or a lapsed
//! reservation rolls back what the round took (release.lua pinned to its
//! token). A crash between the steps leaves the parts taken to their
//! lease: a reservation, or after its extend the full lease.
//!
//! The set's holder releases it with lua/release_many.lua and may extend
//! it (`Config::set_extends`, the engine's `extend_set`) with
//! lua/extend_many.lua ([`crate::set`]), each lock pinned to its token
//! from the set's grant (`fencing_tokens`; `Config::unpinned_set_release`:
//! a caller that sends none, finding 10), one call per slot group: the
//! whole set on one server, so no crash splits it (finding 11) and no
//! other call lands within it (finding 12); on the Cluster path one call
//! per lock, in the acquire's order, and an extend that finds a group not
//! held lets go of it in that call and releases the set's other groups.

use crate::Config;
use crate::hand_over::{Wake, hand_over};
use crate::model::{Call, Phase, State};
use crate::redis::{Data, Grant, Id, Lock, PRIORITY_MAX, Reply, Waiter, next_token, settle};
use crate::steps::{belief, granted, publish};

/// The arguments of one acquire_many call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ManyArgs {
    pub holder: Id,
    /// The lease it grants (`lease_ms`: the ttl, or a reservation).
    pub lease: u8,
    pub answer_by: u8,
    pub limit: u8,
    /// `Some(queue_ttl)` when the caller waits.
    pub queue_ttl: Option<u8>,
    /// The locks of the call, a bit each.
    pub group: u8,
}

/// The reply, each lock's wake-up (its PUBLISHes), and the grants it
/// made (a lock the holder held already is in the reply, not here).
pub struct ManyEffects {
    pub reply: Reply,
    pub wakes: Vec<Wake>,
    pub fresh: Vec<u32>,
}

impl Data {
    fn lock_slot(&mut self, i: u8) -> &mut Option<Lock> {
        if i == 0 {
            &mut self.lock
        } else {
            &mut self.second
        }
    }

    /// lua/acquire_many.lua.
    pub fn acquire_many(&mut self, now: u8, a: ManyArgs) -> ManyEffects {
        // 1. Past the caller's answer-by time nothing happens.
        if a.answer_by != 0 && now > a.answer_by {
            return ManyEffects {
                reply: Reply::Late,
                wakes: Vec::new(),
                fresh: Vec::new(),
            };
        }
        // 2. Every lock read, its lapsed leases purged (dead waiters too,
        //    where a permit is free).
        let ids: Vec<u8> = (0..2).filter(|i| a.group & (1 << i) != 0).collect();
        let locks: Vec<(Lock, bool)> = (ids.iter())
            .map(|&i| {
                let mut lock =
                    (self.lock_slot(i).take()).unwrap_or_else(|| Lock::new(a.limit, None));
                let mut changed = lock.purge_expired(now);
                if lock.room(None, 1) {
                    changed |= lock.purge_dead_waiters(now);
                }
                (lock, changed)
            })
            .collect();
        let before = self.fence;
        let mut many = Many {
            fence: &mut self.fence,
            now,
            a: &a,
            ids: &ids,
            locks,
        };
        let (reply, wakes) = many.steps();
        for (&i, (lock, _)) in ids.iter().zip(many.locks) {
            *self.lock_slot(i) = settle(lock);
        }
        let fresh = match reply {
            Reply::AcquiredMany { tokens, .. } => (tokens.into_iter())
                .filter(|&t| t > 0 && before.is_none_or(|b| t > b))
                .collect(),
            _ => Vec::new(),
        };
        ManyEffects {
            reply,
            wakes,
            fresh,
        }
    }
}

/// A lock's wake-up after a call: whom the permits its purges (or its
/// grant) left free let in, when anything changed.
fn wake_if(changed: bool, lock: &mut Lock, fence: &mut Option<u32>, now: u8) -> Wake {
    if changed {
        hand_over(lock, fence, now)
    } else {
        Wake::none()
    }
}

/// One acquire_many call on the locks it read (each with whether its
/// purges changed it), by the model's index in `ids`.
struct Many<'a> {
    fence: &'a mut Option<u32>,
    now: u8,
    a: &'a ManyArgs,
    ids: &'a [u8],
    locks: Vec<(Lock, bool)>,
}

impl Many<'_> {
    /// Each lock's purges written, and whom they let in woken.
    fn refuse(&mut self, reply: Reply) -> (Reply, Vec<Wake>) {
        let (fence, now) = (&mut *self.fence, self.now);
        let wakes = (self.locks.iter_mut())
            .map(|(lock, changed)| wake_if(*changed, lock, fence, now))
            .collect();
        (reply, wakes)
    }

    /// acquire_many's steps 3 to 7.
    fn steps(&mut self) -> (Reply, Vec<Wake>) {
        let a = self.a;
        // 3. A lock in use under another limit refuses the set.
        let used = |l: &Lock| !l.holders.is_empty() || !l.queue.is_empty();
        if self
            .locks
            .iter()
            .any(|(l, _)| used(l) && l.limit != a.limit)
        {
            return self.refuse(Reply::LimitMismatch);
        }
        // 4. Which locks are busy: held by others to their limit.
        let busy: Vec<usize> = (0..self.locks.len())
            .filter(|&k| {
                let lock = &self.locks[k].0;
                lock.mine(a.holder).is_none() && !lock.room(None, 1)
            })
            .collect();
        let next_expiry = (busy.iter()).map(|&k| self.locks[k].0.earliest()).min();
        // 5. Busy, trying once: nothing changes but the purges.
        let Some(queue_ttl) = a.queue_ttl.filter(|_| !busy.is_empty()) else {
            if !busy.is_empty() {
                return self.refuse(Reply::Busy);
            }
            return self.grant();
        };
        // 6. Busy, waiting: a wake-up place at the tail of each busy lock's
        //    queue (naming no request: woken, never handed a grant), alive
        //    for the request TTL. Nothing is held meanwhile.
        let deadline = self.now + queue_ttl;
        for &k in &busy {
            let (lock, changed) = &mut self.locks[k];
            match lock.queued(a.holder) {
                Some(i) => lock.queue[i].deadline = deadline,
                None => {
                    lock.arrivals += 1;
                    lock.queue.push(Waiter {
                        order: (PRIORITY_MAX + 1, lock.arrivals),
                        id: a.holder,
                        req: 0,
                        deadline,
                        mode: None,
                        hand: None,
                        permits: 1,
                    });
                    lock.queue.sort();
                }
            }
            *changed = true;
        }
        let retry_at = next_expiry.unwrap_or(0);
        self.refuse(Reply::Queued { retry_at })
    }

    /// acquire_many step 7: every lock has room; each grants a permit with
    /// a fresh token, its wake-up place dropped.
    fn grant(&mut self) -> (Reply, Vec<Wake>) {
        let (a, now, fence) = (self.a, self.now, &mut *self.fence);
        let (mut tokens, mut expires, mut all_held) = ([0; 2], u8::MAX, true);
        let mut wakes = Vec::new();
        for (&i, (lock, changed)) in self.ids.iter().zip(self.locks.iter_mut()) {
            let i = usize::from(i);
            if let Some(g) = lock.mine(a.holder) {
                tokens[i] = lock.holders[g].token;
                expires = expires.min(lock.holders[g].expires);
                wakes.push(wake_if(*changed, lock, fence, now));
                continue;
            }
            all_held = false;
            if let Some(q) = lock.queued(a.holder) {
                lock.queue.remove(q);
            }
            let token = next_token(fence, now);
            lock.holders.push(Grant {
                holder: a.holder,
                token,
                expires: now + a.lease,
                full: now + a.lease,
                epoch: 0,
                handed: None,
                permits: 1,
            });
            lock.holders.sort();
            lock.limit = a.limit;
            tokens[i] = token;
            expires = expires.min(now + a.lease);
            // A permit left over goes to the next waiter in line.
            wakes.push(wake_if(lock.any_room() || *changed, lock, fence, now));
        }
        let reply = if all_held {
            Reply::HeldMany { tokens, expires }
        } else {
            Reply::AcquiredMany { tokens, expires }
        };
        (reply, wakes)
    }
}

impl Config {
    /// The first call of a multi-lock's round: the whole set, or on the
    /// Cluster path its first slot group (lock 0).
    pub(crate) fn first_many(&self, c: Id, req: u8, sent: u8, answer_by: u8) -> Call {
        let set = self.set_of(c);
        Call::AcquireMany {
            req,
            sent,
            answer_by,
            group: if self.reservation > 0 { set & 1 } else { set },
            held: 0,
        }
    }

    /// The arguments of a multi-lock's acquire_many call.
    pub fn many_args(&self, c: Id, answer_by: u8, group: u8) -> ManyArgs {
        ManyArgs {
            holder: c,
            lease: match self.reservation {
                0 => self.ttl,
                r => r.min(self.ttl),
            },
            answer_by,
            limit: self.limit,
            queue_ttl: (self.wait > 0).then_some(self.queue_ttl),
            group,
        }
    }
}

/// The locks of which client `c` holds a live grant in Redis, a bit each.
pub(crate) fn held(s: &State, c: Id) -> u8 {
    let live = |l: &Option<Lock>| {
        (l.as_ref()).is_some_and(|l| l.holders.iter().any(|g| g.holder == c && g.expires > s.now))
    };
    u8::from(live(&s.redis.lock)) | u8::from(live(&s.redis.second)) << 1
}

/// After every step: since when each multi-lock client holds part of its
/// set, and whether a part held alone lapsed.
pub(crate) fn track_sets(cfg: &Config, s: &mut State) {
    for c in 0..cfg.clients {
        if !cfg.is_set(c) {
            continue;
        }
        let ci = usize::from(c);
        let parts = held(s, c);
        let partial = parts != 0 && parts != cfg.set_of(c);
        let since = &mut s.ghost.partial_since[ci];
        if partial && *since == 0 {
            *since = s.now;
        } else if !partial {
            if *since != 0 && parts == 0 && !s.ghost.letting_go[ci] {
                s.ghost.part_lapsed = true;
            }
            *since = 0;
        }
    }
}

/// A multi-lock client is told no, or waits, holding nothing.
fn refused(cfg: &Config, s: &mut State, c: Id) {
    s.ghost.set_refused_empty |= held(s, c) == 0 && cfg.is_set(c);
}

/// Redis runs a multi-lock client's call; `live`: its task is there for
/// the answer, and makes the round's next call.
pub(crate) fn run_set_call(cfg: &Config, s: &mut State, c: Id, call: Call, live: bool) {
    let now = s.now;
    let ci = usize::from(c);
    match call {
        Call::AcquireMany {
            req,
            sent,
            answer_by,
            group,
            held: held_token,
        } => {
            // (A dead waiter on a lock of the call: its purge skips it.)
            s.ghost.dead_waiter_skipped |= (group & 1 != 0 && s.dead_waiters_on(&s.redis.lock))
                || (group & 2 != 0 && s.dead_waiters_on(&s.redis.second));
            let out = s
                .redis
                .acquire_many(now, cfg.many_args(c, answer_by, group));
            if let Reply::AcquiredMany { expires, .. } = out.reply {
                for &t in &out.fresh {
                    granted(cfg, s, c, t, req, expires);
                }
            }
            for wake in out.wakes {
                publish(cfg, s, wake);
            }
            if !live {
                s.ghost.late_set_request |= matches!(
                    out.reply,
                    Reply::AcquiredMany { .. } | Reply::HeldMany { .. }
                );
                return;
            }
            let cluster = cfg.reservation > 0;
            let cl = &mut s.clients[ci];
            match out.reply {
                Reply::AcquiredMany { tokens, expires } | Reply::HeldMany { tokens, expires } => {
                    if !cluster {
                        cl.phase = Phase::Holding {
                            token: tokens[0],
                            until: belief(sent, now, expires),
                        };
                        cl.parts = tokens;
                        cl.wake = false;
                        s.ghost.set_granted = true;
                    } else if group == 1 {
                        cl.call = Some(Call::AcquireMany {
                            req,
                            sent: now,
                            answer_by,
                            group: 2,
                            held: tokens[0],
                        });
                    } else {
                        cl.call = Some(Call::ExtendPart {
                            lock: 0,
                            tokens: [held_token, tokens[1]],
                            sent: now,
                            until: u8::MAX,
                        });
                    }
                }
                reply => {
                    let queued = match reply {
                        Reply::Queued { retry_at } => Some(retry_at),
                        _ => None,
                    };
                    if held_token > 0 {
                        // A later group refused: the part taken goes back.
                        cl.call = Some(Call::RollBack {
                            lock: 0,
                            token: held_token,
                            queued,
                        });
                    } else {
                        round_refused(cfg, s, c, req, queued);
                    }
                }
            }
        }
        Call::ExtendPart {
            lock,
            tokens,
            sent,
            until,
        } => {
            let reply = extend_part(cfg, s, c, lock, tokens[usize::from(lock)]);
            if !live {
                return;
            }
            let cl = &mut s.clients[ci];
            match reply {
                Reply::Ok { expires } => {
                    let until = until.min(belief(sent, now, expires));
                    if lock == 0 {
                        cl.call = Some(Call::ExtendPart {
                            lock: 1,
                            tokens,
                            sent,
                            until,
                        });
                    } else {
                        cl.phase = Phase::Holding {
                            token: tokens[0],
                            until,
                        };
                        cl.parts = tokens;
                        cl.wake = false;
                        s.ghost.set_granted = true;
                    }
                }
                _ => {
                    // A reservation lapsed: the other part goes back, and
                    // the caller waits for a wake-up (or is told no).
                    let other = 1 - lock;
                    cl.call = Some(Call::RollBack {
                        lock: other,
                        token: tokens[usize::from(other)],
                        queued: (cfg.wait > 0).then_some(0),
                    });
                }
            }
        }
        Call::RollBack {
            lock,
            token,
            queued,
        } => {
            let woken = s.clients[ci].wake;
            release_part(cfg, s, c, lock, token);
            // The release's wake-up reaches the set's own registration on
            // that lock (a barging one): the engine would try the set
            // again at once, and again (finding 9). Noted; the model then
            // drops it, as the fix does, so its runs stay finite.
            if !woken && s.clients[ci].wake {
                s.ghost.self_woken = true;
                s.clients[ci].wake = false;
            }
            if live {
                let req = s.clients[ci].req;
                round_refused(cfg, s, c, req, queued);
            }
        }
        Call::ExtendSet { .. } | Call::ReleaseSet { .. } => {
            crate::set::run_held_call(cfg, s, c, call, live)
        }
        Call::Dequeue { .. } => {
            // Its wake-up places leave every lock's queue.
            for lock in 0..2 {
                s.redis.select(lock);
                let wake = s.redis.dequeue(now, c, 0);
                publish(cfg, s, wake);
                s.redis.select(lock);
            }
        }
        other => unreachable!("not a multi-lock's call: {other:?}"),
    }
}

/// lua/extend.lua on lock `lock` of the set, pinned to its token.
fn extend_part(cfg: &Config, s: &mut State, c: Id, lock: u8, token: u32) -> Reply {
    s.redis.select(lock);
    let out = s.redis.extend(s.now, c, token, cfg.ttl, 0);
    publish(cfg, s, out.wake);
    s.redis.select(lock);
    out.reply
}

/// lua/release.lua on lock `lock` of the set (`token` 0: any grant of
/// the holder).
fn release_part(cfg: &Config, s: &mut State, c: Id, lock: u8, token: u32) -> Reply {
    s.redis.select(lock);
    let out = s.redis.release(s.now, c, token, None, None, None);
    publish(cfg, s, out.wake);
    s.redis.select(lock);
    out.reply
}

impl Config {
    /// The token a Cluster path's call on one lock of the set names while
    /// the set is taken (its extends and its rollback pin theirs).
    pub fn part_token(&self, call: &Call) -> u32 {
        match *call {
            Call::ExtendPart { lock, tokens, .. } => tokens[usize::from(lock)],
            Call::RollBack { token, .. } => token,
            _ => 0,
        }
    }
}

/// A round refused (`queued`: it waits, its timer at that time; else it
/// is told no), holding nothing of the set.
fn round_refused(cfg: &Config, s: &mut State, c: Id, req: u8, queued: Option<u8>) {
    refused(cfg, s, c);
    let cl = &mut s.clients[usize::from(c)];
    match (queued, cl.phase) {
        (Some(retry_at), Phase::Waiting { answer_by, .. }) => {
            cl.phase = Phase::Waiting {
                answer_by,
                retry_at,
            };
        }
        _ => {
            if cfg.wait > 0 {
                cl.call = Some(Call::Dequeue { req });
            }
            s.ghost.told_no[usize::from(c)] = req;
            s.round_over(c, cfg);
        }
    }
}
