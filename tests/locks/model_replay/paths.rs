//! The model's paths of each primitive replayed (`super`'s machinery):
//! the hand-over, the pause counterexample, read/write locks, weighted
//! permits, elections, `prefer_readers`, multi-locks and their held sets'
//! release and extend, and a request's dead place.

use super::*;

/// The hand-over, the default (decisions 68 and 89): the checker's
/// examples of a grant handed over, of a provisional one taken up (HELD,
/// with the lease asked) and of one handed to a dead replica's waiter
/// (provisional, it lapses by that request's liveness deadline), then
/// random paths with a crash and lost or duplicated wake-ups: the real
/// functions hand over the same grants, with rising tokens, and leave the
/// model's grants.
#[tokio::test]
async fn hand_over_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{HANDED, HANDED_WHOLE, NO_HAND_TO_DEAD, TAKEN_UP};
    let _turn = ONE_AT_A_TIME.lock().await;
    let plain = Config {
        hand_over: true,
        ..Config::mutex()
    };
    let crash = Config {
        hand_over: true,
        reap: true,
        rounds: 2,
        faults: Faults {
            crash: 1,
            ..Faults::default()
        },
        ..Config::small(1)
    };
    let faults = Config {
        faults: Faults {
            crash: 1,
            lose_wake: 1,
            duplicate_wake: 1,
            ..Faults::default()
        },
        ..crash.clone()
    };
    let mut seen = Vec::new();
    for name in [HANDED, TAKEN_UP] {
        let path = trace::discovery(&plain, name).unwrap();
        seen.extend(replay_to_grants(&plain, &path).await);
    }
    let path = trace::discovery(&crash, NO_HAND_TO_DEAD).unwrap();
    seen.extend(replay_to_grants(&crash, &path).await);
    for seed in 0..3 {
        for cfg in [&plain, &faults] {
            let path = trace::random_walk(cfg, 900 + seed, 200);
            seen.extend(replay_to_grants(cfg, &path).await);
        }
    }
    // A release by the waiter's own replica hands it the whole lease
    // (decision 0090): three clients on two replicas, a lease longer than
    // the request TTL.
    let own = Config {
        clients: 3,
        ttl: 3,
        hand_over: true,
        ..Config::small(1)
    };
    let path = trace::discovery(&own, HANDED_WHOLE).unwrap();
    seen.extend(replay_to_grants(&own, &path).await);
    // Grants handed over, taken up (HELD) and queued waiters.
    for code in [HANDED_OVER, 2, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
}

#[tokio::test]
async fn the_pause_counterexample_happens_on_the_real_functions() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut cfg = Config::small(1);
    cfg.faults.pause = 1;
    let path = trace::discovery(&cfg, tumbler_model::properties::MUTUAL_EXCLUSION).unwrap();
    let seen = replay(&cfg, &path).await;
    // Two grants (the second while the first holder, paused, still acts).
    assert_eq!(seen.iter().filter(|&&c| c == 1).count(), 2, "{seen:?}");
}

#[tokio::test]
async fn read_write_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{DOWNGRADE_SHARED, READER_BEHIND_WRITER, READERS_SHARE};
    let _turn = ONE_AT_A_TIME.lock().await;
    // A writer and two readers on a read/write lock of limit 2; the
    // writer may downgrade.
    let cfg = Config::read_write([Mode::Write, Mode::Read, Mode::Read], false);
    let mut seen = Vec::new();
    // The checker's examples: readers sharing, a reader queued behind a
    // waiting writer while readers hold, a downgrade a reader joins.
    for name in [READERS_SHARE, READER_BEHIND_WRITER, DOWNGRADE_SHARED] {
        let path = trace::discovery(&cfg, name).unwrap();
        seen.extend(replay(&cfg, &path).await);
    }
    for seed in 0..4 {
        let path = trace::random_walk(&cfg, 300 + seed, 200);
        seen.extend(replay(&cfg, &path).await);
    }
    // Grants (the downgrade's OK among them) and queued waiters.
    for code in [1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
    assert!(seen.len() > 30, "only {} calls compared", seen.len());
}

