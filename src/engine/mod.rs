//! The lock engine: every lock operation as one Lua script on one shard,
//! with typed inputs and outcomes, plus server-side waiting (see
//! [`waiters`]). The gRPC layer validates requests and maps outcomes to
//! replies; the semantics (who gets a permit, queue order, fencing, expiry,
//! cleanup) live here and in `lua/`.

pub mod keys;
pub mod scripts;
pub mod sessions;
pub mod waiters;
pub mod watchers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{Store, StoreError};
use keys::{LAYOUT_VERSION, Layout, LockKeys};
use scripts::Scripts;
use sessions::{LostGrant, Renewal, Sessions};
use waiters::{RegisterError, Waiters};

/// A lock, named within a namespace. Both are already validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockId {
    pub namespace: String,
    pub name: String,
}

/// One permit of a lock, as stored in its grant record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub holder: String,
    pub fencing_token: u64,
    pub slot: u32,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
    pub ttl_ms: u64,
    pub kind: String,
    pub metadata: BTreeMap<String, String>,
}

/// A validated acquire request.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub lock: LockId,
    pub holder: String,
    pub limit: u32,
    pub ttl_ms: u64,
    pub kind: String,
    pub metadata: BTreeMap<String, String>,
    /// How long to wait for a permit; zero tries once.
    pub wait: Duration,
    /// How long a waiting request lives in Redis without a refresh.
    pub queue_ttl_ms: u64,
    /// Higher goes first; FIFO within a priority.
    pub priority: i32,
    /// Fair requests take their turn in the queue; barging ones take any
    /// free permit.
    pub fair: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// A new grant; `holders` counts live holders including it.
    Acquired { grant: Grant, holders: u32 },
    /// The holder already held a live grant: that grant, unchanged.
    AlreadyHeld { grant: Grant, holders: u32 },
    /// Tried once: every permit is taken (or the queue goes first).
    Busy {
        holders: u32,
        next_expiry_at_ms: i64,
    },
    /// Waited until the wait ended; `position` was its place in the queue.
    TimedOut {
        holders: u32,
        next_expiry_at_ms: i64,
        position: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The grant is gone; it was held this long (Redis clock).
    Released {
        kind: String,
        held_ms: i64,
    },
    NotHeld,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    Extended(Grant),
    NotHeld,
}

/// What Inspect sees of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    pub now_ms: i64,
    pub limit: u32,
    pub waiters: u32,
    /// Live holders, by slot.
    pub holders: Vec<Grant>,
}

/// One live waiting request, as the Queue RPC shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedRequest {
    pub holder: String,
    pub position: u32,
    pub priority: i32,
    pub enqueued_at_ms: i64,
    /// When the request is dropped unless its replica refreshes it.
    pub expires_at_ms: i64,
    /// When its RPC stops waiting.
    pub wait_deadline_ms: i64,
    pub fair: bool,
    pub kind: String,
}

/// What the Queue RPC sees of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueState {
    pub now_ms: i64,
    pub waiters: u32,
    pub requests: Vec<QueuedRequest>,
}

/// One lock in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSummary {
    pub name: String,
    pub holders: u32,
    pub limit: u32,
    pub waiters: u32,
    pub next_expiry_at_ms: i64,
}

/// One lock as list.lua returns it: name, holders, limit, waiters, next expiry.
type ListedLock = (String, u32, u32, u32, i64);

/// Where a listing goes on: a shard and the last name visited in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListCursor {
    pub shard: u32,
    pub after: String,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPage {
    pub locks: Vec<LockSummary>,
    /// None when the listing is complete.
    pub next: Option<ListCursor>,
    pub now_ms: i64,
}

/// What a reap removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReapCounts {
    pub expired_holders: u64,
    pub dead_waiters: u64,
    pub stale_index_entries: u64,
    pub old_grants: u64,
    pub old_waiters: u64,
    pub locks_visited: u64,
}

impl ReapCounts {
    fn add(&mut self, other: &ReapCounts) {
        self.expired_holders += other.expired_holders;
        self.dead_waiters += other.dead_waiters;
        self.stale_index_entries += other.stale_index_entries;
        self.old_grants += other.old_grants;
        self.old_waiters += other.old_waiters;
        self.locks_visited += other.locks_visited;
    }

    /// Anything removed at all.
    pub fn removed_any(&self) -> bool {
        self.expired_holders
            + self.dead_waiters
            + self.stale_index_entries
            + self.old_grants
            + self.old_waiters
            > 0
    }
}

/// What a clear removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClearCounts {
    pub locks: u64,
    pub grants: u64,
    pub requests: u64,
}

/// Locks one shard-walking script call visits at most: bounds how long
/// Redis is busy with one call.
const SHARD_BATCH: u32 = 100;
/// Script calls one List RPC makes at most (then it returns a page token).
const LIST_CALLS: usize = 64;
/// How often a replica re-records a namespace it serves as in use.
const NAMESPACE_NOTE_EVERY: Duration = Duration::from_secs(60);
/// How long an unused namespace stays in the registry.
const NAMESPACE_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// The events counted per minute and kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub acquired: u64,
    pub denied: u64,
    pub timed_out: u64,
    pub released: u64,
    pub extended: u64,
    pub expired: u64,
    pub reaped: u64,
    pub errors: u64,
}

impl Counters {
    fn add_event(&mut self, event: &str, n: u64) {
        let slot = match event {
            "acquired" => &mut self.acquired,
            "denied" => &mut self.denied,
            "timed_out" => &mut self.timed_out,
            "released" => &mut self.released,
            "extended" => &mut self.extended,
            "expired" => &mut self.expired,
            "reaped" => &mut self.reaped,
            "errors" => &mut self.errors,
            _ => return,
        };
        *slot += n;
    }

