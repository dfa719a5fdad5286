//! What Redis running a replica's call does to the system: the function
//! runs (`redis.rs`), its PUBLISH reaches the replicas, and its answer
//! reaches the task that sent it (if that task is still there), which
//! moves its client on; with the ghost checks made at the moment of a
//! grant or a renewal (fencing, FIFO, answer-by, session end).

use crate::Config;
use crate::hand_over::{Mode, Wake};
use crate::model::{Call, Phase, State};
use crate::redis::{Effects, Id, Reply};

/// A call's PUBLISHes reach every replica. A wake-up: the replica whose
/// waiter it names wakes it (nobody, if the waiter is gone). A handed
/// grant (decision 68): the replica whose request it names delivers it to
/// that request's RPC, or, the request being gone, gives it back; a dead
/// replica does neither, and the grant lasts its lease.
/// Any wake-up message wakes the lock's barging waiters too (they take
/// whatever permits are free, whatever their place).
pub(crate) fn publish(cfg: &Config, s: &mut State, wake: Wake) {
    let barging = wake.barging || wake.wake.is_some();
    for c in 0..s.clients.len() as Id {
        let named = wake.wake == Some(c) || (barging && cfg.barges(c));
        let alive = s.alive[usize::from(s.clients[usize::from(c)].replica)];
        let client = s.client(c);
        if named && alive && matches!(client.phase, Phase::Waiting { .. }) {
            client.wake = true;
        }
    }
    for h in wake.handed {
        granted(cfg, s, h.holder, h.token, h.req, h.expires);
        s.ghost.handed = true;
        s.ghost.handed_past_ttl |= h.dead;
        s.ghost.hand_past_deadline |= h.expires > h.deadline && !h.whole;
        s.ghost.handed_whole |= h.whole && h.full > h.deadline;
        s.ghost.waiter_granted = true;
        if !s.alive[usize::from(h.via)] {
            s.ghost.handed_to_dead = true;
            continue;
        }
        let cl = s.client(h.holder);
        let waiting = matches!(cl.phase, Phase::Waiting { .. });
        if waiting && cl.replica == h.via && cl.req == h.req {
            cl.handed = Some((h.token, h.expires, h.full));
        } else {
            let call = Call::GiveBack {
                req: h.req,
                token: h.token,
            };
            s.orphans.push((h.holder, call));
        }
    }
}

/// The replica of client `c`, when a request of it waits on `c`'s lock
/// (the engine's `Waiters::waits_here`): its release says so, and a grant
/// handed to a request of that replica is whole (decision 90).
pub(crate) fn alive_for(cfg: &Config, s: &State, c: Id) -> Option<u8> {
    let r = s.clients[usize::from(c)].replica;
    let lock = cfg.lock_of(c);
    let waits = (0..s.clients.len() as Id).any(|d| {
        let client = &s.clients[usize::from(d)];
        d != c
            && client.replica == r
            && !cfg.is_set(d)
            && cfg.lock_of(d) == lock
            && matches!(client.phase, Phase::Waiting { .. })
    });
    waits.then_some(r)
}

/// The client's belief after a reply that gave a lease ending at
/// `expires` (Redis time) to a call sent at `sent`: the lease counted from
/// when it asked, by its own clock (it cannot know when Redis ran it).
pub(crate) fn belief(sent: u8, now: u8, expires: u8) -> u8 {
    sent + expires.saturating_sub(now)
}

/// Redis runs a client task's call; `live`: its task is there for the
/// answer. A multi-lock's calls are [`crate::multi`]'s; a single-lock
/// call runs on its client's lock.
pub(crate) fn run_call(cfg: &Config, s: &mut State, c: Id, call: Call, live: bool) {
    if cfg.is_set(c) {
        return crate::multi::run_set_call(cfg, s, c, call, live);
    }
    let lock = cfg.lock_of(c);
    s.redis.select(lock);
    run_single(cfg, s, c, call, live);
    s.redis.select(lock);
}

