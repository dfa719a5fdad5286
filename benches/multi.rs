//! Multi-locks (decision 0076), uncontended: a set of 3 names taken with
//! ONE Acquire (`names`) and released with one Release, against the same 3
//! locks taken with 3 single Acquires in sequence and 3 Releases; the same
//! in-process server and redis-server, in the same run, on loopback. 16
//! clients, each on locks of its own (nobody waits).
//!
//! Then Redis' own count of the work per set (`INFO commandstats` after
//! `CONFIG RESETSTAT`, around a fixed number of sets per client): the
//! function calls the server sent and the commands run inside them.
//!
//! `cargo bench --bench multi` (MULTI_SECONDS=N per row after 1 s of
//! warm-up, default 3). Under `cargo test` a smoke run with tiny counts
//! only checks that numbers come out.

pub mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};

const CLIENTS: usize = 16;

/// Commands of the measurement, health and pub/sub: no lock work.
const NOT_LOCK_WORK: &[&str] = &[
    "info",
    "config|resetstat",
    "ping",
    "subscribe",
    "client|setname",
    "hello",
    "select",
];

#[derive(Clone, Copy, Debug)]
enum Row {
    /// One Acquire of 3 names, one Release of the set.
    Multi,
    /// 3 Acquires, then 3 Releases, one after the other.
    Singles,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Multi => "a multi-lock of 3 names: 1 Acquire + 1 Release",
            Row::Singles => "3 single locks in sequence: 3 Acquires + 3 Releases",
        }
    }
}

fn names(client: usize) -> Vec<String> {
    (0..3).map(|i| format!("account-{client}-{i}")).collect()
}

/// One set taken and let go by `client`.
async fn set(row: Row, rpc: &mut LockServiceClient<Channel>, client: usize) {
    let holder = format!("client-{client}");
    let acquire = |name: String, names: Vec<String>| proto::AcquireRequest {
        name,
        names,
        holder: holder.clone(),
        ttl_ms: Some(30_000),
        ..Default::default()
    };
    let release = |name: String, names: Vec<String>| proto::ReleaseRequest {
        name,
        names,
        holder: holder.clone(),
        ..Default::default()
    };
    let requests: Vec<(String, Vec<String>)> = match row {
        Row::Multi => vec![(String::new(), names(client))],
        Row::Singles => names(client).into_iter().map(|n| (n, Vec::new())).collect(),
    };
    for (name, names) in &requests {
        let reply = rpc
            .acquire(acquire(name.clone(), names.clone()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    }
    for (name, names) in requests {
        let reply = rpc
            .release(release(name, names))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), ReleaseStatus::Released);
    }
}

async fn clients(endpoint: &str) -> Vec<LockServiceClient<Channel>> {
    let channel = Channel::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    (0..CLIENTS)
        .map(|_| LockServiceClient::new(channel.clone()))
        .collect()
}

/// Sets per second of `row` over `window`, after `warm_up`.
async fn throughput(row: Row, endpoint: &str, warm_up: Duration, window: Duration) -> f64 {
    let sets = Arc::new(AtomicUsize::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop_at = Instant::now() + warm_up + window;
    let mut tasks = Vec::new();
    for (client, mut rpc) in clients(endpoint).await.into_iter().enumerate() {
        let (sets, counting) = (sets.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                set(row, &mut rpc, client).await;
                if counting.load(Ordering::Relaxed) {
                    sets.fetch_add(1, Ordering::Relaxed);
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
    sets.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Redis' work per set of `row`: (function calls, commands inside).
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
            for _ in 0..each {
                set(row, &mut rpc, client).await;
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
    let sets = (each * CLIENTS) as f64;
    (calls as f64 / sets, inner as f64 / sets)
}

#[tokio::main]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds = std::env::var("MULTI_SECONDS")
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
        health_interval_ms: 60_000,
        ..ServiceArgs::default()
    };
    let config = ServerConfig::new(redis.url(), &args).unwrap();
    let endpoint = common::serve_in_process(config).await;
    common::wait_until_serving(&endpoint).await;
    let mut conn = common::redis_conn(&redis.url()).await;

    println!(
        "tumbler multi-lock benchmark: {CLIENTS} clients on locks of their own, {} s per row after {} ms of warm-up; \
         Redis work over {each} sets per client; one in-process server and redis-server on loopback",
        window.as_secs_f64(),
        warm_up.as_millis()
    );
    println!("| row | sets/s | vs 3 singles | Redis calls per set | commands inside per set |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut results = Vec::new();
    for row in [Row::Singles, Row::Multi] {
        let rate = throughput(row, &endpoint, warm_up, window).await;
        assert!(rate > 0.0, "{row:?} made no sets");
        let (calls, inner) = redis_work(row, &endpoint, &mut conn, each).await;
        assert!(inner > 0.0, "{row:?}: Redis counted no work");
        results.push((row, rate, calls, inner));
    }
    let singles = results[0].1;
    for (row, rate, calls, inner) in results {
        println!(
            "| {} | {rate:.0} | {:.2}× | {calls:.2} | {inner:.2} |",
            row.label(),
            rate / singles
        );
    }
}
