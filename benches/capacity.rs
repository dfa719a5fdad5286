//! Capacity: what one operation costs each process, so the cores a target
//! rate needs are known even where this machine (two shared cores) cannot
//! show throughput scaling.
//!
//! Topology, all on loopback, every process a child of this one, stopped
//! by its pid at the end: a Redis Cluster of three masters, each with one
//! replica (six redis-servers, `redis-cli --cluster create
//! --cluster-replicas 1`), and 2 `tumbler serve` replicas (separate
//! processes, auth on with one bearer token, clients' connections spread
//! over them in turn); then one plain redis-server with the same replicas
//! for comparison.
//!
//! Workloads, through gRPC only (`benches/capacity/workloads.rs`):
//! uncontended pairs (64 clients, each Acquire + Release on 16 names of
//! its own in turn, spread over every shard), a hot lock (16 clients
//! waiting server-side on one lock), the same hot lock with every client
//! on one replica (the other only hears the wake-ups: what the pub/sub
//! fan-out costs a replica that has no waiter), sessions (open, two
//! grants, a keep-alive, close) and held session grants (sessions that
//! stay open, their grants renewed every 500 ms). For each: operations
//! per second and the CPU every process spent per operation, from
//! `/proc/<pid>/stat` (each redis-server, each tumbler replica, this
//! process as the load generator), with the machine's busy time from
//! `/proc/stat` (others' load included). Redis' function calls and
//! PUBLISHes per operation come from `INFO commandstats` per node.
//!
//! Then the model: operations per Redis core and per tumbler core, and a
//! check of its prediction: the uncontended rate with one tumbler replica,
//! predicted from the two-replica run's CPU per pair and the CPU left to
//! the benchmark, against the rate measured.
//!
//! `cargo bench --bench capacity` (CAPACITY_SECONDS=N per window, default
//! 5; CAPACITY_CLIENTS, default 64; CAPACITY_HOT_CLIENTS, default 16;
//! CAPACITY_REPLICAS, default 2; CAPACITY_ARGS="--flag v …" adds flags to
//! every replica; CAPACITY_BINARY=<tumbler> runs another build;
//! CAPACITY_TARGET=N pairs/s for the worked sizing example, default
//! 100000). Under `cargo test --all-targets` it runs a smoke version of a
//! few seconds, and skips the cluster (saying why) when Redis Cluster
//! cannot be started here.

pub mod common;

#[path = "capacity/measure.rs"]
mod measure;
#[path = "capacity/report.rs"]
mod report;
#[path = "capacity/topology.rs"]
mod topology;
#[path = "capacity/workloads.rs"]
mod workloads;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::ServeProcess;
use topology::Topology;
use workloads::Kind;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

struct Settings {
    benching: bool,
    warm_up: Duration,
    window: Duration,
    clients: usize,
    hot_clients: usize,
    session_clients: usize,
    held_sessions: usize,
    held_grants: usize,
    replicas: usize,
    binary: String,
    args: Vec<String>,
    tokens: String,
}

