//! Soak: mixed load on one `tumbler serve` process for a long time (10
//! minutes by default under `cargo bench`), sampling the replica's RSS and
//! Redis' key count every 30 s; then the load stops and the load's lock
//! keys must go back to zero (the reaper's own lock, which the replica
//! holds while it runs, is counted apart). Mixed load: uncontended acquire/release, queued waits
//! on contended locks (mutexes and semaphores), extends, inspects, lists,
//! short sessions holding a few locks, and watchers that come and go.
//!
//! `cargo bench --bench soak` (SOAK_SECONDS=N to change the length); under
//! `cargo test --all-targets` it runs for two seconds as a smoke test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_stream::StreamExt;
use tonic::transport::Channel;

use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, session_request::Command};

pub mod common;

/// Whether `key` belongs to a lock of the load (holders, info, queue,
/// deadlines); the reaper's own lock (namespace `tumbler-system`, held by
/// the running replica for as long as it runs) is not the load's.
fn is_load_lock_key(key: &str) -> bool {
    let rest = key.split_once("}:").map_or("", |(_, r)| r);
    !key.contains("{tumbler-system:") && ["l:", "q:", "d:"].iter().any(|p| rest.starts_with(p))
}

/// Keys of the load's locks, and all keys, by SCAN.
async fn lock_keys(conn: &mut redis::aio::MultiplexedConnection) -> (usize, usize) {
    let (mut cursor, mut locks, mut all) = (0u64, 0usize, 0usize);
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        all += batch.len();
        locks += batch.iter().filter(|k| is_load_lock_key(k)).count();
        if next == 0 {
            return (locks, all);
        }
        cursor = next;
    }
}

