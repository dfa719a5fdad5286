//! Hand-over latency: from a Release returning to the next waiter's
//! Acquire returning, through the real gRPC server and a real Redis that
//! this benchmark starts itself. Baselines in the same run: the round trip
//! of a try-once Acquire on an uncontended lock (what any grant costs),
//! and the same hand-over on a server with the hand-over off (decision
//! 0068: the released permit wakes the waiter, which calls again). The
//! hand-over, the default, is measured twice (decision 0089): with the
//! default request TTL (5 s) under a 30 s lease (one replica: the release
//! comes through the waiter's own, so the grant is whole, decision 0090),
//! and with a request TTL of twice the lease, so it rides the wake-up.
//!
//! Then the same under a queue: 16 waiters (17 clients on one lock, each
//! releasing as soon as it is granted and queueing again), from each
//! Release returning to the next holder's Acquire returning, on each arm,
//! with Redis' own counters: function calls and commands per grant; and
//! by default with the clients spread over two replicas, where a grant
//! handed to the other replica's waiter is provisional and taken up (a
//! waiter of the releasing replica gets its whole lease: decision 0090). And
//! the peer: ZooKeeper 3.8 (Debian's `zookeeper`, started by
//! the benchmark on a free loopback port with its data on tmpfs, its JIT
//! warmed for ZK_WARM_SECONDS, default 15, first) with Curator's
//! InterProcessMutex recipe (`common/zookeeper.rs`, a session per client),
//! measured the same two ways; skipped with a line saying how to get it
//! when it is not installed.
//!
//! `cargo bench --bench handover` (HANDOVERS=N to change the count;
//! HANDOVER_WAITERS=N, default 16; HANDOVER_ZOOKEEPER=0 leaves ZooKeeper
//! out). Under `cargo test` a smoke run with 20 hand-overs, ZooKeeper
//! included when installed, without the JIT warm-up.

pub mod common;
use common::{micros, wait_queued, zookeeper};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
        // Its own checks are function calls: rare, so the counts per
        // grant are the grants'.
        health_interval_ms: 60_000,
        ..ServiceArgs::default()
    }
}

/// The lease every request asks.
const LEASE_MS: u64 = 30_000;

/// The request TTL of the hand-over's second arm: twice the lease, so the
/// lease ends by the waiter's liveness deadline (renewed every third of
/// the TTL) and the grant rides the wake-up (None: the server's default,
/// 5 s).
const LONG_QUEUE_TTL: Option<u64> = Some(2 * LEASE_MS);

fn request(name: &str, holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        name: name.into(),
        holder: holder.into(),
        ttl_ms: Some(LEASE_MS),
        wait_ms,
        ..Default::default()
    }
}

