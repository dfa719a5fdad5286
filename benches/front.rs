//! tumbler's own cost per lock operation, against a **yardstick**: a bare
//! tonic server with tumbler's proto that decodes an Acquire or Release,
//! runs one plain Lua lock script over one multiplexed Redis connection
//! and encodes the reply (no auth, no tracing, no metrics, no checks). It
//! is what any gRPC front over Redis must pay; what tumbler pays above it
//! is its own. A **padded yardstick**, the same with each script first
//! spending about as much Redis CPU as tumbler's functions, splits
//! tumbler's gap in pairs/s into what its Redis work costs (Redis is one
//! thread: while it works through a batch the other core waits) and what
//! its server path does. The peers: etcd's v3lock, when an `etcd` binary
//! exists, and ZooKeeper 3.8 (Debian's `zookeeper`, started by the
//! benchmark on a free loopback port with its data on tmpfs; its JIT
//! warmed for ZK_WARM_SECONDS, default 15, first) locked with Curator's
//! InterProcessMutex recipe (`common/zookeeper.rs`), one session per
//! client, when it is installed.
//!
//! Each server is its own process (the yardstick is this benchmark's own
//! binary, started again in its serving mode), so its CPU is read from
//! `/proc/<pid>/stat`, and Redis' from `INFO cpu`, over the same measured
//! window; its own CPU (the load generator's) and the machine's idle share
//! too, since on a machine the run keeps busy pairs/s follows what a pair
//! costs all three processes together. tumbler runs as deployed: auth on
//! (a bearer token per call), tracing at its default level, the HTTP port
//! with `/metrics` on.
//!
//! Scenario: 64 clients (one tonic Channel per 8), each on its own name,
//! uncontended try-once Acquire + Release pairs, back to back. Then, for
//! the peer table (FRONT_PEERS=0 skips it): the same with 1 client (the
//! acquire's latency), and 16 clients on one lock, each waiting in Acquire
//! and releasing as soon as it is granted (grants/s; the yardstick cannot
//! wait and has no row there).
//!
//! `cargo bench --bench front` (FRONT_SECONDS=N per measurement, default
//! 5; FRONT_CLIENTS=N, default 64; FRONT_ROUNDS=N, default 3: every target
//! is measured in turn N times, each round starting one target later, so
//! a slow spell of a shared machine falls on all of them, and each row
//! sums its rounds; FRONT_PAD=N, the padded yardstick's loop steps;
//! FRONT_ZOOKEEPER=0 leaves ZooKeeper out). Under `cargo test` it runs a
//! smoke version that only checks numbers come out (ZooKeeper included
//! when installed, without the JIT warm-up: a few seconds).
//!
//! For an A/B comparison in one run, `FRONT_COMPARE=<tumbler binary>`
//! adds a second tumbler row (that binary, e.g. one built from another
//! commit, run with the same flags), and `FRONT_COMPARE_ARGS="--flag v …"`
//! adds flags to that row (with the same binary when FRONT_COMPARE is
//! unset): what a change or a setting costs, measured beside the rest
//! (group commit against none: `FRONT_COMPARE_ARGS=--no-group-commit`).
//! `FRONT_ARGS="--flag v …"` adds flags to the main tumbler row.
//! After the table, each tumbler row's Redis calls per batch size
//! (group commit, read from its `/metrics`) over the whole run.

pub mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{ServeProcess, etcd, zookeeper};
use hdrhistogram::Histogram;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};

const CLIENTS_PER_CHANNEL: usize = 8;
/// Clients on the one lock of the peer table's contended scenario.
const HOT_CLIENTS: usize = 16;
const HOT_NAME: &str = "front-hot";
const YARDSTICK_ENV: &str = "TUMBLER_BENCH_YARDSTICK";
/// Steps of an empty Lua loop run before each of the padded yardstick's
/// scripts (FRONT_PAD overrides): about 3 ns each on this machine, 1,800
/// bring its Redis CPU per pair from ~10 µs to about tumbler's ~21 µs,
/// so that row pays what tumbler's Redis work costs and nothing else of
/// tumbler's: how far apart the two are then is the server path alone.
const PAD_STEPS: u64 = 1_800;
const TOKEN: &str = "front-bench-token";