/// One measured window.
struct Row {
    topology: &'static str,
    workload: &'static str,
    kind: Kind,
    clients: usize,
    secs: f64,
    /// Units finished in the window, per running replica.
    ops_by_replica: Vec<f64>,
    /// Per redis-server: label, role, CPU, function calls, PUBLISHes,
    /// pub/sub connections (the replicas' wake-up subscriptions).
    redis: Vec<(String, String, Duration, u64, u64, usize)>,
    /// Per running tumbler replica.
    tumbler: Vec<Duration>,
    client: Duration,
    busy: Duration,
    all: Duration,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Row {
    fn ops(&self) -> f64 {
        self.ops_by_replica.iter().sum()
    }
    fn rate(&self) -> f64 {
        self.ops() / self.secs
    }
    fn per_op(&self, d: Duration) -> f64 {
        us(d) / self.ops().max(1.0)
    }
    /// `per_op` for a table: "–" for the window with no load.
    fn per_op_text(&self, d: Duration) -> String {
        if self.ops() > 0.0 {
            format!("{:.1}", self.per_op(d))
        } else {
            "–".into()
        }
    }
    fn masters(&self) -> Duration {
        (self.redis.iter())
            .filter(|r| r.1 == "master")
            .map(|r| r.2)
            .sum()
    }
    fn redis_replicas(&self) -> Duration {
        (self.redis.iter())
            .filter(|r| r.1 != "master")
            .map(|r| r.2)
            .sum()
    }
    fn tumbler_all(&self) -> Duration {
        self.tumbler.iter().sum()
    }
    /// Everything this benchmark ran: Redis, tumbler, the load generator.
    fn ours(&self) -> Duration {
        self.masters() + self.redis_replicas() + self.tumbler_all() + self.client
    }
    /// Cores other users of the machine kept busy meanwhile.
    fn others_cores(&self) -> f64 {
        self.busy.saturating_sub(self.ours()).as_secs_f64() / self.secs
    }
    fn machine_cores(&self) -> f64 {
        self.all.as_secs_f64() / self.secs
    }
    fn idle_cores(&self) -> f64 {
        self.all.saturating_sub(self.busy).as_secs_f64() / self.secs
    }
    fn unit(&self) -> &'static str {
        match self.kind {
            Kind::Pairs => "pair",
            Kind::Hot => "grant",
            Kind::Sessions => "session",
            Kind::Held { .. } => "grant·s",
        }
    }
}

/// `replicas` tumbler replicas on `topology`.
async fn start_replicas(
    settings: &Settings,
    topology: &Topology,
    replicas: usize,
) -> Vec<ServeProcess> {
    let mut args = vec![
        "--redis-url",
        &topology.url,
        "--auth-tokens-file",
        &settings.tokens,
        "--http-listen",
        "off",
    ];
    args.extend(settings.args.iter().map(String::as_str));
    let mut started = Vec::new();
    for _ in 0..replicas {
        started.push(ServeProcess::start_with_args(&settings.binary, &args).await);
    }
    started
}

/// Runs `kind` with `clients` clients on the replicas `targets` (indexes
/// into `fleet`) and measures one window.
#[allow(clippy::too_many_arguments)]
async fn measure_window(
    settings: &Settings,
    topology: &Topology,
    topology_label: &'static str,
    fleet: &[ServeProcess],
    targets: &[usize],
    kind: Kind,
    workload: &'static str,
    clients: usize,
) -> Row {
    let endpoints: Vec<String> = targets.iter().map(|&t| fleet[t].endpoint.clone()).collect();
    let tag = format!(
        "{}-{}-{}",
        workload.split_whitespace().next().unwrap_or("w"),
        topology_label.split_whitespace().next().unwrap_or("t"),
        fleet.len()
    );
    measure_tagged(
        settings,
        topology,
        topology_label,
        fleet,
        (targets, &endpoints),
        (kind, workload, clients),
        &tag,
    )
    .await
}

