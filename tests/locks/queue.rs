//! Fair queues and server-side waiting: FIFO and priority order, try-once
//! and barging, waiter liveness, cancellation, wake-ups across replicas and
//! at lease expiry, and no polling while waiting.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::wait::wait_until_async;
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, NotAcquiredReason, ReleaseStatus};
use redis::AsyncCommands;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;

pub(super) fn wait_for(name: &str, holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait_ms,
        ..acquire(name, holder)
    }
}

pub(super) async fn queue_of(client: &mut LockServiceClient<Channel>, name: &str) -> Vec<String> {
    let reply = client
        .queue(proto::QueueRequest {
            name: name.into(),
            max_entries: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    reply.requests.into_iter().map(|r| r.holder).collect()
}

/// Polls the Queue RPC until the lock has `n` live waiting requests.
pub(super) async fn until_queued(
    client: &mut LockServiceClient<Channel>,
    name: &str,
    n: usize,
) -> Vec<String> {
    for _ in 0..1000 {
        let queued = queue_of(client, name).await;
        if queued.len() == n {
            return queued;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} never had {n} waiting requests");
}

/// Starts a waiting Acquire in the background.
pub(super) fn spawn_wait(
    mut client: LockServiceClient<Channel>,
    request: proto::AcquireRequest,
) -> JoinHandle<Result<proto::AcquireResponse, tonic::Status>> {
    tokio::spawn(async move { client.acquire(request).await.map(|r| r.into_inner()) })
}

/// Queues `waiters` requests one after another (each visible in the queue
/// before the next starts), lets them all through, and returns holder ids
/// in the order they were granted (by fencing token: grant order).
async fn grant_order(limit: u32, waiters: usize) -> (Vec<String>, Vec<String>) {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let name = format!("fifo-{limit}");
    let take = |holder: &str, wait_ms| proto::AcquireRequest {
        limit: Some(limit),
        ..wait_for(&name, holder, wait_ms)
    };
    for i in 0..limit {
        client
            .acquire(take(&format!("first-{i}"), 0))
            .await
            .unwrap();
    }
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut queued_order = Vec::new();
    for i in 0..waiters {
        let holder = format!("waiter-{i:03}");
        let mut own = server.client().await;
        let request = take(&holder, 60_000);
        let (granted, lock_name) = (granted.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let reply = own.acquire(request).await.unwrap().into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired, "{holder}");
            let grant = reply.grant.unwrap();
            granted
                .lock()
                .await
                .push((grant.fencing_token, holder.clone()));
            let released = own
                .release(release(&lock_name, &holder))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(released.status(), ReleaseStatus::Released);
        }));
        queued_order = until_queued(&mut client, &name, i + 1).await;
    }
    for i in 0..limit {
        client
            .release(release(&name, &format!("first-{i}")))
            .await
            .unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut granted = granted.lock().await.clone();
    granted.sort();
    (queued_order, granted.into_iter().map(|(_, h)| h).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_get_a_mutex_in_arrival_order() {
    let (queued, granted) = grant_order(1, 100).await;
    let expected: Vec<String> = (0..100).map(|i| format!("waiter-{i:03}")).collect();
    assert_eq!(queued, expected, "the Queue RPC shows arrival order");
    assert_eq!(granted, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_of_four_keeps_arrival_order_for_a_hundred_waiters() {
    let (_, granted) = grant_order(4, 100).await;
    let expected: Vec<String> = (0..100).map(|i| format!("waiter-{i:03}")).collect();
    assert_eq!(granted, expected);
}

#[tokio::test]
async fn higher_priority_goes_first_and_fifo_within_a_priority() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("prio", "holder")).await.unwrap();
    let mut tasks = Vec::new();
    for (i, (holder, priority)) in [
        ("low-a", 0),
        ("high-a", 5),
        ("low-b", 0),
        ("high-b", 5),
        ("urgent", 9),
    ]
    .into_iter()
    .enumerate()
    {
        let request = proto::AcquireRequest {
            priority,
            ..wait_for("prio", holder, 30_000)
        };
        tasks.push((holder, spawn_wait(server.client().await, request)));
        until_queued(&mut client, "prio", i + 1).await;
    }
    let order = queue_of(&mut client, "prio").await;
    assert_eq!(order, ["urgent", "high-a", "high-b", "low-a", "low-b"]);
    let positions: Vec<u32> = client
        .queue(proto::QueueRequest {
            name: "prio".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .requests
        .iter()
        .map(|r| r.position)
        .collect();
    assert_eq!(positions, [1, 2, 3, 4, 5]);

    // Hand the lock down the line; each grant goes to the queue's head.
    let mut current = "holder".to_string();
    for expected in order {
        client.release(release("prio", &current)).await.unwrap();
        let (_, task) = tasks.iter_mut().find(|(h, _)| *h == expected).unwrap();
        let reply = task.await.unwrap().unwrap();
        assert_eq!(reply.grant.unwrap().holder, expected);
        current = expected.to_string();
    }
}

#[tokio::test]
async fn a_barging_waiter_overtakes_fair_ones() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("race", "holder")).await.unwrap();
    let fair = spawn_wait(server.client().await, wait_for("race", "fair", 30_000));
    until_queued(&mut client, "race", 1).await;
    let barging = spawn_wait(
        server.client().await,
        proto::AcquireRequest {
            fair: Some(false),
            ..wait_for("race", "barging", 30_000)
        },
    );
    until_queued(&mut client, "race", 2).await;
    // The release names the head ("fair"); its replica also wakes every
    // barging waiter of the lock, which may take the permit though it
    // came second. Whoever is first holds it; the other follows.
    client.release(release("race", "holder")).await.unwrap();
    let (mut fair, mut barging) = (fair, barging);
    let (first, second) = tokio::select! {
        reply = &mut fair => (("fair", reply.unwrap().unwrap()), barging),
        reply = &mut barging => (("barging", reply.unwrap().unwrap()), fair),
    };
    assert_eq!(first.1.status(), AcquireStatus::Acquired, "{}", first.0);
    client.release(release("race", first.0)).await.unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.status(), AcquireStatus::Acquired);
}

#[tokio::test]
async fn a_live_waiter_keeps_its_place_far_beyond_its_queue_ttl() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("patience", "holder")).await.unwrap();
    let ttl = |holder: &str| proto::AcquireRequest {
        queue_ttl_ms: Some(300),
        ..wait_for("patience", holder, 30_000)
    };
    let first = spawn_wait(server.client().await, ttl("first"));
    until_queued(&mut client, "patience", 1).await;
    let second = spawn_wait(server.client().await, ttl("second"));
    until_queued(&mut client, "patience", 2).await;

    // Five queue TTLs later both are still there, in the same order.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(queue_of(&mut client, "patience").await, ["first", "second"]);
    client.release(release("patience", "holder")).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap().grant.unwrap().holder, "first");
    client.release(release("patience", "first")).await.unwrap();
    assert_eq!(
        second.await.unwrap().unwrap().grant.unwrap().holder,
        "second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_killed_replica_are_skipped_after_their_queue_ttl() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    client.acquire(acquire("crash", "holder")).await.unwrap();

    // A second replica, as its own process, queues two waiters first.
    let mut doomed = TumblerProcess::start(&redis.url(), &[]).await;
    let queue_ttl = 1_000;
    let mut doomed_waiters = Vec::new();
    for (i, holder) in ["doomed-1", "doomed-2"].into_iter().enumerate() {
        let remote = doomed.client().await;
        let request = proto::AcquireRequest {
            queue_ttl_ms: Some(queue_ttl),
            ..wait_for("crash", holder, 60_000)
        };
        doomed_waiters.push(spawn_wait(remote, request));
        until_queued(&mut client, "crash", i + 1).await;
    }
    // Then a live waiter here, behind them.
    let survivor = spawn_wait(
        server.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(queue_ttl),
            ..wait_for("crash", "survivor", 4 * queue_ttl)
        },
    );
    until_queued(&mut client, "crash", 3).await;

    doomed.kill();
    let freed = client
        .inspect(inspect("crash"))
        .await
        .unwrap()
        .into_inner()
        .now_ms;
    client.release(release("crash", "holder")).await.unwrap();

    // The dead waiters were first in line; the survivor still gets the
    // lock within its wait (4 queue TTLs), about one queue TTL after the
    // lock freed: the dead ones stop being refreshed and drop out.
    let reply = survivor.await.unwrap().unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let grant = reply.grant.unwrap();
    let handed_over_after = grant.acquired_at_ms - freed;
    println!(
        "survivor granted {handed_over_after} ms after the lock freed (queue_ttl {queue_ttl} ms)"
    );
    assert!(
        handed_over_after < 2 * queue_ttl as i64,
        "dead waiters held the queue for {handed_over_after} ms"
    );
    for waiter in doomed_waiters {
        let outcome = waiter.await.unwrap();
        assert!(outcome.is_err(), "the killed replica cannot have answered");
    }
}

