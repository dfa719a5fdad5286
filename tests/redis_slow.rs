//! Redis slowed, not down: a server-wide stall (`DEBUG SLEEP`) or a pause
//! of every client (`CLIENT PAUSE … ALL`), each far longer than any
//! caller's deadline. Every RPC is still answered by the server within its
//! caller's deadline or its own wait, while Redis is still stalled; nothing
//! is granted while Redis cannot answer; and once Redis is back no waiter
//! is left behind, neither in the replica nor in the lock's queue.
//!
//! A test binary of its own, not folded into an area: it reads the waiting
//! gauge and the DEADLINE_EXCEEDED count from the process-wide metrics
//! registry, which other tests in the same process would move.

pub mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::http::{sample, scrape};
use common::*;
use proto::AcquireStatus;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

/// How long Redis stays stalled: many times every deadline below.
const STALL_SECONDS: u64 = 10;
/// Waiters queued before the stall, and callers arriving during it.
const QUEUED: usize = 20;
const ARRIVING: usize = 20;

#[derive(Clone, Copy, Debug)]
enum Slowdown {
    DebugSleep,
    ClientPause,
}

/// Stalls Redis for `seconds` from a connection of its own; the returned
/// flag turns true once Redis answers again.
fn stall(redis_url: &str, slowdown: Slowdown, seconds: u64) -> Arc<AtomicBool> {
    let over = Arc::new(AtomicBool::new(false));
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let flag = over.clone();
    std::thread::spawn(move || {
        match slowdown {
            // Redis runs the sleep itself: it answers no one until done.
            Slowdown::DebugSleep => {
                ready_tx.send(()).unwrap();
                let _: () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(seconds)
                    .query(&mut conn)
                    .unwrap();
            }
            // The pause returns at once; a PING on the same connection is
            // held until the pause ends.
            Slowdown::ClientPause => {
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(seconds * 1000)
                    .arg("ALL")
                    .query(&mut conn)
                    .unwrap();
                ready_tx.send(()).unwrap();
                let _: String = redis::cmd("PING").query(&mut conn).unwrap();
            }
        }
        flag.store(true, Ordering::SeqCst);
    });
    ready_rx.recv().unwrap();
    // The pause is in force once it was answered; the sleep only once Redis
    // stops answering others.
    if let Slowdown::DebugSleep = slowdown {
        common::wait::wait_until("Redis stalls", Duration::from_secs(5), || {
            !answers_within(&client, Duration::from_millis(50))
        });
    }
    over
}

/// Whether Redis answers a PING on a new connection within `within`.
fn answers_within(client: &redis::Client, within: Duration) -> bool {
    let Ok(mut conn) = client.get_connection_with_timeout(within) else {
        return false;
    };
    conn.set_read_timeout(Some(within)).is_ok()
        && redis::cmd("PING").query::<String>(&mut conn).is_ok()
}

/// The replica's own count of waiting requests.
async fn replica_waiters(http: std::net::SocketAddr) -> u64 {
    sample(&scrape(http).await, "tumbler_waiters", &[]).expect("a tumbler_waiters gauge") as u64
}

/// One waiting acquire of `slow` with a gRPC deadline; its outcome as a
/// word for the tally.
async fn waiting_acquire(
    mut client: proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    holder: String,
    deadline: Option<Duration>,
) -> String {
    let mut request = tonic::Request::new(proto::AcquireRequest {
        wait_ms: 60_000,
        ..acquire("slow", &holder)
    });
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    } else {
        request.get_mut().wait_ms = 1_500;
    }
    match client.acquire(request).await {
        Ok(reply) => {
            let status = reply.into_inner().status();
            assert!(
                !matches!(status, AcquireStatus::Acquired | AcquireStatus::AlreadyHeld),
                "{holder} was granted a lock that another holder still holds"
            );
            format!("{status:?}")
        }
        Err(status) => {
            // The server answers DEADLINE_EXCEEDED just before the
            // deadline; on a loaded machine the client's own timer may
            // fire first (CANCELLED, "Timeout expired"): told no either way.
            let own_deadline =
                status.code() == Code::Cancelled && status.message() == "Timeout expired";
            assert!(
                matches!(status.code(), Code::DeadlineExceeded | Code::Unavailable) || own_deadline,
                "{holder}: unexpected {status:?}"
            );
            format!("{:?}", status.code())
        }
    }
}