/// Replays the checker's example of each property of `names` and random
/// paths (seeds from `seed`) of `cfg`; the statuses compared.
async fn examples_and_walks(cfg: &Config, names: &[&'static str], seed: u64) -> Vec<i64> {
    let mut seen = Vec::new();
    for name in names {
        let path = trace::discovery(cfg, name).unwrap();
        seen.extend(replay(cfg, &path).await);
    }
    for n in 0..4 {
        let path = trace::random_walk(cfg, seed + n, 200);
        seen.extend(replay(cfg, &path).await);
    }
    seen
}

#[tokio::test]
async fn weighted_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{
        BARGER_PASSES_BIG_HEAD, BIG_HEAD_WAITS, WEIGHTED_WAITER_GRANTED,
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    // A big head waiting with a small fair request behind it, a waiter of
    // two granted; then a barging request of one passing the big head.
    let mut seen = examples_and_walks(
        &Config::weighted(false),
        &[BIG_HEAD_WAITS, WEIGHTED_WAITER_GRANTED],
        400,
    )
    .await;
    seen.extend(examples_and_walks(&Config::weighted(true), &[BARGER_PASSES_BIG_HEAD], 500).await);
    for code in [1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
    assert!(seen.len() > 30, "only {} calls compared", seen.len());
}

#[tokio::test]
async fn election_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{PROCLAIM_REFUSED, PROCLAIMED, WAITER_GRANTED};
    let _turn = ONE_AT_A_TIME.lock().await;
    // A proclaim applied, and a resign handing over to the next
    // candidate; then a lapsed leader's proclaim refused (NOT_HELD).
    let mut seen =
        examples_and_walks(&Config::election(0), &[PROCLAIMED, WAITER_GRANTED], 600).await;
    let refused = examples_and_walks(&Config::election(1), &[PROCLAIM_REFUSED], 700).await;
    assert!(refused.contains(&8), "no NOT_HELD among {refused:?}");
    seen.extend(refused);
    for code in [1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
}

#[tokio::test]
async fn prefer_readers_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{READER_PASSES_WRITER, WOKEN_READER_PASSES_WRITER};
    let _turn = ONE_AT_A_TIME.lock().await;
    // The preferring reader granted past a waiting writer, directly
    // (limit 2) and after waiting in the queue itself (limit 1).
    let mut seen =
        examples_and_walks(&Config::prefer_readers(2), &[READER_PASSES_WRITER], 800).await;
    seen.extend(
        examples_and_walks(
            &Config::prefer_readers(1),
            &[WOKEN_READER_PASSES_WRITER],
            900,
        )
        .await,
    );
    for code in [1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
}

#[tokio::test]
async fn multi_lock_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{
        NO_PARTIAL_SET, PART_LAPSED, SET_GRANTED, SET_REFUSED_EMPTY, WAITER_GRANTED,
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    // One call for the set: granted whole, refused with nothing held
    // (its wake-up places left, then woken), a single waiter granted.
    let mut seen = examples_and_walks(
        &Config::multi(0, true, 0),
        &[SET_GRANTED, SET_REFUSED_EMPTY, WAITER_GRANTED],
        1000,
    )
    .await;
    // The Cluster path: reservations, extends, a rollback; with a crash,
    // a part lapsing with its reservation, and the checker's path of a
    // crash between the two extends (a part held alone past its
    // reservation).
    seen.extend(
        examples_and_walks(
            &Config::multi(1, true, 0),
            &[SET_GRANTED, SET_REFUSED_EMPTY],
            1100,
        )
        .await,
    );
    seen.extend(
        examples_and_walks(
            &Config::multi(1, false, 1),
            &[PART_LAPSED, NO_PARTIAL_SET],
            1200,
        )
        .await,
    );
    for code in [1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
    assert!(seen.len() > 50, "only {} calls compared", seen.len());
}

#[tokio::test]
async fn set_release_and_extend_model_paths_get_the_replies_the_model_expects() {
    use tumbler_model::properties::{
        LATE_SET_REQUEST, MUTUAL_EXCLUSION, SET_EXTEND_CUT, SET_EXTENDED, SET_GRANTED,
        STALE_SET_RELEASE_LEFT,
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    // Finding 10's path with the set's release pinned to its tokens: the
    // orphaned release_many lands after the holder took the set again;
    // the real one, pinned to the old tokens, answers NOT_HELD and the
    // new grants stay (each one's real token in the lock, as the model
    // has it).
    let pinned = Config::multi_retake(false, 3);
    let path = trace::discovery(&pinned, STALE_SET_RELEASE_LEFT).unwrap();
    let left = replay_to_grants(&pinned, &path).await;
    assert!(left.contains(&8), "no NOT_HELD among {left:?}");
    // A caller that sends no tokens: the same late release takes the new
    // set (answered OK) and the client of lock 1 is granted lock 1; the
    // real lock 1 ends with that client's grant.
    let unpinned = Config::multi_retake(true, 3);
    let path = trace::discovery(&unpinned, MUTUAL_EXCLUSION).unwrap();
    let mut seen = replay_to_grants(&unpinned, &path).await;
    // On one server a set's extend is one extend_many and its release one
    // release_many, each lock pinned to its token: no single lock's
    // extend.lua or release.lua in the path.
    let cfg = Config::multi(0, true, 0);
    for name in [SET_EXTENDED, SET_GRANTED] {
        let path = trace::discovery(&cfg, name).unwrap();
        let steps = trace::trace(&cfg, &path);
        let count = |f: &str| {
            (steps.iter())
                .filter(|s| matches!(s, Step::Function { function, .. } if *function == f))
                .count()
        };
        if name == SET_EXTENDED {
            assert_eq!(count("extend_many"), 1, "a set's extend is one call");
        }
        assert_eq!(count("extend") + count("release"), 0, "{steps:#?}");
        seen.extend(replay_to_grants(&cfg, &path).await);
    }
    // Finding 12's first step on one server: the earlier request's
    // orphaned acquire_many lands late, before the set's release_many or
    // after it, never between its locks.
    let crash = Config::multi(0, false, 1);
    let path = trace::discovery(&crash, LATE_SET_REQUEST).unwrap();
    seen.extend(replay_to_grants(&crash, &path).await);
    // Finding 11 where it remains, the Cluster path: extend_many of lock
    // 0's group, then the crash before lock 1's.
    let cluster = Config {
        wait: 0,
        ..Config::multi(1, false, 1)
    };
    let path = trace::discovery(&cluster, SET_EXTEND_CUT).unwrap();
    seen.extend(replay_to_grants(&cluster, &path).await);
    for seed in 0..4 {
        let path = trace::random_walk(&pinned, 1400 + seed, 200);
        seen.extend(replay_to_grants(&pinned, &path).await);
        let path = trace::random_walk(&cfg, 1500 + seed, 200);
        seen.extend(replay_to_grants(&cfg, &path).await);
        let path = trace::random_walk(&crash, 1600 + seed, 200);
        seen.extend(replay_to_grants(&crash, &path).await);
    }
    for code in [0, 1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
    assert!(seen.len() > 50, "only {} calls compared", seen.len());
}

#[tokio::test]
async fn a_request_that_can_only_queue_keeps_its_holders_dead_place() {
    use tumbler_model::properties::DEAD_PLACE_KEPT;
    let _turn = ONE_AT_A_TIME.lock().await;
    // acquire.lua step 3 (SAFETY.md, invariant 7): a request that cannot
    // be granted leaves dead waiters to the call that frees a permit, so
    // a new request of a holder whose replica died finds its dead entry
    // and keeps that place (the model used to purge it and queue the
    // request last). The checker's example, replayed: every status (the
    // order of the grants that follow) as the model says.
    let faults = Faults {
        crash: 1,
        ..Faults::default()
    };
    let cfg = Config {
        faults,
        rounds: 2,
        max_time: 6,
        ..Config::small(1)
    };
    let seen = examples_and_walks(&cfg, &[DEAD_PLACE_KEPT], 1300).await;
    assert!(seen.contains(&3), "no QUEUED among {seen:?}");
}
