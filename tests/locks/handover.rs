//! The hand-over (decision 0068): a permit freed while someone waits goes
//! to the head of the queue inside the call that freed it, and the grant
//! reaches the waiter in the wake-up message, so a contended grant costs
//! two function calls (the waiter's enqueue and the holder's release).
//! Its edges: a waiter whose RPC is gone, semaphores permit by permit,
//! a permit freed by an expiry (barging takes it, try-once does not),
//! and a place another request of the holder took over (finding 6).
//! The hand-over is on by default (decision 0089; `provisional.rs` has
//! its provisional lease); these servers say so explicitly, and
//! `--no-hand-over`'s path is `queue.rs`'s.

use crate::{common, model_replay, queue};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::wait::wait_until_async;
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, NotAcquiredReason, ReleaseStatus};
use queue::{queue_of, spawn_wait, until_queued};
use tonic::transport::Channel;

/// `service_args` with the hand-over on (the default).
fn hand_over() -> tumbler::config::ServiceArgs {
    tumbler::config::ServiceArgs {
        hand_over: true,
        ..service_args()
    }
}

fn wait_for(name: &str, holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait_ms,
        // No refresh within a test: its calls would be counted.
        queue_ttl_ms: Some(120_000),
        ..acquire(name, holder)
    }
}

async fn queued(client: &mut LockServiceClient<Channel>, name: &str) -> u32 {
    client
        .inspect(inspect(name))
        .await
        .unwrap()
        .into_inner()
        .waiters
}

async fn holders(client: &mut LockServiceClient<Channel>, name: &str) -> Vec<String> {
    let reply = client.inspect(inspect(name)).await.unwrap().into_inner();
    reply
        .holders
        .into_iter()
        .map(|h| h.grant.unwrap().holder)
        .collect()
}

/// "patient" waits on "line" through a replica of its own (started with
/// `flag`), which settles for `settle_ms` (a fresh subscription wakes its
/// waiters once) and then freezes (SIGSTOP): its queue entry stays alive
/// for the queue TTL while nothing of it answers. The replica, the waiting
/// call and the pid that SIGCONT thaws.
async fn patient_behind_a_frozen_replica(
    redis_url: &str,
    client: &mut LockServiceClient<Channel>,
    flag: &str,
    settle_ms: u64,
) -> (
    TumblerProcess,
    tokio::task::JoinHandle<Result<proto::AcquireResponse, tonic::Status>>,
    nix::unistd::Pid,
) {
    let frozen = TumblerProcess::start(redis_url, &[flag]).await;
    let waiter = spawn_wait(
        frozen.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(30_000),
            ..queue::wait_for("line", "patient", 30_000)
        },
    );
    until_queued(client, "line", 1).await;
    tokio::time::sleep(Duration::from_millis(settle_ms)).await;
    let pid = nix::unistd::Pid::from_raw(frozen.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    (frozen, waiter, pid)
}