#[tokio::main]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 600 } else { 2 });
    let sample_every = Duration::from_secs(if benching { 30 } else { 1 });

    let redis_server = RedisServer::start("redis-server").expect("redis-server");
    let serve = common::ServeProcess::start(
        &redis_server.url(),
        &["--reap-interval-ms", "5000", "--shutdown-drain-ms", "0"],
    )
    .await;
    let channel = Channel::from_shared(serve.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut conn = common::redis_conn(&redis_server.url()).await;

    let ops = Arc::new(AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..24u64 {
        let mut client = LockServiceClient::new(channel.clone());
        let (ops, stop) = (ops.clone(), stop.clone());
        workers.spawn(async move {
            let holder = format!("worker-{worker}");
            let mut round = 0u64;
            while !stop.is_cancelled() {
                round += 1;
                let kind = (worker + round) % 6;
                let name = match kind {
                    // Many distinct names come and go.
                    0 | 1 => format!("u-{worker}-{}", round % 1000),
                    // A few hot names: a mutex and a semaphore.
                    2 => "hot-mutex".to_owned(),
                    _ => format!("hot-sem-{}", round % 3),
                };
                let limit = if kind >= 3 { 4 } else { 1 };
                let granted = client
                    .acquire(proto::AcquireRequest {
                        name: name.clone(),
                        holder: holder.clone(),
                        limit: Some(limit),
                        ttl_ms: Some(5_000),
                        wait_ms: if kind >= 2 { 2_000 } else { 0 },
                        kind: ["batch", "web", "cron"][(round % 3) as usize].into(),
                        metadata: [("round".to_string(), round.to_string())].into(),
                        ..Default::default()
                    })
                    .await
                    .is_ok_and(|r| r.into_inner().status() == proto::AcquireStatus::Acquired);
                if granted {
                    if round.is_multiple_of(5) {
                        let _ = client
                            .extend(proto::ExtendRequest {
                                name: name.clone(),
                                holder: holder.clone(),
                                ttl_ms: Some(5_000),
                                ..Default::default()
                            })
                            .await;
                    }
                    let _ = client
                        .inspect(proto::InspectRequest {
                            name: name.clone(),
                            ..Default::default()
                        })
                        .await;
                    let _ = client
                        .release(proto::ReleaseRequest {
                            name,
                            holder: holder.clone(),
                            ..Default::default()
                        })
                        .await;
                }
                if round.is_multiple_of(50) {
                    let _ = client
                        .list(proto::ListRequest {
                            prefix: "u-".into(),
                            page_size: 100,
                            ..Default::default()
                        })
                        .await;
                }
                ops.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // Sessions: open, take three locks, close; over and over.
    for worker in 0..4u64 {
        let mut client = LockServiceClient::new(channel.clone());
        let (ops, stop) = (ops.clone(), stop.clone());
        workers.spawn(async move {
            let mut round = 0u64;
            while !stop.is_cancelled() {
                round += 1;
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let send = |c| proto::SessionRequest { command: Some(c) };
                let _ = tx
                    .send(send(Command::Open(proto::SessionOpen {
                        ttl_ms: Some(3_000),
                        ..Default::default()
                    })))
                    .await;
                for i in 0..3u64 {
                    let _ = tx
                        .send(send(Command::Acquire(proto::SessionAcquire {
                            request_id: i + 1,
                            acquire: Some(proto::AcquireRequest {
                                name: format!("s-{worker}-{}-{i}", round % 100),
                                ..Default::default()
                            }),
                        })))
                        .await;
                }
                if let Ok(reply) = client
                    .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                {
                    let mut events = reply.into_inner();
                    let mut answered = 0;
                    while answered < 3 {
                        match events.next().await {
                            Some(Ok(proto::SessionResponse {
                                event: Some(proto::session_response::Event::Acquired(_)),
                            })) => answered += 1,
                            Some(Ok(_)) => {}
                            _ => break,
                        }
                    }
                }
                drop(tx);
                ops.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // Watchers that come and go.
    {
        let mut client = LockServiceClient::new(channel.clone());
        let stop = stop.clone();
        workers.spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(reply) = client
                    .watch(proto::WatchRequest {
                        prefix: "hot-".into(),
                        ..Default::default()
                    })
                    .await
                {
                    let mut events = reply.into_inner();
                    let until = Instant::now() + Duration::from_millis(500);
                    while Instant::now() < until {
                        if tokio::time::timeout(Duration::from_millis(100), events.next())
                            .await
                            .is_ok_and(|e| e.is_none())
                        {
                            break;
                        }
                    }
                }
            }
        });
    }

    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(sample_every).await;
        let (locks, all) = lock_keys(&mut conn).await;
        samples.push((
            started.elapsed().as_secs(),
            serve.rss_kib(),
            ops.load(Ordering::Relaxed),
            locks,
            all,
        ));
    }
    stop.cancel();
    while workers.join_next().await.is_some() {}
    // Released locks leave at once; a session's grants when it closed.
    let settle_from = Instant::now();
    let mut after = lock_keys(&mut conn).await;
    while after.0 > 0 && settle_from.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = lock_keys(&mut conn).await;
    }
    let rss_end = serve.rss_kib();
    drop(serve);

    println!("\n### Soak: {seconds} s of mixed load on one replica\n");
    println!("| at s | replica RSS MiB | operations so far | lock keys | all keys |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for (at, rss, ops, locks, all) in &samples {
        println!(
            "| {at} | {:.1} | {ops} | {locks} | {all} |",
            *rss as f64 / 1024.0
        );
    }
    let first = samples.first().map_or(0, |s| s.1);
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    println!(
        "\nRSS first sample {:.1} MiB, peak {:.1} MiB, after the load {:.1} MiB; \
         lock keys {:.1} s after the load stopped: {} (all keys: {}).",
        first as f64 / 1024.0,
        peak as f64 / 1024.0,
        rss_end as f64 / 1024.0,
        settle_from.elapsed().as_secs_f64(),
        after.0,
        after.1
    );
    if after.0 > 0 {
        // What is left, to say why.
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap();
            for key in batch.iter().filter(|k| is_load_lock_key(k)) {
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let dump: redis::Value = if key.contains("}:l:") {
                    redis::cmd("HGETALL")
                        .arg(key)
                        .query_async(&mut conn)
                        .await
                        .unwrap()
                } else {
                    redis::cmd("ZRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut conn)
                        .await
                        .unwrap()
                };
                println!("left: {key} pttl {ttl} ms: {dump:?}");
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    assert_eq!(after.0, 0, "lock keys left after the load stopped");
}
