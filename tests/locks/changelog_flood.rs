//! Readers of a flooded changelog leave another tenant's acquires alone:
//! one tenant's changelog holds thousands of events with 8 KB of metadata
//! each (the defect report's case), eight readers walk it through one
//! replica, and another tenant's Acquire p99 on another replica is
//! measured with and without them, with a real Redis and real sockets.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

use super::changelog::{Server, args, command_calls, in_ns, raw_entries, wide_metadata};
use super::changelog_reads::reset_stats;

type LockServiceClientOf =
    tumbler::proto::lock_service_client::LockServiceClient<tonic::transport::Channel>;

/// Acquire+release pairs of `clients` clients in `namespace` on `server`:
/// each Acquire's latency, sorted. Every one must be granted.
pub(super) async fn acquire_latencies(
    server: &TestServer,
    namespace: &'static str,
    clients: usize,
    pairs_each: usize,
) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(pairs_each);
            for i in 0..pairs_each {
                let name = format!("quiet-{c}-{}", i % 10);
                let started = Instant::now();
                let granted = client
                    .acquire(in_ns(namespace, &name, "q"))
                    .await
                    .unwrap_or_else(|e| panic!("the quiet tenant's Acquire failed: {e}"))
                    .into_inner();
                took.push(started.elapsed());
                assert_eq!(granted.status(), proto::AcquireStatus::Acquired);
                client
                    .release(proto::ReleaseRequest {
                        namespace: namespace.into(),
                        ..release(&name, "q")
                    })
                    .await
                    .unwrap();
            }
            took
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    all
}

pub(super) fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

/// Each reader's pause between pages: 8 readers then ask up to 160
/// pages a second (a read of this flood before the bound took Redis tens
/// of milliseconds: 40 would have kept it busy).
const PACE_MS: u64 = 50;

/// The queries the readers walk, one each: filters that keep the pages
/// small (the replica's JSON is not what is measured), so each page costs
/// Redis its whole bound.
const READER_QUERIES: [&str; 8] = [
    "holder=nobody",
    "holder=h3&prefix=flood-3-1",
    "event=expired",
    "prefix=flood-3-12",
    "prefix=zzz",
    "event=lost",
    "holder=h6&prefix=flood-7-3",
    "holder=h1&event=cleared",
];

/// What the readers do: nothing, walk the flooded changelog, or walk an
/// empty one (what reading costs besides Redis' work: HTTP, JSON, CPU).
const IDLE: usize = 0;
const FLOODED: usize = 1;
const EMPTY: usize = 2;