/// A try-once request of `holder` on "line" (`fair = false` when barging).
async fn try_once(
    client: &mut LockServiceClient<Channel>,
    holder: &str,
    barging: bool,
) -> proto::AcquireResponse {
    let request = proto::AcquireRequest {
        fair: barging.then_some(false),
        ..acquire("line", holder)
    };
    client.acquire(request).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_grant_costs_two_function_calls() {
    let redis = start_redis();
    // Health ticks rarely: each one is two function calls of the replica.
    let args = tumbler::config::ServiceArgs {
        health_interval_ms: 60_000,
        ..hand_over()
    };
    let server = TestServer::new()
        .redis(&redis.url())
        .args(args)
        .start()
        .await;
    let mut conn = redis_conn(&redis.url()).await;
    let before = command_calls(&mut conn).await;
    // 8 clients loop on one mutex, waiting in the server.
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut client = server.client().await;
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let holder = format!("c{i}");
            for _ in 0..25 {
                let reply = client
                    .acquire(wait_for("hot", &holder, 30_000))
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(reply.status(), AcquireStatus::Acquired);
                grants.fetch_add(1, Ordering::Relaxed);
                let released = client.release(release("hot", &holder)).await.unwrap();
                assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let after = command_calls(&mut conn).await;
    let delta = |command: &str| {
        after.get(command).copied().unwrap_or(0) - before.get(command).copied().unwrap_or(0)
    };
    let grants = grants.load(Ordering::Relaxed);
    let functions = delta("fcall") + delta("fcall_ro");
    let commands: u64 = (after.iter())
        .filter(|(name, _)| {
            !name.starts_with("fcall") && !["info", "config"].contains(&name.as_str())
        })
        .map(|(name, calls)| calls - before.get(name).copied().unwrap_or(0))
        .sum();
    let mut each: Vec<(u64, &String)> = (after.iter())
        .map(|(name, calls)| (calls - before.get(name).copied().unwrap_or(0), name))
        .filter(|(n, _)| *n > 0)
        .collect();
    each.sort();
    println!("per command: {each:?}");
    println!(
        "{grants} grants: {functions} function calls ({:.2} per grant), {commands} commands in them ({:.1} per grant)",
        functions as f64 / grants as f64,
        commands as f64 / grants as f64
    );
    assert_eq!(grants, 200);
    // Two per grant (enqueue, release), less the grants that found the
    // lock free; a little room for the replica's own checks.
    assert!(
        functions <= 2 * grants + 4,
        "{functions} function calls for {grants} grants"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_still_costs_eight_commands() {
    let (_redis, _server, mut client, mut conn) = counting_server().await;
    // The namespace's registry entry is written once, at its first call.
    client.acquire(acquire("warm", "h")).await.unwrap();
    client.release(release("warm", "h")).await.unwrap();
    // A round whose window a background call fell into (the per-minute
    // counts, a library sweep: more than the pairs' 200 function calls)
    // is measured again, at most three times.
    for round in 0..3 {
        let before = command_calls(&mut conn).await;
        for i in 0..100 {
            let name = format!("alone-{round}-{i}");
            let reply = client.acquire(acquire(&name, "h")).await.unwrap();
            assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
            client.release(release(&name, "h")).await.unwrap();
        }
        let after = command_calls(&mut conn).await;
        let delta = |name: &str| {
            after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
        };
        if delta("fcall") + delta("fcall_ro") != 200 {
            eprintln!("round {round}: a background call fell into it: {after:?}");
            continue;
        }
        let inside: u64 = (after.keys())
            .filter(|name| {
                !name.starts_with("fcall") && !["info", "config"].contains(&name.as_str())
            })
            .map(|name| delta(name))
            .sum();
        assert_eq!(inside, 800, "{after:?}");
        return;
    }
    panic!("every round had a background call in it");
}

#[tokio::test]
async fn a_waiter_cancelled_just_before_the_release_is_not_left_holding() {
    let server = TestServer::new().args(hand_over()).start().await;
    let mut client = server.client().await;
    for round in 0..10 {
        let name = format!("cancel-{round}");
        client.acquire(acquire(&name, "holder")).await.unwrap();
        let mut first = server.client().await;
        let request = wait_for(&name, "gone", 30_000);
        let cancelled = tokio::spawn(async move { first.acquire(request).await });
        wait_until_async("one waiter", Duration::from_secs(10), || {
            let (mut client, name) = (client.clone(), name.clone());
            async move { queued(&mut client, &name).await == 1 }
        })
        .await;
        let mut second = server.client().await;
        let request = wait_for(&name, "next", 30_000);
        let next = tokio::spawn(async move { second.acquire(request).await });
        wait_until_async("two waiters", Duration::from_secs(10), || {
            let (mut client, name) = (client.clone(), name.clone());
            async move { queued(&mut client, &name).await == 2 }
        })
        .await;
        // The first waiter's RPC goes away as the holder releases: the
        // release may hand it the lock before its dequeue runs; then its
        // replica gives the grant back at once, and the next one gets it.
        cancelled.abort();
        client.release(release(&name, "holder")).await.unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the next waiter is served long before the lease of a lost grant ends")
            .unwrap()
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        assert_eq!(holders(&mut client, &name).await, ["next"]);
        client.release(release(&name, "next")).await.unwrap();
    }
}

#[tokio::test]
async fn a_waiter_past_its_wait_is_not_handed_the_lock() {
    let server = TestServer::new().args(hand_over()).start().await;
    let mut client = server.client().await;
    client.acquire(acquire("patience", "holder")).await.unwrap();
    let reply = client
        .acquire(wait_for("patience", "brief", 300))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::NotAcquired);
    client.release(release("patience", "holder")).await.unwrap();
    // Nobody holds it, nobody waits: the told-no waiter got nothing.
    let state = client
        .inspect(inspect("patience"))
        .await
        .unwrap()
        .into_inner();
    assert!(state.holders.is_empty(), "{state:?}");
    assert_eq!(state.waiters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_hands_over_one_permit_per_release() {
    let server = TestServer::new().args(hand_over()).start().await;
    let mut client = server.client().await;
    let take = |holder: &str, wait_ms| proto::AcquireRequest {
        limit: Some(2),
        ..wait_for("pair", holder, wait_ms)
    };
    for holder in ["a", "b"] {
        client.acquire(take(holder, 0)).await.unwrap();
    }
    let mut waiting = Vec::new();
    for (i, holder) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let mut own = server.client().await;
        let request = take(holder, 30_000);
        waiting.push(tokio::spawn(async move {
            own.acquire(request).await.unwrap().into_inner()
        }));
        wait_until_async("queued", Duration::from_secs(10), || {
            let mut client = client.clone();
            async move { queued(&mut client, "pair").await == i as u32 + 1 }
        })
        .await;
    }
    let mut tokens = Vec::new();
    let mut held = vec!["b".to_owned()];
    for (waiter, (gone, next)) in waiting
        .into_iter()
        .zip([("a", "w1"), ("b", "w2"), ("w1", "w3")])
    {
        client.release(release("pair", gone)).await.unwrap();
        let reply = waiter.await.unwrap();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        let grant = reply.grant.unwrap();
        assert_eq!(grant.holder, next);
        // The freed slot, and a rising token.
        assert!((1..=2).contains(&grant.slot), "{grant:?}");
        tokens.push(grant.fencing_token);
        held.retain(|h| h != gone);
        held.push(next.to_owned());
        let mut now = holders(&mut client, "pair").await;
        now.sort();
        let mut want = held.clone();
        want.sort();
        assert_eq!(now, want, "one permit per release");
    }
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "{tokens:?}");
}

#[tokio::test]
async fn a_late_dequeue_leaves_a_place_another_request_took_over() {
    // Finding 6 (SAFETY.md), on the real functions: a request of holder
    // "h" queues; a second request of "h" (another RPC, another replica)
    // finds the place and takes it over; the first one's dequeue, late,
    // leaves it alone; the second one's removes it.
    let (_redis, mut conn, scripts) = model_replay::redis_with_functions().await;
    let keys = model_replay::keys_of("tumbler:{late:0}", "x");
    let fcall = |function: &str, args: Vec<String>| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function).arg(keys.len()).arg(&keys).arg(args);
        cmd
    };
    let acquire = |holder: &str, request: &str| {
        let mut args: Vec<String> = [holder, "30000", "0", "1", "default", "", "f", "0", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["30000", "30000", "100", request, "0"].map(String::from));
        fcall(&scripts.acquire.function, args)
    };
    let status =
        |reply: Vec<redis::Value>| -> i64 { redis::from_redis_value(reply[0].clone()).unwrap() };
    let granted: Vec<redis::Value> = acquire("holder", "").query_async(&mut conn).await.unwrap();
    assert_eq!(status(granted), 1);
    let first: Vec<redis::Value> = acquire("h", "r.1").query_async(&mut conn).await.unwrap();
    assert_eq!(status(first), 3);
    let second: Vec<redis::Value> = acquire("h", "r.2").query_async(&mut conn).await.unwrap();
    assert_eq!(status(second), 3);
    let dequeue = |request: &str| {
        fcall(
            &scripts.dequeue.function,
            vec!["h".into(), "0".into(), request.into()],
        )
    };
    let (_, position, _): (i64, u32, String) = dequeue("r.1").query_async(&mut conn).await.unwrap();
    assert_eq!(position, 0, "the late dequeue left the place alone");
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg(&keys[1])
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, ["h"]);
    let (_, position, _): (i64, u32, String) = dequeue("r.2").query_async(&mut conn).await.unwrap();
    assert_eq!(position, 1);
}

