//! Election hand-over latency: from the leader's Resign returning to the
//! next candidate's Campaign returning, p50/p99, through the real gRPC
//! server and a real Redis this benchmark starts itself; against etcd
//! 3.4's election (v3election Campaign/Resign over gRPC, each candidate on
//! its own lease) on the same machine, when `etcd` is installed. Baselines
//! in the same run: tumbler's lock hand-over (Release → the waiter's
//! Acquire), which an election hand-over is, and a try-once Acquire round
//! trip (what any grant costs).
//!
//! `cargo bench --bench election` (HANDOVERS=N to change the count).

pub mod common;

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tonic::transport::Channel;

use common::etcd::{self, EtcdServer, LeaseGrantRequest, LeaseGrantResponse};
use common::{micros, wait_queued};
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ResignStatus};

const WARM_UP: usize = 200;
const SMOKE_WARM_UP: usize = 5;

// etcd 3.4 `v3election.proto` and `rpc.proto` (Range), the fields used.
#[derive(Clone, PartialEq, prost::Message)]
struct CampaignRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LeaderKey {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    key: Vec<u8>,
    #[prost(int64, tag = "3")]
    rev: i64,
    #[prost(int64, tag = "4")]
    lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct CampaignResponse {
    #[prost(message, optional, tag = "2")]
    leader: Option<LeaderKey>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResignRequest {
    #[prost(message, optional, tag = "1")]
    leader: Option<LeaderKey>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResignResponse {}

#[derive(Clone, PartialEq, prost::Message)]
struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    range_end: Vec<u8>,
    #[prost(bool, tag = "9")]
    count_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RangeResponse {
    #[prost(int64, tag = "4")]
    count: i64,
}

fn service_args() -> ServiceArgs {
    ServiceArgs {
        redis_timeout_ms: 5000,
        reap_interval_ms: 0,
        ..ServiceArgs::default()
    }
}

fn campaign(name: &str, candidate: &str) -> proto::CampaignRequest {
    proto::CampaignRequest {
        name: name.into(),
        candidate: candidate.into(),
        value: format!("{candidate}:8080"),
        ttl_ms: Some(30_000),
        wait_ms: Some(10_000),
        ..Default::default()
    }
}

fn acquire(name: &str, holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        name: name.into(),
        holder: holder.into(),
        ttl_ms: Some(30_000),
        wait_ms,
        ..Default::default()
    }
}

/// tumbler: the try-once baseline, the lock hand-over, the election
/// hand-over (Resign → Campaign), each `warm_up + n` times.
async fn tumbler_runs(n: usize, warm_up: usize) -> [Histogram<u64>; 3] {
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    let endpoint = common::serve_in_process(config).await;
    let connect = || async {
        loop {
            if let Ok(mut client) = LockServiceClient::connect(endpoint.clone()).await
                && client.acquire(acquire("probe", "probe", 0)).await.is_ok()
            {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut clients = [connect().await, connect().await];
    let mut observer = connect().await;
    let release = |name: &str, holder: &str| proto::ReleaseRequest {
        name: name.into(),
        holder: holder.into(),
        ..Default::default()
    };

    let mut baseline = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + n) {
        let started = Instant::now();
        let reply = clients[0]
            .acquire(acquire("baseline", "b", 0))
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

    let holders = ["h0", "h1"];
    clients[0]
        .acquire(acquire("handover", holders[0], 0))
        .await
        .unwrap();
    let mut lock = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + n) {
        let (current, next) = (i % 2, (i + 1) % 2);
        let mut waiter = clients[next].clone();
        let waiting = tokio::spawn(async move {
            let reply = waiter
                .acquire(acquire("handover", holders[next], 10_000))
                .await;
            (Instant::now(), reply)
        });
        wait_queued(&mut observer, "handover").await;
        clients[current]
            .release(release("handover", holders[current]))
            .await
            .unwrap();
        let released = Instant::now();
        let (granted, reply) = waiting.await.unwrap();
        assert_eq!(
            reply.unwrap().into_inner().status(),
            AcquireStatus::Acquired
        );
        if i >= warm_up {
            lock.record(granted.saturating_duration_since(released).as_micros() as u64)
                .unwrap();
        }
    }

    let first = clients[0]
        .campaign(campaign("election", holders[0]))
        .await
        .unwrap()
        .into_inner();
    let (mut term, mut secret) = (first.leader.unwrap().term, first.secret);
    let mut election = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + n) {
        let (current, next) = (i % 2, (i + 1) % 2);
        let mut candidate = clients[next].clone();
        let waiting = tokio::spawn(async move {
            let reply = candidate
                .campaign(campaign("election", holders[next]))
                .await;
            (Instant::now(), reply)
        });
        wait_queued(&mut observer, "election").await;
        let resigned = clients[current]
            .resign(proto::ResignRequest {
                name: "election".into(),
                candidate: holders[current].into(),
                term,
                secret: secret.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resigned.status(), ResignStatus::Resigned);
        let released = Instant::now();
        let (elected, reply) = waiting.await.unwrap();
        let reply = reply.unwrap().into_inner();
        assert!(reply.elected);
        let next_term = reply.leader.unwrap().term;
        assert!(next_term > term, "terms rise");
        (term, secret) = (next_term, reply.secret);
        if i >= warm_up {
            election
                .record(elected.saturating_duration_since(released).as_micros() as u64)
                .unwrap();
        }
    }
    [baseline, lock, election]
}

/// etcd 3.4: Resign → the next candidate's Campaign returning, each
/// candidate with its own lease (as `etcdctl elect` does).
async fn etcd_runs(n: usize, warm_up: usize) -> Option<Histogram<u64>> {
    let server = EtcdServer::start()?;
    server.ready().await;
    let channel = || async {
        Channel::from_shared(server.endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    let mut grpcs = [
        tonic::client::Grpc::new(channel().await),
        tonic::client::Grpc::new(channel().await),
    ];
    let mut observer = tonic::client::Grpc::new(channel().await);
    let mut leases = [0i64; 2];
    for (lease, grpc) in leases.iter_mut().zip(grpcs.iter_mut()) {
        let granted: LeaseGrantResponse = etcd::call(
            grpc,
            "/etcdserverpb.Lease/LeaseGrant",
            LeaseGrantRequest { ttl: 600, id: 0 },
        )
        .await;
        *lease = granted.id;
    }
    let name = b"election".to_vec();
    let campaign = |lease: i64| CampaignRequest {
        name: name.clone(),
        lease,
        value: b"host:8080".to_vec(),
    };
    let first: CampaignResponse = etcd::call(
        &mut grpcs[0],
        "/v3electionpb.Election/Campaign",
        campaign(leases[0]),
    )
    .await;
    let mut leader = first.leader.unwrap();
    let mut h = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + n) {
        let (current, next) = (i % 2, (i + 1) % 2);
        let mut candidate = grpcs[next].clone();
        let request = campaign(leases[next]);
        let waiting = tokio::spawn(async move {
            let reply: CampaignResponse =
                etcd::call(&mut candidate, "/v3electionpb.Election/Campaign", request).await;
            (Instant::now(), reply)
        });
        // The candidate's key is written before it waits: two keys.
        loop {
            let seen: RangeResponse = etcd::call(
                &mut observer,
                "/etcdserverpb.KV/Range",
                RangeRequest {
                    key: b"election/".to_vec(),
                    range_end: b"election0".to_vec(),
                    count_only: true,
                },
            )
            .await;
            if seen.count == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        let _: ResignResponse = etcd::call(
            &mut grpcs[current],
            "/v3electionpb.Election/Resign",
            ResignRequest {
                leader: Some(leader.clone()),
            },
        )
        .await;
        let resigned = Instant::now();
        let (elected, reply) = waiting.await.unwrap();
        leader = reply.leader.unwrap();
        if i >= warm_up {
            h.record(elected.saturating_duration_since(resigned).as_micros() as u64)
                .unwrap();
        }
    }
    Some(h)
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this
    // as a quick smoke test instead.
    let benching = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("HANDOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 2000 } else { 20 });
    let warm_up = if benching { WARM_UP } else { SMOKE_WARM_UP };
    let [baseline, lock, election] = tumbler_runs(n, warm_up).await;
    let etcd = etcd_runs(n, warm_up).await;

    println!(
        "tumbler election benchmark: {n} hand-overs after {warm_up} warm-up each, loopback, Redis (and etcd) on the same host"
    );
    println!("| measure | p50 µs | p99 µs | max µs |");
    println!("| --- | ---: | ---: | ---: |");
    let mut rows = vec![
        ("tumbler: try-once Acquire round trip (baseline)", &baseline),
        ("tumbler: lock hand-over, Release → Acquire", &lock),
        ("tumbler: election hand-over, Resign → Campaign", &election),
    ];
    if let Some(etcd) = &etcd {
        rows.push(("etcd 3.4: election hand-over, Resign → Campaign", etcd));
    }
    for (label, h) in rows {
        println!(
            "| {label} | {:.0} | {:.0} | {} |",
            micros(h, 0.5),
            micros(h, 0.99),
            h.max()
        );
    }
    let ratio = |a: &Histogram<u64>, b: &Histogram<u64>| {
        (
            micros(a, 0.5) / micros(b, 0.5),
            micros(a, 0.99) / micros(b, 0.99),
        )
    };
    let (p50, p99) = ratio(&election, &lock);
    println!("ratio election hand-over / lock hand-over: p50 {p50:.2}, p99 {p99:.2}");
    let (p50, p99) = ratio(&election, &baseline);
    println!("ratio election hand-over / try-once round trip: p50 {p50:.2}, p99 {p99:.2}");
    match &etcd {
        Some(etcd) => {
            let (p50, p99) = ratio(etcd, &election);
            println!("ratio etcd's election hand-over / tumbler's: p50 {p50:.1}, p99 {p99:.1}");
        }
        None => println!("etcd: not installed (Debian etcd-server), no comparison"),
    }
}
