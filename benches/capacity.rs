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

fn print_rows(rows: &[Row]) {
    println!(
        "\n### Rate and CPU per operation (µs of CPU per unit; cores = CPU seconds per second)\n"
    );
    println!(
        "| Redis | workload | tumbler replicas | clients | units/s | tumbler µs/unit (all replicas) | Redis masters µs/unit | Redis replicas µs/unit | load generator µs/unit | all of ours µs/unit | others' load, cores | idle, cores |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows.iter().filter(|r| r.ops() > 0.0) {
        println!(
            "| {} | {} ({}) | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            r.topology,
            r.workload,
            r.unit(),
            r.tumbler.len(),
            r.clients,
            r.rate(),
            r.per_op(r.tumbler_all()),
            r.per_op(r.masters()),
            r.per_op(r.redis_replicas()),
            r.per_op(r.client),
            r.per_op(r.ours()),
            r.others_cores(),
            r.idle_cores(),
        );
    }
    println!("\n### Per process (each row's window)\n");
    println!(
        "| Redis | workload | process | cores busy | µs per unit (all units) | units it served | µs per unit it served | FCALLs per unit | PUBLISHes per unit | subscribers |"
    );
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        for (label, role, cpu, fcalls, publishes, subscribers) in &r.redis {
            println!(
                "| {} | {} | redis {label} ({role}) | {:.2} | {} | – | – | {} | {} | {subscribers} |",
                r.topology,
                r.workload,
                cpu.as_secs_f64() / r.secs,
                r.per_op_text(*cpu),
                per_unit(*fcalls, r.ops()),
                per_unit(*publishes, r.ops()),
            );
        }
        for (i, cpu) in r.tumbler.iter().enumerate() {
            let served = r.ops_by_replica[i];
            println!(
                "| {} | {} | tumbler replica {} | {:.2} | {} | {:.0} | {} | – | – | – |",
                r.topology,
                r.workload,
                i + 1,
                cpu.as_secs_f64() / r.secs,
                r.per_op_text(*cpu),
                served,
                if served > 0.0 {
                    format!("{:.1}", us(*cpu) / served)
                } else {
                    "(no clients)".into()
                },
            );
        }
        println!(
            "| {} | {} | load generator (this process) | {:.2} | {} | – | – | – | – | – |",
            r.topology,
            r.workload,
            r.client.as_secs_f64() / r.secs,
            r.per_op_text(r.client),
        );
    }
}

/// Calls per unit for a table ("–" for the window with no load).
fn per_unit(calls: u64, units: f64) -> String {
    if units > 0.0 {
        format!("{:.2}", calls as f64 / units)
    } else {
        "–".into()
    }
}

/// Units one core does at `us` µs of CPU each ("–" when nothing was
/// measured: a window shorter than the clock's tick).
fn per_core(us: f64) -> String {
    if us > 0.0 {
        format!("{:.0}", 1e6 / us)
    } else {
        "–".into()
    }
}

