//! Scale: what a held lock and a waiting request cost Redis in memory and
//! keys, what 10,000 waiting RPCs cost a replica (RSS) and Redis (commands
//! per second while they wait), and whether acquire latency depends on how
//! many locks Redis already holds (1,000 vs 1,000,000), and what a
//! changelog event costs Redis (bytes per event; a flooded namespace
//! against its byte budget).
//!
//! Everything runs against its own redis-server on a free port; the
//! waiting-RPC scenario runs `tumbler serve` as a separate process so its
//! RSS is the replica's own. `cargo bench --bench scale` measures at full
//! size (SCALE_LOCKS, SCALE_WAITERS, SCALE_FILL override the defaults;
//! SCALE_ONLY=memory runs the memory part alone, SCALE_ONLY=changelog the
//! changelog part, SCALE_CHANGELOG_FLOOD its flood's pairs);
//! under `cargo test --all-targets` it runs at a tiny size as a smoke test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus};
use tumbler_engine::keys::Layout;
use tumbler_engine::{self as engine, AcquireOutcome, EngineFace, LockEngine, LockId};
use tumbler_store::Store;

pub mod common;

#[path = "scale/changelog.rs"]
mod changelog;
#[path = "scale/waiters.rs"]
mod waiters;

const LONG_TTL_MS: u64 = 600_000;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn service_args() -> ServiceArgs {
    ServiceArgs {
        redis_timeout_ms: 10_000,
        reap_interval_ms: 0,
        max_waiters_per_namespace: 1_000_000,
        ..ServiceArgs::default()
    }
}

/// A field of INFO (e.g. `used_memory`).
async fn info_field(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> i64 {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
}

/// Every key whose name matches `pattern`, by SCAN.
async fn keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut cursor = 0u64;
    let mut found = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        found.extend(batch);
        if next == 0 {
            return found;
        }
        cursor = next;
    }
}

