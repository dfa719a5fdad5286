//! Hand-over latency: from a Release returning to the next waiter's
//! Acquire returning, through the real gRPC server and a real Redis that
//! this benchmark starts itself. Baselines in the same run: the round trip
//! of a try-once Acquire on an uncontended lock (what any grant costs),
//! and the same hand-over on a server with the hand-over off (decision
//! 0068: the released permit wakes the waiter, which calls again).
//!
//! `cargo bench --bench handover` (HANDOVERS=N to change the count).

pub mod common;
use common::{micros, wait_queued};

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tonic::transport::Channel;

use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus};

const WARM_UP: usize = 200;
const SMOKE_WARM_UP: usize = 5;

fn service_args() -> ServiceArgs {
    ServiceArgs {
        redis_timeout_ms: 5000,
        reap_interval_ms: 0,
        ..ServiceArgs::default()
    }
}

fn request(name: &str, holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        name: name.into(),
        holder: holder.into(),
        ttl_ms: Some(30_000),
        wait_ms,
        ..Default::default()
    }
}

fn release(name: &str, holder: &str) -> proto::ReleaseRequest {
    proto::ReleaseRequest {
        name: name.into(),
        holder: holder.into(),
        ..Default::default()
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this
    // as a quick smoke test instead.
    let benching = std::env::args().any(|a| a == "--bench");
    let handovers: usize = std::env::var("HANDOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 2000 } else { 20 });
    let warm_up = if benching { WARM_UP } else { SMOKE_WARM_UP };
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let mut config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    config.wait_limits.hand_over = true;
    let endpoint = common::serve_in_process(config).await;
    let mut config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    config.key_prefix = "woken".into();
    config.wait_limits.hand_over = false;
    let woken = common::serve_in_process(config).await;
    let mut clients = [connect(&endpoint).await, connect(&endpoint).await];
    let mut observer = connect(&endpoint).await;

    // Baseline: try-once Acquire round trips on an uncontended lock.
    let mut baseline = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + handovers) {
        let started = Instant::now();
        let reply = clients[0]
            .acquire(request("baseline", "b", 0))
            .await
            .unwrap()
            .into_inner();
        let took = started.elapsed();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        clients[0].release(release("baseline", "b")).await.unwrap();
        if i >= warm_up {
            baseline.record(took.as_micros() as u64).unwrap();
        }
    }

    let handover = hand_overs(&mut clients, &mut observer, warm_up, handovers).await;
    let mut clients = [connect(&woken).await, connect(&woken).await];
    let mut observer = connect(&woken).await;
    let woken = hand_overs(&mut clients, &mut observer, warm_up, handovers).await;

    println!(
        "tumbler hand-over benchmark: {handovers} hand-overs after {warm_up} warm-up, loopback, Redis on the same host"
    );
    println!("| measure | p50 µs | p99 µs | max µs |");
    println!("| --- | ---: | ---: | ---: |");
    for (label, h) in [
        ("try-once Acquire round trip (baseline)", &baseline),
        (
            "hand-over: Release returns → waiter's Acquire returns",
            &handover,
        ),
        (
            "the same with the hand-over off (the waiter calls again)",
            &woken,
        ),
    ] {
        println!(
            "| {label} | {:.0} | {:.0} | {} |",
            micros(h, 0.5),
            micros(h, 0.99),
            h.max()
        );
    }
    println!(
        "ratio hand-over / baseline: p50 {:.2}, p99 {:.2}",
        micros(&handover, 0.5) / micros(&baseline, 0.5),
        micros(&handover, 0.99) / micros(&baseline, 0.99)
    );
    println!(
        "ratio hand-over / hand-over off: p50 {:.2}, p99 {:.2}",
        micros(&handover, 0.5) / micros(&woken, 0.5),
        micros(&handover, 0.99) / micros(&woken, 0.99)
    );
}

async fn connect(endpoint: &str) -> LockServiceClient<Channel> {
    loop {
        if let Ok(mut client) = LockServiceClient::connect(endpoint.to_owned()).await
            && client.acquire(request("probe", "probe", 0)).await.is_ok()
        {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The holder releases while the other client waits queued, `handovers`
/// times after `warm_up`: from the Release returning to the waiter's
/// Acquire returning.
async fn hand_overs(
    clients: &mut [LockServiceClient<Channel>; 2],
    observer: &mut LockServiceClient<Channel>,
    warm_up: usize,
    handovers: usize,
) -> Histogram<u64> {
    let name = "handover";
    let holders = ["h0", "h1"];
    clients[0]
        .acquire(request(name, holders[0], 0))
        .await
        .unwrap();
    let mut handover = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + handovers) {
        let (current, next) = (i % 2, (i + 1) % 2);
        let mut waiter = clients[next].clone();
        let waiting = tokio::spawn(async move {
            let reply = waiter.acquire(request(name, holders[next], 10_000)).await;
            (Instant::now(), reply)
        });
        wait_queued(observer, name).await;
        clients[current]
            .release(release(name, holders[current]))
            .await
            .unwrap();
        let released = Instant::now();
        let (granted, reply) = waiting.await.unwrap();
        assert_eq!(
            reply.unwrap().into_inner().status(),
            AcquireStatus::Acquired
        );
        if i >= warm_up {
            let took = granted.saturating_duration_since(released);
            handover.record(took.as_micros() as u64).unwrap();
        }
    }
    let last = holders[(warm_up + handovers) % 2];
    clients[0].release(release(name, last)).await.unwrap();
    clients[1].release(release(name, last)).await.unwrap();
    handover
}
