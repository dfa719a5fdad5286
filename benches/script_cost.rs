//! What one lock operation costs Redis, counted by Redis itself
//! (`INFO commandstats` after `CONFIG RESETSTAT`): script calls, the
//! commands run inside them, and Redis' own time in them, per operation.
//! Command counts are exact whatever the machine is doing; Redis' time is
//! what Redis measures around each call, which a busy shared machine
//! inflates (compare runs made side by side).
//!
//! Baseline in the same run, on the same Redis: the plainest Redis lock
//! there is — `SET key value NX PX ttl`, and a compare-and-delete script to
//! release — which has no queue, no fencing token, no semaphore, no index
//! and no metrics. The ratio is what tumbler's guarantees cost Redis.
//!
//! `cargo bench --bench script_cost` (SCRIPT_COST_PAIRS=N, default 5000).
//! Under `cargo test` it runs a few pairs as a smoke test.

mod common;

use common::ServeProcess;
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};

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

/// Redis' counters since the last reset.
#[derive(Debug, Default)]
struct Counted {
    /// Calls the client sent: scripts, and the baseline's SET.
    top_level_calls: u64,
    /// Commands run by scripts (Redis counts them under their own names).
    inner_commands: u64,
    /// Redis' time in the top-level calls (scripts include their commands).
    usec: u64,
}

/// What Redis counted since the reset; `top_level` names the commands the
/// client sent itself (the rest ran inside scripts).
async fn counted(conn: &mut redis::aio::MultiplexedConnection, top_level: &[&str]) -> Counted {
    let mut counted = Counted::default();
    for stat in common::command_stats(conn).await {
        match stat.name.as_str() {
            name if top_level.contains(&name) => {
                counted.top_level_calls += stat.calls;
                counted.usec += stat.usec;
            }
            name if NOT_LOCK_WORK.contains(&name) => {}
            _ => counted.inner_commands += stat.calls,
        }
    }
    counted
}

/// The baseline's release: delete the key only if it still holds our value.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let pairs: u64 = if benching {
        std::env::var("SCRIPT_COST_PAIRS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000)
    } else {
        50
    };
    let redis = RedisServer::start("redis-server").expect("redis-server");
    // Health checks far apart: their PINGs are not counted anyway.
    let server = ServeProcess::start(&redis.url(), &["--health-interval-ms", "60000"]).await;
    let mut client = LockServiceClient::connect(server.endpoint.clone())
        .await
        .unwrap();
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    // tumbler: try-once acquire, release, each on a fresh name.
    let pair = async |client: &mut LockServiceClient<_>, i: u64| {
        let name = format!("cost-{i}");
        let reply = client
            .acquire(proto::AcquireRequest {
                name: name.clone(),
                holder: "h".into(),
                ttl_ms: Some(30_000),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        let reply = client
            .release(proto::ReleaseRequest {
                name,
                holder: "h".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), ReleaseStatus::Released);
    };
    for i in 0..100 {
        pair(&mut client, 1_000_000_000 + i).await;
    }
    common::reset_command_stats(&mut conn).await;
    for i in 0..pairs {
        pair(&mut client, i).await;
    }
    let tumbler = counted(&mut conn, &["evalsha", "eval"]).await;
    if std::env::var_os("SCRIPT_COST_VERBOSE").is_some() {
        for stat in common::command_stats(&mut conn).await {
            println!(
                "{}: {:.2} per pair",
                stat.name,
                stat.calls as f64 / pairs as f64
            );
        }
    }

    // Baseline: SET NX PX, compare-and-delete.
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let baseline_pair = async |i: u64| {
        let key = format!("plain:{i}");
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("h")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        assert!(set.is_some());
        let deleted: i64 = release
            .key(&key)
            .arg("h")
            .invoke_async(&mut conn.clone())
            .await
            .unwrap();
        assert_eq!(deleted, 1);
    };
    for i in 0..100 {
        baseline_pair(1_000_000_000 + i).await;
    }
    common::reset_command_stats(&mut conn.clone()).await;
    for i in 0..pairs {
        baseline_pair(i).await;
    }
    let baseline = counted(&mut conn, &["evalsha", "eval", "set"]).await;

    let per = |n: u64| n as f64 / pairs as f64;
    println!("Redis work per acquire+release pair, {pairs} pairs, uncontended, one client\n");
    println!("| lock | calls | commands inside scripts | Redis µs | µs ÷ baseline |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (label, c) in [
        ("tumbler (acquire.lua + release.lua)", &tumbler),
        ("baseline: SET NX PX + compare-and-delete", &baseline),
    ] {
        println!(
            "| {label} | {:.2} | {:.2} | {:.1} | {:.2} |",
            per(c.top_level_calls),
            per(c.inner_commands),
            per(c.usec),
            c.usec as f64 / baseline.usec.max(1) as f64
        );
    }
    assert!(tumbler.top_level_calls >= 2 * pairs && baseline.top_level_calls >= 2 * pairs);
}