fn run_single(cfg: &Config, s: &mut State, c: Id, call: Call, live: bool) {
    let now = s.now;
    let ci = usize::from(c);
    match call {
        Call::Acquire {
            req,
            sent,
            answer_by,
            epoch,
            via,
        } => {
            s.ghost.dead_waiter_skipped |= s.dead_waiters();
            let was_queued =
                (s.redis.lock.as_ref()).is_some_and(|l| l.queue.iter().any(|w| w.id == c));
            let live_entry = (s.redis.lock.as_ref())
                .is_some_and(|l| l.queue.iter().any(|w| w.id == c && w.deadline > now));
            let args = cfg.request_args(c, via, req, answer_by, epoch);
            let passing = passing(s, c, args.mode);
            let entry = |s: &State| {
                let lock = s.redis.lock.as_ref();
                lock.and_then(|l| l.queue.iter().find(|w| w.id == c).map(|w| w.order))
            };
            let before = entry(s);
            let Effects { reply, wake } = s.redis.acquire(now, args);
            // (A dead entry that a request that can only queue finds is
            // not purged: it keeps its place, acquire.lua step 3.)
            let kept = live_entry || (before.is_some() && before == entry(s));
            s.ghost.dead_place_kept |= kept && !live_entry;
            // Its place in line: a waiter that stayed live keeps the one
            // its request got first (if Redis dropped it meanwhile, FIFO
            // is broken); any other request (a new one, an orphaned one)
            // takes the holder's entry's place if it keeps one (the
            // queue keeps a place per holder), else a new place.
            let same_request = live && s.ghost.arrival[ci].0 == req;
            if !same_request && !kept {
                s.ghost.arrivals += 1;
                s.ghost.arrival[ci].1 = s.ghost.arrivals;
            }
            if live {
                s.ghost.arrival[ci].0 = req;
            }
            if let Reply::Acquired { token, expires } = reply {
                granted(cfg, s, c, token, req, expires);
                let g = &mut s.ghost;
                // (Only a barging request passes: a fair one that is
                // granted had nobody ahead.)
                let barges = cfg.barges(c);
                g.passed_big_head |= passing.0 && barges;
                g.reader_passed_writer |= passing.1 && barges;
                g.woken_reader_passed_writer |= passing.1 && barges && was_queued;
                g.weighted_waiter_granted |= was_queued && cfg.weight(c) > 1;
            }
            publish(cfg, s, wake);
            if !live {
                return;
            }
            if let Reply::Acquired { token, .. } | Reply::Held { token, .. } = reply {
                s.told(cfg, token);
            }
            let cl = &mut s.clients[ci];
            match reply {
                Reply::Acquired { token, expires } | Reply::Held { token, expires } => {
                    s.ghost.waiter_granted |= was_queued && matches!(reply, Reply::Acquired { .. });
                    cl.phase = Phase::Holding {
                        token,
                        until: belief(sent, now, expires),
                    };
                    cl.writer = cfg.mode(c) == Some(Mode::Write);
                    cl.wake = false;
                    // A grant handed to it meanwhile is the one this call
                    // found (HELD): answered, never given back.
                    cl.handed = None;
                }
                Reply::Queued { retry_at } => {
                    if let Phase::Waiting { answer_by, .. } = cl.phase {
                        cl.phase = Phase::Waiting {
                            answer_by,
                            retry_at,
                        };
                    }
                }
                Reply::Moved => cl.phase = Phase::Done,
                _ => {
                    if matches!(cl.phase, Phase::Waiting { .. }) || cfg.wait == 0 {
                        // Told "not acquired"; a waiting RPC's guard dequeues it.
                        if cfg.wait > 0 {
                            cl.call = Some(Call::Dequeue { req });
                        }
                        s.ghost.told_no[ci] = req;
                        s.round_over(c, cfg);
                    }
                }
            }
        }
        Call::Downgrade { req, sent, epoch } => {
            let Effects { reply, wake } = s.redis.acquire(now, cfg.downgrade_args(c, 0, epoch));
            if let Reply::Acquired { token, expires } = reply {
                granted(cfg, s, c, token, req, expires);
            }
            if let Reply::Downgraded { token, .. } = reply {
                s.ghost.downgraded = Some(token);
            }
            publish(cfg, s, wake);
            if !live {
                return;
            }
            match reply {
                // The same grant (or, its lease gone, a new one), now read.
                Reply::Acquired { token, expires }
                | Reply::Held { token, expires }
                | Reply::Downgraded { token, expires } => {
                    s.clients[ci].phase = Phase::Holding {
                        token,
                        until: belief(sent, now, expires),
                    };
                }
                _ => s.round_over(c, cfg),
            }
        }
        Call::GiveBack { req, token } => {
            let alive = alive_for(cfg, s, c);
            let Effects { wake, .. } = s.redis.release(now, c, token, None, Some(req), alive);
            publish(cfg, s, wake);
        }
        Call::Release { token, epoch } => {
            let epoch = (epoch > 0).then_some(epoch);
            let alive = alive_for(cfg, s, c);
            let Effects { reply, wake } = s.redis.release(now, c, token, epoch, None, alive);
            // An election's resign is a release pinned to the term.
            if cfg.election && matches!(reply, Reply::Ok { .. }) {
                s.ghost.lapsed_act |= lapsed(s, token);
            }
            publish(cfg, s, wake);
            if live && !cfg.session(c) {
                s.round_over(c, cfg);
            } else if live {
                s.clients[ci].phase = Phase::Done;
            }
        }
        Call::Extend { token, sent } => {
            let Effects { reply, wake } = s.redis.extend(now, c, token, cfg.ttl, 0);
            if let Reply::Ok { expires } = reply {
                lease_moved(s, token, expires);
            }
            publish(cfg, s, wake);
            if !live {
                return;
            }
            match (reply, s.clients[ci].phase) {
                (Reply::Ok { expires }, Phase::Holding { token, .. }) => {
                    s.clients[ci].phase = Phase::Holding {
                        token,
                        until: belief(sent, now, expires),
                    };
                }
                (Reply::NotHeld, Phase::Holding { .. }) => s.round_over(c, cfg),
                _ => {}
            }
        }
        Call::Proclaim { token } => {
            let Effects { reply, wake } = s.redis.proclaim(now, c, token);
            if matches!(reply, Reply::Ok { .. }) {
                s.ghost.lapsed_act |= lapsed(s, token);
                s.ghost.proclaimed = true;
            } else {
                s.ghost.proclaim_refused = true;
            }
            publish(cfg, s, wake);
            if !live {
                return;
            }
            // Proclaimed: it resigns (a release pinned to its term); told
            // it is no longer the leader: its campaign is over.
            match reply {
                Reply::Ok { .. } => {
                    s.clients[ci].call = Some(Call::Release { token, epoch: 0 });
                }
                _ => s.round_over(c, cfg),
            }
        }
        Call::Dequeue { req } => {
            let wake = s.redis.dequeue(now, c, req);
            publish(cfg, s, wake);
        }
        Call::SessionEnd { epoch, token } => {
            let ended = s.redis.session_end(c, epoch);
            if ended {
                s.ghost.session_over[ci] = true;
            }
            if live {
                let cl = &mut s.clients[ci];
                // The renewer stops renewing its grants, but a renewal
                // already sent still reaches Redis (crates/tumbler-engine/src/sessions.rs
                // `end` does not wait for one in flight).
                if let Some(beat) = cl.beat.take() {
                    s.orphans.push((c, beat));
                }
                let cl = &mut s.clients[ci];
                cl.epoch = 0;
                // Ended: its grants are released; resumed elsewhere: kept.
                if ended {
                    cl.call = Some(Call::Release { token, epoch });
                } else {
                    cl.phase = Phase::Done;
                }
            }
        }
        Call::SessionClaim => {
            let claimed = s.redis.session_claim(now, c, cfg.ttl);
            if claimed.is_none() {
                s.ghost.session_over[ci] = true;
            }
            if !live {
                return;
            }
            match claimed {
                Some(epoch) => {
                    s.ghost.resumed = true;
                    let cl = &mut s.clients[ci];
                    cl.epoch = epoch;
                    // The same grant, with the same token: never a second one.
                    if let Phase::Holding { token, .. } | Phase::Writing { token, .. } = cl.phase {
                        let lock = s.redis.lock.as_ref();
                        let theirs: Vec<u32> = (lock.iter())
                            .flat_map(|l| {
                                l.holders.iter().filter(|g| g.holder == c).map(|g| g.token)
                            })
                            .collect();
                        s.ghost.duplicate_grant |=
                            theirs.iter().any(|&t| t != token) || theirs.len() > 1;
                        // Its grants are renewed at once, stamped with the
                        // new epoch, before the resume is answered
                        // (crates/tumbler-engine/src/resume.rs).
                        let cl = &mut s.clients[ci];
                        cl.call = Some(Call::Renew {
                            token,
                            sent: now,
                            epoch,
                        });
                    }
                }
                None => s.clients[ci].phase = Phase::Done,
            }
        }
        Call::SessionTouch { .. } | Call::Renew { .. } => {
            unreachable!("heartbeat calls run in run_beat")
        }
        Call::AcquireMany { .. }
        | Call::ExtendPart { .. }
        | Call::ExtendSet { .. }
        | Call::RollBack { .. }
        | Call::ReleaseSet { .. } => unreachable!("a multi-lock's calls run in run_set_call"),
    }
}

