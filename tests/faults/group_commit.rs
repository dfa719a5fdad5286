//! Group commit in trouble: a stalled Redis fails every operation of a
//! batch with UNAVAILABLE and none of them is granted when Redis runs the
//! batch later; on a Redis Cluster batches keep to their slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic::Code;

use crate::common::proto::{AcquireStatus, ReleaseStatus};
use crate::common::{
    TestServer, acquire, command_calls, redis_conn, release, scan_keys, service_args, start_redis,
    wait,
};

/// Pauses every client of Redis for `ms` from a connection of its own;
/// the returned flag turns true once Redis answers again.
fn pause(redis_url: &str, ms: u64) -> Arc<AtomicBool> {
    let over = Arc::new(AtomicBool::new(false));
    let mut conn = redis::Client::open(redis_url)
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query(&mut conn)
        .unwrap();
    let flag = over.clone();
    std::thread::spawn(move || {
        // Held until the pause ends.
        let _: String = redis::cmd("PING").query(&mut conn).unwrap();
        flag.store(true, Ordering::SeqCst);
    });
    over
}

/// 32 acquires on one shard sent while Redis is paused for 3 s: the
/// first goes alone, the rest queue behind it and go as one batch (or a
/// few). `deadline`: each caller's own (else the server's Redis timeout,
/// `redis_timeout_ms`, bounds them). Returns the codes they were answered
/// with, once Redis resumed and ran whatever reached it, and Redis' calls
/// since the pause.
async fn stalled_acquires(
    deadline: Option<Duration>,
    redis_timeout_ms: u64,
) -> (Vec<Code>, std::collections::HashMap<String, u64>) {
    let redis = start_redis();
    // One shard: every lock shares the queue; no health calls during the
    // stall.
    let server = TestServer::new()
        .redis(&redis.url())
        .args(tumbler::config::ServiceArgs {
            shards: 1,
            health_interval_ms: 60_000,
            redis_timeout_ms,
            ..service_args()
        })
        .start()
        .await;
    let mut client = server.client().await;
    client.acquire(acquire("warm-up", "h")).await.unwrap();
    let mut conn = redis_conn(&redis.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();

    let resumed = tokio::task::block_in_place(|| pause(&redis.url(), 3_000));
    let mut callers = tokio::task::JoinSet::new();
    for i in 0..32 {
        let mut client = server.client().await;
        callers.spawn(async move {
            let mut request =
                tonic::Request::new(acquire(&format!("stalled-{i}"), &format!("c{i}")));
            if let Some(deadline) = deadline {
                request.set_timeout(deadline);
            }
            client.acquire(request).await
        });
    }
    let mut codes = Vec::new();
    while let Some(answer) = callers.join_next().await {
        let status = answer
            .unwrap()
            .expect_err("no answer but a refusal while Redis is paused");
        codes.push(status.code());
    }
    assert!(
        !resumed.load(Ordering::SeqCst),
        "answered after Redis resumed"
    );
    wait::wait_until_async("Redis resumed", Duration::from_secs(30), || {
        let resumed = resumed.clone();
        async move { resumed.load(Ordering::SeqCst) }
    })
    .await;
    // A call sent now runs after whatever reached Redis during the pause
    // (it was queued first, on the server's connection).
    let reply = client
        .acquire(acquire("after", "h"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let calls = command_calls(&mut conn).await;
    let held = scan_keys(&mut conn, "*:l:stalled-*").await;
    assert!(
        held.is_empty(),
        "granted after the caller was told no: {held:?}"
    );
    // And every lock is free for the next caller.
    for i in 0..32 {
        let reply = client
            .acquire(acquire(&format!("stalled-{i}"), "next"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "stalled-{i}");
    }
    (codes, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_times_out_fails_every_operation_unavailable() {
    // The Redis timeout (1 s) ends the lone call first, then the batch.
    let (codes, _) = stalled_acquires(None, 1_000).await;
    assert!(
        codes.iter().all(|code| *code == Code::Unavailable),
        "{codes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_runs_after_its_callers_were_told_no_grants_none() {
    // The callers give up after 500 ms; the calls stay on their
    // connection (Redis timeout 10 s), so Redis runs the lone call and the
    // batch when it resumes: every operation refuses, past its answer-by.
    let (codes, calls) = stalled_acquires(Some(Duration::from_millis(500)), 10_000).await;
    assert!(
        codes
            .iter()
            .all(|code| matches!(code, Code::DeadlineExceeded | Code::Cancelled)),
        "{codes:?}"
    );
    // 32 acquires, the one after and the counter flusher's: far fewer
    // calls than operations, so the batch reached Redis and ran.
    let fcalls = calls.get("fcall").copied().unwrap_or(0);
    assert!((3..=10).contains(&fcalls), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_batches_keep_to_their_slot() {
    let server = TestServer::new().shards(4).cluster().start().await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await);
    }
    // 128 acquires at once over 4 shards (three nodes): many share a call.
    let calls = (0..128).map(|i| {
        let mut client = clients[i % 8].clone();
        async move {
            let reply = client
                .acquire(acquire(&format!("spread-{i}"), "h"))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired, "spread-{i}");
            reply.grant.unwrap().fencing_token
        }
    });
    let tokens = futures::future::join_all(calls).await;
    // Fencing counters are per shard (invariant 3 is per lock): two shards,
    // on two nodes, may hand out the same number; within a shard, never.
    let layout = tumbler_engine::keys::Layout::new("tumbler", 4);
    let mut per_shard: std::collections::HashMap<u32, std::collections::HashSet<u64>> =
        std::collections::HashMap::new();
    for (i, token) in tokens.iter().enumerate() {
        let shard = layout.shard_of("default", &format!("spread-{i}"));
        assert!(
            per_shard.entry(shard).or_default().insert(*token),
            "token {token} twice in shard {shard}"
        );
    }
    assert_eq!(per_shard.values().map(|t| t.len()).sum::<usize>(), 128);
    let releases = (0..128).map(|i| {
        let mut client = clients[i % 8].clone();
        async move {
            let reply = client
                .release(release(&format!("spread-{i}"), "h"))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.status(), ReleaseStatus::Released, "spread-{i}");
        }
    });
    futures::future::join_all(releases).await;
}