async fn slowed_redis_honours_deadlines_and_leaves_no_waiters(slowdown: Slowdown) {
    let redis = tumbler::dev::RedisServer::start_with_args(
        "redis-server",
        &["--enable-debug-command", "local"],
    )
    .unwrap();
    let http_port = tumbler::dev::free_port().unwrap();
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], http_port));
    let server = TumblerProcess::start(
        &redis.url(),
        &[
            "--http-listen",
            &http.to_string(),
            "--redis-timeout-ms",
            "500",
            "--default-queue-ttl-ms",
            "1000",
            "--health-interval-ms",
            "100",
        ],
    )
    .await;
    let mut client = server.client().await;
    let held = client
        .acquire(acquire("slow", "holder"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.status(), AcquireStatus::Acquired);

    // Waiters queued before the stall, each with a 1.5 s deadline.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..QUEUED {
        let deadline = Some(Duration::from_millis(1_500));
        calls.spawn(waiting_acquire(client.clone(), format!("q{i}"), deadline));
    }
    until_waiters(&mut client, "slow", QUEUED as u32).await;
    assert_eq!(replica_waiters(http).await, QUEUED as u64);

    let over = tokio::task::block_in_place(|| stall(&redis.url(), slowdown, STALL_SECONDS));
    // Callers arriving during the stall: half with a 1 s deadline, half
    // with no deadline but a 1.5 s wait.
    for i in 0..ARRIVING {
        let deadline = (i % 2 == 0).then_some(Duration::from_secs(1));
        calls.spawn(waiting_acquire(client.clone(), format!("a{i}"), deadline));
    }
    let mut outcomes = BTreeMap::<String, usize>::new();
    while let Some(outcome) = calls.join_next().await {
        *outcomes.entry(outcome.unwrap()).or_default() += 1;
    }
    let answered_during_stall = !over.load(Ordering::SeqCst);
    println!(
        "{slowdown:?}: outcomes of {} calls: {outcomes:?}",
        QUEUED + ARRIVING
    );
    assert!(
        answered_during_stall,
        "some calls were answered only after Redis came back: deadlines not honoured"
    );
    assert_eq!(outcomes.values().sum::<usize>(), QUEUED + ARRIVING);
    // Answers past a deadline are the replica's own, so they are counted.
    let deadline_exceeded = sample(
        &scrape(http).await,
        "tumbler_rpc_requests_total",
        &[("method", "Acquire"), ("code", "DEADLINE_EXCEEDED")],
    );
    // (A call whose client timer fired first may still have been answered
    // DEADLINE_EXCEEDED by the replica.)
    let told = outcomes.get("DeadlineExceeded").copied().unwrap_or(0);
    let late = outcomes.get("Cancelled").copied().unwrap_or(0);
    let counted = deadline_exceeded.unwrap_or(0.0) as usize;
    assert!(
        (told..=told + late).contains(&counted),
        "replica counted {counted}, clients saw {told} (+{late} timed out on their side)"
    );

    // Redis back: no waiter left in the replica or in the queue, and the
    // lock goes to the next caller the moment it is released.
    wait_for_health(&server.endpoint, ServingStatus::Serving).await;
    let mut left_in_replica = u64::MAX;
    for _ in 0..100 {
        left_in_replica = replica_waiters(http).await;
        if left_in_replica == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left_in_replica, 0, "waiters piled up in the replica");
    until_waiters(&mut client, "slow", 0).await;
    client.release(release("slow", "holder")).await.unwrap();
    let next = client
        .acquire(acquire("slow", "after"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        next.status(),
        AcquireStatus::Acquired,
        "a stale waiter stood in the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_honours_deadlines_and_leaves_no_waiters() {
    slowed_redis_honours_deadlines_and_leaves_no_waiters(Slowdown::DebugSleep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_honours_deadlines_and_leaves_no_waiters() {
    slowed_redis_honours_deadlines_and_leaves_no_waiters(Slowdown::ClientPause).await;
}

/// The probe that found grants landing after their callers were told no:
/// Redis stalls (`DEBUG SLEEP`) while callers try to take free locks, with
/// a gRPC deadline or only the server's Redis timeout; each caller is
/// answered DEADLINE_EXCEEDED or UNAVAILABLE while Redis sleeps. When Redis
/// wakes, it runs the queued calls: every one of them must refuse (its
/// answer-by time passed), so no lock is held by a caller that was told no.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_lands_after_its_caller_was_told_no() {
    let redis = tumbler::dev::RedisServer::start_with_args(
        "redis-server",
        &["--enable-debug-command", "local"],
    )
    .unwrap();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    // The function library is loaded and the clock known before the stall.
    client.acquire(acquire("warm-up", "h")).await.unwrap();

    let stalled = tokio::task::block_in_place(|| stall(&redis.url(), Slowdown::DebugSleep, 5));
    let mut callers = tokio::task::JoinSet::new();
    for i in 0..10 {
        let mut client = server.client().await;
        callers.spawn(async move {
            let mut request = tonic::Request::new(acquire(&format!("late-{i}"), &format!("c{i}")));
            // Half with a deadline of their own, half bounded only by the
            // server's Redis timeout (1 s in the tests).
            if i % 2 == 0 {
                request.set_timeout(Duration::from_millis(700));
            }
            client.acquire(request).await
        });
    }
    while let Some(answer) = callers.join_next().await {
        let status = answer
            .unwrap()
            .expect_err("no answer but a refusal while Redis sleeps");
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Unavailable),
            "{status:?}"
        );
    }
    assert!(
        !stalled.load(Ordering::SeqCst),
        "answered while Redis still slept"
    );
    common::wait::wait_until_async("Redis woke up", Duration::from_secs(30), || {
        let stalled = stalled.clone();
        async move { stalled.load(Ordering::SeqCst) }
    })
    .await;
    // Redis ran every queued call by now; none of them granted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..10 {
        let seen = client
            .inspect(inspect(&format!("late-{i}")))
            .await
            .unwrap()
            .into_inner();
        assert!(
            seen.holders.is_empty(),
            "late-{i} was granted late: {seen:?}"
        );
    }
    // And the locks are free for the next caller.
    let reply = client.acquire(acquire("late-0", "next")).await.unwrap();
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
}