#[tokio::test]
async fn a_cancelled_or_timed_out_request_leaves_the_queue_at_once() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("bye", "holder")).await.unwrap();
    // A long queue TTL: only the cancellation can remove it quickly.
    let long_ttl = |holder: &str, wait_ms| proto::AcquireRequest {
        queue_ttl_ms: Some(600_000),
        ..wait_for("bye", holder, wait_ms)
    };
    let cancelled = spawn_wait(server.client().await, long_ttl("cancelled", 600_000));
    until_queued(&mut client, "bye", 1).await;
    cancelled.abort();
    until_queued(&mut client, "bye", 0).await;

    // A wait that ends: NOT_ACQUIRED, TIMEOUT, with the place it had.
    let stays = spawn_wait(server.client().await, long_ttl("stays", 600_000));
    until_queued(&mut client, "bye", 1).await;
    let reply = client
        .acquire(long_ttl("impatient", 300))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::NotAcquired);
    assert_eq!(reply.reason(), NotAcquiredReason::Timeout);
    assert_eq!(reply.queue_position, 2);
    assert_eq!(queue_of(&mut client, "bye").await, ["stays"]);

    // The caller's gRPC deadline also ends the wait, with a reply.
    let mut request = tonic::Request::new(long_ttl("deadline", 600_000));
    request.set_timeout(Duration::from_millis(1_000));
    let reply = client.acquire(request).await.unwrap().into_inner();
    assert_eq!(reply.reason(), NotAcquiredReason::Timeout);
    assert_eq!(queue_of(&mut client, "bye").await, ["stays"]);
    stays.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_one_replica_wakes_a_waiter_on_another() {
    let redis = start_redis();
    let here = TestServer::new().redis(&redis.url()).start().await;
    let there = TestServer::new().redis(&redis.url()).start().await;
    let mut there_client = there.client().await;
    there_client
        .acquire(acquire("across", "holder"))
        .await
        .unwrap();
    // A queue TTL far beyond the wait: the refresher's periodic wake-ups
    // cannot be what hands the lock over; only the release notification can.
    let waiter = spawn_wait(
        here.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(600_000),
            ..wait_for("across", "waiter", 5_000)
        },
    );
    until_queued(&mut there_client, "across", 1).await;
    there_client
        .release(release("across", "holder"))
        .await
        .unwrap();
    let reply = waiter.await.unwrap().unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