#[tokio::test]
async fn try_once_does_not_jump_the_queue_but_barging_takes_a_permit_an_expiry_freed() {
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .args(hand_over())
        .start()
        .await;
    let mut client = server.client().await;
    // The lease is long enough for the set-up below on a busy machine: it
    // must lapse only once the waiter's replica is frozen.
    let held = client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(2_500),
            ..acquire("line", "holder")
        })
        .await
        .unwrap()
        .into_inner();
    let expires_at_ms = held.grant.expect("granted").expires_at_ms;
    // "patient" waits through a replica that then stops answering (it is
    // frozen, its queue entry stays alive for the queue TTL). The holder's
    // lease then runs out: nobody calls at that moment, so a permit is
    // free while "patient" is first in line (a release would have handed
    // it to "patient" at once).
    let (_frozen, waiter, pid) =
        patient_behind_a_frozen_replica(&redis.url(), &mut client, "--hand-over", 300).await;
    // Frozen while the lease still ran (else its replica's expiry timer
    // may have granted "patient" already, and the scenario is another).
    let seen = client.inspect(inspect("line")).await.unwrap().into_inner();
    assert!(
        seen.holders
            .iter()
            .any(|h| h.grant.as_ref().is_some_and(|g| g.holder == "holder")),
        "the set-up outlasted the lease: {seen:?}"
    );
    // Then the lease lapses, by Redis' clock.
    let left_ms = (expires_at_ms - seen.now_ms).max(0) as u64 + 150;
    tokio::time::sleep(Duration::from_millis(left_ms)).await;

    // A barging request takes the permit the expiry freed.
    let barging = try_once(&mut client, "barging", true).await;
    assert_eq!(barging.status(), AcquireStatus::Acquired, "{barging:?}");
    // A fair try-once request does not jump the queue.
    let polite = try_once(&mut client, "polite", false).await;
    assert_eq!(polite.status(), AcquireStatus::NotAcquired);
    assert_eq!(polite.reason(), NotAcquiredReason::Busy);
    assert_eq!(queue_of(&mut client, "line").await, ["patient"]);

    // Released, the permit goes to "patient" in the release itself: a
    // try-once request, barging or not, finds none free.
    client.release(release("line", "barging")).await.unwrap();
    let late = client
        .acquire(proto::AcquireRequest {
            fair: Some(false),
            ..acquire("line", "late")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.status(), AcquireStatus::NotAcquired);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let reply = waiter.await.unwrap().unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    assert_eq!(reply.grant.unwrap().holder, "patient");
}