/// The sizing figures and the check of the model's prediction.
fn print_model(rows: &[Row], target: f64) {
    let find = |topology: &str, workload: &str, replicas: usize| {
        rows.iter().find(|r| {
            r.topology == topology && r.workload == workload && r.tumbler.len() == replicas
        })
    };
    let Some(pairs) = rows.iter().find(|r| r.workload == "pairs") else {
        return;
    };
    let topo = pairs.topology;
    let idle = find(topo, "idle", pairs.tumbler.len());
    println!("\n### The model ({topo}, from the rows above)\n");
    println!("| figure | value |");
    println!("| --- | ---: |");
    let redis_us = pairs.per_op(pairs.masters());
    let tumbler_us = pairs.per_op(pairs.tumbler_all());
    let replica_us = pairs.per_op(pairs.redis_replicas());
    println!(
        "| uncontended pairs per Redis (master) core | {} |",
        per_core(redis_us)
    );
    println!(
        "| uncontended pairs per tumbler core | {} |",
        per_core(tumbler_us)
    );
    if replica_us > 0.0 {
        println!(
            "| uncontended pairs per Redis replica core (replication) | {} |",
            per_core(replica_us)
        );
    }
    let masters = pairs.redis.iter().filter(|r| r.1 == "master").count();
    if masters > 1 {
        let busiest = (pairs.redis.iter())
            .filter(|r| r.1 == "master")
            .map(|r| r.2)
            .max()
            .unwrap_or_default();
        println!(
            "| busiest master's share of the masters' CPU (even: {:.2}) | {:.2} |",
            1.0 / masters as f64,
            busiest.as_secs_f64() / pairs.masters().as_secs_f64().max(1e-9)
        );
    }
    let headroom = 0.7;
    println!(
        "| worked example: {target:.0} pairs/s at {:.0} % CPU: Redis masters (one core each) | {:.0} |",
        headroom * 100.0,
        (target * redis_us / 1e6 / headroom).ceil()
    );
    println!(
        "| worked example: tumbler cores | {:.1} |",
        target * tumbler_us / 1e6 / headroom
    );
    if let Some(hot) = find(topo, "hot lock", pairs.tumbler.len()) {
        let hottest = (hot.redis.iter())
            .filter(|r| r.1 == "master")
            .max_by_key(|r| r.2)
            .map(|r| (r.0.clone(), r.2, r.5));
        if let Some((label, cpu, subscribed_there)) = hottest {
            let grant_us = hot.per_op(cpu);
            println!(
                "| hot lock: grants/s measured, {} clients | {:.0} |",
                hot.clients,
                hot.rate()
            );
            println!(
                "| hot lock: replicas' wake-up subscriptions on its master / on all nodes | {subscribed_there} / {} |",
                hot.redis.iter().map(|r| r.5).sum::<usize>()
            );
            println!("| hot lock: its master ({label}) µs per grant | {grant_us:.1} |");
            println!(
                "| hot lock: ceiling of one lock if its master's core were the bound | {} |",
                per_core(grant_us)
            );
            let others: Duration = (hot.redis.iter())
                .filter(|r| r.0 != label)
                .map(|r| r.2)
                .sum();
            println!(
                "| hot lock: every other Redis node together, µs per grant (cluster bus fan-out of PUBLISH, replication) | {:.1} |",
                hot.per_op(others)
            );
        }
    }
    if let Some(one) = find(topo, "hot lock, clients on replica 1", pairs.tumbler.len()) {
        let publishes: u64 = one.redis.iter().map(|r| r.4).sum();
        for (i, cpu) in one.tumbler.iter().enumerate().skip(1) {
            // Less what the replica spends with no load at all.
            let at_rest = idle.map_or(0.0, |idle| us(idle.tumbler[i]) / idle.secs * one.secs);
            println!(
                "| wake-up fan-out: replica {} with no waiter, µs per PUBLISH heard ({publishes} in {:.1} s), less its CPU at rest ({:.0} µs/s) | {:.1} |",
                i + 1,
                one.secs,
                at_rest / one.secs,
                (us(*cpu) - at_rest).max(0.0) / (publishes.max(1) as f64)
            );
        }
    }
    if let Some(sessions) = find(topo, "sessions", pairs.tumbler.len()) {
        println!(
            "| sessions (open, 2 grants, close) per Redis core / per tumbler core | {} / {} |",
            per_core(sessions.per_op(sessions.masters())),
            per_core(sessions.per_op(sessions.tumbler_all()))
        );
    }
    if let Some(held) = rows
        .iter()
        .find(|r| r.topology == topo && matches!(r.kind, Kind::Held { .. }))
    {
        println!(
            "| held session grants (ttl {} ms) one Redis core keeps / one tumbler core keeps | {} / {} |",
            workloads::HELD_TTL_MS,
            per_core(held.per_op(held.masters())),
            per_core(held.per_op(held.tumbler_all()))
        );
    }

    // The check: the one-replica run's rate from the two-replica run's
    // CPU per pair and the cores left to the benchmark.
    let Some(check) = rows
        .iter()
        .find(|r| r.topology == topo && r.workload == "pairs" && r.tumbler.len() == 1)
    else {
        return;
    };
    let whole_us = pairs.per_op(pairs.ours());
    let available = |r: &Row| r.machine_cores() - r.others_cores();
    let predicted_now = available(check) * 1e6 / whole_us;
    let predicted_before = available(pairs) * 1e6 / whole_us;
    let off = |predicted: f64| (check.rate() - predicted) / predicted * 100.0;
    println!(
        "\n### The model's check: {} clients on 1 replica, predicted from {} replicas' CPU per pair\n",
        check.clients,
        pairs.tumbler.len()
    );
    println!("| figure | value |");
    println!("| --- | ---: |");
    println!(
        "| CPU per pair, everything of ours ({} replicas: tumbler + Redis + load generator) | {whole_us:.1} µs |",
        pairs.tumbler.len()
    );
    println!(
        "| CPU per pair measured with 1 replica | {:.1} µs ({:+.1} %) |",
        check.per_op(check.ours()),
        (check.per_op(check.ours()) - whole_us) / whole_us * 100.0
    );
    println!(
        "| of which tumbler: {} replicas / 1 replica | {:.1} / {:.1} µs |",
        pairs.tumbler.len(),
        tumbler_us,
        check.per_op(check.tumbler_all())
    );
    println!(
        "| of which Redis masters: {} replicas / 1 replica | {:.1} / {:.1} µs |",
        pairs.tumbler.len(),
        redis_us,
        check.per_op(check.masters())
    );
    println!(
        "| cores left to the benchmark (machine minus others' load) in the check's window | {:.2} |",
        available(check)
    );
    println!("| predicted pairs/s (those cores ÷ CPU per pair) | {predicted_now:.0} |");
    println!(
        "| predicted pairs/s with the model run's others' load ({:.2} cores left) | {predicted_before:.0} |",
        available(pairs)
    );
    println!(
        "| measured pairs/s | {:.0} ({:+.1} % against the prediction; {:+.1} % against the second) |",
        check.rate(),
        off(predicted_now),
        off(predicted_before)
    );
    println!(
        "| machine idle during the check (a CPU-bound run leaves ~0) | {:.2} cores |",
        check.idle_cores()
    );
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

    print_rows(&rows);
    for topology in ["cluster 3+3", "single"] {
        let (these, rest): (Vec<Row>, Vec<Row>) = std::mem::take(&mut rows)
            .into_iter()
            .partition(|r| r.topology == topology);
        print_model(&these, env("CAPACITY_TARGET").unwrap_or(100_000) as f64);
        rows = rest;
    }
    println!(
        "\ncapacity: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
