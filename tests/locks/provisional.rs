//! The hand-over by default (decision 0089): a lease that ends after the
//! waiter's liveness deadline is handed over provisionally, up to that
//! deadline, and the waiter's replica takes it up (an acquire of the
//! holder answered HELD, with the lease asked) before it answers. A
//! waiter whose replica was killed keeps the lock no longer than its
//! request TTL, and the lapsed grant's token is never accepted. Real
//! `tumbler serve` processes, killed by their pid.

use crate::common;

use std::time::Duration;

use common::*;
use proto::{AcquireStatus, ExtendStatus, ReleaseStatus};
use tokio::time::Instant;

/// A waiter that waits long, with a short request TTL (its liveness).
fn waiter(name: &str, holder: &str, ttl_ms: u64, queue_ttl_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait_ms: 30_000,
        ttl_ms: Some(ttl_ms),
        queue_ttl_ms: Some(queue_ttl_ms),
        ..acquire(name, holder)
    }
}

/// The grant `holder` holds on `name`, as Inspect shows it, with Redis'
/// clock of that reply.
async fn grant_of(
    client: &mut proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    name: &str,
    holder: &str,
) -> Option<(proto::Grant, i64)> {
    let seen = client.inspect(inspect(name)).await.unwrap().into_inner();
    let now = seen.now_ms;
    (seen.holders.into_iter())
        .filter_map(|h| h.grant)
        .find(|g| g.holder == holder)
        .map(|g| (g, now))
}

/// Function calls between two readings of Redis' command counts.
fn fcalls(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
) -> u64 {
    let count = |m: &std::collections::HashMap<String, u64>| m.get("fcall").copied().unwrap_or(0);
    count(after) - count(before)
}

/// The server's own health checks tick rarely: each is function calls.
fn quiet() -> tumbler::config::ServiceArgs {
    tumbler::config::ServiceArgs {
        health_interval_ms: 60_000,
        ..service_args()
    }
}

/// Redis holds `grant` of the handed-over request ("second") on `name`,
/// with more than 50 s of its 60 s lease left: the whole lease, not a
/// provisional one.
async fn holds_the_whole_lease(
    client: &mut proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    name: &str,
    grant: &proto::Grant,
) {
    let (stored, now) = grant_of(client, name, "second").await.unwrap();
    assert_eq!(stored.fencing_token, grant.fencing_token);
    assert!(stored.expires_at_ms - now > 50_000, "{stored:?} at {now}");
}

/// One hand-over, measured: "first" holds the lock, "second" waits for
/// it, "first" releases.
struct HandOver {
    /// The waiter's answer.
    reply: proto::AcquireResponse,
    /// A client of the server, for a look afterwards.
    client: proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    /// Function calls Redis ran from the release to the answer.
    fcalls: u64,
    _servers: (TestServer, Option<TestServer>),
    _redis: tumbler::dev::RedisServer,
}

/// Where the release goes: the waiter's own replica, or another.
#[derive(Clone, Copy, PartialEq)]
enum Releaser {
    SameReplica,
    OtherReplica,
}

