//! Throughput and latency under load: N concurrent clients driving the real
//! gRPC API over real connections (one tonic Channel per 8 clients),
//! against two baselines measured in the same run:
//! - the **plain Redis lock**, the physical limit of a lock in Redis:
//!   `SET key holder NX PX ttl` to acquire, a compare-and-delete script to
//!   release, over four multiplexed connections (tumbler's pool size);
//!   it cannot wait, so a waiting client retries every millisecond (no
//!   semaphores: mutex scenarios only);
//! - **etcd 3.4's v3lock**, when an `etcd` binary is installed (Debian
//!   `etcd-server`): `Lock`/`Unlock` over gRPC with one lease per client,
//!   etcd started by the benchmark on loopback with its data dir on tmpfs
//!   (mutex scenarios only: v3lock has no semaphores).
//!
//! A third row shows tumbler's engine called in-process (same functions,
//! same pool, no gRPC): what the gRPC layer costs, not a baseline. In the
//! contended scenarios a fourth row is tumbler with the hand-over off
//! (`WaitLimits::hand_over`, decision 0068: a freed permit wakes the head,
//! which calls again; the default, `--hand-over` turns it on), measured in
//! the same run beside the rows with it on; and
//! every Redis path's row gives Redis' own count of function calls and of
//! the commands inside them per operation (`INFO commandstats`, reset
//! before each row).
//!
//! Scenarios: uncontended acquire+release pairs (1 and 64 clients, distinct
//! names); 16 and 64 clients queueing on one lock (limit 1) and 64 on a
//! semaphore (limit 8), each holding ~1 ms; 16 clients on one lock that
//! release as soon as they are granted (the hand-over's own rate, with no
//! hold to hide it); 500 jobs over 50 names run by 20 workers (lock the
//! job's name waiting, work 1 ms, release).
//!
//! `cargo bench --bench load` (LOAD_SECONDS=N per measurement, default 4;
//! LOAD_ROUNDS=N rounds of 500 jobs, default 5; LOAD_ONLY=text runs only
//! the scenarios whose label contains it). Under `cargo test` it runs a
//! smoke version with tiny counts that only checks numbers come out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub mod common;

use common::etcd;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};
use tumbler_engine::keys::Layout;
use tumbler_engine::{
    self as engine, AcquireOutcome, EngineFace, EngineSettings, LockEngine, LockId, ReleaseOutcome,
};
use tumbler_store::Store;

const CLIENTS_PER_CHANNEL: usize = 8;
const TTL_MS: u64 = 30_000;
const WAIT_MS: u64 = 30_000;
const HOLD: Duration = Duration::from_millis(1);

fn service_args(prefix: &str, connections: u32) -> ServiceArgs {
    ServiceArgs {
        redis_timeout_ms: 5000,
        reap_interval_ms: 0,
        redis_connections: connections,
        key_prefix: prefix.into(),
        ..ServiceArgs::default()
    }
}

/// How the clients reach the locks.
#[derive(Clone)]
enum Path {
    /// Through tumbler's gRPC server: one Channel per 8 clients.
    Grpc(Vec<Channel>),
    /// The engine in this process: the same Lua, the same pool, no gRPC.
    Direct {
        engine: Arc<LockEngine>,
        queue_ttl_ms: u64,
    },
    /// etcd's v3lock service over gRPC, one lease per client.
    Etcd(Vec<Channel>),
    /// The plain Redis lock over a few multiplexed connections.
    Plain(Vec<redis::aio::MultiplexedConnection>),
}

enum Client {
    Grpc(LockServiceClient<Channel>),
    Direct {
        engine: Arc<LockEngine>,
        queue_ttl_ms: u64,
    },
    Etcd {
        grpc: tonic::client::Grpc<Channel>,
        lease: i64,
        /// The key each held lock got from Lock (Unlock takes the key).
        held: std::collections::HashMap<String, Vec<u8>>,
    },
    Plain(redis::aio::MultiplexedConnection),
}

/// The plain lock's release: delete the key only if it holds our value.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn compare_and_delete() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(COMPARE_AND_DELETE))
}

