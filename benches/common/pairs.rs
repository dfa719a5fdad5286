//! Acquire + release pairs from many clients at once, each with a request
//! of its own, against one server: pairs per second over a window, and
//! Redis' own count of the work per pair (`INFO commandstats` after
//! `CONFIG RESETSTAT`, around a fixed number of pairs per client: the
//! function calls the server sent, group commit carrying several
//! operations in one, and the commands run inside them). Shared by the
//! benchmarks that compare kinds of locks in one run (`read_write`,
//! `weighted`, `multi`). The unit a client repeats is a [`Unit`]: one
//! acquire + release pair, or a set of them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};

/// Clients that share one HTTP/2 connection.
const CLIENTS_PER_CHANNEL: usize = 8;

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

/// How long a benchmark measures: `warm_up`, then `window`; and `each`,
/// the units per client Redis' counters are taken around.
pub struct Timing {
    pub warm_up: Duration,
    pub window: Duration,
    pub each: usize,
}

impl Timing {
    /// Under `cargo bench` (it passes `--bench`): 1 s of warm-up, then the
    /// seconds in the environment variable `seconds_var` (default 3), and
    /// 20 units per client. Under `cargo test --all-targets`, a smoke run
    /// with tiny counts that only checks that numbers come out.
    pub fn from_env(seconds_var: &str) -> Timing {
        let benching = std::env::args().any(|a| a == "--bench");
        let seconds = std::env::var(seconds_var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        if benching {
            Timing {
                warm_up: Duration::from_secs(1),
                window: Duration::from_secs(seconds),
                each: 20,
            }
        } else {
            Timing {
                warm_up: Duration::from_millis(50),
                window: Duration::from_millis(200),
                each: 2,
            }
        }
    }
}

/// What one client repeats, measured as one unit.
pub trait Unit: Clone + Send + 'static {
    fn run(&self, rpc: &mut LockServiceClient<Channel>) -> impl Future<Output = ()> + Send;
}

/// One acquire + release pair.
impl Unit for proto::AcquireRequest {
    async fn run(&self, rpc: &mut LockServiceClient<Channel>) {
        pair(rpc, self).await
    }
}

/// A redis-server of its own and a server in the bench's process on it
/// (no reaper, health checks far apart: their PINGs are not lock work),
/// serving; its endpoint and a connection to that Redis for the counters.
pub async fn server() -> (RedisServer, String, redis::aio::MultiplexedConnection) {
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let args = ServiceArgs {
        reap_interval_ms: 0,
        health_interval_ms: 60_000,
        ..ServiceArgs::default()
    };
    let config = ServerConfig::new(redis.url(), &args).unwrap();
    let endpoint = super::serve_in_process(config).await;
    super::wait_until_serving(&endpoint).await;
    let conn = super::redis_conn(&redis.url()).await;
    (redis, endpoint, conn)
}

/// One acquire + release pair: the acquire must be granted (after its
/// wait, if it asks one), the release must release.
async fn pair(rpc: &mut LockServiceClient<Channel>, request: &proto::AcquireRequest) {
    let reply = rpc.acquire(request.clone()).await.unwrap().into_inner();
    assert_eq!(
        reply.status(),
        AcquireStatus::Acquired,
        "{}: {reply:?}",
        request.name
    );
    let reply = rpc
        .release(proto::ReleaseRequest {
            name: request.name.clone(),
            holder: request.holder.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), ReleaseStatus::Released, "{}", request.name);
}

/// `n` clients, `CLIENTS_PER_CHANNEL` to an HTTP/2 connection.
async fn clients(endpoint: &str, n: usize) -> Vec<LockServiceClient<Channel>> {
    let mut channels = Vec::new();
    for _ in 0..n.div_ceil(CLIENTS_PER_CHANNEL) {
        channels.push(
            Channel::from_shared(endpoint.to_owned())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    (0..n)
        .map(|i| LockServiceClient::new(channels[i / CLIENTS_PER_CHANNEL].clone()))
        .collect()
}

/// Units (pairs) per second over `window` after `warm_up`, one client per
/// unit, each repeating its own.
pub async fn throughput<U: Unit>(
    endpoint: &str,
    requests: &[U],
    warm_up: Duration,
    window: Duration,
) -> f64 {
    let pairs = Arc::new(AtomicUsize::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop_at = Instant::now() + warm_up + window;
    let mut tasks = Vec::new();
    let rpcs = clients(endpoint, requests.len()).await;
    for (mut rpc, request) in rpcs.into_iter().zip(requests.iter().cloned()) {
        let (pairs, counting) = (pairs.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                request.run(&mut rpc).await;
                if counting.load(Ordering::Relaxed) {
                    pairs.fetch_add(1, Ordering::Relaxed);
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
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Redis' work per unit (pair): `each` units per client, one client per
/// unit, all at once, counted by Redis: (function calls, commands inside
/// them).
pub async fn redis_work<U: Unit>(
    endpoint: &str,
    requests: &[U],
    conn: &mut redis::aio::MultiplexedConnection,
    each: usize,
) -> (f64, f64) {
    let rpcs = clients(endpoint, requests.len()).await;
    super::reset_command_stats(conn).await;
    let mut tasks = Vec::new();
    for (mut rpc, request) in rpcs.into_iter().zip(requests.iter().cloned()) {
        tasks.push(tokio::spawn(async move {
            for _ in 0..each {
                request.run(&mut rpc).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (mut calls, mut inner) = (0, 0);
    for stat in super::command_stats(conn).await {
        match stat.name.as_str() {
            "fcall" | "fcall_ro" | "evalsha" | "eval" => calls += stat.calls,
            name if NOT_LOCK_WORK.contains(&name) => {}
            _ => inner += stat.calls,
        }
    }
    let pairs = (each * requests.len()) as f64;
    (calls as f64 / pairs, inner as f64 / pairs)
}