    /// Adds another row's counts to these.
    pub fn add(&mut self, other: &Counters) {
        self.acquired += other.acquired;
        self.denied += other.denied;
        self.timed_out += other.timed_out;
        self.released += other.released;
        self.extended += other.extended;
        self.expired += other.expired;
        self.reaped += other.reaped;
        self.errors += other.errors;
    }
}

/// One kind's counters over one minute (or, in totals, over the range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsRow {
    pub minute_ms: i64,
    pub kind: String,
    pub counters: Counters,
}

/// What the Metrics RPC reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsReport {
    pub minutes: Vec<MetricsRow>,
    pub totals: Vec<MetricsRow>,
    /// Every kind together over the range (kind `*`).
    pub overall: MetricsRow,
}

const MINUTE_MS: i64 = 60_000;
/// How long per-minute counters are kept (METRICS_RETENTION_MS in Lua).
pub const METRICS_RETENTION_MS: i64 = 24 * 3600 * 1000;

/// The tumbler lock that makes one replica at a time the reaper.
pub const REAPER_NAMESPACE: &str = "tumbler-system";
pub const REAPER_LOCK: &str = "reaper";

/// Why an engine call failed. Not getting a lock is not a failure.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the queue of this lock is full ({0} waiting requests)")]
    QueueFull(u32),
    #[error("this replica already holds {0} waiting requests")]
    TooManyWaiters(usize),
    #[error("this namespace already has {0} waiting requests on this replica")]
    TooManyInNamespace(usize),
    #[error("this namespace has reached its lock limit")]
    NamespaceFull,
    #[error("this replica is shutting down; retry on another")]
    ShuttingDown,
}

impl From<RegisterError> for EngineError {
    fn from(err: RegisterError) -> Self {
        match err {
            RegisterError::TooManyWaiters(max) => EngineError::TooManyWaiters(max),
            RegisterError::TooManyInNamespace(max) => EngineError::TooManyInNamespace(max),
            RegisterError::ShuttingDown => EngineError::ShuttingDown,
        }
    }
}

/// Bounds on waiting.
#[derive(Clone, Debug)]
pub struct WaitLimits {
    /// Waiting requests one lock's queue may hold (all replicas together).
    pub max_waiters_per_lock: u32,
    /// Waiting RPCs one replica may hold open.
    pub max_waiters_per_replica: usize,
    /// Waiting RPCs one namespace may hold open on one replica.
    pub max_waiters_per_namespace: usize,
    /// Locks one namespace may have in one shard (0: no limit).
    pub max_locks_per_shard: u64,
    /// How long a dead session's grants stay held; None releases them.
    pub session_lock_delay_ms: Option<u64>,
}

/// The lock engine. Shared by all handlers; cheap to use concurrently.
pub struct LockEngine {
    store: Store,
    layout: Layout,
    scripts: Scripts,
    waiters: Arc<Waiters>,
    watchers: Arc<watchers::Watchers>,
    sessions: Sessions,
    wake_channel: String,
    max_waiters_per_lock: String,
    /// Locks a namespace may have per shard ('0': no limit), as the
    /// acquire script's argument.
    max_locks_per_shard: String,
    /// How long a dead session's grants stay held (None: released at once).
    session_lock_delay_ms: Option<u64>,
    /// Set once the data in Redis is known to use this deployment's layout;
    /// until then every operation answers UNAVAILABLE.
    layout_verified: AtomicBool,
    /// Errors counted here (Redis could not take them when they happened),
    /// by namespace and kind, until the flusher writes them.
    pending_errors: std::sync::Mutex<BTreeMap<(String, String), u64>>,
    /// Namespaces this replica recorded as in use, and when.
    noted_namespaces: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// Why the layout recorded in Redis cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "redis holds tumbler data written with {found}; this server is configured for {expected} (the shard count of a deployment cannot change)"
    )]
    Mismatch { found: String, expected: String },
}

/// What one acquire script call answered.
struct Attempt {
    status: i64,
    record: String,
    expires_at: i64,
    holders: u32,
    next_expiry: i64,
    position: u32,
    now: i64,
}