impl Path {
    async fn client(&self, index: usize) -> Client {
        match self {
            Path::Grpc(channels) => Client::Grpc(LockServiceClient::new(
                channels[(index / CLIENTS_PER_CHANNEL) % channels.len()].clone(),
            )),
            Path::Etcd(channels) => {
                let mut grpc = tonic::client::Grpc::new(
                    channels[(index / CLIENTS_PER_CHANNEL) % channels.len()].clone(),
                );
                let lease: etcd::LeaseGrantResponse = etcd::call(
                    &mut grpc,
                    "/etcdserverpb.Lease/LeaseGrant",
                    etcd::LeaseGrantRequest { ttl: 600, id: 0 },
                )
                .await;
                Client::Etcd {
                    grpc,
                    lease: lease.id,
                    held: Default::default(),
                }
            }
            Path::Direct {
                engine,
                queue_ttl_ms,
            } => Client::Direct {
                engine: engine.clone(),
                queue_ttl_ms: *queue_ttl_ms,
            },
            Path::Plain(connections) => {
                Client::Plain(connections[index % connections.len()].clone())
            }
        }
    }
}

impl Client {
    /// Acquires and panics unless granted (waiting up to WAIT_MS if asked).
    async fn acquire(&mut self, name: &str, holder: &str, limit: u32, wait: bool) {
        let wait_ms = if wait { WAIT_MS } else { 0 };
        match self {
            Client::Grpc(client) => {
                let reply = client
                    .acquire(proto::AcquireRequest {
                        name: name.into(),
                        holder: holder.into(),
                        ttl_ms: Some(TTL_MS),
                        limit: Some(limit),
                        wait_ms,
                        ..Default::default()
                    })
                    .await
                    .expect("Acquire RPC")
                    .into_inner();
                assert_eq!(reply.status(), AcquireStatus::Acquired, "{name}");
            }
            Client::Direct {
                engine,
                queue_ttl_ms,
            } => {
                let outcome = (engine.locks())
                    .acquire(&engine::AcquireRequest {
                        limit,
                        wait: Duration::from_millis(wait_ms),
                        queue_ttl_ms: *queue_ttl_ms,
                        ..engine::AcquireRequest::new(
                            lock_id(name),
                            engine::Holder::stored(holder),
                            engine::Ttl::stored(TTL_MS),
                        )
                    })
                    .await
                    .expect("engine acquire");
                assert!(
                    matches!(outcome, AcquireOutcome::Acquired { .. }),
                    "{name}: {outcome:?}"
                );
            }
            // Lock always waits; only limit 1 exists.
            Client::Etcd { grpc, lease, held } => {
                assert_eq!(limit, 1, "etcd v3lock has no semaphores");
                let reply: etcd::LockResponse = etcd::call(
                    grpc,
                    "/v3lockpb.Lock/Lock",
                    etcd::LockRequest {
                        name: name.as_bytes().to_vec(),
                        lease: *lease,
                    },
                )
                .await;
                held.insert(name.to_owned(), reply.key);
            }
            // No queue: a waiting client retries every millisecond.
            Client::Plain(conn) => {
                assert_eq!(limit, 1, "the plain lock has no semaphores");
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(format!("plain:{name}"))
                        .arg(holder)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL_MS)
                        .query_async(conn)
                        .await
                        .expect("SET NX PX");
                    if set.is_some() {
                        break;
                    }
                    assert!(wait, "{name}: busy");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }

    async fn release(&mut self, name: &str, holder: &str) {
        match self {
            Client::Grpc(client) => {
                let reply = client
                    .release(proto::ReleaseRequest {
                        name: name.into(),
                        holder: holder.into(),
                        ..Default::default()
                    })
                    .await
                    .expect("Release RPC")
                    .into_inner();
                assert_eq!(reply.status(), ReleaseStatus::Released, "{name}");
            }
            Client::Direct { engine, .. } => {
                let outcome = (engine.locks())
                    .release(&lock_id(name), &engine::Holder::stored(holder), None)
                    .await
                    .expect("engine release");
                assert!(
                    matches!(outcome, ReleaseOutcome::Released { .. }),
                    "{name}: {outcome:?}"
                );
            }
            Client::Etcd { grpc, held, .. } => {
                let key = held.remove(name).expect("held");
                let _: etcd::UnlockResponse =
                    etcd::call(grpc, "/v3lockpb.Lock/Unlock", etcd::UnlockRequest { key }).await;
            }
            Client::Plain(conn) => {
                let deleted: i64 = compare_and_delete()
                    .key(format!("plain:{name}"))
                    .arg(holder)
                    .invoke_async(conn)
                    .await
                    .expect("compare-and-delete");
                assert_eq!(deleted, 1, "{name}");
            }
        }
    }
}

fn lock_id(name: &str) -> LockId {
    LockId::parse("default", name).expect("a valid lock name")
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// Acquire (try once) + release pairs, each client on its own name.
    Uncontended { clients: usize },
    /// All clients queue on one name with `limit` permits, hold ~1 ms
    /// (`hold`) or release as soon as granted (the hand-over's own rate).
    Contended {
        clients: usize,
        limit: u32,
        hold: bool,
    },
    /// `jobs` jobs over `names` names, `workers` at a time: lock the job's
    /// name waiting, work ~1 ms, release.
    Jobs {
        jobs: usize,
        names: usize,
        workers: usize,
    },
}

impl Scenario {
    fn label(&self) -> String {
        match *self {
            Scenario::Uncontended { clients } => {
                format!("uncontended pairs, {clients} client(s)")
            }
            Scenario::Contended {
                clients,
                limit: 1,
                hold,
            } => format!(
                "contended: {clients} clients, one lock{}",
                if hold { "" } else { ", released at once" }
            ),
            Scenario::Contended { clients, limit, .. } => {
                format!("contended: {clients} clients, semaphore limit {limit}")
            }
            Scenario::Jobs {
                jobs,
                names,
                workers,
            } => format!("{jobs} jobs / {workers} workers ({names} names)"),
        }
    }

