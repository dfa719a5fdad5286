//! The model checked in CI: each test is one configuration (2 clients on 2
//! replicas unless it says otherwise, one lock), explored breadth-first
//! completely within the clock's bound (`max_time` ticks) and `DEPTH`
//! steps; it names the properties that must hold and those for which the
//! checker must find a counterexample (a fault the protocol does not
//! promise to survive) or an example (the state is reachable, so no check
//! passes vacuously). SAFETY.md has the figures of longer runs.

use stateright::{Checker, Model};
use std::time::Instant;
use tumbler_model::properties::*;
use tumbler_model::redis::Reply;
use tumbler_model::trace::Step;
use tumbler_model::{Config, Faults, Mode};

/// Steps from the initial state. Every run below ends well within it (the
/// clock's bound ends every path first: the deepest path any of them has
/// is under 60 steps), so each explores its whole bounded state space.
const DEPTH: usize = 80;

/// The safety properties every fault-free configuration keeps.
const SAFETY: [&str; 8] = [
    MUTUAL_EXCLUSION,
    TOKENS_RISE,
    FENCED_RESOURCE,
    FIFO,
    NO_GRANT_AFTER_NO,
    NO_RENEWAL_AFTER_END,
    NO_DUPLICATE_GRANT,
    NO_EMPTY_LOCK,
];

fn check(name: &str, cfg: Config) -> impl Checker<Config> {
    let start = Instant::now();
    let checker = cfg.checker().target_max_depth(DEPTH).spawn_bfs().join();
    eprintln!(
        "{name}: {} states, {} unique, max depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    assert!(
        checker.max_depth() < DEPTH,
        "{name}: the depth bound cut paths short"
    );
    checker
}

