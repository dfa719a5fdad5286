//! A mutual-exclusion checker under chaos. Clients spread over three
//! `tumbler serve` processes acquire a few contended locks, campaign in
//! as many elections, read or write a few read/write locks (3 readers
//! at once) and take k of a few semaphores' 4 permits (k from 1 to 4,
//! fair or barging), record each grant (each term) in their own log,
//! hold briefly and release (resign), while a chaos loop
//! SIGKILLs and restarts replicas, SIGKILLs and restarts Redis, and
//! freezes Redis (SIGSTOP/SIGCONT); two replicas of the three hand freed
//! permits over (the default), one wakes the head instead
//! (`--no-hand-over`). Afterwards a checker proves, from the
//! clients' own observations on one monotonic clock, that no two grants
//! of a lock overlapped while both leases were valid (never two leaders
//! with valid terms; never a writer beside a reader or another writer,
//! never more readers than the limit; never more permits of a semaphore
//! in valid grants than its limit, invariant 14), and that fencing tokens per lock
//! (terms per election) strictly rose in grant order, across modes
//! (`chaos/check.rs`). The clients also take multi-locks of 2 or 3 plain
//! locks while observers Inspect those locks: no set is seen partial while
//! its holder holds it, and no part outlives its round by more than its
//! reservation (invariant 15, `chaos/sets.rs`; `CHAOS_MISSET_SETS=1` shows
//! the checker failing).
//!
//! Three Redis set-ups:
//! - durable (`--appendonly yes --appendfsync always`): a restart keeps
//!   every acknowledged write, so mutual exclusion must hold: 0 overlaps.
//! - a durable Redis Cluster of three masters, whose nodes are killed,
//!   restarted and frozen one at a time: 0 overlaps as well.
//! - volatile (no persistence): a restart forgets held locks, so overlaps
//!   can happen (Redis cannot keep a promise it forgot; this is the case
//!   fencing tokens exist for): a writer beside readers, readers or
//!   permits past the limit, as two plain holders — but tokens must still
//!   only rise, across modes too.
//!
//! Short by default (CI); `CHAOS_SECONDS=N` runs longer, `CHAOS_OPS=N`
//! runs until N grants, `CHAOS_LOCKS` / `CHAOS_CLIENTS` change the load
//! (the long mode in the README: 100,000 grants).

mod check;
mod multi;
mod ops;
mod sets;

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::topology::{TestCluster, start_cluster_with};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::transport::Channel;
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;

use check::{Grant, Mode, check};
use multi::Log;
use ops::{Op, PERMITS, READERS, RW_LOCKS, SEMAPHORES, acquire, campaign, release, resign};
use sets::History;

/// Locks and clients: few and many (contention), or CHAOS_LOCKS and
/// CHAOS_CLIENTS for the long mode.
fn locks() -> usize {
    env_or("CHAOS_LOCKS", 4)
}

fn clients() -> usize {
    env_or("CHAOS_CLIENTS", 12)
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
const REPLICAS: usize = 3;
/// Redis that keeps every acknowledged write across a crash.
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];
const TTL_MS: u64 = 1_500;

/// A `tumbler serve` replica on a fixed port, restartable.
struct Replica {
    port: u16,
    redis_url: String,
    /// Hands freed permits over (the default; one of the three runs with
    /// `--no-hand-over`: both paths of a contended grant share the locks).
    hand_over: bool,
    child: Option<std::process::Child>,
}

impl Replica {
    fn start(redis_url: &str, hand_over: bool) -> Replica {
        let mut replica = Replica {
            port: tumbler::dev::free_port().unwrap(),
            redis_url: redis_url.to_owned(),
            hand_over,
            child: None,
        };
        replica.spawn();
        replica
    }

