//! A multi-lock caught by a stalled Redis (SIGSTOP of the redis-server
//! the test started, past the server's command timeout): the caller is
//! answered UNAVAILABLE, never granted, and once Redis runs again what it
//! had queued meanwhile grants nothing: Redis' own view shows no name of
//! the set held by its holder (invariant 9 and 15).

use crate::common;

use std::time::Duration;

use common::wait::wait_until_async;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::Code;

fn set(names: &[&str], holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        holder: holder.into(),
        ttl_ms: Some(30_000),
        wait_ms,
        ..Default::default()
    }
}

/// The holders Redis itself records for lock `name` (default namespace).
async fn held_in_redis(url: &str, name: &str) -> Vec<String> {
    let layout = tumbler_engine::keys::Layout::new("tumbler", service_args().shards);
    let key = layout.lock_keys("default", name).lock;
    grants_in(&mut redis_conn(url).await, &key).await
}

/// A waiting set that wakes during a stall (the lease it waits on ends)
/// and a try-once set sent during it are both answered UNAVAILABLE while
/// Redis is stopped; after SIGCONT (Redis then runs their queued calls)
/// neither holds any name, and the names are free for the next caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_caught_by_a_stalled_redis_is_unavailable_and_takes_nothing() {
    let redis = start_redis();
    let url = redis.url();
    let server = TestServer::new().redis(&url).start().await;
    let mut client = server.client().await;
    // "x" holds stall-b for 1.5 s: the set {stall-a, stall-b} waits, and
    // wakes when that lease ends, inside the stall.
    let x = client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(1_500),
            ..acquire("stall-b", "x")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(x.status(), proto::AcquireStatus::Acquired);
    let waiting = tokio::spawn({
        let mut client = client.clone();
        async move {
            client
                .acquire(set(&["stall-a", "stall-b"], "s", 10_000))
                .await
        }
    });
    until_waiters(&mut client, "stall-b", 1).await;

    let pid = Pid::from_raw(redis.pid().expect("redis runs") as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let stalled = std::time::Instant::now();
    let tried = tokio::spawn({
        let mut client = client.clone();
        async move { client.acquire(set(&["stall-c", "stall-d"], "t", 0)).await }
    });
    let answers = async {
        let waited = waiting.await.unwrap();
        let tried = tried.await.unwrap();
        (waited, tried, stalled.elapsed())
    };
    let answered = tokio::time::timeout(Duration::from_secs(6), answers).await;
    kill(pid, Signal::SIGCONT).unwrap();
    let (waited, tried, within) = answered.expect("both sets are answered while Redis is stopped");
    for (who, answer) in [("the waiting set", waited), ("the try-once set", tried)] {
        let status = answer.expect_err(who);
        assert_eq!(status.code(), Code::Unavailable, "{who}: {status:?}");
    }
    assert!(within < Duration::from_secs(6), "answered after {within:?}");

    // Redis runs again, with whatever it had queued: no name is held by
    // the sets' holders, now nor a moment later (the queued calls ran).
    let mut plain = redis_conn(&url).await;
    let _: () = redis::cmd("PING").query_async(&mut plain).await.unwrap();
    for _ in 0..2 {
        for (name, holder) in [
            ("stall-a", "s"),
            ("stall-b", "s"),
            ("stall-c", "t"),
            ("stall-d", "t"),
        ] {
            let held = held_in_redis(&url, name).await;
            assert!(
                !held.contains(&holder.to_string()),
                "{name} held by {holder}: {held:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // And the whole set is free for the next caller at once.
    wait_until_async("stall-b's lease is over", Duration::from_secs(5), || {
        let url = url.clone();
        async move { held_in_redis(&url, "stall-b").await.is_empty() }
    })
    .await;
    let next = client
        .acquire(set(
            &["stall-a", "stall-b", "stall-c", "stall-d"],
            "next",
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.status(), proto::AcquireStatus::Acquired, "{next:?}");
}