#[tokio::test]
async fn try_once_does_not_jump_the_queue_but_barging_does() {
    // Without the hand-over (`--no-hand-over`: the release wakes the
    // head, which calls again); with it, the test above has the same case.
    let redis = start_redis();
    let args = tumbler::config::ServiceArgs {
        no_hand_over: true,
        ..service_args()
    };
    let server = TestServer::new()
        .redis(&redis.url())
        .args(args)
        .start()
        .await;
    let mut client = server.client().await;
    client.acquire(acquire("line", "holder")).await.unwrap();
    // "patient" waits through a replica that then stops answering (it is
    // frozen, its queue entry stays alive for the queue TTL): once the
    // holder releases, a permit is free while "patient" is first in line.
    let (_frozen, waiter, pid) =
        patient_behind_a_frozen_replica(&redis.url(), &mut client, "--no-hand-over", 500).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.release(release("line", "holder")).await.unwrap();

    // A fair try-once request does not take the free permit: "patient"
    // goes first.
    let polite = try_once(&mut client, "polite", false).await;
    assert_eq!(polite.status(), AcquireStatus::NotAcquired);
    assert_eq!(polite.reason(), NotAcquiredReason::Busy);
    // A barging request takes it at once.
    let barging = try_once(&mut client, "barging", true).await;
    assert_eq!(barging.status(), AcquireStatus::Acquired, "{barging:?}");
    assert_eq!(queue_of(&mut client, "line").await, ["patient"]);

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    client.release(release("line", "barging")).await.unwrap();
    let reply = waiter.await.unwrap().unwrap();
    assert_eq!(reply.grant.unwrap().holder, "patient");
}