impl LockEngine {
    pub fn new(store: Store, layout: Layout, limits: WaitLimits) -> Self {
        LockEngine {
            wake_channel: layout.wake_channel(),
            waiters: Waiters::new(
                limits.max_waiters_per_replica,
                limits.max_waiters_per_namespace,
            ),
            max_locks_per_shard: limits.max_locks_per_shard.to_string(),
            sessions: Sessions::default(),
            watchers: watchers::Watchers::new(),
            max_waiters_per_lock: limits.max_waiters_per_lock.to_string(),
            session_lock_delay_ms: limits.session_lock_delay_ms,
            store,
            layout,
            scripts: Scripts::new(),
            layout_verified: AtomicBool::new(false),
            noted_namespaces: Default::default(),
            pending_errors: Default::default(),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    pub fn watchers(&self) -> &Arc<watchers::Watchers> {
        &self.watchers
    }

    /// Records this deployment's layout in Redis, or checks the one already
    /// there: the shard count is fixed per deployment, since moving it
    /// would move every lock to another shard.
    pub async fn verify_layout(&self) -> Result<(), LayoutError> {
        let meta = self.layout.meta_key();
        let expected = format!("v{LAYOUT_VERSION}/{} shards", self.layout.shards());
        let mut write = redis::cmd("HSETNX");
        write.arg(&meta).arg("layout").arg(&expected);
        let _: i64 = self.store.command(write).await?;
        let mut read = redis::cmd("HGET");
        read.arg(&meta).arg("layout");
        let found: String = self.store.command(read).await?;
        if found != expected {
            return Err(LayoutError::Mismatch { found, expected });
        }
        self.layout_verified.store(true, Ordering::Release);
        Ok(())
    }

    pub fn is_layout_verified(&self) -> bool {
        self.layout_verified.load(Ordering::Acquire)
    }

    fn ready(&self) -> Result<(), StoreError> {
        if self.is_layout_verified() {
            Ok(())
        } else {
            Err(StoreError::Unavailable(
                "the redis key layout is not verified yet".into(),
            ))
        }
    }

    /// Runs one operation script on a lock's keys: the lock name and the
    /// wake channel go first, then the operation's own arguments.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &scripts::LockScript,
        lock: &LockId,
        keys: &LockKeys,
        args: &[&str],
    ) -> Result<T, StoreError> {
        let all_args = self.lock_script_args(lock, args);
        self.store
            .run_script(script, &keys.as_script_keys(), &all_args)
            .await
    }

    /// A lock script's arguments: the lock name and the wake channel, then
    /// the operation's own.
    fn lock_script_args<'a>(&'a self, lock: &'a LockId, args: &[&'a str]) -> Vec<&'a str> {
        let mut all_args = Vec::with_capacity(args.len() + 2);
        all_args.push(lock.name.as_str());
        all_args.push(self.wake_channel.as_str());
        all_args.extend_from_slice(args);
        all_args
    }

    /// [`Self::run`] for a script that may grant (acquire, extend): with
    /// `--min-replicas-acked`, a grant is answered only once enough
    /// replicas acknowledged it. `granted` lists the statuses (the reply's
    /// first element) that are grants.
    async fn run_granting<T: redis::FromRedisValue>(
        &self,
        script: &scripts::LockScript,
        lock: &LockId,
        keys: &LockKeys,
        args: &[&str],
        granted: &'static [i64],
    ) -> Result<T, StoreError> {
        let all_args = self.lock_script_args(lock, args);
        self.store
            .run_granting_script(script, &keys.as_script_keys(), &all_args, |reply| {
                matches!(reply, redis::Value::Array(items)
                    if matches!(items.first(), Some(redis::Value::Int(status)) if granted.contains(status)))
            })
            .await
    }

    /// The limits an acquire attempt ran into, as errors.
    fn refused(&self, attempt: &Attempt) -> Result<(), EngineError> {
        match attempt.status {
            -1 => Err(EngineError::QueueFull(
                self.max_waiters_per_lock.parse().unwrap_or(u32::MAX),
            )),
            -2 => Err(EngineError::NamespaceFull),
            _ => Ok(()),
        }
    }

    async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &LockKeys,
        metadata: &str,
        wait_left: Option<Duration>,
    ) -> Result<Attempt, StoreError> {
        let wait_left_ms = wait_left.map_or(0, |d| d.as_millis().max(1) as u64);
        let (status, record, expires_at, holders, next_expiry, position, now) = self
            .run_granting(
                &self.scripts.acquire,
                &req.lock,
                keys,
                &[
                    &req.holder,
                    &req.limit.to_string(),
                    &req.ttl_ms.to_string(),
                    &req.kind,
                    metadata,
                    if wait_left.is_some() { "wait" } else { "try" },
                    if req.fair { "1" } else { "0" },
                    &req.priority.to_string(),
                    &req.queue_ttl_ms.to_string(),
                    &wait_left_ms.to_string(),
                    &self.max_waiters_per_lock,
                    &self.max_locks_per_shard,
                ],
                // Acquired, and already held (a retry after UNAVAILABLE
                // must not count on a grant the replicas lack either).
                &[1, 2],
            )
            .await?;
        Ok(Attempt {
            status,
            record,
            expires_at,
            holders,
            next_expiry,
            position,
            now,
        })
    }

    /// Takes a permit, trying once or waiting in this server (in the
    /// lock's queue) until granted or `req.wait` has passed.
    pub async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&req.lock.namespace, &req.lock.name);
        let metadata = serde_json::to_string(&req.metadata)
            .map_err(|e| StoreError::Protocol(format!("metadata encoding: {e}")))?;
        self.note_namespace(&req.lock.namespace).await?;
        if req.wait.is_zero() {
            let attempt = self.attempt(req, &keys, &metadata, None).await?;
            self.refused(&attempt)?;
            return match granted(req, &attempt)? {
                Some(outcome) => Ok(outcome),
                None => Ok(AcquireOutcome::Busy {
                    holders: attempt.holders,
                    next_expiry_at_ms: attempt.next_expiry,
                }),
            };
        }
        self.acquire_waiting(req, &keys, &metadata).await
    }

    async fn acquire_waiting(
        self: &Arc<Self>,
        req: &AcquireRequest,
        keys: &LockKeys,
        metadata: &str,
    ) -> Result<AcquireOutcome, EngineError> {
        let deadline = Instant::now() + req.wait;
        // Registered before the first script call: no wake-up is missed.
        let registration = self.waiters.register(
            &req.lock.namespace,
            keys,
            &req.lock.name,
            &req.holder,
            req.queue_ttl_ms,
            req.fair,
        )?;
        // Leaves the queue if this future is dropped (client cancelled,
        // deadline passed) or fails while queued.
        let mut queued = QueuedGuard {
            engine: self.clone(),
            lock: req.lock.clone(),
            keys: keys.clone(),
            holder: req.holder.clone(),
            armed: false,
        };
        loop {
            let wait_left = deadline.saturating_duration_since(Instant::now());
            let attempt = self.attempt(req, keys, metadata, Some(wait_left)).await?;
            if let Some(outcome) = granted(req, &attempt)? {
                queued.armed = false;
                return Ok(outcome);
            }
            self.refused(&attempt)?;
            queued.armed = true;
            // At the head, also wake when the first lease runs out, so an
            // expiry hands over without a release. (Only the head can be
            // granted; it wakes the next one while permits remain.)
            let expiry = (attempt.next_expiry > 0 && attempt.position == 1).then(|| {
                Instant::now()
                    + Duration::from_millis((attempt.next_expiry - attempt.now).max(0) as u64 + 1)
            });
            tokio::select! {
                () = registration.notified() => {}
                () = sleep_until_some(expiry) => {}
                () = tokio::time::sleep_until(deadline) => {
                    queued.armed = false;
                    let position = self
                        .dequeue(&req.lock, keys, &req.holder, Dequeue::TimedOut)
                        .await?;
                    return Ok(AcquireOutcome::TimedOut {
                        holders: attempt.holders,
                        next_expiry_at_ms: attempt.next_expiry,
                        position: if position > 0 { position } else { attempt.position },
                    });
                }
                () = self.waiters.shutdown_token().cancelled() => {
                    // Leave the queue before answering, while the replica
                    // still runs (a spawned clean-up might never run).
                    queued.armed = false;
                    let _ = self
                        .dequeue(&req.lock, keys, &req.holder, Dequeue::Cancelled)
                        .await;
                    return Err(EngineError::ShuttingDown);
                }
            }
        }
    }

    /// Takes a waiting request out of the queue; returns the position it
    /// had (0 when it was not queued).
    async fn dequeue(
        &self,
        lock: &LockId,
        keys: &LockKeys,
        holder: &str,
        why: Dequeue,
    ) -> Result<u32, StoreError> {
        let why = match why {
            Dequeue::TimedOut => "timeout",
            Dequeue::Cancelled => "cancel",
        };
        self.run(&self.scripts.dequeue, lock, keys, &[holder, why])
            .await
    }

    /// Renews this replica's requests on one lock; returns the ids whose
    /// place was lost meanwhile.
    async fn refresh(&self, batch: &waiters::RefreshBatch) -> Result<Vec<String>, StoreError> {
        let lock = LockId {
            namespace: String::new(),
            name: batch.name.clone(),
        };
        let ttls: Vec<String> = batch
            .requests
            .iter()
            .map(|(_, ttl)| ttl.to_string())
            .collect();
        let mut args = Vec::with_capacity(batch.requests.len() * 2);
        for ((id, _), ttl) in batch.requests.iter().zip(&ttls) {
            args.push(id.as_str());
            args.push(ttl.as_str());
        }
        self.run(&self.scripts.refresh, &lock, &batch.keys, &args)
            .await
    }

    /// Keeps this replica's waiting requests alive until shutdown: per
    /// lock, one script call every queue_ttl/3.
    pub async fn run_refresher(self: Arc<Self>) {
        let shutdown = self.waiters.shutdown_token().clone();
        loop {
            let (due, next) = self.waiters.take_due(Instant::now());
            let mut calls = tokio::task::JoinSet::new();
            for batch in due {
                let engine = self.clone();
                calls.spawn(async move {
                    match engine.refresh(&batch).await {
                        Ok(lost) if !lost.is_empty() => {
                            // Their place is gone: let them queue again.
                            let lost: Vec<&str> = lost.iter().map(String::as_str).collect();
                            engine.waiters.wake(&batch.keys.queue, &lost);
                        }
                        Ok(_) => {}
                        Err(err) => tracing::warn!(error = %err, lock = %batch.name, "refreshing waiters failed"),
                    }
                });
            }
            let next = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(next) => {}
                () = self.waiters.refresh_changed() => {}
            }
            while calls.join_next().await.is_some() {}
        }
    }

    /// Records (at most once a minute per replica) that a namespace is in
    /// use, so the reaper knows which namespaces to walk without KEYS.
    async fn note_namespace(&self, namespace: &str) -> Result<(), StoreError> {
        let now = std::time::Instant::now();
        let due = {
            let noted = self.noted_namespaces.lock().unwrap();
            noted
                .get(namespace)
                .is_none_or(|at| now.duration_since(*at) >= NAMESPACE_NOTE_EVERY)
        };
        if !due {
            return Ok(());
        }
        let key = self.layout.namespaces_key();
        let now_ms = unix_ms();
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(&key)
            .arg(now_ms)
            .arg(namespace)
            .ignore();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now_ms - NAMESPACE_RETENTION_MS)
            .ignore();
        pipe.cmd("PEXPIRE")
            .arg(&key)
            .arg(NAMESPACE_RETENTION_MS)
            .ignore();
        self.store.pipeline::<()>(pipe).await?;
        self.noted_namespaces
            .lock()
            .unwrap()
            .insert(namespace.to_owned(), now);
        Ok(())
    }

    /// The namespaces in use (recorded by the replicas that served them).
    pub async fn namespaces(&self) -> Result<Vec<String>, EngineError> {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(self.layout.namespaces_key()).arg(0).arg(-1);
        Ok(self.store.command(cmd).await?)
    }

    /// Runs one shard-walking script (list, reap, clear) on a shard.
    async fn run_on_shard<T: redis::FromRedisValue>(
        &self,
        script: &scripts::LockScript,
        shard: &keys::ShardKeys,
        args: &[&str],
    ) -> Result<T, StoreError> {
        let mut all_args = Vec::with_capacity(args.len() + 3);
        all_args.extend_from_slice(&["", self.wake_channel.as_str(), shard.prefix.as_str()]);
        all_args.extend_from_slice(args);
        self.store
            .run_script(script, &shard.as_script_keys(), &all_args)
            .await
    }

    /// One page of a namespace's locks (name order within each shard, one
    /// shard after another), filtered by name prefix and by having waiters.
    pub async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        page_size: u32,
        from: Option<ListCursor>,
        only_waiting: bool,
    ) -> Result<ListPage, EngineError> {
        self.ready()?;
        let ListCursor {
            mut shard,
            mut after,
        } = from.unwrap_or(ListCursor {
            shard: 0,
            after: String::new(),
        });
        let mut locks = Vec::new();
        let mut now_ms = 0;
        let mut calls = 0;
        let only_waiting = if only_waiting { "1" } else { "0" };
        while shard < self.layout.shards() && locks.len() < page_size as usize && calls < LIST_CALLS
        {
            calls += 1;
            let want = (page_size as usize - locks.len()).min(SHARD_BATCH as usize);
            let keys = self.layout.shard_keys(namespace, shard);
            let (now, last, found): (i64, String, Vec<ListedLock>) = self
                .run_on_shard(
                    &self.scripts.list,
                    &keys,
                    &[&after, prefix, &want.to_string(), only_waiting],
                )
                .await?;
            now_ms = now;
            locks.extend(found.into_iter().map(
                |(name, holders, limit, waiters, next_expiry_at_ms)| LockSummary {
                    name,
                    holders,
                    limit,
                    waiters,
                    next_expiry_at_ms,
                },
            ));
            if last.is_empty() {
                shard += 1;
                after.clear();
            } else {
                after = last;
            }
        }
        let next = (shard < self.layout.shards()).then_some(ListCursor { shard, after });
        Ok(ListPage {
            locks,
            next,
            now_ms,
        })
    }

    /// Cleans up every shard of a namespace now, in batches (see
    /// lua/reap.lua); with `older_than_ms` also drops old grants and requests.
    pub async fn reap(
        &self,
        namespace: &str,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError> {
        self.ready()?;
        let older_than = older_than_ms.map(|ms| ms.to_string()).unwrap_or_default();
        let batch = SHARD_BATCH.to_string();
        let mut total = ReapCounts::default();
        for shard in 0..self.layout.shards() {
            let keys = self.layout.shard_keys(namespace, shard);
            let mut after = String::new();
            loop {
                let (expired, dead, stale, old_grants, old_waiters, visited, last): (
                    u64,
                    u64,
                    u64,
                    u64,
                    u64,
                    u64,
                    String,
                ) = self
                    .run_on_shard(&self.scripts.reap, &keys, &[&batch, &older_than, &after])
                    .await?;
                total.add(&ReapCounts {
                    expired_holders: expired,
                    dead_waiters: dead,
                    stale_index_entries: stale,
                    old_grants,
                    old_waiters,
                    locks_visited: visited,
                });
                if last.is_empty() {
                    break;
                }
                after = last;
            }
        }
        Ok(total)
    }

    /// Releases every lock and drops every queue of a namespace, in batches.
    pub async fn clear(&self, namespace: &str) -> Result<ClearCounts, EngineError> {
        self.ready()?;
        let batch = SHARD_BATCH.to_string();
        let mut total = ClearCounts::default();
        for shard in 0..self.layout.shards() {
            let keys = self.layout.shard_keys(namespace, shard);
            loop {
                let (locks, grants, requests, more): (u64, u64, u64, i64) = self
                    .run_on_shard(&self.scripts.clear, &keys, &[&batch])
                    .await?;
                total.locks += locks;
                total.grants += grants;
                total.requests += requests;
                if more == 0 {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// Acquires for a session: the holder is the session id, the lease the
    /// session TTL, and a grant is renewed by this replica from now on
    /// (lost grants are reported on `lost`).
    pub async fn session_acquire(
        self: &Arc<Self>,
        session: &str,
        req: &AcquireRequest,
        lost: &tokio::sync::mpsc::Sender<LostGrant>,
    ) -> Result<AcquireOutcome, EngineError> {
        let outcome = self.acquire(req).await?;
        if let AcquireOutcome::Acquired { grant, .. } | AcquireOutcome::AlreadyHeld { grant, .. } =
            &outcome
        {
            // The lease started no later than now: renewing from now on is
            // safe (early, never late).
            self.sessions.add(
                session,
                &req.lock,
                grant.fencing_token,
                Duration::from_millis(req.ttl_ms),
                Instant::now(),
                lost.clone(),
            );
        }
        Ok(outcome)
    }

    /// Releases one grant of a session and stops renewing it.
    pub async fn session_release(
        &self,
        session: &str,
        lock: &LockId,
    ) -> Result<ReleaseOutcome, EngineError> {
        let token = self.sessions.remove(session, lock);
        self.release(lock, session, token).await
    }

    /// A session ended: release every grant it holds, at once (and so wake
    /// their waiters). With a lock-delay, a session that died (rather than
    /// being closed) leaves its grants held for that delay instead, so a
    /// partitioned old holder cannot overlap with the next one. Grants that
    /// cannot be released now (Redis trouble) expire at their short lease.
    /// Returns how many grants the session had.
    pub async fn end_session(&self, session: &str, died: bool) -> usize {
        let grants = self.sessions.end(session);
        let count = grants.len();
        let delay = self.session_lock_delay_ms.filter(|_| died);
        let endings = grants.iter().map(|(lock, token)| async move {
            match delay {
                Some(delay_ms) => self
                    .extend(lock, session, Some(delay_ms), Some(*token))
                    .await
                    .map(|_| ()),
                None => self.release(lock, session, Some(*token)).await.map(|_| ()),
            }
        });
        for outcome in futures::future::join_all(endings).await {
            if let Err(err) = outcome {
                tracing::warn!(%session, error = %err, "a session grant could not be released; it expires at its lease");
            }
        }
        count
    }

    /// Keeps this replica's session grants alive: one `renew.lua` call per
    /// shard for every batch of due grants, until shutdown.
    pub async fn run_session_renewer(self: Arc<Self>) {
        const BATCH: usize = 250;
        let shutdown = self.waiters.shutdown_token().clone();
        // Renewals in flight, across rounds: a finished one wakes the loop
        // so its grant's next renewal is scheduled at once.
        let mut calls = tokio::task::JoinSet::new();
        loop {
            let now = Instant::now();
            self.sessions.expire_overdue(now);
            let (due, next) = self.sessions.take_due(now);
            let mut by_shard: BTreeMap<(String, u32), Vec<Renewal>> = BTreeMap::new();
            for renewal in due {
                let shard = self
                    .layout
                    .shard_of(&renewal.key.namespace, &renewal.key.name);
                by_shard
                    .entry((renewal.key.namespace.clone(), shard))
                    .or_default()
                    .push(renewal);
            }
            for ((namespace, shard), renewals) in by_shard {
                for batch in renewals.chunks(BATCH) {
                    let engine = self.clone();
                    let keys = self.layout.shard_keys(&namespace, shard);
                    let batch = batch.to_vec();
                    calls.spawn(async move { engine.renew(&keys, &batch).await });
                }
            }
            let wake_at = next.map_or(now + Duration::from_secs(1), |n| {
                n.min(now + Duration::from_secs(1))
            });
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(wake_at) => {}
                () = self.sessions.changed() => {}
                Some(_) = calls.join_next(), if !calls.is_empty() => {}
            }
        }
    }

    /// Renews one batch of session grants of one shard.
    async fn renew(&self, keys: &keys::ShardKeys, batch: &[Renewal]) {
        let sent_at = Instant::now();
        let fields: Vec<[String; 4]> = batch
            .iter()
            .map(|r| {
                [
                    r.key.name.clone(),
                    r.key.session.clone(),
                    r.token.to_string(),
                    (r.ttl.as_millis() as u64).to_string(),
                ]
            })
            .collect();
        let args: Vec<&str> = fields.iter().flatten().map(String::as_str).collect();
        match self
            .run_on_shard::<Vec<usize>>(&self.scripts.renew, keys, &args)
            .await
        {
            Ok(lost) => {
                for (i, renewal) in batch.iter().enumerate() {
                    if lost.contains(&(i + 1)) {
                        self.sessions.lost(&renewal.key);
                    } else {
                        self.sessions.renewed(&renewal.key, sent_at);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, grants = batch.len(), "renewing session grants failed");
                let now = Instant::now();
                for renewal in batch {
                    self.sessions.failed(&renewal.key, now);
                }
            }
        }
    }

    /// The background reaper: every `interval`, the replica that holds the
    /// tumbler lock `tumbler-system/reaper` reaps every namespace in use.
    /// Its lease is three intervals long and renewed each round, so when
    /// that replica dies another one takes over within three intervals; a
    /// replica shutting down releases it at once.
    pub async fn run_reaper(self: Arc<Self>, interval: Duration, replica: String) {
        let lock = LockId {
            namespace: REAPER_NAMESPACE.into(),
            name: REAPER_LOCK.into(),
        };
        let lease_ms = (interval.as_millis() as u64).saturating_mul(3).max(1);
        let shutdown = self.waiters.shutdown_token().clone();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            if !self.is_layout_verified() {
                continue;
            }
            match self.take_reaper_lease(&lock, &replica, lease_ms).await {
                Ok(true) => self.reap_everything().await,
                Ok(false) => {}
                Err(err) => tracing::debug!(error = %err, "reaper lease unavailable"),
            }
        }
        if let Err(err) = self.release(&lock, &replica, None).await {
            tracing::debug!(error = %err, "could not hand the reaper lease over");
        }
    }

    /// Takes or renews the reaper lease; true while this replica holds it.
    async fn take_reaper_lease(
        &self,
        lock: &LockId,
        replica: &str,
        lease_ms: u64,
    ) -> Result<bool, EngineError> {
        let request = AcquireRequest {
            lock: lock.clone(),
            holder: replica.to_owned(),
            limit: 1,
            ttl_ms: lease_ms,
            kind: "reaper".into(),
            metadata: BTreeMap::new(),
            wait: Duration::ZERO,
            queue_ttl_ms: lease_ms,
            priority: 0,
            fair: true,
        };
        // Acquire needs an Arc for waiting; a try-once acquire does not
        // wait, so the engine's own attempt is enough here.
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let attempt = self.attempt(&request, &keys, "{}", None).await?;
        match attempt.status {
            1 => {
                tracing::info!(%replica, "this replica is now the reaper");
                Ok(true)
            }
            2 => Ok(matches!(
                self.extend(lock, replica, Some(lease_ms), None).await?,
                ExtendOutcome::Extended(_)
            )),
            _ => Ok(false),
        }
    }

    async fn reap_everything(&self) {
        let namespaces = match self.namespaces().await {
            Ok(namespaces) => namespaces,
            Err(err) => {
                tracing::warn!(error = %err, "reaper cannot read the namespaces");
                return;
            }
        };
        for namespace in namespaces {
            match self.reap(&namespace, None).await {
                Ok(counts) => {
                    crate::observe::reaped(&counts);
                    if counts.removed_any() {
                        tracing::info!(%namespace, ?counts, "reaped");
                    }
                }
                Err(err) => tracing::warn!(%namespace, error = %err, "reaping failed"),
            }
        }
        crate::observe::reaper_run();
    }

    /// Counts a request that failed on Redis trouble; the flusher writes
    /// it to the shared counters.
    pub fn record_error(&self, namespace: &str, kind: &str) {
        let mut pending = self.pending_errors.lock().unwrap();
        // Bounded: one entry per namespace and kind seen.
        *pending
            .entry((namespace.to_owned(), kind.to_owned()))
            .or_default() += 1;
    }

    /// Every second, adds the errors counted here to the shared per-minute
    /// counters (of shard 0 of their namespace). Counts that cannot be
    /// written wait for the next round.
    pub async fn run_metrics_flusher(self: Arc<Self>) {
        let shutdown = self.waiters.shutdown_token().clone();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let pending = std::mem::take(&mut *self.pending_errors.lock().unwrap());
            for ((namespace, kind), n) in pending {
                let minute = unix_ms() - unix_ms() % MINUTE_MS;
                let key = format!(
                    "{}:m:{minute}",
                    self.layout.shard_keys(&namespace, 0).prefix
                );
                let mut pipe = redis::pipe();
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg(format!("{kind}|errors"))
                    .arg(n)
                    .ignore();
                pipe.cmd("PEXPIRE")
                    .arg(&key)
                    .arg(METRICS_RETENTION_MS)
                    .ignore();
                if self.store.pipeline::<()>(pipe).await.is_err() {
                    *self
                        .pending_errors
                        .lock()
                        .unwrap()
                        .entry((namespace, kind))
                        .or_default() += n;
                }
            }
        }
    }

    /// Per-minute counters of a namespace between two instants (inclusive
    /// minutes), summed over every shard, so over every replica.
    pub async fn metrics(
        &self,
        namespace: &str,
        from_ms: i64,
        to_ms: i64,
        kind: Option<&str>,
    ) -> Result<MetricsReport, EngineError> {
        self.ready()?;
        let first = from_ms - from_ms.rem_euclid(MINUTE_MS);
        let minutes: Vec<i64> = (first..=to_ms).step_by(MINUTE_MS as usize).collect();
        let mut sums: BTreeMap<(i64, String), Counters> = BTreeMap::new();
        for shard in 0..self.layout.shards() {
            let prefix = self.layout.shard_keys(namespace, shard).prefix;
            // One pipeline per shard: its keys share one cluster slot.
            let mut pipe = redis::pipe();
            for minute in &minutes {
                pipe.cmd("HGETALL").arg(format!("{prefix}:m:{minute}"));
            }
            let counts: Vec<std::collections::HashMap<String, u64>> =
                self.store.pipeline(pipe).await?;
            for (minute, fields) in minutes.iter().zip(counts) {
                for (field, n) in fields {
                    let Some((field_kind, event)) = field.rsplit_once('|') else {
                        continue;
                    };
                    if kind.is_some_and(|k| k != field_kind) {
                        continue;
                    }
                    sums.entry((*minute, field_kind.to_owned()))
                        .or_default()
                        .add_event(event, n);
                }
            }
        }
        let mut totals: BTreeMap<String, Counters> = BTreeMap::new();
        let minutes = sums
            .into_iter()
            .map(|((minute_ms, kind), counters)| {
                totals.entry(kind.clone()).or_default().add(&counters);
                MetricsRow {
                    minute_ms,
                    kind,
                    counters,
                }
            })
            .collect();
        let mut overall = MetricsRow {
            minute_ms: first,
            kind: "*".into(),
            counters: Counters::default(),
        };
        let totals = totals
            .into_iter()
            .map(|(kind, counters)| {
                overall.counters.add(&counters);
                MetricsRow {
                    minute_ms: first,
                    kind,
                    counters,
                }
            })
            .collect();
        Ok(MetricsReport {
            minutes,
            totals,
            overall,
        })
    }

    pub async fn release(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let (released, record, now): (i64, String, i64) = self
            .run(
                &self.scripts.release,
                lock,
                &keys,
                &[holder, &token_arg(fencing_token)],
            )
            .await?;
        if released != 1 {
            return Ok(ReleaseOutcome::NotHeld);
        }
        // The expiry is not needed to know how long it was held.
        let grant = parse_grant(holder, &record, 0)?;
        Ok(ReleaseOutcome::Released {
            kind: grant.kind,
            held_ms: now - grant.acquired_at_ms,
        })
    }

    /// Resets the remaining lease to `ttl_ms` (or the grant's own ttl).
    pub async fn extend(
        &self,
        lock: &LockId,
        holder: &str,
        ttl_ms: Option<u64>,
        fencing_token: Option<u64>,
    ) -> Result<ExtendOutcome, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let ttl = ttl_ms.map(|t| t.to_string()).unwrap_or_default();
        let (extended, record, expires_at): (i64, String, i64) = self
            .run_granting(
                &self.scripts.extend,
                lock,
                &keys,
                &[holder, &token_arg(fencing_token), &ttl],
                &[1],
            )
            .await?;
        if extended == 1 {
            Ok(ExtendOutcome::Extended(parse_grant(
                holder, &record, expires_at,
            )?))
        } else {
            Ok(ExtendOutcome::NotHeld)
        }
    }

    pub async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let (now_ms, limit, waiters, live): (i64, u32, u32, Vec<(String, i64, String)>) =
            self.run(&self.scripts.inspect, lock, &keys, &[]).await?;
        let mut holders = live
            .iter()
            .map(|(holder, expires_at, record)| parse_grant(holder, record, *expires_at))
            .collect::<Result<Vec<_>, _>>()?;
        holders.sort_by_key(|grant| grant.slot);
        Ok(LockState {
            now_ms,
            limit,
            waiters,
            holders,
        })
    }

    /// The live waiting requests of a lock in grant order (at most `most`).
    pub async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let (now_ms, waiters, entries): (i64, u32, Vec<(String, i64, String)>) = self
            .run(&self.scripts.queue, lock, &keys, &[&most.to_string()])
            .await?;
        let requests = entries
            .iter()
            .zip(1..)
            .map(|((holder, expires_at, record), position)| {
                parse_waiter(holder, record, *expires_at, position)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(QueueState {
            now_ms,
            waiters,
            requests,
        })
    }
}

/// A granted (or already held) attempt as an outcome; None when not granted.
fn granted(req: &AcquireRequest, attempt: &Attempt) -> Result<Option<AcquireOutcome>, StoreError> {
    let grant = || parse_grant(&req.holder, &attempt.record, attempt.expires_at);
    Ok(match attempt.status {
        1 => Some(AcquireOutcome::Acquired {
            grant: grant()?,
            holders: attempt.holders,
        }),
        2 => Some(AcquireOutcome::AlreadyHeld {
            grant: grant()?,
            holders: attempt.holders,
        }),
        -2..=0 => None,
        other => return Err(StoreError::Protocol(format!("acquire status {other}"))),
    })
}

/// Milliseconds since the Unix epoch on this replica's clock (only for
/// bookkeeping such as the namespace registry; locks use Redis time).
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a waiting request leaves its queue (only timeouts are counted).
#[derive(Clone, Copy)]
enum Dequeue {
    TimedOut,
    Cancelled,
}

/// Takes a waiting request out of the queue when its RPC goes away while
/// queued (dropped future: client cancelled, deadline passed, error).
struct QueuedGuard {
    engine: Arc<LockEngine>,
    lock: LockId,
    keys: LockKeys,
    holder: String,
    armed: bool,
}

impl Drop for QueuedGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let engine = self.engine.clone();
        let (lock, keys, holder) = (self.lock.clone(), self.keys.clone(), self.holder.clone());
        tokio::spawn(async move {
            if let Err(err) = engine
                .dequeue(&lock, &keys, &holder, Dequeue::Cancelled)
                .await
            {
                // Its liveness deadline will drop it instead.
                tracing::warn!(error = %err, lock = %lock.name, "leaving the queue failed");
            }
        });
    }
}

