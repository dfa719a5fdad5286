//! A mutual-exclusion checker under chaos. Clients spread over three
//! `tumbler serve` processes acquire a few contended locks, and campaign
//! in as many elections, record each grant (each term) in their own log,
//! hold briefly and release (resign), while a chaos loop
//! SIGKILLs and restarts replicas, SIGKILLs and restarts Redis, and
//! freezes Redis (SIGSTOP/SIGCONT); one replica of the three hands freed
//! permits over (`--hand-over`). Afterwards a checker proves, from the
//! clients' own observations on one monotonic clock, that no two grants
//! of a lock overlapped while both leases were valid (never two leaders
//! with valid terms), and that fencing tokens per lock (terms per
//! election) strictly rose in grant order.
//!
//! Three Redis set-ups:
//! - durable (`--appendonly yes --appendfsync always`): a restart keeps
//!   every acknowledged write, so mutual exclusion must hold: 0 overlaps.
//! - a durable Redis Cluster of three masters, whose nodes are killed,
//!   restarted and frozen one at a time: 0 overlaps as well.
//! - volatile (no persistence): a restart forgets held locks, so overlaps
//!   can happen (Redis cannot keep a promise it forgot; this is the case
//!   fencing tokens exist for) — but tokens must still only rise.
//!
//! Short by default (CI); `CHAOS_SECONDS=N` runs longer, `CHAOS_OPS=N`
//! runs until N grants, `CHAOS_LOCKS` / `CHAOS_CLIENTS` change the load
//! (the long mode in the README: 100,000 grants).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proto;
use common::topology::{TestCluster, start_cluster_with};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::transport::Channel;
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;

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

/// One grant (or one term of a leader) as its client saw it.
#[derive(Clone, Debug)]
struct Grant {
    /// The lock, or `locks() + k` for election k.
    lock: usize,
    token: u64,
    /// The grant arrived.
    start: Instant,
    /// The holder stopped relying on it: when it sent its release (its
    /// critical section was over, whether or not the release got through),
    /// or when the lease ran out at the latest (its acquire was sent + ttl).
    end: Instant,
    client: usize,
}

/// A `tumbler serve` replica on a fixed port, restartable.
struct Replica {
    port: u16,
    redis_url: String,
    /// Runs with `--hand-over` (one of the three does: both paths of a
    /// contended grant share the locks).
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
            .args(self.hand_over.then_some("--hand-over"))
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

/// Runs one chaos round and returns the grants, faults and errors seen.
async fn run(store: Store) -> (Vec<Grant>, Faults, BTreeMap<String, usize>, usize) {
    let seconds = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8u64);
    let target_ops: Option<usize> = std::env::var("CHAOS_OPS").ok().and_then(|v| v.parse().ok());
    let redis_url = store.url();
    let nodes = store.nodes();
    let store = Arc::new(Mutex::new(store));
    let replicas: Vec<Arc<Mutex<Replica>>> = (0..REPLICAS)
        .map(|i| Arc::new(Mutex::new(Replica::start(&redis_url, i == 0))))
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

    let grants = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let errors = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();

