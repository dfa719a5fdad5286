//! Multi-locks across Redis Cluster slots (decision 0076, invariant 15):
//! a set whose locks live in different slots is taken group by group in
//! one global order, each group a short reservation until every group is
//! held. Under contention a set is held whole or not at all; a replica
//! killed (SIGKILL) between two groups leaves its first groups to lapse
//! with their reservation, never with the full lease. A held set is
//! extended and released with one call per slot group (decision 0079).

use crate::common;

use std::time::Duration;

use common::topology::start_cluster;
use common::wait::{wait_for, wait_until_async};
use common::*;
use proto::AcquireStatus;
use proto::lock_service_client::LockServiceClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// The set's names: with 16 shards they fall in several slots, on more
/// than one node (checked by the tests).
const NAMES: [&str; 4] = ["ledger-a", "ledger-b", "ledger-c", "ledger-d"];

fn set(names: &[&str], holder: &str, ttl_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        ttl_ms: Some(ttl_ms),
        ..acquire("", holder)
    }
}

/// Every live grant of `names`: (name, holder, acquired_at, expires_at).
async fn grants_of(
    client: &mut LockServiceClient<Channel>,
    names: &[&str],
) -> Vec<(String, String, i64, i64)> {
    let mut grants = Vec::new();
    for name in names {
        let state = client.inspect(inspect(name)).await.unwrap().into_inner();
        for h in state.holders {
            let g = h.grant.unwrap();
            grants.push((
                name.to_string(),
                g.holder,
                g.acquired_at_ms,
                g.expires_at_ms,
            ));
        }
    }
    grants
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_spanning_slots_is_all_or_nothing_under_contention() {
    let server = TestServer::new().cluster().shards(16).start().await;
    let client = server.client().await;
    // The set spans nodes: its lock keys are on more than one.
    let reply = client
        .clone()
        .acquire(set(&NAMES, "probe", 30_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let nodes = (server.cluster().scan_each("tumbler:*:l:ledger-*").iter())
        .filter(|keys| !keys.is_empty())
        .count();
    assert!(nodes > 1, "the set spans slots on {nodes} node(s)");
    let release_all = proto::ReleaseRequest {
        names: NAMES.iter().map(|n| n.to_string()).collect(),
        ..release("", "probe")
    };
    client.clone().release(release_all).await.unwrap();

    let mut tasks = Vec::new();
    for caller in 0..4usize {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let holder = format!("c{caller}");
            let mut granted = 0;
            for round in 0..10usize {
                // Overlapping sets of three, in rotating orders.
                let mut names: Vec<&str> = NAMES.to_vec();
                names.rotate_left((caller + round) % 4);
                names.truncate(3);
                if round % 2 == 1 {
                    names.reverse();
                }
                let wait = if round % 3 == 0 { 0 } else { 3_000 };
                let request = proto::AcquireRequest {
                    wait_ms: wait,
                    ..set(&names, &holder, 30_000)
                };
                let reply = client.acquire(request).await.unwrap().into_inner();
                let mine = (grants_of(&mut client, &names).await.into_iter())
                    .filter(|(_, h, _, _)| *h == holder)
                    .count();
                if reply.status() == AcquireStatus::Acquired {
                    granted += 1;
                    assert_eq!(mine, 3, "{holder}: the whole set {names:?}");
                    let release_set = proto::ReleaseRequest {
                        names: names.iter().map(|n| n.to_string()).collect(),
                        ..release("", &holder)
                    };
                    let released = client.release(release_set).await.unwrap().into_inner();
                    assert_eq!(released.status(), proto::ReleaseStatus::Released);
                } else {
                    assert_eq!(mine, 0, "{holder}: refused, yet holds part of {names:?}");
                }
            }
            granted
        }));
    }
    let mut granted = 0;
    for task in tasks {
        granted += tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("no caller stuck")
            .unwrap();
    }
    assert!(granted > 0);
    assert!(grants_of(&mut client.clone(), &NAMES).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_between_the_groups_leaves_no_part_beyond_the_reservation() {
    let cluster = start_cluster();
    let url = cluster.url();
    let flags = ["--shards", "16", "--redis-timeout-ms", "500"];
    // This replica pauses 5 s between a set's groups (a debug build's
    // test hook), long enough to be killed there.
    let mut paused = TumblerProcess::spawn_with_env(
        &url,
        tumbler::dev::free_port().unwrap(),
        &flags,
        &[("TUMBLER_TEST_MULTI_PAUSE_MS", "5000")],
    );
    wait_for_health(&paused.endpoint, ServingStatus::Serving).await;
    let observer = TumblerProcess::start(&url, &flags).await;
    let mut watch = observer.client().await;

    let mut caller = paused.client().await;
    let ttl_ms = 60_000;
    let asking = tokio::spawn(async move { caller.acquire(set(&NAMES, "crashing", ttl_ms)).await });
    // The first group is held (as a reservation), the rest not yet.
    let part = wait_for("part of the set taken", Duration::from_secs(10), || {
        let mut watch = watch.clone();
        async move { Some(grants_of(&mut watch, &NAMES).await).filter(|part| !part.is_empty()) }
    })
    .await;
    assert!(part.len() < NAMES.len(), "a part only: {part:?}");
    for (name, holder, acquired, expires) in &part {
        assert_eq!(holder, "crashing");
        let lease = expires - acquired;
        assert!(
            lease <= 4_000,
            "{name}: a reservation, not the {ttl_ms} ms lease ({lease} ms)"
        );
    }
    paused.kill();
    let _ = asking.await;
    // The part lapses with its reservation: nothing is held well before
    // the full lease could end.
    let started = std::time::Instant::now();
    wait_until_async(
        "the crashed replica's part lapses",
        Duration::from_secs(10),
        || {
            let mut watch = watch.clone();
            async move { grants_of(&mut watch, &NAMES).await.is_empty() }
        },
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    // And the set is free for another caller.
    let reply = watch
        .acquire(set(&NAMES, "next", 10_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
}

/// A server on a cluster of its own with 16 shards, for counting
/// function calls: no health tick (it calls functions too).
async fn counting_cluster() -> TestServer {
    TestServer::new()
        .cluster()
        .args(counting_args())
        .shards(16)
        .start()
        .await
}

/// Function calls on every node of the cluster since `reset`.
async fn cluster_calls(server: &TestServer, reset: bool) -> u64 {
    let mut calls = 0;
    for node in &server.cluster().nodes {
        let mut conn = redis_conn(&node.url()).await;
        if reset {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn)
                .await
                .unwrap();
        } else {
            let counted = command_calls(&mut conn).await;
            calls += ["fcall", "fcall_ro"]
                .iter()
                .map(|name| counted.get(*name).copied().unwrap_or(0))
                .sum::<u64>();
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_set_is_extended_and_released_with_one_call_per_slot_group() {
    let server = counting_cluster().await;
    let mut client = server.client().await;
    // With 16 shards `ledger-x` shares `ledger-a`'s shard and `ledger-z`
    // `ledger-c`'s: six locks in fewer slot groups (checked below), so a
    // call per lock and a call per group differ.
    let names = [NAMES.as_slice(), &["ledger-x", "ledger-z"]].concat();
    let reply = client.acquire(set(&names, "me", 30_000)).await.unwrap();
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
    // The set's slot groups: its lock keys' distinct slots.
    let mut node = redis_conn(&server.cluster().nodes[0].url()).await;
    let mut slots = std::collections::BTreeSet::new();
    for keys in server.cluster().scan_each("tumbler:*:l:ledger-*") {
        for key in keys {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query_async(&mut node)
                .await
                .unwrap();
            slots.insert(slot);
        }
    }
    assert!(
        (2..names.len()).contains(&slots.len()),
        "the set spans {} slot(s)",
        slots.len()
    );
    let before = grants_of(&mut client, &names).await;
    cluster_calls(&server, true).await;
    let extend = proto::ExtendRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        holder: "me".into(),
        ttl_ms: Some(60_000),
        ..Default::default()
    };
    let extended = client.extend(extend.clone()).await.unwrap().into_inner();
    assert_eq!(extended.status(), proto::ExtendStatus::Extended);
    let extends = cluster_calls(&server, false).await;
    let after = grants_of(&mut client, &names).await;
    assert_eq!(after.len(), names.len());
    for (was, now) in before.iter().zip(&after) {
        assert!(now.3 > was.3 + 20_000, "{now:?} extended from {was:?}");
    }
    cluster_calls(&server, true).await;
    let release_all = proto::ReleaseRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        ..release("", "me")
    };
    let released = client.release(release_all).await.unwrap().into_inner();
    assert_eq!(released.status(), proto::ReleaseStatus::Released);
    let releases = cluster_calls(&server, false).await;
    assert_eq!(
        (extends, releases),
        (slots.len() as u64, slots.len() as u64),
        "one call per slot group, {} groups",
        slots.len()
    );
    assert!(grants_of(&mut client, &names).await.is_empty());

    // Broken in its last slot group (`ledger-d`, the highest slot): the
    // groups before it, extended already, are released again, and the
    // answer is NOT_HELD; nothing of the set is left held.
    let reply = client.acquire(set(&names, "me", 30_000)).await.unwrap();
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
    let gone = client.release(release("ledger-d", "me")).await.unwrap();
    assert_eq!(gone.into_inner().status(), proto::ReleaseStatus::Released);
    let extended = client.extend(extend).await.unwrap().into_inner();
    assert_eq!(extended.status(), proto::ExtendStatus::NotHeld);
    assert_eq!(grants_of(&mut client, &names).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_sleeps_until_its_busy_lock_changes() {
    let server = counting_cluster().await;
    let mut client = server.client().await;
    // `first` and `busy` held; the set waits (a wake-up place on each);
    // `first` is let go. For the pairs where `first` comes before `busy`
    // in slot order, the set then takes `first`'s group, is refused at
    // `busy`'s and rolls `first` back: a release on a lock where its own
    // place waits. Waking on that would retry the round at once, over and
    // over, until the wait ends (the protocol model's finding).
    for first in NAMES {
        for busy in NAMES.into_iter().filter(|n| *n != first) {
            for name in [first, busy] {
                let reply = client.acquire(acquire(name, "other")).await.unwrap();
                assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
            }
            let mut waiting = client.clone();
            let set_waits = tokio::spawn(async move {
                let request = proto::AcquireRequest {
                    wait_ms: 1_200,
                    ..set(&NAMES, "waiting-set", 30_000)
                };
                waiting.acquire(request).await.unwrap().into_inner()
            });
            // Its round refused, it waits: a place at the lock that refused it.
            wait_until_async("the set waits", Duration::from_secs(10), || {
                let mut client = client.clone();
                async move {
                    let mut places = 0;
                    for name in [first, busy] {
                        places += client
                            .inspect(inspect(name))
                            .await
                            .unwrap()
                            .into_inner()
                            .waiters;
                    }
                    places > 0
                }
            })
            .await;
            cluster_calls(&server, true).await;
            client.release(release(first, "other")).await.unwrap();
            let reply = set_waits.await.unwrap();
            assert_eq!(
                reply.reason(),
                proto::NotAcquiredReason::Timeout,
                "{reply:?}"
            );
            let calls = cluster_calls(&server, false).await;
            eprintln!("{first} freed, {busy} busy: {calls} function calls");
            // A round after the release: a call per group, the roll-back,
            // then refreshes and the places' removal: a handful, not a loop.
            assert!(
                calls < 40,
                "{first} freed, {busy} busy: {calls} function calls"
            );
            client.release(release(busy, "other")).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_set_across_slots_is_renewed_whole_and_released_by_close() {
    use common::session::Session;

    let server = TestServer::new().cluster().shards(16).start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 600).await;
    // The set spans slot groups: taken by reservations, then extended to
    // the session's lease, every lock the session's.
    let reply = session.acquire(1, set(&NAMES, "", 60_000)).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let nodes = (server.cluster().scan_each("tumbler:*:l:ledger-*").iter())
        .filter(|keys| !keys.is_empty())
        .count();
    assert!(nodes > 1, "the set spans slots on {nodes} node(s)");
    let tokens: Vec<(String, u64)> = (reply.grants.iter())
        .map(|g| (g.name.clone(), g.fencing_token))
        .collect();
    // Well past the session's lease (and any reservation), kept alive by
    // the session: every lock still the session's, same tokens.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        session.keep_alive().await;
    }
    for (name, token) in &tokens {
        let state = client.inspect(inspect(name)).await.unwrap().into_inner();
        let grants: Vec<(String, u64)> = (state.holders.into_iter())
            .map(|h| h.grant.unwrap())
            .map(|g| (g.holder, g.fencing_token))
            .collect();
        assert_eq!(grants, [(session.id.clone(), *token)], "{name}");
    }
    // Closing the session lets the whole set go.
    drop(session.commands);
    while session.events.message().await.ok().flatten().is_some() {}
    wait_until_async("the set is let go", Duration::from_secs(5), || {
        let mut client = client.clone();
        async move { grants_of(&mut client, &NAMES).await.is_empty() }
    })
    .await;
}