/// The fencing-token argument of release and extend: '' means any token.
fn token_arg(token: Option<u64>) -> String {
    token.map(|t| t.to_string()).unwrap_or_default()
}

/// Decodes a grant record: `token|slot|acquired_at_ms|ttl_ms|kind|metadata`.
/// Public so that the fuzz targets (`fuzz/`) and property tests reach it.
pub fn parse_grant(holder: &str, record: &str, expires_at_ms: i64) -> Result<Grant, StoreError> {
    let bad = || StoreError::Protocol(format!("grant record of {holder:?} not understood"));
    let mut fields = record.splitn(6, '|');
    let mut next = || fields.next().ok_or_else(bad);
    let fencing_token = next()?.parse().map_err(|_| bad())?;
    let slot = next()?.parse().map_err(|_| bad())?;
    let acquired_at_ms = next()?.parse().map_err(|_| bad())?;
    let ttl_ms = next()?.parse().map_err(|_| bad())?;
    let kind = next()?.to_owned();
    let metadata = serde_json::from_str(next()?).map_err(|_| bad())?;
    Ok(Grant {
        holder: holder.to_owned(),
        fencing_token,
        slot,
        acquired_at_ms,
        expires_at_ms,
        ttl_ms,
        kind,
        metadata,
    })
}