    // Clients: each picks a replica and a lock per operation.
    let (locks, client_count) = (locks(), clients());
    let mut clients = tokio::task::JoinSet::new();
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
        let (grants, errors, attempts, stop) = (
            grants.clone(),
            errors.clone(),
            attempts.clone(),
            stop.clone(),
        );
        clients.spawn(async move {
            let holder = format!("client-{client}");
            let mut op = 0usize;
            while !stop.is_cancelled() {
                op += 1;
                let lock = (client + op) % locks;
                // Every third operation is a term in election `lock`.
                let election = op.is_multiple_of(3);
                let mut rpc = LockServiceClient::new(channels[(client + op) % REPLICAS].clone());
                attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let sent = Instant::now();
                let token = if election {
                    campaign(&mut rpc, lock, &holder).await
                } else {
                    acquire(&mut rpc, lock, &holder).await
                };
                let granted_at = Instant::now();
                let token = match token {
                    Ok(Some(token)) => token,
                    Ok(None) => continue,
                    Err(status) => {
                        let what = if election { "campaign" } else { "acquire" };
                        *errors
                            .lock()
                            .unwrap()
                            .entry(format!("{what} {:?}", status.code()))
                            .or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let lease_end = sent + Duration::from_millis(TTL_MS);
                // Hold briefly, then release (resign).
                tokio::time::sleep(Duration::from_millis(((client * 7 + op) % 15) as u64)).await;
                let releasing = Instant::now();
                let released = if election {
                    resign(&mut rpc, lock, &holder, token).await
                } else {
                    release(&mut rpc, lock, &holder, token).await
                };
                let end = releasing.min(lease_end);
                if let Err(status) = released {
                    let what = if election { "resign" } else { "release" };
                    *errors
                        .lock()
                        .unwrap()
                        .entry(format!("{what} {:?}", status.code()))
                        .or_default() += 1;
                    // The grant may still stand until its lease ends:
                    // let it run out before acquiring again.
                    tokio::time::sleep_until(lease_end.into()).await;
                }
                if granted_at < lease_end {
                    grants.lock().unwrap().push(Grant {
                        lock: if election { locks + lock } else { lock },
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
    (grants, faults, errors, attempts)
}

/// Acquires lock `lock`: its fencing token when granted.
async fn acquire(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    holder: &str,
) -> Result<Option<u64>, tonic::Status> {
    let reply = rpc
        .acquire(proto::AcquireRequest {
            name: format!("chaos-{lock}"),
            holder: holder.to_owned(),
            ttl_ms: Some(TTL_MS),
            wait_ms: 1_000,
            ..Default::default()
        })
        .await?
        .into_inner();
    let granted = matches!(
        reply.status(),
        proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld
    );
    Ok(reply.grant.filter(|_| granted).map(|g| g.fencing_token))
}

async fn release(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    holder: &str,
    token: u64,
) -> Result<(), tonic::Status> {
    rpc.release(proto::ReleaseRequest {
        name: format!("chaos-{lock}"),
        holder: holder.to_owned(),
        fencing_token: Some(token),
        ..Default::default()
    })
    .await
    .map(|_| ())
}

/// Campaigns in election `lock`: the term when elected.
async fn campaign(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    candidate: &str,
) -> Result<Option<u64>, tonic::Status> {
    let reply = rpc
        .campaign(proto::CampaignRequest {
            name: format!("chaos-election-{lock}"),
            candidate: candidate.to_owned(),
            value: candidate.to_owned(),
            ttl_ms: Some(TTL_MS),
            wait_ms: Some(1_000),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(reply
        .leader
        .filter(|_| reply.elected)
        .map(|leader| leader.term))
}

async fn resign(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    candidate: &str,
    term: u64,
) -> Result<(), tonic::Status> {
    rpc.resign(proto::ResignRequest {
        name: format!("chaos-election-{lock}"),
        candidate: candidate.to_owned(),
        term,
        ..Default::default()
    })
    .await
    .map(|_| ())
}

/// Pairs of grants of one lock that break a rule.
type Pairs = Vec<(Grant, Grant)>;

/// Overlapping grants of one lock, and grants whose token did not rise.
fn check(grants: &[Grant]) -> (Pairs, Pairs) {
    let mut by_lock: HashMap<usize, Vec<&Grant>> = HashMap::new();
    for grant in grants {
        by_lock.entry(grant.lock).or_default().push(grant);
    }
    let mut overlaps = Vec::new();
    let mut token_drops = Vec::new();
    for list in by_lock.values_mut() {
        list.sort_by_key(|g| g.start);
        let mut latest: Option<&Grant> = None;
        for pair in list.windows(2) {
            // The same token twice is one grant seen twice (its holder
            // acquired again while it stood: ALREADY_HELD).
            let same_grant = pair[1].token == pair[0].token && pair[1].client == pair[0].client;
            if pair[1].token <= pair[0].token && !same_grant {
                token_drops.push((pair[0].clone(), pair[1].clone()));
            }
        }
        for grant in list.iter() {
            if let Some(previous) = latest
                && grant.start < previous.end
            {
                overlaps.push((previous.clone(), (*grant).clone()));
            }
            if latest.is_none_or(|l| grant.end > l.end) {
                latest = Some(grant);
            }
        }
    }
    (overlaps, token_drops)
}

fn report(
    mode: &str,
    grants: &[Grant],
    faults: &Faults,
    errors: &BTreeMap<String, usize>,
    attempts: usize,
) -> (usize, usize) {
    let (overlaps, drops) = check(grants);
    println!(
        "chaos ({mode}): {attempts} acquire and campaign attempts, {} grants and terms checked on {} locks and as many elections by {} clients over {REPLICAS} replicas; \
         faults: {} replica SIGKILLs, {} Redis SIGKILLs, {} Redis freezes; errors seen by clients: {errors:?}; \
         overlapping grants: {}; tokens not rising: {}",
        grants.len(),
        locks(),
        clients(),
        faults.replica_kills,
        faults.redis_kills,
        faults.redis_freezes,
        overlaps.len(),
        drops.len()
    );
    for (a, b) in overlaps.iter().take(3) {
        println!("  overlap: {a:?} / {b:?}");
    }
    (overlaps.len(), drops.len())
}

/// One chaos round on `store` that must end with no overlapping grants
/// and only rising tokens, with every kind of fault injected.
async fn assert_mutual_exclusion(mode: &str, store: Store) {
    let (grants, faults, errors, attempts) = run(store).await;
    let (overlaps, drops) = report(mode, &grants, &faults, &errors, attempts);
    assert!(
        grants.len() > 50,
        "too few grants to say anything: {}",
        grants.len()
    );
    let terms = grants.iter().filter(|g| g.lock >= locks()).count();
    assert!(
        terms > 10,
        "too few leaders' terms to say anything: {terms}"
    );
    assert!(faults.redis_kills > 0 && faults.replica_kills > 0 && faults.redis_freezes > 0);
    assert_eq!(
        overlaps, 0,
        "two grants of one lock (two leaders) overlapped"
    );
    assert_eq!(drops, 0, "a fencing token did not rise");
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
    let layout = tumbler::engine::keys::Layout::new("tumbler", 32);
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
    let (grants, faults, errors, attempts) = run(Store::Standalone(redis)).await;
    let (_overlaps, drops) = report("volatile Redis", &grants, &faults, &errors, attempts);
    assert!(
        grants.len() > 50,
        "too few grants to say anything: {}",
        grants.len()
    );
    assert!(faults.redis_kills > 0);
    // Overlaps are possible here (a restarted empty Redis forgets held
    // locks); that is what the tokens are for: they never go back.
    assert_eq!(drops, 0, "a fencing token did not rise across data loss");
}

#[test]
fn the_checker_finds_overlaps_and_falling_tokens() {
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let grant = |lock, token, start, end| Grant {
        lock,
        token,
        start: at(start),
        end: at(end),
        client: 0,
    };
    let clean = [grant(0, 1, 0, 10), grant(0, 2, 10, 20), grant(1, 1, 5, 15)];
    assert_eq!(check(&clean).0.len() + check(&clean).1.len(), 0);
    let overlapping = [grant(0, 1, 0, 10), grant(0, 2, 9, 20)];
    assert_eq!(check(&overlapping).0.len(), 1);
    // Overlap with an earlier, longer grant, not just the previous one.
    let nested = [grant(0, 1, 0, 30), grant(0, 2, 10, 12), grant(0, 3, 20, 25)];
    assert_eq!(check(&nested).0.len(), 2);
    let falling = [grant(0, 5, 0, 10), grant(0, 4, 10, 20)];
    assert_eq!(check(&falling).1.len(), 1);
}