    fn unit(&self) -> &'static str {
        match self {
            Scenario::Uncontended { .. } => "pairs/s",
            Scenario::Contended { .. } => "grants/s",
            Scenario::Jobs { .. } => "jobs/s",
        }
    }

    fn latency(&self) -> &'static str {
        match self {
            Scenario::Uncontended { .. } => "pair",
            Scenario::Contended { .. } => "wait",
            Scenario::Jobs { .. } => "job",
        }
    }
}

struct Measured {
    ops: u64,
    /// Operations of the whole run, warm-up included (what Redis' counts
    /// cover).
    all_ops: u64,
    elapsed: Duration,
    /// µs: a pair's round trips, a contended Acquire's wait, or a whole job.
    latency: Histogram<u64>,
    /// Redis' function (or script) calls and the commands inside them
    /// (plain commands too), over the whole run with its warm-up.
    redis: Option<(u64, u64)>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

struct Timing {
    warm_up: Duration,
    measure: Duration,
    job_rounds: usize,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

/// Runs `scenario` over `path`; `tag` keeps each run's names apart.
async fn run(path: &Path, scenario: Scenario, tag: &str, timing: &Timing) -> Measured {
    match scenario {
        Scenario::Uncontended { clients } | Scenario::Contended { clients, .. } => {
            let started = Instant::now();
            let measure_from = started + timing.warm_up;
            let end = measure_from + timing.measure;
            let mut tasks = Vec::new();
            for i in 0..clients {
                let mut client = path.client(i).await;
                let holder = format!("{tag}-h{i}");
                let (name, limit, wait, hold) = match scenario {
                    Scenario::Contended { limit, hold, .. } => {
                        (format!("{tag}-contended"), limit, true, hold)
                    }
                    _ => (format!("{tag}-u{i}"), 1, false, false),
                };
                tasks.push(tokio::spawn(async move {
                    let mut latency = histogram();
                    let (mut ops, mut all) = (0u64, 0u64);
                    let mut last = measure_from;
                    loop {
                        let t0 = Instant::now();
                        if t0 >= end {
                            break;
                        }
                        all += 1;
                        client.acquire(&name, &holder, limit, wait).await;
                        let granted = Instant::now();
                        if hold {
                            tokio::time::sleep(HOLD).await;
                        }
                        client.release(&name, &holder).await;
                        last = Instant::now();
                        if t0 >= measure_from {
                            ops += 1;
                            let took = if wait { granted - t0 } else { last - t0 };
                            latency.record(took.as_micros().max(1) as u64).unwrap();
                        }
                    }
                    (ops, latency, last, all)
                }));
            }
            let mut measured = Measured {
                ops: 0,
                all_ops: 0,
                elapsed: Duration::ZERO,
                latency: histogram(),
                redis: None,
            };
            let mut last = measure_from;
            for task in tasks {
                let (ops, latency, finished, all) = task.await.unwrap();
                measured.ops += ops;
                measured.all_ops += all;
                measured.latency.add(latency).unwrap();
                last = last.max(finished);
            }
            measured.elapsed = last - measure_from;
            measured
        }
        Scenario::Jobs {
            jobs,
            names,
            workers,
        } => {
            let mut measured = Measured {
                ops: 0,
                all_ops: 0,
                elapsed: Duration::ZERO,
                latency: histogram(),
                redis: None,
            };
            // Round 0 is the warm-up.
            for round in 0..=timing.job_rounds {
                let next = Arc::new(AtomicUsize::new(0));
                let started = Instant::now();
                let mut tasks = Vec::new();
                for w in 0..workers {
                    let mut client = path.client(w).await;
                    let next = next.clone();
                    let holder = format!("{tag}-r{round}-w{w}");
                    let tag = tag.to_owned();
                    tasks.push(tokio::spawn(async move {
                        let mut latency = histogram();
                        loop {
                            let job = next.fetch_add(1, Ordering::Relaxed);
                            if job >= jobs {
                                return latency;
                            }
                            let name = format!("{tag}-job{}", job % names);
                            let t0 = Instant::now();
                            client.acquire(&name, &holder, 1, true).await;
                            tokio::time::sleep(HOLD).await;
                            client.release(&name, &holder).await;
                            latency
                                .record(t0.elapsed().as_micros().max(1) as u64)
                                .unwrap();
                        }
                    }));
                }
                let mut round_latency = histogram();
                for task in tasks {
                    round_latency.add(task.await.unwrap()).unwrap();
                }
                measured.all_ops += jobs as u64;
                if round > 0 {
                    measured.elapsed += started.elapsed();
                    measured.ops += jobs as u64;
                    measured.latency.add(round_latency).unwrap();
                }
            }
            measured
        }
    }
}

/// An engine of its own (own key prefix, own wake-up channel), with the
/// replica's loops running, as `serve` runs them (no reaper).
async fn direct_engine(redis_url: &str, prefix: &str, connections: u32) -> Path {
    let mut config = ServerConfig::new(redis_url.to_owned(), &service_args(prefix, connections))
        .expect("config");
    config.wait_limits.hand_over = true;
    let store = Store::new(&config.store).expect("store");
    let layout = Layout::new(&config.key_prefix, config.shards);
    let running = LockEngine::start(
        store,
        EngineSettings {
            layout,
            wait_limits: config.wait_limits.clone(),
            changelog: Default::default(),
            reap_interval: None,
            replica: "load-direct".to_owned(),
            library_grace: None,
        },
    );
    let engine = running.engine().clone();
    std::mem::forget(running); // its loops run as long as the bench does
    engine.verify_layout().await.expect("layout");
    Path::Direct {
        engine,
        queue_ttl_ms: config.limits.default_queue_ttl_ms,
    }
}

async fn grpc_path(endpoint: &str, clients: usize) -> Path {
    Path::Grpc(channels(endpoint, clients).await)
}

async fn channels(endpoint: &str, clients: usize) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..clients.div_ceil(CLIENTS_PER_CHANNEL) {
        let channel = loop {
            match Channel::from_shared(endpoint.to_owned())
                .unwrap()
                .connect()
                .await
            {
                Ok(channel) => break channel,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        channels.push(channel);
    }
    channels
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this
    // as a quick smoke test instead.
    let benching = std::env::args().any(|a| a == "--bench");
    let (timing, scenarios) = if benching {
        let seconds = env("LOAD_SECONDS").unwrap_or(4);
        (
            Timing {
                warm_up: Duration::from_secs(1),
                measure: Duration::from_secs(seconds),
                job_rounds: env("LOAD_ROUNDS").unwrap_or(5) as usize,
            },
            vec![
                Scenario::Uncontended { clients: 1 },
                Scenario::Uncontended { clients: 64 },
                Scenario::Contended {
                    clients: 16,
                    limit: 1,
                    hold: true,
                },
                Scenario::Contended {
                    clients: 16,
                    limit: 1,
                    hold: false,
                },
                Scenario::Contended {
                    clients: 64,
                    limit: 1,
                    hold: true,
                },
                Scenario::Contended {
                    clients: 64,
                    limit: 8,
                    hold: true,
                },
                Scenario::Jobs {
                    jobs: 500,
                    names: 50,
                    workers: 20,
                },
            ],
        )
    } else {
        (
            Timing {
                warm_up: Duration::from_millis(50),
                measure: Duration::from_millis(200),
                job_rounds: 1,
            },
            vec![
                Scenario::Uncontended { clients: 1 },
                Scenario::Uncontended { clients: 4 },
                Scenario::Contended {
                    clients: 4,
                    limit: 1,
                    hold: true,
                },
                Scenario::Contended {
                    clients: 4,
                    limit: 1,
                    hold: false,
                },
                Scenario::Contended {
                    clients: 4,
                    limit: 2,
                    hold: true,
                },
                Scenario::Jobs {
                    jobs: 20,
                    names: 5,
                    workers: 4,
                },
            ],
        )
    };

    let only = std::env::var("LOAD_ONLY").unwrap_or_default();
    let scenarios: Vec<Scenario> = (scenarios.into_iter())
        .filter(|s| s.label().contains(&only))
        .collect();

    let redis = RedisServer::start("redis-server").expect("redis-server");
    let mut config = ServerConfig::new(
        redis.url(),
        &service_args("tumbler", ServiceArgs::default().redis_connections),
    )
    .unwrap();
    config.wait_limits.hand_over = true;
    let endpoint = common::serve_in_process(config).await;
    // The same server with the hand-over off (its own key prefix): the
    // contended scenarios' A/B row.
    let mut config = ServerConfig::new(
        redis.url(),
        &service_args("woken", ServiceArgs::default().redis_connections),
    )
    .unwrap();
    config.wait_limits.hand_over = false;
    let woken_endpoint = common::serve_in_process(config).await;
    common::wait_until_serving(&woken_endpoint).await;
    let mut stats = common::redis_conn(&redis.url()).await;
    // Until the server answers (its layout verified).
    let probe = grpc_path(&endpoint, 1).await;
    loop {
        let Path::Grpc(channels) = &probe else {
            unreachable!()
        };
        let mut client = LockServiceClient::new(channels[0].clone());
        if client
            .acquire(proto::AcquireRequest {
                name: "probe".into(),
                ..Default::default()
            })
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let direct = direct_engine(
        &redis.url(),
        "direct",
        ServiceArgs::default().redis_connections,
    )
    .await;
    let mut plain = Vec::new();
    for _ in 0..4 {
        plain.push(
            redis::Client::open(redis.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        );
    }
    // The peer: etcd's v3lock, when an `etcd` binary is installed.
    let etcd = etcd::EtcdServer::start();
    if let Some(etcd) = &etcd {
        etcd.ready().await;
    }

    println!(
        "tumbler load benchmark: warm-up {:?}, {:?} per measurement, {} round(s) of jobs after one warm-up round; loopback, Redis on the same host",
        timing.warm_up, timing.measure, timing.job_rounds
    );
    println!();
    println!(
        "| scenario | path | ops/s | latency | p50 µs | p99 µs | tumbler ÷ this | Redis calls / op | commands in them / op |"
    );
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut ratios = Vec::new();
    for (index, &scenario) in scenarios.iter().enumerate() {
        let clients = match scenario {
            Scenario::Uncontended { clients } | Scenario::Contended { clients, .. } => clients,
            Scenario::Jobs { workers, .. } => workers,
        };
        let grpc = grpc_path(&endpoint, clients).await;
        let mut paths = vec![
            (TUMBLER, grpc),
            (
                "tumbler's engine in-process (same functions and pool, no gRPC)",
                direct.clone(),
            ),
        ];
        // The plain lock and etcd's v3lock have mutexes only.
        let limit_one = !matches!(scenario, Scenario::Contended { limit, .. } if limit > 1);
        if limit_one {
            paths.push((PLAIN, Path::Plain(plain.clone())));
        }
        if let (Some(etcd), true) = (&etcd, limit_one) {
            paths.push((ETCD, Path::Etcd(channels(&etcd.endpoint, clients).await)));
        }
        if matches!(scenario, Scenario::Contended { .. }) {
            paths.insert(1, (WOKEN, grpc_path(&woken_endpoint, clients).await));
        }
        let mut results = Vec::new();
        for (p, (label, path)) in paths.iter().enumerate() {
            common::reset_command_stats(&mut stats).await;
            let mut measured = run(path, scenario, &format!("s{index}p{p}"), &timing).await;
            if !matches!(path, Path::Etcd(_)) {
                measured.redis = Some(redis_work(&common::command_stats(&mut stats).await));
            }
            assert!(
                measured.ops > 0 && !measured.latency.is_empty() && measured.rate() > 0.0,
                "{}: {label}: no numbers",
                scenario.label()
            );
            results.push((*label, measured));
        }
        let tumbler = results[0].1.rate();
        let rate_of = |wanted: &str| {
            (results.iter())
                .find(|(label, _)| *label == wanted)
                .map(|(_, m)| tumbler / m.rate())
        };
        ratios.push((scenario.label(), rate_of(PLAIN), rate_of(ETCD)));
        for (label, measured) in &results {
            let per_op = |n: u64| format!("{:.2}", n as f64 / measured.all_ops.max(1) as f64);
            let (calls, commands) = measured
                .redis
                .map_or(("—".to_owned(), "—".to_owned()), |(calls, commands)| {
                    (per_op(calls), per_op(commands))
                });
            println!(
                "| {} | {label} | {:.0} {} | {} | {} | {} | {:.2} | {calls} | {commands} |",
                scenario.label(),
                measured.rate(),
                scenario.unit(),
                scenario.latency(),
                measured.latency.value_at_quantile(0.5),
                measured.latency.value_at_quantile(0.99),
                tumbler / measured.rate()
            );
        }
    }
    println!();
    println!("| scenario | tumbler ÷ plain Redis lock | tumbler ÷ etcd v3lock |");
    println!("| --- | ---: | ---: |");
    let show = |ratio: Option<f64>| ratio.map_or("—".to_owned(), |r| format!("{r:.2}"));
    for (label, plain, etcd) in ratios {
        println!("| {label} | {} | {} |", show(plain), show(etcd));
    }
    println!();
    println!(
        "latency: pair = Acquire + Release round trips; wait = a queued Acquire until granted; job = wait + ~1 ms work + Release"
    );
    if etcd.is_none() {
        println!("(no `etcd` binary: the etcd rows were skipped)");
    }
}

/// Redis' function and script calls, and every other command (those
/// inside them, and a plain lock's own), from `INFO commandstats`; the
/// benchmark's own INFO and CONFIG left out. The servers' background
/// (health checks, waiter refreshes) is in it too: a few calls a second.
fn redis_work(stats: &[common::CommandStat]) -> (u64, u64) {
    let calls = ["fcall", "fcall_ro", "eval", "evalsha"];
    let ours = ["info", "config"];
    let count = |keep: &dyn Fn(&str) -> bool| -> u64 {
        (stats.iter())
            .filter(|s| keep(&s.name))
            .map(|s| s.calls)
            .sum()
    };
    (
        count(&|name| calls.contains(&name)),
        count(&|name| !calls.contains(&name) && !ours.contains(&name)),
    )
}

const TUMBLER: &str = "tumbler: gRPC, default pool (one connection)";
const WOKEN: &str =
    "tumbler with the hand-over off (the head is woken and calls again: the path before)";
const PLAIN: &str = "plain Redis lock: SET NX PX + compare-and-delete, 4 connections";
const ETCD: &str = "etcd 3.4 v3lock: gRPC Lock/Unlock with a lease";