/// The yardstick: a bare front over the plain Redis lock.
#[path = "front/drive.rs"]
mod drive;
#[path = "front/peers.rs"]
mod peers;
#[path = "front/yardstick.rs"]
mod yardstick;

use drive::*;

/// What a target is, for the ratios.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Yardstick,
    /// The yardstick with its scripts padded to cost Redis about what
    /// tumbler's functions do (see `PAD_STEPS`).
    Padded,
    Tumbler,
    Etcd,
    ZooKeeper,
    /// The A/B row (see the head comment).
    Compare,
}

/// What the clients do: `clients` of them, each on a name of its own
/// (try-once Acquire), or all on one lock (`one_lock`: waiting Acquire).
#[derive(Clone, Copy)]
struct Scenario {
    clients: usize,
    one_lock: bool,
}

/// A client's way to its target: a gRPC channel, or a ZooKeeper session.
#[derive(Clone)]
enum Conn {
    Grpc(Channel),
    Zk(zookeeper_client::Client),
}

/// A server process under test: its endpoint and pid.
struct Target {
    label: &'static str,
    endpoint: String,
    pid: u32,
    kind: Kind,
}

/// What a pair costs the server side: tumbler's and the yardstick's
/// include their Redis; a peer is one process.
fn whole_us(kind: Kind, m: &Measured) -> f64 {
    match kind {
        Kind::Etcd | Kind::ZooKeeper => m.server_us(),
        _ => m.server_us() + m.redis_us(),
    }
}