/// Keys that belong to one lock (not to its shard: index, names, fence,
/// metrics), by kind letter.
fn lock_key_kinds(keys: &[String]) -> std::collections::BTreeMap<&'static str, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for key in keys {
        let after_tag = key.split_once("}:").map_or("", |(_, rest)| rest);
        let kind = match after_tag.get(..2) {
            Some("l:") => "l (lock)",
            Some("q:") => "q (queue)",
            Some("d:") => "d (deadlines)",
            Some("w:") => "w (waiter records)",
            _ => continue,
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

struct Server {
    endpoint: String,
    _task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start_server(redis_url: &str) -> Server {
    let config = ServerConfig::new(redis_url.to_owned(), &service_args()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(tumbler::server::serve(
        config,
        listener,
        std::future::pending(),
    ));
    common::wait_until_serving(&endpoint).await;
    Server {
        endpoint,
        _task: task,
    }
}

async fn channels(endpoint: &str, n: usize) -> Vec<Channel> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            Channel::from_shared(endpoint.to_owned())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    out
}

/// Acquires `names` (try once, long lease) with `concurrency` RPCs in flight.
async fn acquire_all(
    channels: &[Channel],
    names: Vec<String>,
    concurrency: usize,
    holder: Option<&str>,
) -> Vec<(String, String)> {
    let names = Arc::new(std::sync::Mutex::new(names));
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..concurrency {
        let mut client = LockServiceClient::new(channels[i % channels.len()].clone());
        let (names, held) = (names.clone(), held.clone());
        // No holder: the server makes one (a 36-character UUIDv7).
        let holder = holder.unwrap_or_default().to_owned();
        tasks.spawn(async move {
            loop {
                let Some(name) = names.lock().unwrap().pop() else {
                    return;
                };
                let reply = client
                    .acquire(proto::AcquireRequest {
                        name: name.clone(),
                        holder: holder.clone(),
                        ttl_ms: Some(LONG_TTL_MS),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(reply.status(), AcquireStatus::Acquired);
                let grant = reply.grant.unwrap();
                held.lock().unwrap().push((name, grant.holder));
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(held).unwrap().into_inner().unwrap()
}

/// Memory and keys per held lock and per waiting request.
async fn memory(locks: usize, waiters_per_lock: usize, waited_locks: usize) {
    let redis_server = RedisServer::start("redis-server").expect("redis-server");
    let server = start_server(&redis_server.url()).await;
    let mut conn = common::redis_conn(&redis_server.url()).await;
    // At most 500 streams per connection: the server allows 1,000
    // (--max-concurrent-streams), and waiting RPCs hold theirs.
    let chans = channels(
        &server.endpoint,
        (waiters_per_lock * waited_locks).div_ceil(500).max(8),
    )
    .await;

    // Held locks.
    let before = info_field(&mut conn, "memory", "used_memory").await;
    let names: Vec<String> = (0..locks).map(|i| format!("held-{i:08}")).collect();
    acquire_all(&chans, names, 64, Some("filler")).await;
    let after = info_field(&mut conn, "memory", "used_memory").await;
    let per_lock = (after - before) as f64 / locks as f64;
    let held_keys = keys(&mut conn, "tumbler:{default:*}:*").await;
    let kinds = lock_key_kinds(&held_keys);
    let sample = held_keys
        .iter()
        .filter(|k| k.contains("}:l:"))
        .take(100)
        .collect::<Vec<_>>();
    let mut usage = 0i64;
    for key in &sample {
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key.as_str())
            .query_async(&mut conn)
            .await
            .unwrap();
        usage += bytes.unwrap_or(0);
    }
    let usage_per_lock = usage as f64 / sample.len() as f64;
    // The shard indexes' share: every entry of every index and names ZSET
    // (SAMPLES 0 counts them all), per lock.
    let mut index_bytes = 0i64;
    for key in (held_keys.iter()).filter(|k| k.ends_with(":index") || k.ends_with(":names")) {
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key.as_str())
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
        index_bytes += bytes.unwrap_or(0);
    }
    let index_per_lock = index_bytes as f64 / locks as f64;

    // The same number of locks again, each with a holder the server makes
    // (what a caller that brings none gets): then let go.
    let before_uuid = info_field(&mut conn, "memory", "used_memory").await;
    let names: Vec<String> = (0..locks).map(|i| format!("made-{i:08}")).collect();
    let made = acquire_all(&chans, names, 64, None).await;
    let after_uuid = info_field(&mut conn, "memory", "used_memory").await;
    let per_lock_uuid = (after_uuid - before_uuid) as f64 / locks as f64;
    let mut releaser = LockServiceClient::new(chans[0].clone());
    for (name, holder) in made {
        releaser
            .release(proto::ReleaseRequest {
                name,
                holder,
                ..Default::default()
            })
            .await
            .unwrap();
    }

    // Waiting requests: `waiters_per_lock` on each of `waited_locks` locks
    // held by someone else.
    let client = LockServiceClient::new(chans[0].clone());
    let before_waiting = info_field(&mut conn, "memory", "used_memory").await;
    let mut waiting = tokio::task::JoinSet::new();
    for l in 0..waited_locks {
        for w in 0..waiters_per_lock {
            let mut c =
                LockServiceClient::new(chans[(l * waiters_per_lock + w) % chans.len()].clone());
            waiting.spawn(async move {
                let _ = c
                    .acquire(proto::AcquireRequest {
                        name: format!("held-{l:08}"),
                        holder: format!("w{l}-{w}"),
                        wait_ms: 600_000,
                        queue_ttl_ms: Some(600_000),
                        ..Default::default()
                    })
                    .await;
            });
        }
    }
    let total_waiters = (waiters_per_lock * waited_locks) as u32;
    let mut inspector = client.clone();
    loop {
        let mut queued = 0;
        for l in 0..waited_locks {
            queued += inspector
                .inspect(proto::InspectRequest {
                    name: format!("held-{l:08}"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .waiters;
        }
        if queued == total_waiters {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after_waiting = info_field(&mut conn, "memory", "used_memory").await;
    let per_waiter = (after_waiting - before_waiting) as f64 / total_waiters as f64;
    let waited_kinds = lock_key_kinds(&keys(&mut conn, "tumbler:{default:*}:*").await);
    waiting.abort_all();
    while waiting.join_next().await.is_some() {}

    // Everything released: which keys remain.
    let mut releaser = client.clone();
    for i in 0..locks {
        releaser
            .release(proto::ReleaseRequest {
                name: format!("held-{i:08}"),
                holder: "filler".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // Cancelled waiters leave their queues as their RPCs end.
    let mut left = Vec::new();
    for _ in 0..200 {
        left = keys(&mut conn, "tumbler:{default:*}:*").await;
        if lock_key_kinds(&left).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shard_keys: Vec<&str> = left
        .iter()
        .map(|k| {
            k.split_once("}:")
                .map_or("?", |(_, rest)| rest.split(':').next().unwrap_or("?"))
        })
        .collect();
    let mut shard_kinds = std::collections::BTreeMap::<&str, usize>::new();
    for kind in shard_keys {
        *shard_kinds.entry(kind).or_default() += 1;
    }

    println!(
        "\n### Memory and keys ({locks} held locks; {total_waiters} waiting requests on {waited_locks} of them)\n"
    );
    println!("| measure | value |");
    println!("| --- | ---: |");
    println!("| INFO used_memory delta per held lock (holder `filler`) | {per_lock:.0} bytes |");
    println!(
        "| INFO used_memory delta per held lock (server-made 36-character holder) | {per_lock_uuid:.0} bytes |"
    );
    println!(
        "| MEMORY USAGE of a lock's own key (l), mean of {} locks | {usage_per_lock:.0} bytes |",
        sample.len()
    );
    println!(
        "| of which shard indexes (layout v2's index + names; none in v3 without a lock limit; MEMORY USAGE SAMPLES 0) | {index_per_lock:.0} bytes |"
    );
    println!(
        "| of which the rest: the key's TTL entry, hash-table buckets | {:.0} bytes |",
        per_lock - usage_per_lock - index_per_lock
    );
    println!("| INFO used_memory delta per waiting request | {per_waiter:.0} bytes |");
    println!(
        "| keys per held lock | {:?} |",
        per_lock_counts(&kinds, locks)
    );
    println!(
        "| keys per lock with waiters | {:?} |",
        per_lock_counts_of_waited(&waited_kinds, waited_locks)
    );
    println!(
        "| lock keys left after every release and cancel | {} |",
        lock_key_kinds(&left).values().sum::<usize>()
    );
    println!("| shard-level keys left (per kind) | {shard_kinds:?} |");
}

fn per_lock_counts(
    kinds: &std::collections::BTreeMap<&'static str, usize>,
    locks: usize,
) -> Vec<String> {
    kinds
        .iter()
        .map(|(k, n)| format!("{k}: {:.2}", *n as f64 / locks as f64))
        .collect()
}

/// Queue and deadline keys exist only on locks that have waiters.
fn per_lock_counts_of_waited(
    kinds: &std::collections::BTreeMap<&'static str, usize>,
    waited: usize,
) -> Vec<String> {
    kinds
        .iter()
        .filter(|(k, _)| k.starts_with('q') || k.starts_with('d'))
        .map(|(k, n)| format!("{k}: {:.2}", *n as f64 / waited as f64))
        .collect()
}

/// Acquire+release latency through gRPC on fresh names with `existing`
/// other locks held in Redis (filled through the engine, in-process).
async fn latency_with_existing(fills: &[usize], samples: usize) {
    let redis_server = RedisServer::start("redis-server").expect("redis-server");
    let server = start_server(&redis_server.url()).await;
    let config = ServerConfig::new(redis_server.url(), &service_args()).unwrap();
    let store = Store::new(&config.store).unwrap();
    let engine = Arc::new(LockEngine::new(
        store,
        Layout::new(&config.key_prefix, config.shards),
        config.wait_limits.clone(),
    ));
    engine.verify_layout().await.unwrap();
    let chans = channels(&server.endpoint, 1).await;
    let mut client = LockServiceClient::new(chans[0].clone());
    let mut filled = 0usize;
    let mut rows = Vec::new();
    for (round, &target) in fills.iter().enumerate() {
        // Fill up to `target` held locks, 256 script calls in flight.
        let started = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(filled));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..256 {
            let (engine, next) = (engine.clone(), next.clone());
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= target {
                        return;
                    }
                    let outcome = (engine.locks())
                        .acquire(&engine::AcquireRequest::new(
                            LockId::parse("default", format!("fill-{i:08}"))
                                .expect("a valid lock name"),
                            engine::Holder::stored("filler"),
                            engine::Ttl::stored(LONG_TTL_MS),
                        ))
                        .await
                        .unwrap();
                    assert!(matches!(outcome, AcquireOutcome::Acquired { .. }));
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let fill_time = started.elapsed();
        filled = target;

        let mut latency = Histogram::<u64>::new(3).unwrap();
        for s in 0..samples {
            let name = format!("probe-{round}-{s}");
            let t0 = Instant::now();
            let reply = client
                .acquire(proto::AcquireRequest {
                    name: name.clone(),
                    holder: "probe".into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let took = t0.elapsed();
            assert_eq!(reply.status(), AcquireStatus::Acquired);
            client
                .release(proto::ReleaseRequest {
                    name,
                    holder: "probe".into(),
                    ..Default::default()
                })
                .await
                .unwrap();
            latency.record(took.as_micros().max(1) as u64).unwrap();
        }
        rows.push((target, fill_time, latency));
    }
    let base = rows[0].2.value_at_quantile(0.5) as f64;
    println!(
        "\n### Acquire latency against the number of locks already held ({samples} acquires each)\n"
    );
    println!("| locks held in Redis | filled in | acquire p50 µs | p99 µs | p50 ÷ first row |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for (target, fill_time, latency) in rows {
        let p50 = latency.value_at_quantile(0.5);
        println!(
            "| {target} | {:.1} s | {p50} | {} | {:.2} |",
            fill_time.as_secs_f64(),
            latency.value_at_quantile(0.99),
            p50 as f64 / base
        );
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs a tiny
    // version as a smoke test.
    let benching = std::env::args().any(|a| a == "--bench");
    if benching {
        if std::env::var("SCALE_ONLY").is_ok_and(|only| only == "changelog") {
            changelog::changelog_bytes(
                2_000,
                env("SCALE_CHANGELOG_FLOOD").unwrap_or(20_000) as usize,
            )
            .await;
            return;
        }
        memory(env("SCALE_LOCKS").unwrap_or(100_000) as usize, 100, 100).await;
        if std::env::var("SCALE_ONLY").is_ok_and(|only| only == "memory") {
            return;
        }
        waiters::many_waiters(
            env("SCALE_WAITERS").unwrap_or(10_000) as usize,
            100,
            Duration::from_secs(10),
        )
        .await;
        let fill = env("SCALE_FILL").unwrap_or(1_000_000) as usize;
        latency_with_existing(&[1_000, fill], 2_000).await;
        changelog::changelog_bytes(
            2_000,
            env("SCALE_CHANGELOG_FLOOD").unwrap_or(20_000) as usize,
        )
        .await;
    } else {
        memory(200, 5, 4).await;
        waiters::many_waiters(50, 5, Duration::from_millis(500)).await;
        latency_with_existing(&[100, 300], 20).await;
        changelog::changelog_bytes(50, 50).await;
    }
}
