//! The wait-for registry bounded per tenant (decision 0081), with a real
//! Redis and two replicas: the defect report's attack (4,000 readers with
//! 250-byte names on one lock, 255 named writers waiting for it, then more
//! walks) stays within the namespace's budget, no deadlock call is slow in
//! Redis' SLOWLOG, and another tenant's Acquire p99 on the other replica
//! stays within noise; a replica killed mid-wait leaves no edge past its
//! waiters' queue TTL; the dashboard reads the registry a page at a time.

use crate::common;

use std::time::{Duration, Instant};

use common::wait::wait_until_async;
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, LockMode};
use serde_json::Value;
use tonic::transport::Channel;

use super::changelog_flood::{acquire_latencies, p99};

const NOISY: &str = "noisy";
const REGISTRY: &str = "tumbler:{noisy:waits}";
/// The registry's budget (`deadlock.rs`'s `BUDGET_BYTES`).
const BUDGET: i64 = 1 << 20;
const READERS: usize = 4_000;
const WRITERS: usize = 255;

/// A 250-byte holder name.
fn long(prefix: &str, i: usize) -> String {
    let head = format!("{prefix}-{i:05}-");
    format!("{head}{}", "x".repeat(250 - head.len()))
}

fn noisy(name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: NOISY.into(),
        ttl_ms: Some(600_000),
        ..acquire(name, holder)
    }
}

/// A writer's wait for `big`, long enough to outlast the test.
fn writer(holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        mode: LockMode::Write.into(),
        limit: Some(READERS as u32),
        wait_ms,
        ..noisy("big", holder)
    }
}

async fn registry_bytes(conn: &mut redis::aio::MultiplexedConnection) -> (i64, i64) {
    let counted: Option<i64> = redis::cmd("HGET")
        .arg(REGISTRY)
        .arg("")
        .query_async(conn)
        .await
        .unwrap();
    let memory: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(REGISTRY)
        .query_async(conn)
        .await
        .unwrap();
    (counted.unwrap_or(0), memory.unwrap_or(0))
}

async fn edges(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, Value)> {
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(REGISTRY)
        .query_async(conn)
        .await
        .unwrap();
    // Each edge is `<end ms>|<request>|<waits as JSON>`; field "" is the
    // registry's byte count.
    (fields.into_iter())
        .filter(|(holder, _)| !holder.is_empty())
        .map(|(holder, text)| {
            let waits = text.splitn(3, '|').nth(2).unwrap();
            (holder, serde_json::from_str(waits).unwrap())
        })
        .collect()
}