/// A waiting request with request TTL `queue_ttl_ms` (None: the default).
fn waiting(name: &str, holder: &str, queue_ttl_ms: Option<u64>) -> proto::AcquireRequest {
    proto::AcquireRequest {
        queue_ttl_ms,
        ..request(name, holder, 10_000)
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
    let waiters: usize = std::env::var("HANDOVER_WAITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let mut config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    config.wait_limits.hand_over = true;
    let endpoint = common::serve_in_process(config.clone()).await;
    // A second replica on the same Redis: waiters spread over both hand
    // grants across replicas, provisionally, and take them up.
    let second = common::serve_in_process(config).await;
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

    let handover = hand_overs(&mut clients, &mut observer, warm_up, handovers, None).await;
    let riding = hand_overs(
        &mut clients,
        &mut observer,
        warm_up,
        handovers,
        LONG_QUEUE_TTL,
    )
    .await;
    let mut clients = [connect(&woken).await, connect(&woken).await];
    let mut observer = connect(&woken).await;
    let woken_one = hand_overs(&mut clients, &mut observer, warm_up, handovers, None).await;

    // Under a queue: `waiters` behind the holder, on each arm, counted.
    let total = warm_up + handovers;
    let mut conn = common::redis_conn(&redis.url()).await;
    let (crowd, crowd_calls) = crowd_counted(&mut conn, &[&endpoint], waiters, total, None).await;
    let (riding_crowd, riding_calls) =
        crowd_counted(&mut conn, &[&endpoint], waiters, total, LONG_QUEUE_TTL).await;
    let (woken_crowd, woken_calls) =
        crowd_counted(&mut conn, &[&woken], waiters, total, None).await;
    let (spread_crowd, spread_calls) =
        crowd_counted(&mut conn, &[&endpoint, &second], waiters, total, None).await;
    let spread_crowd = latencies(spread_crowd, warm_up);
    let crowd = latencies(crowd, warm_up);
    let riding_crowd = latencies(riding_crowd, warm_up);
    let woken_crowd = latencies(woken_crowd, warm_up);

    // The peer, when installed.
    let zk_server = if std::env::var("HANDOVER_ZOOKEEPER").as_deref() == Ok("0") {
        None
    } else {
        zookeeper::ZkServer::start()
    };
    let zk = match &zk_server {
        Some(server) => {
            server.ready().await;
            // A fresh JVM runs well below its steady rate until its JIT
            // has compiled the request path.
            if benching {
                server.warm_up(zookeeper::warm_up_length()).await;
            }
            let one = zk_hand_overs(server, warm_up, handovers).await;
            let crowd = latencies(crowd_zk(server, waiters, total).await, warm_up);
            Some((one, crowd))
        }
        None => None,
    };

    println!(
        "tumbler hand-over benchmark: {handovers} hand-overs after {warm_up} warm-up, loopback, Redis on the same host"
    );
    println!("| measure | p50 µs | p99 µs | max µs |");
    println!("| --- | ---: | ---: | ---: |");
    let crowd_label = format!(
        "{waiters} waiters: hand-over (default), each Release returns → the next holder's Acquire returns"
    );
    let riding_crowd_label =
        format!("{waiters} waiters: the same with a request TTL of twice the lease");
    let woken_crowd_label = format!("{waiters} waiters: the same with the hand-over off");
    let spread_crowd_label = format!(
        "{waiters} waiters over two replicas (default; a grant to the other replica's waiter is taken up)"
    );
    let mut rows = vec![
        ("try-once Acquire round trip (baseline)", &baseline),
        (
            "hand-over (default; a 30 s lease past the 5 s request TTL, released through the waiter's replica: whole): Release returns → waiter's Acquire returns",
            &handover,
        ),
        (
            "the same with a request TTL of twice the lease (rides the wake-up)",
            &riding,
        ),
        (
            "the same with the hand-over off (the waiter calls again)",
            &woken_one,
        ),
        (crowd_label.as_str(), &crowd),
        (riding_crowd_label.as_str(), &riding_crowd),
        (woken_crowd_label.as_str(), &woken_crowd),
        (spread_crowd_label.as_str(), &spread_crowd),
    ];
    let zk_crowd_label = format!(
        "ZooKeeper (Curator's recipe), {waiters} waiters: each delete returns → the next holder's lock returns"
    );
    if let Some((one, zk_crowd)) = &zk {
        rows.push((
            "ZooKeeper (Curator's recipe): delete returns → the waiter's lock returns (its watch fired, children listed)",
            one,
        ));
        rows.push((zk_crowd_label.as_str(), zk_crowd));
    }
    for (label, h) in rows {
        println!(
            "| {label} | {:.0} | {:.0} | {} |",
            micros(h, 0.5),
            micros(h, 0.99),
            h.max()
        );
    }
    println!("Redis' counters per contended grant, {waiters} waiters ({total} grants each):");
    println!("| arm | function calls | commands in them |");
    println!("| --- | ---: | ---: |");
    for (label, (calls, commands)) in [
        ("hand-over (default)", crowd_calls),
        ("hand-over, request TTL twice the lease", riding_calls),
        ("hand-over off", woken_calls),
        ("hand-over (default), two replicas", spread_calls),
    ] {
        println!("| {label} | {calls:.2} | {commands:.1} |");
    }
    println!(
        "ratio hand-over / baseline: p50 {:.2}, p99 {:.2}",
        micros(&handover, 0.5) / micros(&baseline, 0.5),
        micros(&handover, 0.99) / micros(&baseline, 0.99)
    );
    println!(
        "ratio hand-over / hand-over off: p50 {:.2}, p99 {:.2}",
        micros(&handover, 0.5) / micros(&woken_one, 0.5),
        micros(&handover, 0.99) / micros(&woken_one, 0.99)
    );
    println!(
        "ratio hand-over / hand-over off at {waiters} waiters: p50 {:.2}, p99 {:.2}",
        micros(&crowd, 0.5) / micros(&woken_crowd, 0.5).max(1.0),
        micros(&crowd, 0.99) / micros(&woken_crowd, 0.99).max(1.0)
    );
    println!(
        "ratio hand-over riding the wake-up / hand-over off at {waiters} waiters: p50 {:.2}, p99 {:.2}",
        micros(&riding_crowd, 0.5) / micros(&woken_crowd, 0.5).max(1.0),
        micros(&riding_crowd, 0.99) / micros(&woken_crowd, 0.99).max(1.0)
    );
    match &zk {
        Some((one, zk_crowd)) => {
            let ratio = |label: &str, t: &Histogram<u64>, z: &Histogram<u64>| {
                println!(
                    "ratio tumbler / ZooKeeper, {label}: p50 {:.2}, p99 {:.2} (below 1: tumbler faster)",
                    micros(t, 0.5) / micros(z, 0.5).max(1.0),
                    micros(t, 0.99) / micros(z, 0.99).max(1.0)
                );
            };
            ratio("one waiter, hand-over (default)", &handover, one);
            ratio("one waiter, hand-over riding the wake-up", &riding, one);
            ratio("one waiter, hand-over off", &woken_one, one);
            ratio(
                &format!("{waiters} waiters, hand-over (default)"),
                &crowd,
                zk_crowd,
            );
            ratio(
                &format!("{waiters} waiters, hand-over riding the wake-up"),
                &riding_crowd,
                zk_crowd,
            );
            ratio(
                &format!("{waiters} waiters, hand-over off"),
                &woken_crowd,
                zk_crowd,
            );
        }
        None if zookeeper::ZkServer::installed() => {
            println!("(HANDOVER_ZOOKEEPER=0: the ZooKeeper rows were skipped)")
        }
        None => println!("{}", zookeeper::HOW_TO_GET),
    }
}

/// Per grant after the first `warm_up`: from the previous holder's
/// release returning to this holder's acquire returning (0 when the grant
/// came back first). `grants` holds (acquire returned, release returned)
/// per grant; the lock has one holder at a time, so the order its
/// acquires returned in is the order it was granted in.
fn latencies(mut grants: Vec<(Instant, Instant)>, warm_up: usize) -> Histogram<u64> {
    grants.sort_by_key(|(granted, _)| *granted);
    let mut h = Histogram::<u64>::new(3).unwrap();
    for pair in grants.windows(2).skip(warm_up) {
        let took = pair[1].0.saturating_duration_since(pair[0].1);
        h.record(took.as_micros() as u64).unwrap();
    }
    h
}

/// [`crowd_tumbler`] with Redis' counters around it: the grants, and the
/// function calls and the commands inside them per grant.
async fn crowd_counted(
    conn: &mut redis::aio::MultiplexedConnection,
    endpoints: &[&str],
    waiters: usize,
    total: usize,
    queue_ttl_ms: Option<u64>,
) -> (Vec<(Instant, Instant)>, (f64, f64)) {
    common::reset_command_stats(conn).await;
    let grants = crowd_tumbler(endpoints, waiters, total, queue_ttl_ms).await;
    let stats = common::command_stats(conn).await;
    let n = grants.len() as f64;
    let functions: u64 = (stats.iter())
        .filter(|c| c.name.starts_with("fcall"))
        .map(|c| c.calls)
        .sum();
    let commands: u64 = (stats.iter())
        .filter(|c| !c.name.starts_with("fcall") && !["info", "config"].contains(&c.name.as_str()))
        .map(|c| c.calls)
        .sum();
    (grants, (functions as f64 / n, commands as f64 / n))
}

/// `waiters + 1` clients (each its own connection, client i to replica
/// i mod the endpoints) on one lock, each waiting in Acquire (request TTL
/// `queue_ttl_ms`; None: the default), releasing as soon as it is granted
/// and queueing again, until `total` grants: (acquire returned, release
/// returned) per grant.
async fn crowd_tumbler(
    endpoints: &[&str],
    waiters: usize,
    total: usize,
    queue_ttl_ms: Option<u64>,
) -> Vec<(Instant, Instant)> {
    let name = "crowd";
    let granted_so_far = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for i in 0..=waiters {
        clients.push(connect(endpoints[i % endpoints.len()]).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (id, mut client) in clients.into_iter().enumerate() {
        let granted_so_far = granted_so_far.clone();
        tasks.spawn(async move {
            let holder = format!("c{id}");
            let mut grants = Vec::new();
            loop {
                let reply = client
                    .acquire(waiting(name, &holder, queue_ttl_ms))
                    .await
                    .unwrap()
                    .into_inner();
                let granted = Instant::now();
                assert_eq!(reply.status(), AcquireStatus::Acquired);
                let n = granted_so_far.fetch_add(1, Ordering::Relaxed) + 1;
                client.release(release(name, &holder)).await.unwrap();
                grants.push((granted, Instant::now()));
                if n >= total {
                    return grants;
                }
            }
        });
    }
    tasks.join_all().await.into_iter().flatten().collect()
}

/// [`crowd_tumbler`] on ZooKeeper: a session per client.
async fn crowd_zk(
    server: &zookeeper::ZkServer,
    waiters: usize,
    total: usize,
) -> Vec<(Instant, Instant)> {
    let dir = "/crowd";
    let granted_so_far = Arc::new(AtomicUsize::new(0));
    let mut sessions = Vec::new();
    for _ in 0..=waiters {
        sessions.push(server.session().await);
    }
    zookeeper::make_lock_node(&sessions[0], dir).await;
    let mut tasks = tokio::task::JoinSet::new();
    for session in sessions {
        let granted_so_far = granted_so_far.clone();
        tasks.spawn(async move {
            let mut grants = Vec::new();
            loop {
                let held = zookeeper::lock(&session, dir, || {}).await;
                let granted = Instant::now();
                let n = granted_so_far.fetch_add(1, Ordering::Relaxed) + 1;
                zookeeper::unlock(&session, &held).await;
                grants.push((granted, Instant::now()));
                if n >= total {
                    return grants;
                }
            }
        });
    }
    tasks.join_all().await.into_iter().flatten().collect()
}

/// [`hand_overs`] on ZooKeeper: two sessions take turns; the holder
/// deletes its node once the other's watch on it is set.
async fn zk_hand_overs(
    server: &zookeeper::ZkServer,
    warm_up: usize,
    handovers: usize,
) -> Histogram<u64> {
    let dir = "/handover";
    let sessions = [server.session().await, server.session().await];
    zookeeper::make_lock_node(&sessions[0], dir).await;
    let mut held = zookeeper::lock(&sessions[0], dir, || {}).await;
    let mut handover = Histogram::<u64>::new(3).unwrap();
    for i in 0..(warm_up + handovers) {
        let (current, next) = (i % 2, (i + 1) % 2);
        let waiter = sessions[next].clone();
        let (queued, is_queued) = tokio::sync::oneshot::channel();
        let waiting = tokio::spawn(async move {
            let mut queued = Some(queued);
            let path = zookeeper::lock(&waiter, dir, || {
                if let Some(queued) = queued.take() {
                    let _ = queued.send(());
                }
            })
            .await;
            (Instant::now(), path)
        });
        is_queued.await.unwrap();
        zookeeper::unlock(&sessions[current], &held).await;
        let released = Instant::now();
        let (granted, path) = waiting.await.unwrap();
        held = path;
        if i >= warm_up {
            let took = granted.saturating_duration_since(released);
            handover.record(took.as_micros() as u64).unwrap();
        }
    }
    zookeeper::unlock(&sessions[(warm_up + handovers) % 2], &held).await;
    handover
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

/// The holder releases while the other client waits queued (request TTL
/// `queue_ttl_ms`; None: the default), `handovers` times after
/// `warm_up`: from the Release returning to the waiter's Acquire
/// returning.
async fn hand_overs(
    clients: &mut [LockServiceClient<Channel>; 2],
    observer: &mut LockServiceClient<Channel>,
    warm_up: usize,
    handovers: usize,
    queue_ttl_ms: Option<u64>,
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
            let reply = waiter
                .acquire(waiting(name, holders[next], queue_ttl_ms))
                .await;
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