/// Replica A and its readers, on a runtime of their own (two threads), as
/// another replica's would be: the measured tenant's replica and clients
/// keep the test's runtime, so what the readers cost shows through Redis
/// (and the machine's two cores), not as tasks queued on shared workers.
/// The readers walk as `mode` says, until `done` (or 20,000 pages).
fn reader_side(
    redis_url: String,
    settings: tumbler::config::ServiceArgs,
    mode: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    pages: Arc<AtomicUsize>,
) -> (String, std::thread::JoinHandle<()>) {
    let (endpoint_tx, endpoint_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let a = Server::start(&redis_url, settings).await;
            endpoint_tx.send(a.server.endpoint()).unwrap();
            // One client with kept-alive connections, as a browser's.
            let client = reqwest::Client::new();
            let base = format!("http://{}/api/v1/changelog", a.server.http());
            let mut readers = Vec::new();
            for query in READER_QUERIES {
                let (client, base) = (client.clone(), base.clone());
                let (mode, done, pages) = (mode.clone(), done.clone(), pages.clone());
                readers.push(tokio::spawn(async move {
                    let mut token = String::new();
                    let mut last = IDLE;
                    while !done.load(Ordering::Relaxed) && pages.load(Ordering::Relaxed) < 20_000 {
                        let now = mode.load(Ordering::Relaxed);
                        if now != last {
                            (last, token) = (now, String::new());
                        }
                        let namespace = match now {
                            FLOODED => "noisy",
                            EMPTY => "empty",
                            _ => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                continue;
                            }
                        };
                        let url =
                            format!("{base}?namespace={namespace}&{query}&page_token={token}");
                        let reply = client.get(url).send().await.unwrap();
                        assert_eq!(reply.status().as_u16(), 200);
                        let page: Value =
                            serde_json::from_str(&reply.text().await.unwrap()).unwrap();
                        pages.fetch_add(1, Ordering::Relaxed);
                        token = page["nextPageToken"].as_str().unwrap().to_owned();
                        tokio::time::sleep(Duration::from_millis(PACE_MS)).await;
                    }
                }));
            }
            for reader in readers {
                reader.await.unwrap();
            }
        });
    });
    (endpoint_rx.recv().unwrap(), thread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_a_flooded_changelog_leave_another_tenants_acquires_alone() {
    let redis = start_redis();
    let settings = args(&["noisy", "empty"], 1000, 600_000, 4);
    let mode = Arc::new(AtomicUsize::new(IDLE));
    let done = Arc::new(AtomicBool::new(false));
    let pages = Arc::new(AtomicUsize::new(0));
    let (a, readers) = reader_side(
        redis.url(),
        settings.clone(),
        mode.clone(),
        done.clone(),
        pages.clone(),
    );
    // Replica B serves the other tenant.
    let b = TestServer::new()
        .redis(&redis.url())
        .args(settings)
        .start()
        .await;

    // The flood, through replica A: 8 KB of metadata on each of 3,200
    // grants, and as many events again for their releases.
    let metadata = wide_metadata(32, 250);
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let mut client = LockServiceClientOf::connect(a.clone()).await.unwrap();
        let metadata = metadata.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..400 {
                let name = format!("flood-{worker}-{i}");
                let holder = format!("h{}", i % 7);
                let mut request = in_ns("noisy", &name, &holder);
                request.metadata = metadata.clone();
                client.acquire(request).await.unwrap();
                client
                    .release(proto::ReleaseRequest {
                        namespace: "noisy".into(),
                        ..release(&name, &holder)
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut conn = redis_conn(&redis.url()).await;
    let flooded: usize = raw_entries(&mut conn, "noisy", 4)
        .await
        .iter()
        .map(Vec::len)
        .sum();
    assert!(flooded > 2000, "{flooded} entries");

    // Rounds without readers, with readers of the flood and with the same
    // readers of an empty changelog, in turn, so the machine's other load
    // falls on all three alike.
    acquire_latencies(&b, "quiet", 4, 50).await;
    let mut took = [Vec::new(), Vec::new(), Vec::new()];
    let mut read = [0, 0, 0];
    reset_stats(&mut conn).await;
    for _ in 0..3 {
        for round in [IDLE, FLOODED, EMPTY] {
            mode.store(round, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let before = pages.load(Ordering::Relaxed);
            took[round].extend(acquire_latencies(&b, "quiet", 4, 60).await);
            read[round] += pages.load(Ordering::Relaxed) - before;
        }
    }
    done.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || readers.join().unwrap())
        .await
        .unwrap();
    let lranges = command_calls(&mut conn)
        .await
        .get("lrange")
        .copied()
        .unwrap_or(0);
    for t in &mut took {
        t.sort();
    }
    let (without, flooded, empty) = (p99(&took[IDLE]), p99(&took[FLOODED]), p99(&took[EMPTY]));
    println!(
        "quiet tenant's Acquire p99: {without:?} without readers, {flooded:?} with readers of \
         the flood ({} pages, {lranges} LRANGE calls), {empty:?} with them reading an empty \
         changelog ({} pages); p50 {:?} / {:?} / {:?}",
        read[FLOODED],
        read[EMPTY],
        took[IDLE][took[IDLE].len() / 2],
        took[FLOODED][took[FLOODED].len() / 2],
        took[EMPTY][took[EMPTY].len() / 2],
    );
    assert!(
        read[FLOODED] >= 50,
        "the readers hardly read ({read:?} pages)"
    );
    // Within noise, with generous slack for a shared machine of two cores
    // that the readers' own HTTP and JSON work share: before the bound,
    // each read of this flood took Redis tens of milliseconds and such
    // Acquires timed out.
    let ratio = flooded.as_secs_f64() / without.as_secs_f64().max(0.000_5);
    assert!(
        ratio < 5.0,
        "p99 {flooded:?} with readers against {without:?} without ({ratio:.1}x)"
    );
}