/// The SLOWLOG's entries whose command is FCALL of a deadlock function:
/// the function and its µs.
async fn slow_deadlock_calls(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, i64)> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1000)
        .query_async(conn)
        .await
        .unwrap();
    let mut slow = Vec::new();
    for entry in entries {
        let redis::Value::Array(parts) = entry else {
            continue;
        };
        let micros: i64 = redis::from_redis_value(parts[2].clone()).unwrap_or(0);
        let args: Vec<String> = redis::from_redis_value(parts[3].clone()).unwrap_or_default();
        let function = args.get(1).cloned().unwrap_or_default();
        let deadlock = ["wait_for", "wait_end", "wait_renew", "waits", "blockers"]
            .iter()
            .any(|f| function.ends_with(&format!("_{f}")));
        if deadlock {
            slow.push((function, micros));
        }
    }
    slow
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_waits_stay_in_budget_and_leave_another_tenants_acquires_alone() {
    let redis = start_redis();
    let settings = tumbler::config::ServiceArgs {
        max_limit: 10_000,
        ..service_args()
    };
    let a = TestServer::new()
        .redis(&redis.url())
        .args(settings.clone())
        .start()
        .await;
    let b = TestServer::new()
        .redis(&redis.url())
        .args(settings)
        .start()
        .await;
    let mut conn = redis_conn(&redis.url()).await;
    for (name, value) in [
        ("slowlog-log-slower-than", "20000"),
        ("slowlog-max-len", "1000"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    // 1. 4,000 readers of `big`, 250-byte names, through replica A.
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let mut client = LockServiceClient::connect(a.endpoint()).await.unwrap();
        tasks.push(tokio::spawn(async move {
            for i in (worker..READERS).step_by(16) {
                let request = proto::AcquireRequest {
                    mode: LockMode::Read.into(),
                    limit: Some(READERS as u32),
                    ..noisy("big", &long("reader", i))
                };
                let reply = client.acquire(request).await.unwrap().into_inner();
                assert_eq!(reply.status(), AcquireStatus::Acquired);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    acquire_latencies(&b, "quiet", 4, 20).await; // warm
    let without = acquire_latencies(&b, "quiet", 4, 60).await;
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .unwrap();

    // 2. 255 named writers wait for it (each holds a lock of its own, as a
    // holder that may deadlock does), through replica A.
    let client_a = LockServiceClient::connect(a.endpoint()).await.unwrap();
    let mut waiting = Vec::new();
    for i in 0..WRITERS {
        let holder = long("writer", i);
        let mut client = client_a.clone();
        let own = client.acquire(noisy(&format!("own-{i}"), &holder)).await;
        assert_eq!(own.unwrap().into_inner().status(), AcquireStatus::Acquired);
        waiting.push(tokio::spawn(async move {
            client.acquire(writer(&holder, 120_000)).await
        }));
    }
    // Their checks come a second into their waits.
    wait_until_async("the writers' edges", Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move {
            let (counted, _) = registry_bytes(&mut conn).await;
            counted > BUDGET - 8 * 1024
        }
    })
    .await;

    // 3. More walks while the other tenant is measured: a named writer
    // every 50 ms (each checked 60 ms into its 600 ms wait).
    let walker = {
        let client = client_a.clone();
        tokio::spawn(async move {
            let mut n = 0;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(4) {
                let mut client = client.clone();
                let holder = long("walker", n);
                tokio::spawn(async move { client.acquire(writer(&holder, 600)).await });
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        })
    };
    let with = acquire_latencies(&b, "quiet", 4, 60).await;
    let walkers = walker.await.unwrap();

    // 4. The registry kept its budget, each edge its 16 holders.
    let (counted, memory) = registry_bytes(&mut conn).await;
    let recorded = edges(&mut conn).await;
    println!(
        "registry: {} edges, {counted} bytes counted, MEMORY USAGE {memory}; {walkers} walkers",
        recorded.len()
    );
    assert!(counted <= BUDGET, "{counted} bytes");
    assert!(memory < 2 * BUDGET, "MEMORY USAGE {memory}");
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(REGISTRY)
        .query_async(&mut conn)
        .await
        .unwrap();
    let sum: usize = (fields.iter())
        .filter(|(holder, _)| !holder.is_empty())
        .map(|(holder, text)| holder.len() + text.len())
        .sum();
    assert_eq!(sum as i64, counted, "the byte count is exact");
    assert!(recorded.len() < WRITERS, "some waits went unchecked");
    for (holder, edge) in &recorded {
        let holders = edge[0][1].as_array().unwrap();
        assert_eq!(holders.len(), 16, "{holder}'s edge: {}", holders.len());
    }

    // 5. No deadlock call was slow in Redis, and the other tenant did not
    // notice (generous slack for a shared 2-core machine: before the
    // bound, each walk of this flood took Redis seconds and such Acquires
    // failed UNAVAILABLE).
    let slow = slow_deadlock_calls(&mut conn).await;
    println!("deadlock calls over 5 ms: {slow:?}");
    let slowest = slow.iter().map(|(_, micros)| *micros).max().unwrap_or(0);
    assert!(slowest < 100_000, "slow deadlock calls: {slow:?}");
    let (p99_without, p99_with) = (p99(&without), p99(&with));
    println!("quiet tenant's Acquire p99: {p99_without:?} before, {p99_with:?} during the flood");
    // Within 5x, or under 50 ms whatever the ratio (this replica's
    // neighbour serves 330 waits in the same process; what failed was 2 s).
    let ratio = p99_with.as_secs_f64() / p99_without.as_secs_f64().max(0.002);
    assert!(
        ratio < 5.0 || p99_with < Duration::from_millis(50),
        "p99 {p99_with:?} against {p99_without:?}"
    );

    // 6. The waits end (the namespace cleared): no registry key is left.
    let mut admin = a.client().await;
    admin
        .clear(proto::ClearRequest {
            namespace: NOISY.into(),
        })
        .await
        .unwrap();
    for wait in waiting {
        wait.abort();
    }
    wait_until_async("the registry gone", Duration::from_secs(15), || {
        let mut conn = conn.clone();
        async move {
            let exists: bool = redis::cmd("EXISTS")
                .arg(REGISTRY)
                .query_async(&mut conn)
                .await
                .unwrap();
            !exists
        }
    })
    .await;
}

async fn hold(client: &mut LockServiceClient<Channel>, name: &str, holder: &str) {
    let reply = client
        .acquire(noisy(name, holder))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

#[tokio::test]
async fn a_killed_replicas_edges_leave_within_their_queue_ttl() {
    let redis = start_redis();
    let survivor = TestServer::new().redis(&redis.url()).start().await;
    let mut client = survivor.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    hold(&mut client, "x", "owner").await;
    // A named holder waits for x through a replica that is then killed.
    let mut doomed = TumblerProcess::start(&redis.url(), &[]).await;
    let mut doomed_client = doomed.client().await;
    hold(&mut doomed_client, "y", "waiter").await;
    let request = proto::AcquireRequest {
        wait_ms: 60_000,
        queue_ttl_ms: Some(1_000),
        ..noisy("x", "waiter")
    };
    let _wait = tokio::spawn(async move { doomed_client.acquire(request).await });
    wait_until_async("the waiter's edge", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { edges(&mut conn).await.len() == 1 }
    })
    .await;
    // Renewed while its replica lives (its queue TTL is 1 s).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        edges(&mut conn).await.len(),
        1,
        "renewed past its first TTL"
    );
    doomed.kill();
    let killed = Instant::now();
    wait_until_async(
        "the dead replica's edge gone",
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move { edges(&mut conn).await.is_empty() }
        },
    )
    .await;
    // Its queue TTL, the registry's second of grace, and the poll.
    assert!(
        killed.elapsed() < Duration::from_millis(3_500),
        "{:?}",
        killed.elapsed()
    );
}

#[tokio::test]
async fn the_dashboard_reads_the_registry_a_page_at_a_time() {
    let server = TestServer::new().http().start().await;
    let mut client = server.client().await;
    let conn = redis_conn(server.redis_url()).await;
    // 300 waits of named holders, each on a lock its own holder keeps.
    let mut waits = Vec::new();
    // Names long enough that the registry is a hash table, not Redis'
    // compact encoding (which HSCAN returns whole, at most 512 small
    // fields).
    let pad = "p".repeat(40);
    for i in 0..300 {
        let (name, owner) = (format!("lock-{i}-{pad}"), format!("owner-{i}"));
        hold(&mut client, &name, &owner).await;
        let mut waiter = client.clone();
        let request = proto::AcquireRequest {
            wait_ms: 60_000,
            ..noisy(&name, &format!("waiter-{i}"))
        };
        waits.push(tokio::spawn(async move { waiter.acquire(request).await }));
    }
    wait_until_async("300 edges", Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move { edges(&mut conn).await.len() == 300 }
    })
    .await;
    let http = reqwest::Client::new();
    let base = format!("http://{}/api/v1/waits?namespace={NOISY}", server.http());
    let (mut token, mut pages, mut seen) = (String::new(), 0, std::collections::BTreeSet::new());
    loop {
        let reply = http
            .get(format!("{base}&page_token={token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 200);
        let page: Value = serde_json::from_str(&reply.text().await.unwrap()).unwrap();
        for chain in page["chains"].as_array().unwrap() {
            for step in chain.as_array().unwrap() {
                seen.insert(step["holder"].as_str().unwrap().to_owned());
            }
        }
        pages += 1;
        token = page["nextPageToken"].as_str().unwrap().to_owned();
        if token.is_empty() {
            break;
        }
        assert!(pages < 50, "the pages never end");
    }
    assert!(pages > 1, "300 edges in one page");
    assert_eq!(
        seen.len(),
        300,
        "every waiting holder on some page ({pages} pages)"
    );
    // A token this service did not issue names its field.
    let reply = http
        .get(format!("{base}&page_token=bm9wZQ"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 400);
    assert!(reply.text().await.unwrap().contains("page_token"));
    for wait in waits {
        wait.abort();
    }
}

/// The walk at its worst: a registry filled to its budget with edges of 16
/// 250-byte holders each, every holder named one that waits too (none
/// leading back, so the walk runs to its bounds), walked by one more wait
/// through the real function. Redis' time for it is what one tenant can
/// cost all others per wait; printed for docs/benchmarks/notebook.md, and held well
/// under the store's 2 s timeout.
#[tokio::test]
async fn a_walk_at_its_bounds_takes_redis_milliseconds() {
    use tumbler_engine::scripts::Scripts;
    let server = TestServer::new().start().await;
    let mut conn = redis_conn(server.redis_url()).await;
    // Loads the library (any call does).
    server.client().await.inspect(inspect("x")).await.unwrap();
    let scripts = Scripts::compile();
    let holders: Vec<String> = (0..240).map(|i| long("chain", i)).collect();
    let far = far_future();
    let mut counted = 0;
    for (i, holder) in holders.iter().enumerate() {
        // Spread over the others (a fixed scatter: 7 and 240 are coprime).
        let waits_on: Vec<&String> = (1..=16)
            .map(|k| &holders[(i + 7 * k * k + k) % holders.len()])
            .collect();
        let waits = serde_json::json!([["lock", waits_on]]);
        let text = format!("{far}|req|{waits}");
        counted += holder.len() + text.len();
        let _: () = redis::cmd("HSET")
            .arg(REGISTRY)
            .arg(holder)
            .arg(text)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(REGISTRY)
        .arg("")
        .arg(counted)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(counted as i64 <= BUDGET, "{counted}");
    // One more wait, on 16 of them, with room left in the budget.
    let mut args = vec![
        "walker".to_owned(),
        "req-w".to_owned(),
        "60000".to_owned(),
        (2 * BUDGET).to_string(),
        (256 << 10).to_string(),
        "lock".to_owned(),
        "16".to_owned(),
    ];
    args.extend(holders[..16].iter().cloned());
    let mut took = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let reply: redis::Value = redis::cmd("FCALL")
            .arg(&scripts.wait_for.function)
            .arg(1)
            .arg(REGISTRY)
            .arg(&args)
            .query_async(&mut conn)
            .await
            .unwrap();
        took.push(started.elapsed());
        let redis::Value::Array(parts) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(
            parts[1],
            redis::Value::Int(0),
            "no cycle: the walk ran to its bounds"
        );
    }
    took.sort();
    println!(
        "a walk at its bounds over {} edges: median {:?}, worst {:?}",
        holders.len(),
        took[2],
        took[4]
    );
    assert!(took[2] < Duration::from_millis(100), "{took:?}");
}

/// An edge end that outlasts the test (Redis ms).
fn far_future() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_millis() as i64 + 3_600_000
}
