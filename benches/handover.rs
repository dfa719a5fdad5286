//! Hand-over latency: from a Release returning to the next waiter's
//! Acquire returning, through the real gRPC server and a real Redis that
//! this benchmark starts itself. Baseline in the same run: the round trip
//! of a try-once Acquire on an uncontended lock (what any grant costs).
//!
//! `cargo bench --bench handover` (HANDOVERS=N to change the count).

pub mod common;

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

async fn wait_queued(client: &mut LockServiceClient<Channel>, name: &str) {
    loop {
        let queue = client
            .queue(proto::QueueRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if queue.waiters == 1 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64
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
    let config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    let endpoint = common::serve_in_process(config).await;
    let connect = || async {
        loop {
            if let Ok(client) = LockServiceClient::connect(endpoint.clone()).await {
                let probe = request("probe", "probe", 0);
                let mut client = client;
                if client.acquire(probe).await.is_ok() {
                    return client;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut clients = [connect().await, connect().await];
    let mut observer = connect().await;

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

    // Hand-over: the holder releases while the other client waits queued.
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
        wait_queued(&mut observer, name).await;
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
}
