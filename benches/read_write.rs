//! Read/write locks under shared load: acquire READ + release pairs per
//! second with 64 concurrent readers on ONE read/write lock, against 64
//! clients each on a mutex of its own (the uncontended pair), and, to
//! tell the one hot lock from the mode rule, 64 holders of ONE plain
//! semaphore of limit 64; the same in-process server and redis-server, in
//! the same run, on loopback. Nobody waits in any row: the read/write
//! lock admits the server's maximum of readers (its limit left out), the
//! semaphore 64.
//!
//! Then Redis' own count of the work per pair (`INFO commandstats` after
//! `CONFIG RESETSTAT`, around a fixed number of pairs per client): the
//! function calls the server sent (group commit may carry several
//! operations in one) and the commands run inside them.
//!
//! `cargo bench --bench read_write` (READ_WRITE_SECONDS=N per row after
//! 1 s of warm-up, default 3). Under `cargo test` a smoke run with tiny
//! counts only checks that numbers come out.

pub mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, LockMode, ReleaseStatus};

const CLIENTS: usize = 64;
const CLIENTS_PER_CHANNEL: usize = 8;

/// Commands the measurement itself, the health check and the pub/sub
/// connection send: not part of any lock operation.
const NOT_LOCK_WORK: &[&str] = &[
    "info",
    "config|resetstat",
    "ping",
    "subscribe",
    "client|setname",
    "hello",
    "select",
];

/// What each client acquires and releases.
#[derive(Clone, Copy, Debug)]
enum Row {
    /// Client i: mutex `mutex-i`.
    Mutexes,
    /// Every client: semaphore `semaphore`, limit 64.
    Semaphore,
    /// Every client: read/write lock `catalog`, READ.
    Readers,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Mutexes => "64 clients, 64 mutexes (one each): acquire + release",
            Row::Semaphore => "64 clients, ONE semaphore of limit 64: acquire + release",
            Row::Readers => "64 readers, ONE read/write lock: acquire READ + release",
        }
    }

    fn request(self, client: usize) -> proto::AcquireRequest {
        let holder = format!("client-{client}");
        let mut request = proto::AcquireRequest {
            holder,
            ttl_ms: Some(30_000),
            ..Default::default()
        };
        match self {
            Row::Mutexes => request.name = format!("mutex-{client}"),
            Row::Semaphore => {
                request.name = "semaphore".into();
                request.limit = Some(CLIENTS as u32);
            }
            Row::Readers => {
                request.name = "catalog".into();
                request.set_mode(LockMode::Read);
            }
        }
        request
    }
}

/// One acquire + release pair of `row`'s client.
async fn pair(rpc: &mut LockServiceClient<Channel>, request: &proto::AcquireRequest) {
    let reply = rpc.acquire(request.clone()).await.unwrap().into_inner();
    assert_eq!(
        reply.status(),
        AcquireStatus::Acquired,
        "{}: {reply:?}",
        request.name
    );
    let reply = rpc
        .release(proto::ReleaseRequest {
            name: request.name.clone(),
            holder: request.holder.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), ReleaseStatus::Released, "{}", request.name);
}

/// The 64 clients, 8 to an HTTP/2 connection.
async fn clients(endpoint: &str) -> Vec<LockServiceClient<Channel>> {
    let mut channels = Vec::new();
    for _ in 0..CLIENTS.div_ceil(CLIENTS_PER_CHANNEL) {
        channels.push(
            Channel::from_shared(endpoint.to_owned())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    (0..CLIENTS)
        .map(|i| LockServiceClient::new(channels[i / CLIENTS_PER_CHANNEL].clone()))
        .collect()
}

/// Pairs per second of `row` over `window`, after `warm_up`.
async fn throughput(row: Row, endpoint: &str, warm_up: Duration, window: Duration) -> f64 {
    let pairs = Arc::new(AtomicUsize::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop_at = Instant::now() + warm_up + window;
    let mut tasks = Vec::new();
    for (client, mut rpc) in clients(endpoint).await.into_iter().enumerate() {
        let (pairs, counting) = (pairs.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            let request = row.request(client);
            while Instant::now() < stop_at {
                pair(&mut rpc, &request).await;
                if counting.load(Ordering::Relaxed) {
                    pairs.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(warm_up).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Redis' work per pair of `row`: `each` pairs per client, all clients at
/// once, counted by Redis (function calls, commands inside them).
async fn redis_work(
    row: Row,
    endpoint: &str,
    conn: &mut redis::aio::MultiplexedConnection,
    each: usize,
) -> (f64, f64) {
    let clients = clients(endpoint).await;
    common::reset_command_stats(conn).await;
    let mut tasks = Vec::new();
    for (client, mut rpc) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let request = row.request(client);
            for _ in 0..each {
                pair(&mut rpc, &request).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (mut calls, mut inner) = (0, 0);
    for stat in common::command_stats(conn).await {
        match stat.name.as_str() {
            "fcall" | "fcall_ro" | "evalsha" | "eval" => calls += stat.calls,
            name if NOT_LOCK_WORK.contains(&name) => {}
            _ => inner += stat.calls,
        }
    }
    let pairs = (each * CLIENTS) as f64;
    (calls as f64 / pairs, inner as f64 / pairs)
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this
    // as a quick smoke test instead.
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds = std::env::var("READ_WRITE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (warm_up, window, each) = if benching {
        (Duration::from_secs(1), Duration::from_secs(seconds), 20)
    } else {
        (Duration::from_millis(50), Duration::from_millis(200), 2)
    };
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let args = ServiceArgs {
        reap_interval_ms: 0,
        // Health checks far apart: their PINGs are not lock work.
        health_interval_ms: 60_000,
        ..ServiceArgs::default()
    };
    let config = ServerConfig::new(redis.url(), &args).unwrap();
    let endpoint = common::serve_in_process(config).await;
    common::wait_until_serving(&endpoint).await;
    let mut conn = common::redis_conn(&redis.url()).await;

    println!(
        "tumbler read/write benchmark: {CLIENTS} clients, {} s per row after {} ms of warm-up; \
         Redis work over {each} pairs per client; one in-process server and redis-server on loopback",
        window.as_secs_f64(),
        warm_up.as_millis()
    );
    println!("| row | pairs/s | vs 64 mutexes | Redis calls per pair | commands inside per pair |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut mutexes = 0.0;
    for row in [Row::Mutexes, Row::Semaphore, Row::Readers] {
        let rate = throughput(row, &endpoint, warm_up, window).await;
        assert!(rate > 0.0, "{row:?} made no pairs");
        if let Row::Mutexes = row {
            mutexes = rate;
        }
        let (calls, inner) = redis_work(row, &endpoint, &mut conn, each).await;
        assert!(inner > 0.0, "{row:?}: Redis counted no work");
        println!(
            "| {} | {rate:.0} | {:.2}× | {calls:.2} | {inner:.2} |",
            row.label(),
            rate / mutexes
        );
    }
}