/// [`HandOver`] on `name`, on a server started with `args`; the waiter
/// asks a lease of `ttl_ms` with a request TTL of `queue_ttl_ms`; the
/// holder releases through `releaser`.
async fn hand_over_once(
    args: tumbler::config::ServiceArgs,
    name: &str,
    ttl_ms: u64,
    queue_ttl_ms: u64,
    releaser: Releaser,
) -> HandOver {
    let redis = start_redis();
    let start = || {
        TestServer::new()
            .redis(&redis.url())
            .args(args.clone())
            .start()
    };
    let server = start().await;
    let other = match releaser {
        Releaser::SameReplica => None,
        Releaser::OtherReplica => Some(start().await),
    };
    let mut holder = match &other {
        Some(other) => other.client().await,
        None => server.client().await,
    };
    let mut waiting = server.client().await;
    let held = holder.acquire(acquire(name, "first")).await.unwrap();
    assert_eq!(held.into_inner().status(), AcquireStatus::Acquired);
    let request = waiter(name, "second", ttl_ms, queue_ttl_ms);
    let wait = tokio::spawn(async move { waiting.acquire(request).await.unwrap().into_inner() });
    until_waiters(&mut holder, name, 1).await;
    let mut conn = redis_conn(&redis.url()).await;
    let before = command_calls(&mut conn).await;
    let released = holder.release(release(name, "first")).await.unwrap();
    assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
    let reply = wait.await.unwrap();
    let after = command_calls(&mut conn).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    HandOver {
        reply,
        client: holder,
        fcalls: fcalls(&before, &after),
        _servers: (server, other),
        _redis: redis,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_past_the_waiters_liveness_is_taken_up_before_the_answer() {
    // A lease of 60 s, a request TTL of 3 s, released through another
    // replica: the hand-over can only give it up to the request's
    // liveness deadline.
    let mut run = hand_over_once(quiet(), "long", 60_000, 3_000, Releaser::OtherReplica).await;
    let grant = run.reply.grant.unwrap();
    // Answered with the lease asked, and Redis holds that lease: the
    // take-up ran before the answer.
    assert_eq!(grant.ttl_ms, 60_000);
    assert!(
        grant.expires_at_ms >= grant.acquired_at_ms + 60_000,
        "{grant:?}"
    );
    holds_the_whole_lease(&mut run.client, "long", &grant).await;
    // Two function calls for it: the release (which handed it over) and
    // the take-up (the waiter had queued before); a refresh of the
    // waiter (every second) may fall between.
    assert!(
        (2..=3).contains(&run.fcalls),
        "{} function calls",
        run.fcalls
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_the_releasing_replica_is_handed_its_whole_lease_in_one_call() {
    // The same long lease and short request TTL, released through the
    // waiter's own replica: the release knows that replica alive (it is
    // the one calling), so the grant is whole (decision 0090), and no
    // take-up is needed.
    let mut run = hand_over_once(quiet(), "own", 60_000, 3_000, Releaser::SameReplica).await;
    let grant = run.reply.grant.unwrap();
    assert_eq!(grant.ttl_ms, 60_000);
    holds_the_whole_lease(&mut run.client, "own", &grant).await;
    // One function call, the release; a refresh of the waiter (every
    // second) may fall between.
    assert!(
        (1..=2).contains(&run.fcalls),
        "{} function calls",
        run.fcalls
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_within_the_waiters_liveness_rides_the_wake_up() {
    let run = hand_over_once(quiet(), "short", 2_000, 60_000, Releaser::OtherReplica).await;
    let grant = run.reply.grant.unwrap();
    assert_eq!(grant.expires_at_ms, grant.acquired_at_ms + 2_000);
    // One function call: the release handed it over whole.
    assert_eq!(run.fcalls, 1, "{} function calls", run.fcalls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiting_replica_keeps_the_lock_no_longer_than_its_request_ttl() {
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .args(quiet())
        .start()
        .await;
    let mut client = server.client().await;
    let held = client
        .acquire(acquire("doomed", "holder"))
        .await
        .unwrap()
        .into_inner();
    let first_token = held.grant.unwrap().fencing_token;
    // "dead" waits through a replica that is then killed: its request
    // TTL is 3 s, its lease 60 s.
    let mut replica = TumblerProcess::start(&redis.url(), &[]).await;
    let mut doomed = replica.client().await;
    let _orphan = tokio::spawn(async move {
        let _ = doomed
            .acquire(waiter("doomed", "dead", 60_000, 3_000))
            .await;
    });
    until_waiters(&mut client, "doomed", 1).await;
    replica.kill();
    // Released at once: the permit goes to the dead replica's waiter,
    // whose liveness deadline has not passed yet.
    let released = client.release(release("doomed", "holder")).await.unwrap();
    assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
    let (handed, now) = grant_of(&mut client, "doomed", "dead")
        .await
        .expect("handed to the dead replica's waiter");
    assert!(handed.fencing_token > first_token);
    // Provisional: it ends by the request's liveness deadline, not the
    // lease's end.
    assert!(
        handed.expires_at_ms - now <= 3_000,
        "{handed:?} at {now}: a lease past the request TTL"
    );
    // A live waiter is granted once it lapses: within the request TTL,
    // not the 60 s lease.
    let started = Instant::now();
    let next = client
        .acquire(proto::AcquireRequest {
            wait_ms: 20_000,
            ..acquire("doomed", "next")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.status(), AcquireStatus::Acquired, "{next:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(next.grant.unwrap().fencing_token > handed.fencing_token);
    // The lapsed grant's token is never accepted.
    let extend = client
        .extend(proto::ExtendRequest {
            name: "doomed".into(),
            holder: "dead".into(),
            fencing_token: Some(handed.fencing_token),
            ttl_ms: Some(60_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extend.status(), ExtendStatus::NotHeld);
    let release = client
        .release(proto::ReleaseRequest {
            fencing_token: Some(handed.fencing_token),
            ..release("doomed", "dead")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(release.status(), ReleaseStatus::NotHeld);
    let (now_held, _) = grant_of(&mut client, "doomed", "next").await.unwrap();
    assert_eq!(now_held.holder, "next");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_hand_over_a_release_wakes_the_waiter_to_call_again() {
    // `--no-hand-over`, the A/B switch: the waiter is woken and calls
    // again, a second function call for the grant.
    let args = tumbler::config::ServiceArgs {
        no_hand_over: true,
        ..quiet()
    };
    let run = hand_over_once(args, "ab", 2_000, 60_000, Releaser::SameReplica).await;
    assert_eq!(run.fcalls, 2, "{} function calls", run.fcalls);
}
