//! The invariants of DESIGN.md as stateright properties. Each is named
//! for the tests (`checker.discovery(NAME)`); SAFETY.md says which
//! invariant each one stands for.

use crate::Config;
use crate::hand_over::Mode;
use crate::model::{Client, Phase, State};
use stateright::Property;

/// Invariant 2: at most `limit` clients act on grants they believe valid
/// (by their own clock, counted from when they asked), on each lock; a
/// multi-lock's holder counts on every lock of its set.
pub const MUTUAL_EXCLUSION: &str = "at most limit clients believe they hold";
/// Invariant 3: every grant's token is above every earlier grant's.
pub const TOKENS_RISE: &str = "fencing tokens strictly rise";
/// Invariant 3, what fencing guarantees: a resource that keeps the highest
/// token never takes a write from two holders with the same token.
pub const FENCED_RESOURCE: &str = "the fenced resource never confuses two holders";
/// Invariant 7: no request is granted while a live waiter that reached
/// Redis before it (same priority or higher) still waits.
pub const FIFO: &str = "fifo among live waiters";
/// Invariant 9: no grant for a request already answered no.
pub const NO_GRANT_AFTER_NO: &str = "no grant after the caller was told no";
/// Invariant 10: no renewal lands after the session ended.
pub const NO_RENEWAL_AFTER_END: &str = "no renewal after a session ended";
/// Invariants 4 and 10: a resume (or retry) never makes a second grant.
pub const NO_DUPLICATE_GRANT: &str = "resume never duplicates a grant";
/// Invariant 6: a lock nobody holds or waits for has no key.
pub const NO_EMPTY_LOCK: &str = "no key for a lock nobody holds or waits for";
/// Liveness (invariant 7), as bounded response: a waiter whose replica
/// keeps refreshing it is granted within `Config::served_within` ticks of
/// its request (holders release, or their leases pass). An `always`
/// property, not stateright's `eventually`: that one is judged only at
/// terminal states, and here every path ends at the clock's bound, where a
/// request made at the last tick still waits.
pub const SERVED_IN_TIME: &str = "a refreshed waiter is served in bounded time";

/// Invariant 13: never a writer beside another grant. Among the clients
/// acting on grants they believe valid, a writer is alone; and among
/// Redis' grants whose lease has not passed, a lock whose header says
/// `w` has one.
pub const RW_EXCLUSION: &str = "a writer never shares the lock";

/// The hand-over (decision 68's amendment): a waiter whose replica died
/// within its request TTL is not known dead yet, and a release hands it
/// the lock. Expected to fail with the hand-over and a crash; since
/// decision 89 that grant lapses by the request's liveness deadline
/// ([`NO_HAND_PAST_DEADLINE`]), so the queue waits no longer than it did
/// for a dead waiter.
pub const NO_HAND_TO_DEAD: &str = "the lock is never handed to a dead replica's waiter";

/// Invariant 7 with the hand-over: a request past its request TTL is
/// skipped, never handed a grant (which would keep the lock from the
/// live waiters for a lease, longer than that TTL).
pub const NO_HAND_PAST_TTL: &str = "no grant is handed to a request past its request TTL";

/// Invariant 7 with the hand-over on by default (decision 89): a handed
/// grant's lease ends by its request's liveness deadline until its
/// replica takes it up, so a waiter whose replica died keeps the lock no
/// longer than its request TTL. A grant handed by a call of the request's
/// own replica, alive as it calls, is whole (decision 90), as a grant of
/// its own acquire would be.
pub const NO_HAND_PAST_DEADLINE: &str =
    "a handed grant ends by its request's liveness deadline until taken up";

/// Invariant 14: the permits of the grants clients believe valid never
/// sum past the limit; nor do those of Redis' grants whose lease has not
/// passed.
pub const PERMITS_WITHIN_LIMIT: &str = "the permits of valid grants never sum past the limit";

