//! The lock engine: every lock operation as one Redis function call on one
//! shard, with typed inputs and outcomes, plus server-side waiting,
//! sessions, watchers and the background loops that serve them. The gRPC
//! and HTTP layers validate requests and map outcomes to replies; the
//! semantics (who gets a permit, queue order, fencing, expiry, cleanup)
//! live here and in `lua/`.
//!
//! This file is the engine's face: [`LockEngine`], its calls into Redis,
//! the health check and the session operations. Where the rest lives:
//! - `readiness.rs`: whether a request may call Redis now, and if not why;
//! - `locks.rs`: operations on one lock (acquire, release, extend,
//!   inspect, queue, dequeue);
//! - `walks.rs`: walks over a namespace's shards (namespaces, list, reap,
//!   clear, metrics);
//! - `types.rs`: requests, outcomes, errors;
//! - `ops/`: one typed twin per Redis function (arguments, reply, parse);
//! - `records.rs`: the grant and waiter records inside a lock's hash;
//! - `waiting.rs`: an Acquire that waits in the lock's queue;
//! - `background.rs`: the refresher, session renewer, reaper, counter
//!   flusher and watch registry loops;
//! - `keys.rs`, `scripts.rs`, `clock.rs`, `tally.rs`, `sessions.rs`,
//!   `waiters.rs`, `watchers.rs`: layout, function library, Redis' clock,
//!   per-minute counters, session grants, waiting RPCs, watch streams.

mod background;
pub mod changelog;
pub mod clock;
pub mod keys;
mod lifecycle;
mod locks;
pub mod names;
pub mod ops;
mod readiness;
pub mod records;
pub mod resume;
pub mod scripts;
pub mod sessions;
pub mod tally;
mod types;
pub mod waiters;
mod waiting;
mod walks;
pub mod watchers;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::store::{ScanCursor, Store, StoreError};
use keys::{Layout, LockKeys};
use scripts::{LockScript, Scripts};
use sessions::{LostGrant, Sessions};
use waiters::Waiters;

pub use lifecycle::{EngineSettings, Running};
pub use names::{Invalid, LockName, Namespace};
pub use records::{parse_grant, parse_waiter};
pub use types::*;

/// Locks one shard function call visits at most: bounds how long Redis is
/// busy with one call.
const SHARD_BATCH: usize = 100;
/// SCAN steps one List RPC makes at most (then it returns a page token).
const LIST_CALLS: usize = 64;
/// Keys one SCAN step looks at.
const SCAN_COUNT: u32 = 1000;
/// How often a replica re-records a namespace it serves as in use.
const NAMESPACE_NOTE_EVERY: Duration = Duration::from_secs(60);
/// How long an unused namespace stays in the registry.
const NAMESPACE_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

const MINUTE_MS: i64 = 60_000;
/// How long per-minute counters are kept.
pub const METRICS_RETENTION_MS: i64 = 24 * 3600 * 1000;

/// The tumbler lock that makes one replica at a time the reaper.
pub const REAPER_NAMESPACE: &str = "tumbler-system";
pub const REAPER_LOCK: &str = "reaper";

/// The lock engine. Shared by all handlers; cheap to use concurrently.
pub struct LockEngine {
    store: Store,
    layout: Layout,
    scripts: Scripts,
    waiters: Arc<Waiters>,
    watchers: Arc<watchers::Watchers>,
    sessions: Sessions,
    /// Redis' clock as this replica estimates it (answer-by times).
    clock: clock::RedisClock,
    /// Per-minute counters not yet written to Redis.
    tally: tally::Tally,
    max_waiters_per_lock: u32,
    /// Locks a namespace may have per shard (0: no limit).
    max_locks_per_shard: u64,
    /// How long a dead session's grants stay held (None: released at once).
    session_lock_delay_ms: Option<u64>,
    /// Whether Redis may be called for a request now, and if not why.
    readiness: readiness::Readiness,
    /// Namespaces this replica recorded as in use, and when.
    noted_namespaces: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Which namespaces keep a changelog (`changelog.rs`).
    changelog: changelog::ChangelogSettings,
}