#[tokio::test]
async fn an_expiring_lease_hands_over_without_a_release() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let held = client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(500),
            ..acquire("expiry", "forgetful")
        })
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let reply = client
        .acquire(proto::AcquireRequest {
            queue_ttl_ms: Some(600_000),
            ..wait_for("expiry", "next", 5_000)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let grant = reply.grant.unwrap();
    assert!(grant.acquired_at_ms >= held.expires_at_ms);
    assert!(grant.fencing_token > held.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_waiting_costs_redis_only_heartbeats() {
    let (_redis, server, mut client, mut conn) = counting_server().await;
    client.acquire(acquire("idle", "holder")).await.unwrap();
    let queue_ttl_ms = 1_500;
    let mut waiters = Vec::new();
    for i in 0..100 {
        let request = proto::AcquireRequest {
            queue_ttl_ms: Some(queue_ttl_ms),
            ..wait_for("idle", &format!("w{i}"), 60_000)
        };
        waiters.push(spawn_wait(server.client().await, request));
    }
    until_queued(&mut client, "idle", 100).await;
    // Each named waiter's deadlock check is due a second into its wait
    // (decision 0077): it runs once, then the wait is idle.
    common::wait::wait_until_async(
        "100 waiters checked for deadlocks",
        Duration::from_secs(20),
        || {
            let mut conn = conn.clone();
            async move {
                let fields: u64 = redis::cmd("HLEN")
                    .arg("tumbler:{default:waits}")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                // The edges, and field "" (their byte count).
                fields == 101
            }
        },
    )
    .await;

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let idle_ms = 5_000;
    tokio::time::sleep(Duration::from_millis(idle_ms)).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    let scripts = calls("fcall");
    // One heartbeat per lock every queue_ttl/3, whatever the waiter count;
    // and as these holders are named (their waits checked for deadlocks),
    // one renewal of their wait-for edges per namespace as often (decision
    // 0081): twice that, not a call per waiter.
    let heartbeats = 2 * idle_ms / (queue_ttl_ms / 3);
    println!(
        "{idle_ms} ms idle, 100 waiters: {scripts} script calls (heartbeat bound {heartbeats}), {} PUBLISH",
        calls("publish")
    );
    println!("{stats}");
    assert!(
        scripts >= heartbeats / 2,
        "waiters were not kept alive: {scripts}"
    );
    assert!(
        scripts <= heartbeats + 3,
        "waiting polled Redis: {scripts} script calls"
    );
    assert_eq!(calls("publish"), 0);
    assert_eq!(queue_of(&mut client, "idle").await.len(), 100);
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test]
async fn full_queues_answer_resource_exhausted() {
    let mut args = service_args();
    args.max_waiters_per_lock = 2;
    args.max_waiters = 3;
    let server = TestServer::new().args(args).start().await;
    let mut client = server.client().await;
    client.acquire(acquire("full", "holder")).await.unwrap();
    let mut waiting = Vec::new();
    for holder in ["a", "b"] {
        waiting.push(spawn_wait(
            server.client().await,
            wait_for("full", holder, 30_000),
        ));
    }
    until_queued(&mut client, "full", 2).await;
    let err = client
        .acquire(wait_for("full", "c", 30_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("queue"), "{}", err.message());

    // Per replica: the third open waiting RPC (on another lock) is refused.
    client.acquire(acquire("other", "holder")).await.unwrap();
    waiting.push(spawn_wait(
        server.client().await,
        wait_for("other", "d", 30_000),
    ));
    until_queued(&mut client, "other", 1).await;
    let err = client
        .acquire(wait_for("other", "e", 30_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("replica"), "{}", err.message());
    for task in waiting {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_shutting_down_answers_its_waiters_unavailable() {
    let redis = start_redis();
    let leaving = TestServer::new().redis(&redis.url()).start().await;
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut client = staying.client().await;
    client.acquire(acquire("rollout", "holder")).await.unwrap();
    let waiter = spawn_wait(leaving.client().await, wait_for("rollout", "w", 60_000));
    until_queued(&mut client, "rollout", 1).await;
    let shutdown = tokio::spawn(leaving.shutdown());
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    shutdown.await.unwrap().unwrap();
    until_queued(&mut client, "rollout", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiter_whose_queue_entry_was_removed_rejoins_and_is_granted() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("dropped", "holder")).await.unwrap();
    let waiter = spawn_wait(
        server.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(600),
            ..wait_for("dropped", "waiter", 10_000)
        },
    );
    until_queued(&mut client, "dropped", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An operator's reap drops the old grant and the waiter's queue entry
    // while its RPC is still open; nothing wakes it but its replica's next
    // refresh, which finds the entry gone.
    let counts = client
        .reap(proto::ReapRequest {
            older_than_ms: Some(200),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((counts.old_grants, counts.old_waiters), (1, 1));
    let reply = waiter.await.unwrap().unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    assert_eq!(reply.grant.unwrap().holder, "waiter");
}

#[tokio::test]
async fn a_downgrade_never_hands_a_read_grant_to_a_waiter_past_its_queue_ttl() {
    // Finding 8 (SAFETY.md): a writer's downgrade frees room for readers
    // and hands it to the head of the queue (decision 68). A reader whose
    // replica died is past its request TTL there: it must be skipped as
    // dead, not handed a grant that keeps the lock from live waiters for
    // a lease. acquire.lua step 3 used to purge dead waiters only when the
    // request itself fitted, which a writer asking READ does not.
    let (_redis, mut conn, scripts) = crate::model_replay::redis_with_functions().await;
    let keys = crate::model_replay::keys_of("tumbler:{dead:0}", "x");
    let acquire = |args: &[&str]| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&scripts.acquire.function)
            .arg(keys.len())
            .arg(&keys)
            .arg(args);
        cmd
    };
    let status =
        |reply: Vec<redis::Value>| -> i64 { redis::from_redis_value(reply[0].clone()).unwrap() };
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let answer_by = ((secs + 60) * 1000).to_string();
    let writer = ["writer", "30000", "0", "2", "default", "", "w", "0", "0"];
    let granted = acquire(&writer).query_async(&mut conn).await.unwrap();
    assert_eq!(status(granted), 1);
    // A hand-over reader with a request TTL of 100 ms, never refreshed.
    let dead = [
        "dead", "30000", "0", "2", "default", "", "r", "0", "0", "30000", "100", "100", "dead.1",
        &answer_by,
    ];
    let queued = acquire(&dead).query_async(&mut conn).await.unwrap();
    assert_eq!(status(queued), 3);
    // Its liveness deadline leads its field in the lock's hash (layout v4).
    let stored: String = conn.hget(&keys[0], "w:dead").await.unwrap();
    let deadline: f64 = stored.split('|').next().unwrap().parse().unwrap();
    let mut probe = conn.clone();
    wait_until_async(
        "the reader's request TTL passed",
        Duration::from_secs(2),
        || {
            let mut probe = probe.clone();
            async move {
                let (secs, micros): (u64, u64) =
                    redis::cmd("TIME").query_async(&mut probe).await.unwrap();
                (secs * 1000 + micros / 1000) as f64 > deadline
            }
        },
    )
    .await;
    let downgrade = ["writer", "30000", "0", "2", "default", "", "r"];
    let downgraded = acquire(&downgrade).query_async(&mut probe).await.unwrap();
    assert_eq!(status(downgraded), 1, "the writer is downgraded");
    let handed: bool = redis::cmd("HEXISTS")
        .arg(&keys[0])
        .arg("h:dead")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!handed, "the dead reader was handed a grant");
    let place = redis::cmd("ZSCORE").arg(&keys[1]).arg("dead").clone();
    let waiting: Option<f64> = place.query_async(&mut conn).await.unwrap();
    assert_eq!(waiting, None, "the dead reader left the queue");
}