/// Invariant 12 (an election): at most one client believes it leads (its
/// term valid by its own clock).
pub const ONE_LEADER: &str = "at most one leader whose term is valid as it believes it";
/// Invariant 12: no leader is told a term below one told earlier.
pub const TERMS_RISE: &str = "an election's terms strictly rise";
/// Invariant 12: a proclaim or a resign is applied only under the latest
/// term, its lease not passed (a ghost check, against the terms granted,
/// not the functions' own test).
pub const NO_LAPSED_ACT: &str = "no proclaim or resign under a lapsed term";

/// Invariant 15, as another caller can observe it: a multi-lock's caller
/// holds a strict part of its set (the live grants of some of its locks,
/// not all) only while it lets go of a set it was granted (its release
/// sent), or for less than the reservation (on the Cluster path, while
/// its round goes on or after a crash in it; on one server: never).
pub const NO_PARTIAL_SET: &str = "a set is held in part no longer than its reservation";
/// Invariant 15 as DESIGN.md words it: no part of a set is held alone
/// longer than the lease.
pub const PARTIAL_WITHIN_LEASE: &str = "a part of a set outlives the rest by at most a lease";

/// Finding 10: a set's release (or the release after its extend found a
/// part not held) takes only the grants of the set it releases, never a
/// newer grant of the same holder (its set taken again).
pub const NO_NEWER_GRANT_RELEASED: &str = "a set's release never takes a newer grant";

/// Decision 76's wait: a multi-lock's own rollback never wakes its wait
/// (which would try the set again at once, in a loop while a later lock
/// stays busy: finding 9).
pub const NO_SELF_WAKE: &str = "a multi-lock's rollback never wakes its own wait";

/// `sometimes` properties: the interesting states are reachable.
pub const HELD: &str = "a lock is held";
pub const FULL: &str = "every permit is taken";
pub const QUEUED: &str = "someone waits in the queue";
pub const WAITER_GRANTED: &str = "a waiter is granted after waiting";
pub const WRITTEN: &str = "the resource took a write";
pub const REFUSED: &str = "the resource refused a stale write";
pub const DEAD_WAITER: &str = "a dead waiter is skipped";
/// acquire.lua step 3: a request that can only queue leaves dead entries
/// alone, and one of its own holder keeps its place.
pub const DEAD_PLACE_KEPT: &str = "a request keeps its holder's dead entry's place";
pub const RESUMED: &str = "a session is resumed";
pub const SESSION_ENDED: &str = "a session ends";
pub const TOKEN_AFTER_LOSS: &str = "a token is minted after Redis lost data";
pub const WAKE_LOST: &str = "a wake-up is lost";
/// Read/write: two readers act at once (so `RW_EXCLUSION` is not a mutex's).
pub const READERS_SHARE: &str = "readers share the lock";
/// Read/write: a writer downgraded, and a reader was granted beside it.
pub const DOWNGRADE_SHARED: &str = "a downgraded writer shares with a reader";
/// Read/write fairness: readers hold, a writer waits, a reader waits behind it.
pub const READER_BEHIND_WRITER: &str = "a reader waits behind a waiting writer";
/// Decision 68: a call that freed a permit granted it to the head.
pub const HANDED: &str = "a grant is handed over";

/// A provisional handed grant (decision 89) reaches its live replica,
/// which takes it up before it answers.
pub const TAKEN_UP: &str = "a provisional grant is taken up";

/// Decision 90: a release by the replica of a waiting request hands that
/// request the lease it asked (the replica is alive: it is calling).
pub const HANDED_WHOLE: &str = "a grant is handed whole to the caller's own waiter";
/// Weighted: a head of several permits waits though permits are free,
/// with a smaller request waiting behind it (it fits only by barging).
pub const BIG_HEAD_WAITS: &str = "a big head waits while permits are free";
/// Weighted: a barging request takes free permits past a head that does
/// not fit.
pub const BARGER_PASSES_BIG_HEAD: &str = "a barging request passes a big head";
/// Weighted: a waiter of several permits is granted after waiting.
pub const WEIGHTED_WAITER_GRANTED: &str = "a waiter of several permits is granted";
/// Multi-locks: a set granted whole; a set refused (told no, or waiting)
/// with nothing of it held; a part held alone lapsed (a crash mid-set).
pub const SET_GRANTED: &str = "a set is granted";
/// Multi-locks: a set's extend renewed both locks; an extend found a part
/// not held and let go of the rest (a part of it still live), pinned to
/// the set's tokens.
pub const SET_EXTENDED: &str = "a set is extended whole";
pub const SET_EXTEND_BROKEN: &str = "a set's extend finds a part lapsed and lets go of the rest";
/// Finding 11's path, left on the Cluster path: a crash cuts a set's
/// extend between its slot groups (one extended, the next not sent or
/// orphaned). On one server the extend is one call and never cut.
pub const SET_EXTEND_CUT: &str = "a crash cuts a set's extend between its groups";
/// Finding 12's first step: an earlier request's orphaned acquire_many
/// lands late and grants the set, or finds it held.
pub const LATE_SET_REQUEST: &str =
    "an earlier set request lands late and finds the set free or held";