/// Redis runs a session heartbeat's call.
pub(crate) fn run_beat(cfg: &Config, s: &mut State, c: Id, call: Call, live: bool) {
    let now = s.now;
    let ci = usize::from(c);
    match call {
        Call::SessionTouch { epoch } => {
            let kept = s.redis.session_touch(now, c, epoch);
            if !live {
                return;
            }
            let cl = &mut s.clients[ci];
            match (kept, cl.phase) {
                (1, Phase::Holding { token, .. } | Phase::Writing { token, .. }) => {
                    cl.beat = Some(Call::Renew {
                        token,
                        sent: now,
                        epoch,
                    });
                }
                (1, _) => {}
                // Resumed elsewhere (0) or the record is gone (-1): the
                // stream stops; with the record gone its client is told so.
                (0, _) => cl.epoch = 0,
                _ => {
                    cl.epoch = 0;
                    if !matches!(cl.phase, Phase::Writing { .. }) {
                        cl.phase = Phase::Done;
                    }
                }
            }
        }
        Call::Renew { token, sent, epoch } => {
            let Effects { reply, wake } = s.redis.renew(now, c, token, cfg.ttl, epoch);
            if let Reply::Ok { expires } = reply {
                lease_moved(s, token, expires);
            }
            publish(cfg, s, wake);
            if matches!(reply, Reply::Ok { .. }) && s.ghost.session_over[ci] {
                s.ghost.renewed_after_end = true;
            }
            if !live {
                return;
            }
            let cl = &mut s.clients[ci];
            match (reply, cl.phase) {
                (Reply::Ok { expires }, Phase::Holding { token, .. }) => {
                    cl.phase = Phase::Holding {
                        token,
                        until: belief(sent, now, expires),
                    };
                }
                (Reply::Ok { expires }, Phase::Writing { token, .. }) => {
                    cl.phase = Phase::Writing {
                        token,
                        until: belief(sent, now, expires),
                    };
                }
                (Reply::NotHeld, Phase::Holding { .. }) => cl.phase = Phase::Done,
                (Reply::Moved, _) => cl.epoch = 0,
                _ => {}
            }
        }
        _ => unreachable!("client calls run in run_call"),
    }
}