/// [`measure_window`] with the names' tag given (the hot lock is
/// `<tag>-hot`).
async fn measure_tagged(
    settings: &Settings,
    topology: &Topology,
    topology_label: &'static str,
    fleet: &[ServeProcess],
    (targets, endpoints): (&[usize], &[String]),
    (kind, workload, clients): (Kind, &'static str, usize),
    tag: &str,
) -> Row {
    let load = workloads::start(kind, endpoints, clients, tag).await;
    tokio::time::sleep(settings.warm_up).await;
    for node in &topology.nodes {
        measure::reset_stats(node.port()).await;
    }
    let pids: Vec<u32> = (topology.nodes.iter().map(|n| n.pid()))
        .chain(fleet.iter().map(|f| f.pid()))
        .collect();
    let before = measure::snapshot(&pids);
    load.counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(settings.window).await;
    load.counting.store(false, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    let spent = measure::snapshot(&pids).since(&before);
    let counted = load.counted();
    let mut redis = Vec::new();
    for (node, cpu) in topology.nodes.iter().zip(&spent.processes) {
        redis.push((
            node.label.clone(),
            node.role.clone(),
            *cpu,
            measure::calls(node.port(), &["fcall", "fcall_ro"]).await,
            measure::calls(node.port(), &["publish"]).await,
            measure::subscribers(node.port()).await,
        ));
    }
    load.finish().await;
    let mut ops_by_replica = vec![0.0; fleet.len()];
    for (i, &t) in targets.iter().enumerate() {
        ops_by_replica[t] += match kind {
            // Grants held for the window, by the replica serving them.
            Kind::Held { grants } => {
                let sessions_here = (0..clients)
                    .filter(|c| (c / workloads::CLIENTS_PER_CHANNEL) % targets.len() == i)
                    .count();
                (sessions_here * grants) as f64 * secs
            }
            _ => counted[i] as f64,
        };
    }
    Row {
        topology: topology_label,
        workload,
        kind,
        clients,
        secs,
        ops_by_replica,
        redis,
        tumbler: spent.processes[topology.nodes.len()..].to_vec(),
        client: spent.client,
        busy: spent.busy,
        all: spent.all,
    }
}

/// Two tags whose hot lock (`<tag>-hot`) lives on the master where the
/// replicas hold their wake-up subscriptions, and on another master:
/// found by taking a lock of each candidate name and looking for its key.
async fn hot_tags(endpoint: &str, topology: &Topology) -> Option<(String, String)> {
    let masters: Vec<&topology::Node> = topology
        .nodes
        .iter()
        .filter(|n| n.role == "master")
        .collect();
    let mut subscribed = None;
    let mut most = 0;
    for node in &masters {
        let n = measure::subscribers(node.port()).await;
        if n > most {
            (most, subscribed) = (n, Some(node.port()));
        }
    }
    let subscribed = subscribed?;
    let (mut on, mut off) = (None, None);
    for k in 0..200 {
        if on.is_some() && off.is_some() {
            break;
        }
        let tag = format!("probe{k}");
        let name = format!("{tag}-hot");
        workloads::hold(endpoint, &name, true).await;
        let mut home = None;
        for node in &masters {
            if measure::has_key_with(node.port(), &name).await {
                home = Some(node.port());
            }
        }
        workloads::hold(endpoint, &name, false).await;
        match home {
            Some(port) if port == subscribed && on.is_none() => on = Some(tag),
            Some(port) if port != subscribed && off.is_none() => off = Some(tag),
            _ => {}
        }
    }
    Some((on?, off?))
}

async fn run_topology(
    settings: &Settings,
    topology: &Topology,
    label: &'static str,
    rows: &mut Vec<Row>,
    full: bool,
) {
    let fleet = start_replicas(settings, topology, settings.replicas).await;
    eprintln!("capacity: {label}: {} replicas serving", fleet.len());
    let all: Vec<usize> = (0..fleet.len()).collect();
    let s = settings;
    // At rest: what each process spends with no client at all.
    rows.push(measure_window(s, topology, label, &fleet, &all, Kind::Pairs, "idle", 0).await);
    rows.push(
        measure_window(
            s,
            topology,
            label,
            &fleet,
            &all,
            Kind::Pairs,
            "pairs",
            s.clients,
        )
        .await,
    );
    rows.push(
        measure_window(
            s,
            topology,
            label,
            &fleet,
            &all,
            Kind::Hot,
            "hot lock",
            s.hot_clients,
        )
        .await,
    );
    if full && fleet.len() > 1 {
        rows.push(
            measure_window(
                s,
                topology,
                label,
                &fleet,
                &[0],
                Kind::Hot,
                "hot lock, clients on replica 1",
                s.hot_clients,
            )
            .await,
        );
    }
    // On a cluster: the hot lock on the master the replicas subscribed
    // to for wake-ups, and on another one, in the same run.
    if full && topology.nodes.len() > 1 {
        match hot_tags(&fleet[0].endpoint, topology).await {
            Some((on, off)) => {
                let endpoints: Vec<String> = fleet.iter().map(|f| f.endpoint.clone()).collect();
                for (tag, workload) in [
                    (on, "hot lock on the subscribed master"),
                    (off, "hot lock on another master"),
                ] {
                    rows.push(
                        measure_tagged(
                            s,
                            topology,
                            label,
                            &fleet,
                            (&all, &endpoints),
                            (Kind::Hot, workload, s.hot_clients),
                            &tag,
                        )
                        .await,
                    );
                }
            }
            None => println!("capacity: no lock name found on each side of the subscription"),
        }
    }
    rows.push(
        measure_window(
            s,
            topology,
            label,
            &fleet,
            &all,
            Kind::Sessions,
            "sessions",
            s.session_clients,
        )
        .await,
    );
    if full {
        rows.push(
            measure_window(
                s,
                topology,
                label,
                &fleet,
                &all,
                Kind::Held {
                    grants: s.held_grants,
                },
                "held session grants",
                s.held_sessions,
            )
            .await,
        );
        // The model's check: one replica, the others stopped.
        let mut fleet = fleet;
        fleet.truncate(1);
        rows.push(
            measure_window(
                s,
                topology,
                label,
                &fleet,
                &[0],
                Kind::Pairs,
                "pairs",
                s.clients,
            )
            .await,
        );
    }
}

#[tokio::main]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"capacity\"\nsha256 = \"{}\"\nrole = \"client\"\nnamespaces = [\"*\"]\n",
            tumbler_proto::tokens::digest(workloads::TOKEN)
        ),
    )
    .unwrap();
    let settings = if benching {
        Settings {
            benching,
            warm_up: Duration::from_secs(1),
            window: Duration::from_secs(env("CAPACITY_SECONDS").unwrap_or(5)),
            clients: env("CAPACITY_CLIENTS").unwrap_or(64) as usize,
            hot_clients: env("CAPACITY_HOT_CLIENTS").unwrap_or(16) as usize,
            session_clients: 32,
            held_sessions: 64,
            held_grants: 16,
            replicas: env("CAPACITY_REPLICAS").unwrap_or(2) as usize,
            binary: String::new(),
            args: Vec::new(),
            tokens: String::new(),
        }
    } else {
        Settings {
            benching,
            warm_up: Duration::from_millis(50),
            window: Duration::from_millis(200),
            clients: 8,
            hot_clients: 4,
            session_clients: 4,
            held_sessions: 4,
            held_grants: 2,
            replicas: 2,
            binary: String::new(),
            args: Vec::new(),
            tokens: String::new(),
        }
    };
    let settings = Settings {
        binary: std::env::var("CAPACITY_BINARY")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tumbler").to_owned()),
        args: std::env::var("CAPACITY_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        tokens: tokens.display().to_string(),
        ..settings
    };
    let started = Instant::now();
    let uptime = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "capacity: {} cores, load average {}; tumbler {} {:?}; windows of {:?} after {:?}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        uptime
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        settings.binary,
        settings.args,
        settings.window,
        settings.warm_up,
    );

    let mut rows = Vec::new();
    match topology::cluster() {
        Ok(cluster) => {
            eprintln!(
                "capacity: cluster ok after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            run_topology(&settings, &cluster, "cluster 3+3", &mut rows, true).await;
            drop(cluster);
        }
        Err(why) if !settings.benching => {
            println!("capacity: cluster part skipped: {why}");
        }
        Err(why) => panic!("a Redis Cluster could not be started: {why}"),
    }
    eprintln!(
        "capacity: cluster part done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let single = topology::single().expect("redis-server");
    run_topology(&settings, &single, "single", &mut rows, settings.benching).await;
    drop(single);

    report::print_rows(&rows);
    for topology in ["cluster 3+3", "single"] {
        let (these, rest): (Vec<Row>, Vec<Row>) = std::mem::take(&mut rows)
            .into_iter()
            .partition(|r| r.topology == topology);
        report::print_model(&these, env("CAPACITY_TARGET").unwrap_or(100_000) as f64);
        rows = rest;
    }
    println!(
        "\ncapacity: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