/// Finding 10's path with the release pinned: a set's release that lands
/// after its holder took the set again finds the newer grant and leaves it.
pub const STALE_SET_RELEASE_LEFT: &str = "a late set release leaves the holder's next set";
pub const SET_REFUSED_EMPTY: &str = "a set is refused with nothing of it held";
pub const PART_LAPSED: &str = "a part of a set left alone lapses";
/// Election: a leader proclaimed; a lapsed leader's proclaim was refused.
pub const PROCLAIMED: &str = "a leader proclaims";
pub const PROCLAIM_REFUSED: &str = "a lapsed leader's proclaim is refused";
/// prefer_readers: a barging reader is granted while a writer waits; and
/// one that had itself waited in the queue (woken with the barging ones).
pub const READER_PASSES_WRITER: &str = "a preferring reader passes a waiting writer";
pub const WOKEN_READER_PASSES_WRITER: &str =
    "a queued preferring reader, woken, passes a waiting writer";

/// Whether a client acts on a grant it believes valid (by its own clock).
fn believes(s: &State, c: &Client) -> bool {
    match c.phase {
        Phase::Holding { until, .. } => s.now < until,
        Phase::Writing { .. } => true,
        _ => false,
    }
}

/// The clients acting on grants they believe valid.
fn believing(s: &State) -> impl Iterator<Item = &Client> {
    s.clients.iter().filter(|c| believes(s, c))
}

fn believers(s: &State) -> usize {
    believing(s).count()
}

/// Per lock, the clients acting on grants of it they believe valid are
/// at most its limit.
fn exclusive(m: &Config, s: &State) -> bool {
    (0..m.lock_count()).all(|lock| {
        let on = (s.clients.iter().enumerate())
            .filter(|(i, c)| m.set_of(*i as u8) & (1 << lock) != 0 && believes(s, c))
            .count();
        on <= usize::from(m.limit)
    })
}

/// How long a multi-lock's part may be held alone (`bound`), unless it
/// lets go of its set.
fn partial_within(s: &State, bound: u8) -> bool {
    let g = &s.ghost;
    (g.partial_since.iter().zip(&g.letting_go))
        .all(|(&since, &going)| since == 0 || going || s.now - since < bound)
}

fn permits_within(m: &Config, s: &State) -> bool {
    // (Per lock: a multi-lock's holder counts on each lock of its set.)
    let believed = |lock: u8| -> u32 {
        (s.clients.iter().enumerate())
            .filter(|(i, c)| m.set_of(*i as u8) & (1 << lock) != 0 && believes(s, c))
            .map(|(i, _)| u32::from(m.weight(i as u8)))
            .sum()
    };
    let believed = (0..m.lock_count()).map(believed).max().unwrap_or(0);
    let live = (s.redis.lock.as_ref()).map_or(0, |l| {
        (l.holders.iter().filter(|g| g.expires > s.now))
            .map(|g| u32::from(g.permits))
            .sum()
    });
    believed <= u32::from(m.limit) && live <= u32::from(m.limit)
}

fn rw_exclusive(s: &State) -> bool {
    let alone = believing(s).all(|c| !c.writer) || believers(s) <= 1;
    let live = |l: &crate::redis::Lock| l.holders.iter().filter(|g| g.expires > s.now).count();
    let header =
        (s.redis.lock.as_ref()).is_none_or(|l| l.mode != Some(Mode::Write) || live(l) <= 1);
    alone && header
}