/// Decodes a waiter record: `priority|enqueued_at_ms|wait_deadline_ms|fair|kind`.
/// Public so that the fuzz targets (`fuzz/`) and property tests reach it.
pub fn parse_waiter(
    holder: &str,
    record: &str,
    expires_at_ms: i64,
    position: u32,
) -> Result<QueuedRequest, StoreError> {
    let bad = || StoreError::Protocol(format!("waiter record of {holder:?} not understood"));
    let mut fields = record.splitn(5, '|');
    let mut next = || fields.next().ok_or_else(bad);
    Ok(QueuedRequest {
        holder: holder.to_owned(),
        position,
        priority: next()?.parse().map_err(|_| bad())?,
        enqueued_at_ms: next()?.parse().map_err(|_| bad())?,
        wait_deadline_ms: next()?.parse().map_err(|_| bad())?,
        fair: next()? == "1",
        kind: next()?.to_owned(),
        expires_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_record_round_trips_metadata_with_separators() {
        let grant = parse_grant(
            "w-1",
            r#"1732230000000001|3|1732230000000|5000|jobs|{"a|b":"c|d"}"#,
            1732230005000,
        )
        .unwrap();
        assert_eq!(grant.fencing_token, 1_732_230_000_000_001);
        assert_eq!(grant.slot, 3);
        assert_eq!(grant.ttl_ms, 5000);
        assert_eq!(grant.kind, "jobs");
        assert_eq!(grant.metadata.get("a|b").map(String::as_str), Some("c|d"));
    }

    #[test]
    fn malformed_grant_record_is_a_protocol_error() {
        assert!(parse_grant("w", "12|x|3|4|k|{}", 0).is_err());
        assert!(parse_grant("w", "12|1|3", 0).is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn records_of_any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_grant("h", &text, 0);
            let _ = parse_waiter("h", &text, 0, 1);
        }

        #[test]
        fn grant_records_round_trip_metadata_with_separators_and_unicode(
            token in any::<u64>(),
            slot in any::<u32>(),
            acquired_at_ms in any::<i64>(),
            ttl_ms in any::<u64>(),
            kind in "[a-z0-9_.-]{1,32}",
            metadata in proptest::collection::btree_map("[^\\p{Cc}]{1,16}|\\|+", "((?s:.)|\\||\\{|\\}|\"|\\\\){0,24}", 0..6),
        ) {
            // Written as lua/acquire.lua writes it, with the JSON the engine sends.
            let json = serde_json::to_string(&metadata).unwrap();
            let record = format!("{token}|{slot}|{acquired_at_ms}|{ttl_ms}|{kind}|{json}");
            let grant = parse_grant("h", &record, 7).unwrap();
            prop_assert_eq!(grant.fencing_token, token);
            prop_assert_eq!(grant.slot, slot);
            prop_assert_eq!(grant.acquired_at_ms, acquired_at_ms);
            prop_assert_eq!(grant.ttl_ms, ttl_ms);
            prop_assert_eq!(grant.kind, kind);
            prop_assert_eq!(grant.metadata, metadata);
        }
    }
}