    fn spawn(&mut self) {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args([
                "--redis-url",
                &self.redis_url,
                "--http-listen",
                "off",
                "--no-auth",
            ])
            .args(["--redis-timeout-ms", "500", "--health-interval-ms", "100"])
            .args(["--default-queue-ttl-ms", "500", "--shutdown-drain-ms", "0"])
            .args(["--reap-interval-ms", "1000"])
            .args((!self.hand_over).then_some("--no-hand-over"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The Redis the replicas share: one server or a cluster of three
/// masters; faults hit one node at a time.
enum Store {
    Standalone(RedisServer),
    Cluster(TestCluster),
}

impl Store {
    fn url(&self) -> String {
        match self {
            Store::Standalone(redis) => redis.url(),
            Store::Cluster(cluster) => cluster.url(),
        }
    }

    fn nodes(&self) -> usize {
        match self {
            Store::Standalone(_) => 1,
            Store::Cluster(cluster) => cluster.nodes.len(),
        }
    }

    fn kill(&mut self, node: usize) {
        match self {
            Store::Standalone(redis) => redis.kill(),
            Store::Cluster(cluster) => cluster.nodes[node].kill(),
        }
    }

    /// Starts a killed node again on its port and data directory; returns
    /// once it answers.
    fn restart(&mut self, node: usize) {
        match self {
            Store::Standalone(redis) => redis.restart().unwrap(),
            Store::Cluster(cluster) => cluster.nodes[node].restart(),
        }
    }

    fn pid(&self, node: usize) -> Pid {
        let pid = match self {
            Store::Standalone(redis) => redis.pid(),
            Store::Cluster(cluster) => cluster.nodes[node].pid(),
        };
        Pid::from_raw(pid.expect("the node runs") as i32)
    }
}

#[derive(Default, Debug)]
struct Faults {
    replica_kills: usize,
    redis_kills: usize,
    redis_freezes: usize,
}

/// What one chaos round recorded.
struct Run {
    grants: Vec<Grant>,
    faults: Faults,
    errors: BTreeMap<String, usize>,
    attempts: usize,
    history: History,
}

/// Runs one chaos round and returns the grants, faults and errors seen.
async fn run(store: Store) -> Run {
    let seconds = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8u64);
    let target_ops: Option<usize> = std::env::var("CHAOS_OPS").ok().and_then(|v| v.parse().ok());
    let redis_url = store.url();
    let nodes = store.nodes();
    let store = Arc::new(Mutex::new(store));
    let replicas: Vec<Arc<Mutex<Replica>>> = (0..REPLICAS)
        .map(|i| Arc::new(Mutex::new(Replica::start(&redis_url, i != 0))))
        .collect();
    let endpoints: Vec<String> = replicas
        .iter()
        .map(|r| r.lock().unwrap().endpoint())
        .collect();
    for endpoint in &endpoints {
        common::wait_for_health(
            endpoint,
            tonic_health::pb::health_check_response::ServingStatus::Serving,
        )
        .await;
    }

    let log = Log {
        grants: Arc::default(),
        history: Arc::default(),
        errors: Arc::default(),
        misset: std::env::var("CHAOS_MISSET_SETS").is_ok_and(|v| v == "1"),
    };
    let (grants, errors) = (log.grants.clone(), log.errors.clone());
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();

    // Clients: each picks a replica and a lock per operation; and one
    // observer of the multi-locks.
    let (locks, client_count) = (locks(), clients());
    let mut clients = tokio::task::JoinSet::new();
    let channels = endpoints
        .iter()
        .map(|e| Channel::from_shared(e.clone()).unwrap());
    let channels = (channels.map(|c| c.timeout(Duration::from_secs(5)).connect_lazy())).collect();
    clients.spawn(multi::observe(channels, locks, log.clone(), stop.clone()));
    for client in 0..client_count {
        let channels: Vec<Channel> = endpoints
            .iter()
            .map(|e| {
                Channel::from_shared(e.clone())
                    .unwrap()
                    .connect_timeout(Duration::from_millis(300))
                    .timeout(Duration::from_secs(5))
                    .connect_lazy()
            })
            .collect();
        let (grants, log, attempts, stop) =
            (grants.clone(), log.clone(), attempts.clone(), stop.clone());
        clients.spawn(async move {
            let holder = format!("client-{client}");
            let mut op = 0usize;
            while !stop.is_cancelled() {
                op += 1;
                let lock = (client + op) % locks;
                let what = Op::pick(client, op);
                let mut rpc = LockServiceClient::new(channels[(client + op) % REPLICAS].clone());
                attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let sent = Instant::now();
                if let Op::Multi { size } = what {
                    let set = (client, op, lock, size, locks);
                    multi::take_set(&mut rpc, set, &log).await;
                    continue;
                }
                let granted = match what {
                    Op::Term => (campaign(&mut rpc, lock, &holder).await)
                        .map(|term| term.map(|term| (term, Mode::Exclusive))),
                    _ => (acquire(&mut rpc, what.request(lock, &holder)).await)
                        .map(|grant| grant.map(|g| (g.fencing_token, what.mode(&g)))),
                };
                let granted_at = Instant::now();
                // A plain acquire may leave a grant its client never learnt
                // of (an error): the set checker needs to know.
                if what == Op::Plain {
                    log.attempt(client, vec![lock], sent, TTL_MS);
                }
                let (token, mode) = match granted {
                    Ok(Some(granted)) => granted,
                    Ok(None) => continue,
                    Err(status) => {
                        log.error(what.verbs().0, &status);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let lease_end = sent + Duration::from_millis(TTL_MS);
                // Hold briefly, then release (resign).
                tokio::time::sleep(Duration::from_millis(((client * 7 + op) % 15) as u64)).await;
                let releasing = Instant::now();
                let released = match what {
                    Op::Term => resign(&mut rpc, lock, &holder, token).await,
                    _ => release(&mut rpc, &what.name(lock), &holder, token).await,
                };
                let end = releasing.min(lease_end);
                if let Err(status) = released {
                    log.error(what.verbs().1, &status);
                    // The grant may still stand until its lease ends:
                    // let it run out before acquiring again.
                    tokio::time::sleep_until(lease_end.into()).await;
                }
                if granted_at < lease_end {
                    grants.lock().unwrap().push(Grant {
                        lock: what.index(locks, lock),
                        mode,
                        token,
                        start: granted_at,
                        end,
                        client,
                    });
                }
            }
        });
    }

    // Chaos: one fault at a time, every 300-900 ms.
    let mut faults = Faults::default();
    let started = Instant::now();
    let mut round = 0u64;
    loop {
        let done = match target_ops {
            Some(ops) => grants.lock().unwrap().len() >= ops,
            None => started.elapsed() >= Duration::from_secs(seconds),
        };
        if done {
            break;
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(300 + (round * 137) % 600)).await;
        match round % 3 {
            0 => {
                let replica = replicas[(round as usize / 3) % REPLICAS].clone();
                replica.lock().unwrap().kill();
                faults.replica_kills += 1;
                tokio::time::sleep(Duration::from_millis(200 + (round * 53) % 400)).await;
                replica.lock().unwrap().spawn();
            }
            1 => {
                let node = (round as usize / 3) % nodes;
                store.lock().unwrap().kill(node);
                faults.redis_kills += 1;
                tokio::time::sleep(Duration::from_millis(100 + (round * 31) % 300)).await;
                let store = store.clone();
                tokio::task::spawn_blocking(move || store.lock().unwrap().restart(node))
                    .await
                    .unwrap();
            }
            _ => {
                let pid = store.lock().unwrap().pid((round as usize / 3) % nodes);
                kill(pid, Signal::SIGSTOP).unwrap();
                faults.redis_freezes += 1;
                tokio::time::sleep(Duration::from_millis(200 + (round * 71) % 500)).await;
                kill(pid, Signal::SIGCONT).unwrap();
            }
        }
    }
    stop.cancel();
    while clients.join_next().await.is_some() {}
    let grants = grants.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let attempts = attempts.load(std::sync::atomic::Ordering::Relaxed);
    let history = std::mem::take(&mut *log.history.lock().unwrap());
    Run {
        grants,
        faults,
        errors,
        attempts,
        history,
    }
}

/// The findings' counts: overlaps (a writer beside a reader included),
/// readers over the limit, permits over the limit, tokens not rising.
struct Violations {
    overlaps: usize,
    over_limit: usize,
    permits_over: usize,
    drops: usize,
    /// Invariant 15: partial sets seen while whole, parts past their
    /// reservation or lease.
    sets: sets::Counts,
}

fn report(mode: &str, run: &Run) -> Violations {
    let Run {
        grants,
        faults,
        errors,
        attempts,
        history,
    } = run;
    let found = check(grants, READERS as usize, PERMITS as usize);
    let count = |m: Mode| grants.iter().filter(|g| g.mode == m).count();
    let (reads, writes) = (count(Mode::Read), count(Mode::Write));
    let weighted: Vec<u32> = (grants.iter())
        .filter_map(|g| match g.mode {
            Mode::Permits(k) => Some(k),
            _ => None,
        })
        .collect();
    let permits: u32 = weighted.iter().sum();
    // The pairs of one kind of lock: read/write, or weighted.
    let of = |pairs: &check::Pairs, kind: fn(Mode) -> bool| {
        (pairs.iter())
            .filter(|(a, b)| kind(a.mode) || kind(b.mode))
            .count()
    };
    let rw = |m: Mode| matches!(m, Mode::Read | Mode::Write);
    let weighted_kind = |m: Mode| matches!(m, Mode::Permits(_));
    let rw_overlaps = of(&found.overlaps, rw);
    let (rw_drops, weighted_drops) = (
        of(&found.token_drops, rw),
        of(&found.token_drops, weighted_kind),
    );
    println!(
        "chaos ({mode}): {attempts} acquire and campaign attempts, {} grants and terms checked on {} locks, as many elections, {RW_LOCKS} read/write locks ({reads} read and {writes} write grants, {READERS} readers at once) and {SEMAPHORES} semaphores of {PERMITS} permits ({} weighted grants, {permits} permits) by {} clients over {REPLICAS} replicas; \
         faults: {} replica SIGKILLs, {} Redis SIGKILLs, {} Redis freezes; errors seen by clients: {errors:?}; \
         overlapping grants: {} (read/write: {rw_overlaps}); readers over the limit: {}; permits over the limit: {}; tokens not rising: {} (read/write: {rw_drops}, weighted: {weighted_drops})",
        grants.len(),
        locks(),
        weighted.len(),
        clients(),
        faults.replica_kills,
        faults.redis_kills,
        faults.redis_freezes,
        found.overlaps.len(),
        found.over_limit.len(),
        found.permits_over.len(),
        found.token_drops.len()
    );
    for (a, b) in found.overlaps.iter().take(3) {
        println!("  overlap: {a:?} / {b:?}");
    }
    for (a, b) in found.token_drops.iter().take(3) {
        println!("  token not rising: {a:?} / {b:?}");
    }
    for reader in found.over_limit.iter().take(3) {
        println!("  reader over the limit: {reader:?}");
    }
    for grant in found.permits_over.iter().take(3) {
        println!("  permits over the limit: {grant:?}");
    }
    Violations {
        overlaps: found.overlaps.len(),
        over_limit: found.over_limit.len(),
        permits_over: found.permits_over.len(),
        drops: found.token_drops.len(),
        sets: sets::report(mode, history, grants),
    }
}

/// Enough grants of every kind for the run to say something.
fn assert_enough(grants: &[Grant]) {
    assert!(
        grants.len() > 50,
        "too few grants to say anything: {}",
        grants.len()
    );
    let count = |m: Mode| grants.iter().filter(|g| g.mode == m).count();
    assert!(
        count(Mode::Read) > 10 && count(Mode::Write) > 5,
        "too few read ({}) or write ({}) grants to say anything",
        count(Mode::Read),
        count(Mode::Write)
    );
    let weighted = || grants.iter().filter(|g| matches!(g.mode, Mode::Permits(_)));
    assert!(
        weighted().count() > 10 && weighted().any(|g| g.mode != Mode::Permits(1)),
        "too few weighted grants ({}) or none of more than one permit",
        weighted().count()
    );
}

/// One chaos round on `store` that must end with no overlapping grants
/// and only rising tokens, with every kind of fault injected.
async fn assert_mutual_exclusion(mode: &str, store: Store) {
    let run = run(store).await;
    let found = report(mode, &run);
    let (grants, faults) = (&run.grants, &run.faults);
    assert_enough(grants);
    let terms = (grants.iter())
        .filter(|g| (locks()..2 * locks()).contains(&g.lock))
        .count();
    assert!(
        terms > 10,
        "too few leaders' terms to say anything: {terms}"
    );
    assert!(faults.redis_kills > 0 && faults.replica_kills > 0 && faults.redis_freezes > 0);
    assert_eq!(
        found.overlaps, 0,
        "two grants of one lock (two leaders, a writer and a reader) overlapped"
    );
    assert_eq!(found.over_limit, 0, "more readers than the limit at once");
    assert_eq!(
        found.permits_over, 0,
        "the permits of valid grants summed past a semaphore's limit"
    );
    assert_eq!(found.drops, 0, "a fencing token did not rise");
    found.sets.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_redis_keeps_mutual_exclusion_through_crashes_and_freezes() {
    let redis = RedisServer::start_with_args("redis-server", DURABLE).expect("redis-server");
    assert_mutual_exclusion("durable Redis", Store::Standalone(redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_redis_cluster_keeps_mutual_exclusion_through_node_crashes_and_freezes() {
    let cluster = tokio::task::spawn_blocking(|| start_cluster_with(DURABLE))
        .await
        .unwrap();
    // The contended locks must live on more than one node, or killing the
    // others would prove little. A node answers for a key it owns and
    // redirects (MOVED) for the rest.
    let layout = tumbler_engine::keys::Layout::new("tumbler", 32);
    let owners: std::collections::BTreeSet<usize> = (0..locks())
        .map(|lock| {
            let key = layout.lock_keys("default", &format!("chaos-{lock}")).lock;
            let exists = redis::cmd("EXISTS").arg(&key).clone();
            (cluster.nodes.iter())
                .position(|node| node.try_query::<i64>(&exists).is_ok())
                .expect("some node owns the key")
        })
        .collect();
    println!("the chaos locks live on nodes {owners:?}");
    assert!(owners.len() >= 2, "the chaos locks all live on one node");
    assert_mutual_exclusion("durable Redis Cluster", Store::Cluster(cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn volatile_redis_keeps_tokens_rising_even_when_it_forgets_locks() {
    let redis = RedisServer::start_with_args("redis-server", &[]).expect("redis-server");
    let run = run(Store::Standalone(redis)).await;
    let found = report("volatile Redis", &run);
    let (grants, faults) = (&run.grants, &run.faults);
    println!(
        "  (volatile: overlaps, a writer beside readers, readers and permits over the limit are \
         allowed here, {}, {} and {} seen: a restart forgets grants; tokens must rise all the same)",
        found.overlaps, found.over_limit, found.permits_over
    );
    assert_enough(grants);
    assert!(faults.redis_kills > 0);
    // Overlaps are possible here (a restarted empty Redis forgets held
    // locks: a writer may then be granted beside readers it forgot, or
    // readers or permits past the limit); that is what the tokens are for: they never
    // go back, whatever the modes.
    assert_eq!(
        found.drops, 0,
        "a fencing token did not rise across data loss"
    );
}