/// What one target measured.
struct Measured {
    pairs: u64,
    seconds: f64,
    latency: Histogram<u64>,
    server_cpu: Duration,
    redis_cpu: Duration,
    /// This benchmark's own CPU: the load generator (clients and channels).
    client_cpu: Duration,
    /// The share of the machine's CPU time left idle over the window.
    idle: f64,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.seconds
    }
    fn server_us(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.pairs as f64
    }
    fn redis_us(&self) -> f64 {
        self.redis_cpu.as_secs_f64() * 1e6 / self.pairs as f64
    }
    /// Adds another measurement of the same target (another round).
    fn add(&mut self, other: Measured) {
        self.idle = (self.idle * self.seconds + other.idle * other.seconds)
            / (self.seconds + other.seconds);
        self.pairs += other.pairs;
        self.seconds += other.seconds;
        self.latency.add(other.latency).unwrap();
        self.server_cpu += other.server_cpu;
        self.redis_cpu += other.redis_cpu;
        self.client_cpu += other.client_cpu;
    }
    fn client_us(&self) -> f64 {
        self.client_cpu.as_secs_f64() * 1e6 / self.pairs as f64
    }
    /// Everything one pair cost the machine: load generator, server, Redis.
    fn all_us(&self) -> f64 {
        self.client_us() + self.server_us() + self.redis_us()
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::main]
async fn main() {
    if let Ok(spec) = std::env::var(YARDSTICK_ENV) {
        let mut parts = spec.split(' ');
        let (Some(listen), Some(redis_url), Some(pad)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("{YARDSTICK_ENV}: <listen> <redis url> <pad steps>");
        };
        yardstick::serve(listen, redis_url, pad.parse().unwrap()).await;
        return;
    }
    let benching = std::env::args().any(|a| a == "--bench");
    let (clients, warm_up, window, rounds) = if benching {
        (
            env("FRONT_CLIENTS").unwrap_or(64) as usize,
            Duration::from_secs(1),
            Duration::from_secs(env("FRONT_SECONDS").unwrap_or(5)),
            env("FRONT_ROUNDS").unwrap_or(3),
        )
    } else {
        (4, Duration::from_millis(100), Duration::from_millis(300), 1)
    };

    let redis_server = RedisServer::start("redis-server").expect("redis-server");
    let mut redis = common::redis_conn(&redis_server.url()).await;

    // tumbler as deployed: auth on, default tracing, /metrics served.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"bench\"\nsha256 = \"{}\"\nrole = \"client\"\nnamespaces = [\"*\"]\n",
            tumbler::auth::token_digest(TOKEN)
        ),
    )
    .unwrap();
    let tokens_path = tokens.display().to_string();
    // tumbler as deployed, on `binary`, with `extra` flags (the A/B row's).
    let start_tumbler = async |binary: &str, extra: &str| {
        let http = format!("127.0.0.1:{}", tumbler::dev::free_port().unwrap());
        let redis_url = redis_server.url();
        let mut args = vec![
            "--redis-url",
            &redis_url,
            "--auth-tokens-file",
            &tokens_path,
            "--http-listen",
            &http,
            "--reap-interval-ms",
            "0",
        ];
        args.extend(extra.split_whitespace());
        (ServeProcess::start_with_args(binary, &args).await, http)
    };
    let main_args = std::env::var("FRONT_ARGS").unwrap_or_default();
    let (tumbler, tumbler_http) = start_tumbler(env!("CARGO_BIN_EXE_tumbler"), &main_args).await;

    // The yardstick, plain and padded: this binary in its serving mode.
    let start_yardstick = async |pad: u64| {
        let port = tumbler::dev::free_port().unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        let process = std::process::Command::new(std::env::current_exe().unwrap())
            .env(
                YARDSTICK_ENV,
                format!("127.0.0.1:{port} {} {pad}", redis_server.url()),
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        common::wait_until_serving(&endpoint).await;
        (endpoint, process)
    };
    let pad = env("FRONT_PAD").unwrap_or(PAD_STEPS);
    let (yardstick_endpoint, mut yardstick) = start_yardstick(0).await;
    let (padded_endpoint, mut padded) = start_yardstick(pad).await;

    let etcd_server = etcd::EtcdServer::start();
    if let Some(etcd_server) = &etcd_server {
        etcd_server.ready().await;
    }
    let zk_server = if env("FRONT_ZOOKEEPER") == Some(0) {
        None
    } else {
        zookeeper::ZkServer::start()
    };
    if let Some(zk_server) = &zk_server {
        zk_server.ready().await;
        // A fresh JVM runs well below its steady rate until its JIT has
        // compiled the request path: warm it before anything is measured.
        let length = if benching {
            zookeeper::warm_up_length()
        } else {
            Duration::ZERO
        };
        zk_server.warm_up(length).await;
    }

    let mut targets = vec![
        Target {
            label: "yardstick: bare tonic front, one plain Lua lock script, one connection",
            endpoint: yardstick_endpoint,
            pid: yardstick.id(),
            kind: Kind::Yardstick,
        },
        Target {
            label: Box::leak(
                format!(
                    "padded yardstick: the same, each script first runs {pad} empty Lua loop steps"
                )
                .into_boxed_str(),
            ),
            endpoint: padded_endpoint,
            pid: padded.id(),
            kind: Kind::Padded,
        },
        Target {
            label: "tumbler: auth on, default tracing, metrics on",
            endpoint: tumbler.endpoint.clone(),
            pid: tumbler.pid(),
            kind: Kind::Tumbler,
        },
    ];
    if let Some(etcd_server) = &etcd_server {
        targets.push(Target {
            label: "etcd 3.4 v3lock: Lock/Unlock with a lease",
            endpoint: etcd_server.endpoint.clone(),
            pid: etcd_server.pid(),
            kind: Kind::Etcd,
        });
    }
    if let Some(zk_server) = &zk_server {
        targets.push(Target {
            label: "ZooKeeper 3.8: Curator's InterProcessMutex recipe, a session per client",
            endpoint: zk_server.address.clone(),
            pid: zk_server.pid(),
            kind: Kind::ZooKeeper,
        });
    }
    // The A/B row (see the head comment); its process lives until the end.
    let compare_bin = std::env::var("FRONT_COMPARE").ok();
    let compare_args = std::env::var("FRONT_COMPARE_ARGS").unwrap_or_default();
    let _compare = if compare_bin.is_some() || !compare_args.is_empty() {
        let bin = compare_bin.unwrap_or_else(|| env!("CARGO_BIN_EXE_tumbler").to_owned());
        let (process, http) = start_tumbler(&bin, &compare_args).await;
        let label = format!("compare: {bin} {compare_args}");
        targets.push(Target {
            label: Box::leak(label.into_boxed_str()),
            endpoint: process.endpoint.clone(),
            pid: process.pid(),
            kind: Kind::Compare,
        });
        Some((process, http))
    } else {
        None
    };

    println!(
        "tumbler front benchmark: {clients} clients, uncontended try-once Acquire + Release pairs, warm-up {warm_up:?}, {window:?} measured, {rounds} round(s) of every target in turn (rows sum them); every server its own process; loopback"
    );
    if zk_server.is_some() && benching {
        println!(
            "(ZooKeeper's JIT warmed for {:?} before the first measurement)",
            zookeeper::warm_up_length()
        );
    }
    println!();
    println!(
        "| path | pairs/s | acquire p50 µs | acquire p99 µs | server CPU µs/pair | Redis CPU µs/pair | whole µs/pair | load generator µs/pair | machine idle |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let targets: Vec<Arc<Target>> = targets.into_iter().map(Arc::new).collect();
    let timing = (warm_up, window, rounds);
    let uncontended = Scenario {
        clients,
        one_lock: false,
    };
    let measured_all = rounds_of(&targets, uncontended, timing, &mut redis).await;
    let mut results = Vec::new();
    let mut rates = Vec::new();
    for (target, (measured, rate)) in targets.iter().cloned().zip(measured_all) {
        rates.push(rate);
        println!(
            "| {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} % |",
            target.label,
            measured.rate(),
            measured.latency.value_at_quantile(0.5),
            measured.latency.value_at_quantile(0.99),
            measured.server_us(),
            measured.redis_us(),
            measured.server_us() + measured.redis_us(),
            measured.client_us(),
            measured.idle * 100.0,
        );
        results.push((target, measured));
    }
    let find = |kind: Kind| results.iter().position(|(t, _)| t.kind == kind);
    let (yard_i, tumbler_i) = (find(Kind::Yardstick).unwrap(), find(Kind::Tumbler).unwrap());
    let (yard, tumbler_m) = (&results[yard_i].1, &results[tumbler_i].1);
    if rounds > 1 {
        let each: Vec<String> = (rates[tumbler_i].iter().zip(&rates[yard_i]))
            .map(|(t, y)| format!("{:.2}", t / y))
            .collect();
        println!();
        println!(
            "tumbler pairs/s ÷ the yardstick's, round by round: {}",
            each.join(", ")
        );
    }
    println!();
    println!("| ratio (same run) | value | target |");
    println!("| --- | ---: | ---: |");
    println!(
        "| tumbler's own CPU per pair ÷ the yardstick's | {:.2} | ≤ 1.5 |",
        tumbler_m.server_us() / yard.server_us()
    );
    println!(
        "| tumbler pairs/s ÷ the yardstick's | {:.2} | ≥ 0.9 |",
        tumbler_m.rate() / yard.rate()
    );
    println!(
        "| tumbler Redis CPU per pair ÷ the yardstick's (the plain Lua lock: SET NX PX, compare-and-delete) | {:.2} | ≤ 1.0 |",
        tumbler_m.redis_us() / yard.redis_us()
    );
    // On a machine the run keeps busy, pairs/s follows the CPU a pair
    // costs all three processes together; this is the ratio that predicts.
    println!(
        "| yardstick's CPU per pair ÷ tumbler's, load generator + server + Redis (predicts the line above when the machine is busy) | {:.2} | |",
        yard.all_us() / tumbler_m.all_us()
    );
    println!(
        "| tumbler acquire p99 ÷ the yardstick's | {:.2} | ≤ 2 |",
        tumbler_m.latency.value_at_quantile(0.99) as f64
            / yard.latency.value_at_quantile(0.99).max(1) as f64
    );
    // The padded row pays tumbler's Redis work and nothing else of
    // tumbler's: these two lines split the gap above in two.
    let padded_m = &results[find(Kind::Padded).unwrap()].1;
    println!(
        "| padded yardstick's pairs/s ÷ the yardstick's (what Redis work like tumbler's costs a bare front) | {:.2} | |",
        padded_m.rate() / yard.rate()
    );
    println!(
        "| tumbler pairs/s ÷ the padded yardstick's (the server path alone, Redis work alike) | {:.2} | |",
        tumbler_m.rate() / padded_m.rate()
    );
    if let Some(compare_i) = find(Kind::Compare) {
        let compare_m = &results[compare_i].1;
        println!(
            "| compare row's own CPU per pair ÷ tumbler's | {:.2} | |",
            compare_m.server_us() / tumbler_m.server_us()
        );
        println!(
            "| compare row's pairs/s ÷ tumbler's | {:.2} | |",
            compare_m.rate() / tumbler_m.rate()
        );
        println!(
            "| compare row's Redis CPU per pair ÷ tumbler's | {:.2} | |",
            compare_m.redis_us() / tumbler_m.redis_us()
        );
        for q in [0.5, 0.99] {
            println!(
                "| tumbler acquire p{} ÷ the compare row's | {:.2} | |",
                q * 100.0,
                tumbler_m.latency.value_at_quantile(q) as f64
                    / compare_m.latency.value_at_quantile(q).max(1) as f64
            );
        }
    }
    if let Some(etcd_i) = find(Kind::Etcd) {
        let etcd_m = &results[etcd_i].1;
        println!(
            "| tumbler pairs/s ÷ etcd's | {:.2} | ≥ 2.5 |",
            tumbler_m.rate() / etcd_m.rate()
        );
        println!(
            "| tumbler whole CPU per pair (tumbler + Redis) ÷ etcd's | {:.2} | ≤ 0.5 |",
            (tumbler_m.server_us() + tumbler_m.redis_us()) / etcd_m.server_us()
        );
    } else {
        println!("(no `etcd` binary: the etcd rows were skipped)");
    }
    // What a pair costs the server side: tumbler's and the yardstick's
    // include their Redis; a peer is one process.
    if let Some(zk_i) = find(Kind::ZooKeeper) {
        let zk_m = &results[zk_i].1;
        println!(
            "| tumbler pairs/s ÷ ZooKeeper's | {:.2} | ≥ 1 |",
            tumbler_m.rate() / zk_m.rate()
        );
        println!(
            "| tumbler whole CPU per pair (tumbler + Redis) ÷ ZooKeeper's (its JVM) | {:.2} | |",
            whole_us(Kind::Tumbler, tumbler_m) / zk_m.server_us()
        );
    } else if zookeeper::ZkServer::installed() {
        println!("(FRONT_ZOOKEEPER=0: the ZooKeeper rows were skipped)");
    } else {
        println!("{}", zookeeper::HOW_TO_GET);
    }

    if env("FRONT_PEERS") != Some(0) {
        let hot = if benching { HOT_CLIENTS } else { clients };
        peers::peer_table(&targets, &results, (clients, hot), timing, &mut redis).await;
    }
    println!();
    let mut rows = vec![("tumbler", tumbler_http)];
    rows.extend(
        _compare
            .as_ref()
            .map(|(_, http)| ("compare row", http.clone())),
    );
    for (row, http) in rows {
        match batch_sizes(&http).await {
            Some(sizes) if !sizes.is_empty() => {
                let calls: f64 = sizes.iter().map(|(_, n)| n).sum();
                let shown: Vec<String> = sizes
                    .iter()
                    .map(|(size, n)| format!("{size}: {n:.0} ({:.0} %)", n * 100.0 / calls))
                    .collect();
                println!("{row}'s Redis calls per batch size: {}", shown.join(", "));
            }
            _ => println!("{row}: no group-commit counts (group commit off)"),
        }
    }
    for process in [&mut yardstick, &mut padded] {
        let _ = process.kill();
        let _ = process.wait();
    }
}