/// Every property; a test asserts which hold and which the checker must
/// find a counterexample (or example) for.
pub fn all() -> Vec<Property<Config>> {
    vec![
        Property::always(MUTUAL_EXCLUSION, exclusive),
        Property::always(TOKENS_RISE, |_, s: &State| !s.ghost.token_went_back),
        Property::always(FENCED_RESOURCE, |_, s: &State| !s.resource.confused),
        Property::always(FIFO, |_, s: &State| !s.ghost.fifo_broken),
        Property::always(NO_GRANT_AFTER_NO, |_, s: &State| !s.ghost.granted_after_no),
        Property::always(NO_RENEWAL_AFTER_END, |_, s: &State| {
            !s.ghost.renewed_after_end
        }),
        Property::always(NO_DUPLICATE_GRANT, |_, s: &State| {
            let lock = s.redis.lock.as_ref();
            let unique =
                lock.is_none_or(|l| l.holders.windows(2).all(|w| w[0].holder != w[1].holder));
            unique && !s.ghost.duplicate_grant
        }),
        Property::always(NO_EMPTY_LOCK, |_, s: &State| {
            [&s.redis.lock, &s.redis.second].iter().all(|lock| {
                (lock.as_ref()).is_none_or(|l| !l.holders.is_empty() || !l.queue.is_empty())
            })
        }),
        Property::always(NO_PARTIAL_SET, |m: &Config, s: &State| {
            partial_within(s, m.reservation)
        }),
        Property::always(NO_SELF_WAKE, |_, s: &State| !s.ghost.self_woken),
        Property::always(NO_NEWER_GRANT_RELEASED, |_, s: &State| {
            !s.ghost.newer_grant_released
        }),
        Property::always(PARTIAL_WITHIN_LEASE, |m: &Config, s: &State| {
            partial_within(s, m.ttl)
        }),
        Property::always(SERVED_IN_TIME, |m: &Config, s: &State| {
            m.served_within == 0
                || s.clients.iter().all(|c| match c.phase {
                    Phase::Waiting { answer_by, .. } => {
                        let since = answer_by - m.wait;
                        !s.alive[usize::from(c.replica)] || s.now - since <= m.served_within
                    }
                    _ => true,
                })
        }),
        Property::always(RW_EXCLUSION, |_, s: &State| rw_exclusive(s)),
        Property::always(NO_HAND_TO_DEAD, |_, s: &State| !s.ghost.handed_to_dead),
        Property::always(NO_HAND_PAST_TTL, |_, s: &State| !s.ghost.handed_past_ttl),
        Property::always(NO_HAND_PAST_DEADLINE, |_, s: &State| {
            !s.ghost.hand_past_deadline
        }),
        Property::always(PERMITS_WITHIN_LIMIT, permits_within),
        Property::always(ONE_LEADER, |m: &Config, s: &State| {
            !m.election || believers(s) <= 1
        }),
        Property::always(TERMS_RISE, |m: &Config, s: &State| {
            !m.election || !s.ghost.terms_fell
        }),
        Property::always(NO_LAPSED_ACT, |_, s: &State| !s.ghost.lapsed_act),
        Property::sometimes(HELD, |_, s: &State| {
            s.redis.lock.as_ref().is_some_and(|l| !l.holders.is_empty())
        }),
        Property::sometimes(FULL, |m: &Config, s: &State| {
            (s.redis.lock.as_ref()).is_some_and(|l| l.in_use() == m.limit)
        }),
        // (On either lock: a multi-lock's configurations wait on both.)
        Property::sometimes(QUEUED, |_, s: &State| {
            [&s.redis.lock, &s.redis.second]
                .iter()
                .any(|lock| lock.as_ref().is_some_and(|l| !l.queue.is_empty()))
        }),
        Property::sometimes(WAITER_GRANTED, |_, s: &State| s.ghost.waiter_granted),
        Property::sometimes(WRITTEN, |_, s: &State| s.resource.last.is_some()),
        Property::sometimes(REFUSED, |_, s: &State| s.resource.refused),
        Property::sometimes(DEAD_WAITER, |_, s: &State| s.ghost.dead_waiter_skipped),
        Property::sometimes(DEAD_PLACE_KEPT, |_, s: &State| s.ghost.dead_place_kept),
        Property::sometimes(RESUMED, |_, s: &State| s.ghost.resumed),
        Property::sometimes(SESSION_ENDED, |_, s: &State| {
            s.ghost.session_over.iter().any(|&o| o)
        }),
        Property::sometimes(TOKEN_AFTER_LOSS, |_, s: &State| s.ghost.token_after_loss),
        Property::sometimes(WAKE_LOST, |_, s: &State| s.ghost.wake_lost),
        Property::sometimes(READERS_SHARE, |_, s: &State| {
            let read = (s.redis.lock.as_ref()).is_some_and(|l| l.mode == Some(Mode::Read));
            read && believing(s).filter(|c| !c.writer).count() >= 2
        }),
        Property::sometimes(DOWNGRADE_SHARED, |_, s: &State| {
            let lock = s.redis.lock.as_ref();
            lock.is_some_and(|l| {
                let downgraded = (l.holders.iter()).any(|g| Some(g.token) == s.ghost.downgraded);
                l.mode == Some(Mode::Read) && downgraded && l.holders.len() >= 2
            })
        }),
        Property::sometimes(READER_BEHIND_WRITER, |_, s: &State| {
            s.redis.lock.as_ref().is_some_and(|l| {
                let writer_at = l.queue.iter().position(|w| w.mode == Some(Mode::Write));
                let reader_after =
                    |i: usize| (l.queue.iter().skip(i + 1)).any(|w| w.mode == Some(Mode::Read));
                l.mode == Some(Mode::Read)
                    && !l.holders.is_empty()
                    && writer_at.is_some_and(reader_after)
            })
        }),
        Property::sometimes(HANDED, |_, s: &State| s.ghost.handed),
        Property::sometimes(TAKEN_UP, |_, s: &State| s.ghost.taken_up),
        Property::sometimes(HANDED_WHOLE, |_, s: &State| s.ghost.handed_whole),
        Property::sometimes(BIG_HEAD_WAITS, |_, s: &State| {
            s.redis.lock.as_ref().is_some_and(|l| {
                let big =
                    (l.queue.first()).is_some_and(|h| h.permits > 1 && !l.room(h.mode, h.permits));
                big && l.any_room() && l.queue.len() > 1
            })
        }),
        Property::sometimes(BARGER_PASSES_BIG_HEAD, |_, s: &State| {
            s.ghost.passed_big_head
        }),
        Property::sometimes(WEIGHTED_WAITER_GRANTED, |_, s: &State| {
            s.ghost.weighted_waiter_granted
        }),
        Property::sometimes(PROCLAIMED, |_, s: &State| s.ghost.proclaimed),
        Property::sometimes(SET_GRANTED, |_, s: &State| s.ghost.set_granted),
        Property::sometimes(SET_EXTENDED, |_, s: &State| s.ghost.set_extended),
        Property::sometimes(SET_EXTEND_BROKEN, |_, s: &State| s.ghost.set_extend_broken),
        Property::sometimes(SET_EXTEND_CUT, |_, s: &State| s.ghost.set_extend_cut),
        Property::sometimes(LATE_SET_REQUEST, |_, s: &State| s.ghost.late_set_request),
        Property::sometimes(STALE_SET_RELEASE_LEFT, |_, s: &State| {
            s.ghost.stale_set_release_left
        }),
        Property::sometimes(SET_REFUSED_EMPTY, |_, s: &State| s.ghost.set_refused_empty),
        Property::sometimes(PART_LAPSED, |_, s: &State| s.ghost.part_lapsed),
        Property::sometimes(PROCLAIM_REFUSED, |_, s: &State| s.ghost.proclaim_refused),
        Property::sometimes(READER_PASSES_WRITER, |_, s: &State| {
            s.ghost.reader_passed_writer
        }),
        Property::sometimes(WOKEN_READER_PASSES_WRITER, |_, s: &State| {
            s.ghost.woken_reader_passed_writer
        }),
    ]
}