/// Whether a request of client `c` (of `mode`) would pass a waiting head:
/// (a barging request, a head of several permits that does not fit; a
/// barging reader, a writer waiting), judged on the lock as the call
/// finds it once expired leases and dead waiters are gone.
fn passing(s: &State, c: Id, mode: Option<Mode>) -> (bool, bool) {
    let Some(mut lock) = s.redis.lock.clone() else {
        return (false, false);
    };
    lock.purge(s.now);
    let others = || lock.queue.iter().filter(|w| w.id != c);
    let big_head = (lock.queue.first()).is_some_and(|h| {
        h.id != c && h.permits > 1 && lock.limit > 1 && !lock.room(h.mode, h.permits)
    });
    let writer_waits = mode == Some(Mode::Read) && others().any(|w| w.mode == Some(Mode::Write));
    (big_head, writer_waits)
}

/// Election: a term is lapsed unless it is the latest granted and its
/// lease (as Redis set it) has not passed.
fn lapsed(s: &State, token: u32) -> bool {
    !matches!(s.ghost.term, Some((t, expires)) if t == token && expires > s.now)
}

/// An extend or renewal of `token` moved its lease to `expires`.
fn lease_moved(s: &mut State, token: u32, expires: u8) {
    if let Some((t, e)) = &mut s.ghost.term
        && *t == token
    {
        *e = expires;
    }
}

/// A new grant: the ghost checks of fencing, FIFO and answer-by, and the
/// election's latest term.
pub(crate) fn granted(cfg: &Config, s: &mut State, c: Id, token: u32, req: u8, expires: u8) {
    let g = &mut s.ghost;
    if token <= g.max_token {
        g.token_went_back = true;
    }
    if cfg.election {
        g.term = Some((token, expires));
    }
    g.max_token = g.max_token.max(token);
    g.token_after_loss |= g.data_lost;
    if g.told_no[usize::from(c)] == req {
        g.granted_after_no = true;
    }
    // FIFO: no live waiter that reached Redis earlier, of this priority
    // or higher, is still waiting while this request is granted.
    // (The holder's place, whichever of its requests, live or orphaned,
    // is granted: the grant is the holder's.)
    // A barging request (fair = false, prefer_readers) passes waiters by
    // design: FIFO is among fair requests.
    let mine = g.arrival[usize::from(c)].1;
    for (i, other) in s.clients.iter().enumerate() {
        let (their_req, arrived) = g.arrival[i];
        let arrived = if their_req == other.req { arrived } else { 0 };
        // A waiter past its answer-by time is told no (or about to be:
        // every granting call refuses it), no longer in line; the
        // hand-over drops it from the queue (decision 68).
        // And one that was handed its grant (the message on its way, or
        // lost) is served.
        let served = (s.redis.lock.as_ref())
            .is_some_and(|l| l.holders.iter().any(|g| usize::from(g.holder) == i));
        let live = s.alive[usize::from(other.replica)]
            && !served
            && matches!(other.phase, Phase::Waiting { answer_by, .. } if s.now <= answer_by);
        if i != usize::from(c)
            && !cfg.barges(c)
            && cfg.set_of(i as Id) == cfg.set_of(c)
            && live
            && arrived > 0
            && arrived < mine
            && cfg.priority(i as Id) >= cfg.priority(c)
        {
            g.fifo_broken = true;
        }
    }
}