fn holds(checker: &impl Checker<Config>, names: &[&'static str]) {
    for name in names {
        checker.assert_no_discovery(name);
    }
}

fn found(checker: &impl Checker<Config>, names: &[&'static str]) {
    for name in names {
        checker.assert_any_discovery(name);
    }
}

/// Every safety property, and those of one primitive.
fn safety_and(extra: &[&'static str]) -> Vec<&'static str> {
    [&SAFETY[..], extra].concat()
}

#[test]
fn a_mutex_without_faults_keeps_every_invariant() {
    let checker = check("mutex", Config::mutex());
    holds(&checker, &SAFETY);
    found(&checker, &[HELD, QUEUED, WAITER_GRANTED, WRITTEN, FULL]);
}

#[test]
fn a_semaphore_of_two_keeps_every_invariant() {
    let cfg = Config {
        clients: 3,
        max_time: 5,
        ..Config::small(2)
    };
    let checker = check("semaphore", cfg);
    holds(&checker, &SAFETY);
    found(&checker, &[FULL, QUEUED, WAITER_GRANTED]);
}

#[test]
fn priorities_keep_fifo_within_a_priority() {
    let cfg = Config {
        rounds: 2,
        priorities: vec![0, 1],
        ..Config::small(1)
    };
    let checker = check("priorities", cfg);
    holds(&checker, &SAFETY);
    found(&checker, &[QUEUED, WAITER_GRANTED]);
}

#[test]
fn a_replica_crash_and_lost_or_duplicated_wakeups_keep_every_invariant() {
    let faults = Faults {
        crash: 1,
        lose_wake: 1,
        duplicate_wake: 1,
        ..Faults::default()
    };
    let checker = check(
        "crash and wake-ups",
        Config {
            faults,
            reap: true,
            rounds: 2,
            max_time: 6,
            ..Config::small(1)
        },
    );
    holds(&checker, &SAFETY);
    found(&checker, &[DEAD_WAITER, WAKE_LOST, WAITER_GRANTED]);
}

#[test]
fn a_pause_past_the_lease_breaks_exclusion_but_the_fence_holds() {
    let mut cfg = Config {
        rounds: 2,
        max_time: 6,
        ..Config::small(1)
    };
    cfg.faults.pause = 1;
    let checker = check("pause", cfg);
    // The Jepsen case: a client checks its lease, pauses past it, and acts
    // while the next holder acts.
    found(&checker, &[MUTUAL_EXCLUSION, REFUSED]);
    holds(
        &checker,
        &[TOKENS_RISE, FENCED_RESOURCE, FIFO, NO_GRANT_AFTER_NO],
    );
}

#[test]
fn a_failover_without_wait_breaks_exclusion_but_tokens_still_rise() {
    let mut cfg = Config {
        max_time: 6,
        ..Config::small(1)
    };
    cfg.faults.failover = 1;
    let checker = check("failover", cfg);
    found(&checker, &[MUTUAL_EXCLUSION, TOKEN_AFTER_LOSS, REFUSED]);
    holds(&checker, &[TOKENS_RISE, FENCED_RESOURCE, NO_GRANT_AFTER_NO]);
}

#[test]
fn a_restart_without_persistence_breaks_exclusion_but_tokens_still_rise() {
    let mut cfg = Config {
        max_time: 6,
        ..Config::small(1)
    };
    cfg.faults.restart_empty = 1;
    let checker = check("restart empty", cfg);
    found(&checker, &[MUTUAL_EXCLUSION, TOKEN_AFTER_LOSS, REFUSED]);
    holds(&checker, &[TOKENS_RISE, FENCED_RESOURCE, NO_GRANT_AFTER_NO]);
}

#[test]
fn tokens_repeat_only_when_the_clock_stands_still_across_a_failover() {
    // What `next_token` assumes: the Redis clock moves on (by at least a
    // millisecond) between the last write the replica got and the first
    // grant after the failover. Without that, a token is handed out twice.
    let mut cfg = Config::small(1);
    cfg.faults.failover = 1;
    cfg.faults.failover_same_tick = true;
    let checker = check("failover within a tick", cfg);
    found(&checker, &[TOKENS_RISE, FENCED_RESOURCE]);
}

/// A session client (0) and a plain one (1).
fn sessions(crash: u8, end_awaits_renewals: bool) -> Config {
    let mut cfg = Config {
        sessions: vec![true, false],
        end_awaits_renewals,
        ..Config::small(1)
    };
    cfg.faults.crash = crash;
    cfg
}

/// Every safety property but the one about renewals after the end.
const SAFETY_BUT_RENEWAL: [&str; 7] = [
    MUTUAL_EXCLUSION,
    TOKENS_RISE,
    FENCED_RESOURCE,
    FIFO,
    NO_GRANT_AFTER_NO,
    NO_DUPLICATE_GRANT,
    NO_EMPTY_LOCK,
];

#[test]
fn without_the_wait_a_renewal_in_flight_can_land_after_its_session_ended() {
    // Finding 1 (SAFETY.md, invariant 10), the engine before the fix: it
    // stopped renewing a session's grants when the session ended but did
    // not wait for the renewal already sent; Redis could run it after
    // session_end. The release that follows the end removes the grant (if
    // the replica lives to send it; otherwise the grant lives one TTL past
    // the end).
    let checker = check("sessions", sessions(0, false));
    found(
        &checker,
        &[NO_RENEWAL_AFTER_END, SESSION_ENDED, WRITTEN, WAITER_GRANTED],
    );
    holds(&checker, &SAFETY_BUT_RENEWAL);
}

#[test]
fn an_end_that_awaits_the_renewal_in_flight_is_never_followed_by_one() {
    // The fix (the engine's `Sessions::settled`), checked with a replica
    // crash too.
    let checker = check("sessions, end after renewals", sessions(0, true));
    holds(&checker, &SAFETY);
    found(&checker, &[SESSION_ENDED]);
    // A resumed session keeps its grant and its token.
    let checker = check("sessions, end after renewals, a crash", sessions(1, true));
    holds(&checker, &SAFETY);
    found(&checker, &[RESUMED, SESSION_ENDED]);
}

/// Waits longer than the run (no timeouts), two requests per client, a
/// lost wake-up; the liveness bound `within` checked.
fn liveness(within: u8) -> Config {
    let mut cfg = Config {
        wait: 20,
        max_time: 8,
        rounds: 2,
        served_within: within,
        ..Config::small(1)
    };
    cfg.faults.lose_wake = 1;
    cfg
}

#[test]
fn a_waiter_that_keeps_refreshing_is_served_within_a_lease_and_a_tick() {
    // With a lease of 2 ticks: the holder ahead releases or its lease
    // passes (2), and a lost wake-up is made good by the next refresh (1).
    let checker = check("liveness", liveness(3));
    holds(&checker, &[SERVED_IN_TIME, MUTUAL_EXCLUSION, FIFO]);
    found(&checker, &[WAITER_GRANTED, WAKE_LOST]);
    // The bound is tight: one tick less and the checker finds a waiter
    // still waiting (so the property is not vacuous).
    let checker = check("liveness, a tick less", liveness(2));
    found(&checker, &[SERVED_IN_TIME]);
}

#[test]
fn a_counterexample_reads_as_the_redis_calls_it_makes() {
    // The input of the replay against real functions (SAFETY.md, "Next"):
    // the pause counterexample is an acquire granted, a second one
    // queued, the lease passing, the waiter granted with a higher token.
    let mut cfg = Config::small(1);
    cfg.faults.pause = 1;
    let checker = cfg.clone().checker().spawn_bfs().join();
    let path = checker.assert_any_discovery(MUTUAL_EXCLUSION).into_vec();
    let steps = tumbler_model::trace::trace(&cfg, &path);
    let tokens: Vec<u32> = (steps.iter())
        .filter_map(|step| match step {
            Step::Function {
                reply: Some(Reply::Acquired { token, .. }),
                ..
            } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens.len(), 2, "{steps:#?}");
    assert!(tokens[0] < tokens[1]);
    assert!(steps.iter().any(|s| matches!(
        s,
        Step::Function {
            reply: Some(Reply::Queued { .. }),
            ..
        }
    )));
    assert!(steps.contains(&Step::Tick));
}

#[test]
fn a_late_dequeue_of_an_earlier_request_leaves_the_holders_new_place() {
    // Finding 6 (SAFETY.md), fixed: a dequeue sent when the holder's
    // earlier request timed out, still in flight (its replica crashed),
    // names that request; the holder's next request took the place over
    // under its own name, so the late dequeue leaves it alone and FIFO
    // holds (before the fix the checker found it broken here).
    let mut cfg = Config {
        rounds: 2,
        wait: 1,
        ttl: 3,
        max_time: 4,
        ..Config::small(1)
    };
    cfg.faults.crash = 1;
    let checker = check("late dequeue", cfg);
    holds(&checker, &SAFETY);
}

#[test]
fn a_client_that_gives_up_on_a_release_and_asks_again_can_lose_the_grant_it_is_told_it_holds() {
    // Finding 5 (SAFETY.md): the release's answer is lost with its
    // replica; a client that goes on and acquires again under the same
    // holder id is answered HELD, then the late release removes that grant
    // and another client is granted. The fence still holds. Clients that
    // retry the release until they get an answer (the default here, and
    // the Rust client's) keep mutual exclusion.
    let no_retry = |retry_release| {
        let mut cfg = Config {
            rounds: 2,
            max_time: 3,
            retry_release,
            ..Config::small(1)
        };
        cfg.faults.crash = 1;
        cfg
    };
    let checker = check("a release given up", no_retry(false));
    found(&checker, &[MUTUAL_EXCLUSION]);
    holds(&checker, &[TOKENS_RISE, FENCED_RESOURCE, NO_GRANT_AFTER_NO]);
    let checker = check("a release retried", no_retry(true));
    holds(&checker, &SAFETY);
}

#[test]
fn a_read_write_lock_never_lets_a_writer_share_it() {
    use Mode::{Read, Write};
    // A writer and two readers: readers share, a reader waits behind a
    // waiting writer (fairness), the writer downgrades and a reader joins.
    let checker = check("read/write", Config::read_write([Write, Read, Read], false));
    holds(&checker, &safety_and(&[RW_EXCLUSION]));
    found(
        &checker,
        &[
            READERS_SHARE,
            READER_BEHIND_WRITER,
            DOWNGRADE_SHARED,
            WAITER_GRANTED,
            FULL,
        ],
    );
    // Two writers and a reader: writers exclude each other too.
    let checker = check(
        "read/write, two writers",
        Config::read_write([Write, Read, Write], false),
    );
    holds(&checker, &safety_and(&[RW_EXCLUSION]));
    found(
        &checker,
        &[READER_BEHIND_WRITER, DOWNGRADE_SHARED, WAITER_GRANTED],
    );
}

#[test]
fn the_hand_over_keeps_every_invariant_without_faults() {
    // Decision 68: the release grants the head itself and publishes the
    // grant. A mutex (two requests each, extends, the reaper, 6 ticks)...
    let cfg = Config {
        hand_over: true,
        ..Config::mutex()
    };
    let checker = check("hand-over", cfg);
    holds(&checker, &SAFETY);
    holds(&checker, &[NO_HAND_TO_DEAD, NO_HAND_PAST_DEADLINE]);
    found(&checker, &[HANDED, TAKEN_UP, WAITER_GRANTED, WRITTEN]);
    // ... and a read/write lock: the hand-over stops at a head that does
    // not fit, and a downgrade hands the readers behind it their grants.
    use Mode::{Read, Write};
    let checker = check(
        "hand-over, read/write",
        Config::read_write([Write, Read, Read], true),
    );
    holds(&checker, &safety_and(&[RW_EXCLUSION]));
    found(&checker, &[HANDED, DOWNGRADE_SHARED, READER_BEHIND_WRITER]);
}

#[test]
fn with_the_hand_over_a_dead_replicas_waiter_keeps_the_lock_no_longer_than_its_request_ttl() {
    // Decision 68's amendment (SAFETY.md, invariant 7): a waiter whose
    // replica died within its request TTL is not known dead, and a
    // release hands it the lock (the checker finds it). Decision 89: that
    // grant is provisional up to the request's liveness deadline, which
    // only a live replica renews; a live replica takes it up before it
    // answers. Before 89 the checker found the lock kept for a lease, and
    // FIFO broken twice over: a holder's earlier request landing late (its
    // replica crashed) took the place over with its earlier answer-by and
    // was dropped as late while the later request waited; and a grant
    // handed to the dead replica's request lapsed while the holder's live
    // request, its wake-up lost, had not called yet. Now the later request
    // keeps its name, and an unclaimed handed grant lives on while a live
    // replica renews its holder's request: FIFO and every other safety
    // property hold.
    let faults = Faults {
        crash: 1,
        lose_wake: 1,
        duplicate_wake: 1,
        ..Faults::default()
    };
    let cfg = Config {
        faults,
        reap: true,
        rounds: 2,
        hand_over: true,
        ..Config::small(1)
    };
    let checker = check("hand-over, crash and wake-ups", cfg);
    found(
        &checker,
        &[NO_HAND_TO_DEAD, HANDED, TAKEN_UP, DEAD_WAITER, WAKE_LOST],
    );
    holds(&checker, &SAFETY);
    holds(&checker, &[NO_HAND_PAST_TTL, NO_HAND_PAST_DEADLINE]);
}

#[test]
fn a_release_by_the_waiters_own_replica_hands_it_the_whole_lease() {
    // Decision 90: a release says when its replica has a request waiting
    // on the lock, and a grant handed to that request is whole: the lease
    // asked, past the request's liveness deadline, since the replica making
    // the call is alive. Three clients on two replicas (0 and 2 share
    // replica 0), a lease longer than the request TTL, a crash: a waiter of
    // another replica still gets a provisional grant and takes it up, and
    // every safety property holds, FIFO with them.
    let cfg = Config {
        clients: 3,
        ttl: 3,
        hand_over: true,
        faults: Faults {
            crash: 1,
            ..Faults::default()
        },
        ..Config::small(1)
    };
    let checker = check("hand-over, a replica's own waiter", cfg);
    holds(&checker, &SAFETY);
    holds(&checker, &[NO_HAND_PAST_TTL, NO_HAND_PAST_DEADLINE]);
    found(&checker, &[HANDED_WHOLE, TAKEN_UP, HANDED]);
}

#[test]
fn a_read_write_path_reads_as_calls_with_their_modes() {
    // The replay's input for read/write (tests/locks/model_replay.rs): the
    // checker's example of a downgrade a reader joins is the writer's
    // acquire WRITE, a reader's acquire READ queued, the writer's acquire
    // READ answered OK with its own token, and the reader granted.
    use Mode::{Read, Write};
    let cfg = Config::read_write([Write, Read, Read], false);
    let path = tumbler_model::trace::discovery(&cfg, DOWNGRADE_SHARED).unwrap();
    let steps = tumbler_model::trace::trace(&cfg, &path);
    let acquires: Vec<(u8, Option<Mode>, Reply)> = (steps.iter())
        .filter_map(|step| match step {
            Step::Function {
                function: "acquire",
                client,
                mode,
                reply: Some(reply),
                ..
            } => Some((*client, *mode, *reply)),
            _ => None,
        })
        .collect();
    let written = acquires.iter().find_map(|a| match a {
        (0, Some(Write), Reply::Acquired { token, .. }) => Some(*token),
        _ => None,
    });
    let downgraded = acquires.iter().find_map(|a| match a {
        (0, Some(Read), Reply::Downgraded { token, .. }) => Some(*token),
        _ => None,
    });
    assert!(written.is_some() && written == downgraded, "{acquires:#?}");
    assert!(
        (acquires.iter()).any(|a| matches!(a, (1 | 2, Some(Read), Reply::Acquired { .. }))),
        "{acquires:#?}"
    );
}

#[test]
fn weighted_permits_never_sum_past_the_limit() {
    // Fair: a head of two permits waits while one is free, and the
    // request of one behind it waits too (FIFO); the head is granted once
    // enough are free.
    let checker = check("weighted", Config::weighted(false));
    holds(&checker, &safety_and(&[PERMITS_WITHIN_LIMIT]));
    found(
        &checker,
        &[BIG_HEAD_WAITS, WEIGHTED_WAITER_GRANTED, FULL, QUEUED],
    );
    // The request of one barges: it takes a free permit past the head.
    let checker = check("weighted, barging", Config::weighted(true));
    holds(&checker, &safety_and(&[PERMITS_WITHIN_LIMIT]));
    found(
        &checker,
        &[BARGER_PASSES_BIG_HEAD, WEIGHTED_WAITER_GRANTED, FULL],
    );
    // With the hand-over: a head of two is handed its permits only when
    // both are free.
    let cfg = Config {
        hand_over: true,
        ..Config::weighted(false)
    };
    let checker = check("weighted, hand-over", cfg);
    holds(&checker, &safety_and(&[PERMITS_WITHIN_LIMIT]));
    found(&checker, &[HANDED, WEIGHTED_WAITER_GRANTED, BIG_HEAD_WAITS]);
}

/// The election's properties (terms: `TOKENS_RISE` as Redis mints them,
/// `TERMS_RISE` as leaders are told them).
const ELECTION_SAFETY: [&str; 6] = [
    ONE_LEADER,
    TOKENS_RISE,
    TERMS_RISE,
    NO_LAPSED_ACT,
    FENCED_RESOURCE,
    NO_GRANT_AFTER_NO,
];

#[test]
fn an_election_has_one_leader_rising_terms_and_no_act_under_a_lapsed_term() {
    let checker = check("election", Config::election(0));
    holds(&checker, &ELECTION_SAFETY);
    holds(&checker, &SAFETY);
    found(&checker, &[PROCLAIMED, WAITER_GRANTED]);
    // A leader that pauses past its lease still believes it leads when
    // the next is elected (the Jepsen case: two leaders), but its
    // proclaim under the lapsed term is refused and its write fenced.
    let checker = check("election, a pause", Config::election(1));
    found(&checker, &[ONE_LEADER, PROCLAIM_REFUSED, REFUSED]);
    holds(
        &checker,
        &[
            TOKENS_RISE,
            TERMS_RISE,
            NO_LAPSED_ACT,
            FENCED_RESOURCE,
            FIFO,
        ],
    );
}

#[test]
fn a_reader_that_prefers_readers_passes_a_waiting_writer_and_never_shares_with_it() {
    // Limit 2: while a reader holds and the writer waits, the fair reader
    // waits behind the writer and the preferring one comes in.
    let checker = check("prefer readers", Config::prefer_readers(2));
    holds(&checker, &safety_and(&[RW_EXCLUSION]));
    found(
        &checker,
        &[READER_PASSES_WRITER, READER_BEHIND_WRITER, READERS_SHARE],
    );
    // Limit 1: the preferring reader waits in the queue behind the
    // writer; the release wakes the head and the barging waiters, and the
    // preferring reader may come in first.
    let checker = check("prefer readers, limit 1", Config::prefer_readers(1));
    holds(&checker, &safety_and(&[RW_EXCLUSION]));
    found(&checker, &[WOKEN_READER_PASSES_WRITER]);
}

/// Every safety property, and invariant 15's.
fn multi_safety() -> Vec<&'static str> {
    safety_and(&[
        NO_PARTIAL_SET,
        PARTIAL_WITHIN_LEASE,
        NO_NEWER_GRANT_RELEASED,
    ])
}

/// The same but `NO_PARTIAL_SET` (a part held alone past the
/// reservation), for the configurations whose faults reach it.
fn multi_safety_but_partial() -> Vec<&'static str> {
    safety_and(&[PARTIAL_WITHIN_LEASE, NO_NEWER_GRANT_RELEASED])
}

#[test]
fn a_multi_lock_in_one_call_is_never_held_in_part() {
    // Invariant 15 on one server (decision 76): client 0 asks locks 0
    // and 1 in one acquire_many, client 1 lock 1, client 2 lock 0; every
    // lock counts the set's holder. Granted whole or refused with nothing
    // held, waiting on wake-up places; released whole (release_many) and
    // extended whole (extend_many, once), each lock pinned to its token:
    // no part is ever held alone.
    let checker = check("multi", Config::multi(0, true, 0));
    holds(&checker, &multi_safety());
    holds(&checker, &[NO_SELF_WAKE]);
    found(
        &checker,
        &[
            SET_GRANTED,
            SET_REFUSED_EMPTY,
            WAITER_GRANTED,
            QUEUED,
            SET_EXTENDED,
        ],
    );
    // One call per extend: it never finds a part lapsed beside a live one.
    assert!(checker.discovery(SET_EXTEND_BROKEN).is_none());
    // A crash with requests that try once: calls of its replica may
    // still land, answered to nobody.
    let cfg = Config {
        wait: 0,
        set_extends: 0,
        ..Config::multi(0, false, 1)
    };
    let checker = check("multi, a crash", cfg);
    holds(&checker, &multi_safety());
    found(&checker, &[SET_GRANTED, SET_REFUSED_EMPTY]);
}

#[test]
fn on_one_server_a_crash_within_a_sets_extend_or_release_leaves_no_part_alone() {
    // Findings 11 and 12, fixed on one server: the set's extend is one
    // extend_many and its release one release_many. A crash orphans the
    // whole call or none of it (finding 11: no lock extended without the
    // other); an earlier request's orphaned acquire_many, made again
    // after the crash, lands before the set's release or after it, never
    // between two locks' releases (finding 12: no lock granted anew
    // beside a lock about to be released). With the strict rule (a part
    // excused only while the set's release is unanswered, never past the
    // reservation, here 0), no part is ever held alone.
    let cfg = Config::multi(0, false, 1);
    let checker = check("multi, extends, a crash", cfg);
    holds(&checker, &multi_safety());
    found(
        &checker,
        &[
            SET_GRANTED,
            SET_EXTENDED,
            SET_REFUSED_EMPTY,
            QUEUED,
            LATE_SET_REQUEST,
        ],
    );
    assert!(checker.discovery(SET_EXTEND_CUT).is_none());
    assert!(checker.discovery(SET_EXTEND_BROKEN).is_none());
}

#[test]
fn on_the_cluster_path_a_crash_within_a_sets_extend_leaves_a_part_alone_at_most_a_lease() {
    // Finding 11 where it remains: on the Cluster path the set's extend is
    // one extend_many per slot group (lock 0, then lock 1). The replica
    // crashes after lock 0's, lock 1's is orphaned (it lands a tick
    // later, or never): one lock's lease ends before the other's, which
    // stays held alone past the reservation (decision 76's window), never
    // past the lease. (Requests try once.)
    let cfg = Config {
        wait: 0,
        ..Config::multi(1, false, 1)
    };
    let checker = check("multi, cluster, extends, a crash", cfg);
    found(
        &checker,
        &[SET_EXTEND_CUT, NO_PARTIAL_SET, SET_EXTENDED, SET_GRANTED],
    );
    holds(&checker, &multi_safety_but_partial());
}

#[test]
fn a_late_set_release_pinned_to_its_tokens_never_takes_the_next_set() {
    // Finding 10: the set's holder sends its release_many, its replica
    // crashes with it in flight, the client releases again through the
    // other replica and takes the set again; the orphaned release lands
    // last. Pinned to the old set's tokens (the default, as the clients
    // send `fencing_tokens`), it answers NOT_HELD for each lock and
    // leaves the new grants: no release takes a newer grant, no part is
    // held alone, mutual exclusion holds.
    let checker = check(
        "multi, taken again",
        Config::multi_retake(false, RETAKE_TICKS),
    );
    holds(&checker, &multi_safety());
    found(&checker, &[STALE_SET_RELEASE_LEFT, SET_GRANTED]);
    // A caller that sends no tokens: the late release takes the new set,
    // the client of lock 1 is granted it while the set's holder believes
    // it holds both (the limit "Not promised" names). The fence still
    // holds. The check must find it, or the pinned run above proves
    // nothing.
    let checker = check(
        "multi, taken again, unpinned",
        Config::multi_retake(true, RETAKE_TICKS),
    );
    found(&checker, &[MUTUAL_EXCLUSION, NO_NEWER_GRANT_RELEASED]);
    holds(
        &checker,
        &[
            TOKENS_RISE,
            FENCED_RESOURCE,
            NO_GRANT_AFTER_NO,
            NO_EMPTY_LOCK,
        ],
    );
}

/// The clock's bound of finding 10's configuration: enough for a set, its
/// release, the crash and the set again.
const RETAKE_TICKS: u8 = 3;

#[test]
fn a_sets_extend_with_slow_calls_lets_go_of_the_rest_only_on_the_cluster_path() {
    // Calls slower than a tick. On one server the set's locks are granted
    // and extended in one call each, so their leases end together: an
    // extend that lands late finds both lapsed, never one beside a live
    // one, and no part is held alone.
    let mut cfg = Config::multi(0, false, 0);
    cfg.faults.slow_network = true;
    let checker = check("multi, extends, slow network", cfg);
    holds(&checker, &multi_safety());
    found(&checker, &[SET_EXTENDED, SET_GRANTED]);
    assert!(checker.discovery(SET_EXTEND_BROKEN).is_none());
    // On the Cluster path each lock is extended to the lease by its own
    // call: lock 0's extend_many runs, lock 1's lands after its lease
    // ended and answers NOT_HELD; lock 0 is released (pinned to its
    // token), held alone until then: past the reservation, never past
    // the lease.
    let mut cfg = Config {
        wait: 0,
        ..Config::multi(1, false, 0)
    };
    cfg.faults.slow_network = true;
    let checker = check("multi, cluster, extends, slow network", cfg);
    found(
        &checker,
        &[SET_EXTEND_BROKEN, SET_EXTENDED, NO_PARTIAL_SET, PART_LAPSED],
    );
    holds(&checker, &multi_safety_but_partial());
}

#[test]
fn on_the_cluster_path_a_crash_leaves_a_reservation_or_between_the_extends_a_lease() {
    // The slot-group path (decision 76): lock 0, then lock 1, each
    // reserved for a tick, then each extended to the lease (3 ticks);
    // refused at lock 1, lock 0 goes back (pinned to its token).
    let checker = check("multi, cluster", Config::multi(1, true, 0));
    holds(&checker, &multi_safety());
    found(
        &checker,
        &[SET_GRANTED, SET_REFUSED_EMPTY, WAITER_GRANTED, SET_EXTENDED],
    );
    // Refused at lock 1 while a single request waits on lock 0, the
    // rollback's release wakes the set's own wait (finding 9).
    found(&checker, &[NO_SELF_WAKE]);
    // A crash between the groups leaves lock 0 to its reservation, which
    // lapses; a crash between the two extends leaves lock 0 extended to
    // the lease and lock 1 to its reservation: a part held alone past
    // the reservation (decision 76 says so), never past the lease.
    let checker = check("multi, cluster, a crash", Config::multi(1, false, 1));
    found(&checker, &[NO_PARTIAL_SET, PART_LAPSED, SET_GRANTED]);
    holds(
        &checker,
        &[
            PARTIAL_WITHIN_LEASE,
            MUTUAL_EXCLUSION,
            TOKENS_RISE,
            FENCED_RESOURCE,
            FIFO,
            NO_GRANT_AFTER_NO,
            NO_EMPTY_LOCK,
        ],
    );
}