impl LockEngine {
    pub fn new(store: Store, layout: Layout, limits: WaitLimits) -> Self {
        let readiness = readiness::Readiness::new(&store, &layout);
        LockEngine {
            waiters: Waiters::new(
                limits.max_waiters_per_replica,
                limits.max_waiters_per_namespace,
            ),
            max_locks_per_shard: limits.max_locks_per_shard,
            sessions: Sessions::default(),
            watchers: watchers::Watchers::new(),
            max_waiters_per_lock: limits.max_waiters_per_lock,
            session_lock_delay_ms: limits.session_lock_delay_ms,
            clock: clock::RedisClock::default(),
            tally: tally::Tally::default(),
            store,
            layout,
            scripts: Scripts::compile(),
            readiness,
            noted_namespaces: Default::default(),
            changelog: Default::default(),
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
    /// there (create if absent, then compare): the shard count is fixed per
    /// deployment, since moving it would move every lock to another shard.
    /// Also learns Redis' clock. Run at start, at every health tick, and
    /// (through [`layout_check`]) on every new connection, so a Redis that
    /// restarted empty is claimed again before anything else uses it, and
    /// a replica of another layout that claimed it first stops this one.
    pub async fn verify_layout(&self) -> Result<(), LayoutError> {
        let meta = self.layout.meta_key();
        let expected = readiness::layout_record(&self.layout);
        let mut pipe = readiness::claim_layout(&meta, &expected);
        pipe.cmd("TIME");
        let (found, (secs, micros)): (String, (i64, i64)) = self.store.pipeline(pipe).await?;
        self.clock.observe(secs * 1000 + micros / 1000);
        self.readiness.set_verified(found == expected);
        if found != expected {
            return Err(LayoutError::Mismatch { found, expected });
        }
        Ok(())
    }

    /// The health check: Redis answers (every cluster primary, the master
    /// Sentinel names), holds this deployment's layout record, and lets
    /// the configured user run the lock path (see
    /// [`Self::check_lock_path`]). A failure's reason is kept for `ready`.
    pub async fn check_redis(&self) -> Result<(), LayoutError> {
        let checked = self.check_redis_once().await;
        self.readiness.checked(&checked);
        checked
    }

    async fn check_redis_once(&self) -> Result<(), LayoutError> {
        if let Err(err) = self.store.ping().await {
            // A connection refused for another layout's record fails
            // the ping: say why.
            return Err(match self.readiness.take_mismatch() {
                Some(found) => LayoutError::Mismatch {
                    found,
                    expected: readiness::layout_record(&self.layout),
                },
                None => err.into(),
            });
        }
        self.verify_layout().await?;
        self.check_lock_path().await
    }

    /// Proves the lock path with the configured user: a read-only
    /// function of tumbler's library (inspect, of a lock of
    /// `tumbler-system` nobody holds) called with `FCALL_RO` and then with
    /// `FCALL`, through the store as every lock call goes. Redis' ACL
    /// checks `FCALL`'s keys as writes, so the pair proves that the user
    /// may load and call the library and read and write tumbler's keys,
    /// and the function writes nothing. An ACL refusal
    /// ([`StoreError::Denied`]) is kept by [`Self::check_redis`].
    async fn check_lock_path(&self) -> Result<(), LayoutError> {
        let keys = self.layout.lock_keys(REAPER_NAMESPACE, PROBE_LOCK);
        let declared = keys.declared(self.counts_live());
        let script = &self.scripts.inspect;
        let proved = match self
            .store
            .run_read_only::<Value>(script, &declared, &[])
            .await
        {
            Ok(_) => self.store.run_script::<Value>(script, &declared, &[]).await,
            Err(err) => Err(err),
        };
        proved.map(drop).map_err(LayoutError::from)
    }

    pub fn is_layout_verified(&self) -> bool {
        self.readiness.is_verified()
    }

    /// Whether this replica may call Redis for a request now, and if not,
    /// the real cause (see [`readiness::Readiness::ready`]).
    fn ready(&self) -> Result<(), StoreError> {
        self.readiness.ready(&self.store)
    }

    /// Calls a function of a shard (its fence key names the slot).
    async fn call(
        &self,
        script: &LockScript,
        key: &str,
        args: &[String],
    ) -> Result<Value, StoreError> {
        self.call_with(script, &[key], args).await
    }

    /// Calls a function with the keys it declares.
    async fn call_with(
        &self,
        script: &LockScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.store.run_script(script, keys, &args).await
    }

    /// Calls a function on one lock (declaring its keys).
    async fn call_lock(
        &self,
        script: &LockScript,
        keys: &LockKeys,
        args: &[String],
    ) -> Result<Value, StoreError> {
        self.call_with(script, &keys.declared(self.counts_live()), args)
            .await
    }

    /// True when the shards count their live locks (a per-namespace lock
    /// limit is set): every function that may delete a lock then keeps
    /// the count.
    fn counts_live(&self) -> bool {
        self.max_locks_per_shard > 0
    }

    /// [`Self::call_lock`] for a function that may grant (acquire,
    /// extend): with `--min-replicas-acked`, a grant is answered only once
    /// enough replicas acknowledged it.
    async fn call_granting(
        &self,
        script: &LockScript,
        keys: &[&str],
        args: &[String],
        is_grant: fn(&Value) -> bool,
    ) -> Result<Value, StoreError> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.store
            .run_granting_script(script, keys, &args, is_grant)
            .await
    }

    /// The answer-by argument of a call sent now: the caller's own limit,
    /// or the Redis command timeout (after which this replica answers
    /// UNAVAILABLE), whichever comes first.
    fn answer_by(&self, caller: Option<Instant>) -> i64 {
        let timeout = self.store.command_timeout();
        let budget = caller.map_or(timeout, |at| {
            at.saturating_duration_since(Instant::now()).min(timeout)
        });
        self.clock.answer_by(budget)
    }

    /// Counts what a function noted (expired leases, reaped waiters).
    fn count_noted(&self, namespace: &str, now: i64, noted: &[ops::Noted]) {
        for n in noted {
            self.tally.add(namespace, now, &n.kind, &n.event, 1);
        }
    }

    /// Counts one event of a kind now.
    fn count(&self, namespace: &str, kind: &str, event: &str) {
        self.tally
            .add(namespace, self.clock.now_ms(), kind, event, 1);
    }

    /// Counts a request that failed on Redis trouble (written to the
    /// shared counters with the others).
    pub fn record_error(&self, namespace: &str, kind: &str) {
        self.count(namespace, kind, "errors");
    }

    /// Acquires for a session: the holder is the session id, the lease the
    /// session TTL, and a grant is named in the session's record (so any
    /// replica can resume it) and renewed by this replica from now on
    /// (lost grants are reported on `lost`). A grant that cannot be named
    /// in the record is released again and the call fails: the client is
    /// never told of a grant its session could not take along.
    ///
    /// Every call carries the stream's epoch: a grant a newer stream of
    /// the session holds is refused ([`EngineError::SessionMoved`]) and
    /// left alone, by the function itself.
    pub async fn session_acquire(
        self: &Arc<Self>,
        session: &str,
        epoch: u64,
        req: &AcquireRequest,
        lost: &tokio::sync::mpsc::Sender<LostGrant>,
    ) -> Result<AcquireOutcome, EngineError> {
        debug_assert_eq!(
            req.session_epoch,
            Some(epoch),
            "the request names its stream's epoch"
        );
        let outcome = self.acquire(req).await?;
        if let AcquireOutcome::Acquired { grant, .. } | AcquireOutcome::AlreadyHeld { grant, .. } =
            &outcome
        {
            let token = grant.fencing_token;
            // The lease started no later than now: renewing from now on is
            // safe (early, never late).
            let granted_at = Instant::now();
            let noted = self
                .note_session_grant(session, epoch, &req.lock, Some(token))
                .await;
            if !matches!(noted, Ok(true)) {
                // Refused (MOVED) when a newer stream took the grant over
                // meanwhile: then it is that stream's to keep.
                let _ = self
                    .release_as(&req.lock, session, Some(token), Some(epoch))
                    .await;
                return Err(match noted {
                    Err(err) => err,
                    _ => EngineError::SessionMoved,
                });
            }
            self.sessions.add(
                session,
                epoch,
                &req.lock,
                token,
                Duration::from_millis(req.ttl_ms),
                granted_at,
                lost.clone(),
            );
        }
        Ok(outcome)
    }

    /// Releases one grant of a session, stops renewing it and takes it off
    /// the session's record.
    pub async fn session_release(
        &self,
        session: &str,
        epoch: u64,
        lock: &LockId,
    ) -> Result<ReleaseOutcome, EngineError> {
        let token = self.sessions.remove(session, epoch, lock);
        let outcome = self.release_as(lock, session, token, Some(epoch)).await?;
        if let Err(err) = self.note_session_grant(session, epoch, lock, None).await {
            // A resume would find the grant gone and report it lost.
            tracing::warn!(%session, error = %err, "a released grant stays named in the session record");
        }
        Ok(outcome)
    }

    /// Releases the grants of a session that is over, at once (and so
    /// wakes their waiters). With a lock-delay, a session that died
    /// (rather than being closed) leaves its grants held for that delay
    /// instead, so a partitioned old holder cannot overlap with the next
    /// one. Grants that cannot be released now (Redis trouble) expire at
    /// their short lease.
    async fn release_session_grants(
        &self,
        session: &str,
        epoch: u64,
        grants: &[(LockId, u64)],
        died: bool,
    ) {
        let delay = self.session_lock_delay_ms.filter(|_| died);
        let endings = grants.iter().map(|(lock, token)| async move {
            let grant = locks::GrantRef {
                lock,
                holder: session,
                fencing_token: Some(*token),
            };
            match delay {
                Some(delay_ms) => self
                    .extend_as(grant, Some(delay_ms), None, Some(epoch))
                    .await
                    .map(|_| ()),
                None => self
                    .release_as(lock, session, Some(*token), Some(epoch))
                    .await
                    .map(|_| ()),
            }
        });
        for outcome in futures::future::join_all(endings).await {
            if let Err(err) = outcome {
                tracing::warn!(%session, error = %err, "a session grant could not be released; it expires at its lease");
            }
        }
    }
}

/// The error of a call that ran in Redis past its answer-by time: the
/// caller was (or is about to be) answered without it, nothing changed.
fn late() -> StoreError {
    StoreError::Unavailable(
        "redis ran the request after its caller's deadline; nothing was granted".into(),
    )
}

/// The lock of `tumbler-system` the health check inspects (never held).
const PROBE_LOCK: &str = "readiness";
