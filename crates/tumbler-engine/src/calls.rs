//! [`Calls`]: the engine's one way into Redis. It owns the store, the key
//! layout, tumbler's function library, Redis' clock as this replica
//! estimates it and the readiness state, so a function of the library can
//! only be called through it: every call is refused first while Redis may
//! not be used (see `readiness.rs`), declares its keys, and a call that
//! may grant waits for replica acknowledgements. The health check (layout
//! record, then the lock path) lives here too, since it feeds readiness.
//! The hot path's operations go through group commit (`group.rs`): those
//! of one slot that are ready together share one call.

use std::sync::Arc;

use redis::Value;
use tokio::time::Instant;

use super::clock::RedisClock;
use super::group::{self, GroupCommit, Groups};
use super::keys::{Layout, LockKeys};
use super::readiness::{self, Readiness};
use super::scripts::{LockScript, Scripts};
use super::{LayoutError, REAPER_NAMESPACE};
use crate::store::{Store, StoreError};

/// Picks one function of the library (`|s| &s.acquire`): the only way a
/// part names the function it calls.
pub(super) type Pick = fn(&Scripts) -> &LockScript;

/// The lock of `tumbler-system` the health check inspects (never held).
const PROBE_LOCK: &str = "readiness";

/// The store, layout, function library, Redis' clock and readiness.
pub(super) struct Calls {
    store: Store,
    layout: Layout,
    scripts: Scripts,
    /// Redis' clock as this replica estimates it (answer-by times).
    clock: RedisClock,
    /// Whether Redis may be called for a request now, and if not why.
    readiness: Readiness,
    /// The shards count their live locks (a per-namespace lock limit is
    /// set): every function that may delete a lock then keeps the count.
    counts_live: bool,
    /// Group commit (None: off, every operation is its own call).
    groups: Option<Arc<Groups>>,
}

impl Calls {
    pub(super) fn new(
        store: Store,
        layout: Layout,
        counts_live: bool,
        group_commit: &GroupCommit,
    ) -> Self {
        let readiness = Readiness::new(&store, &layout);
        let scripts = Scripts::compile();
        let groups = group_commit.enabled.then(|| {
            Groups::new(
                group_commit.clone(),
                store.clone(),
                scripts.batch.clone(),
                format!("{}_", scripts.library_name),
            )
        });
        Calls {
            store,
            layout,
            scripts,
            clock: RedisClock::default(),
            readiness,
            counts_live,
            groups,
        }
    }

    /// Calls sent per batch size bucket ([`group::SIZE_BUCKETS`]); empty
    /// with group commit off.
    pub(super) fn batch_sizes(&self) -> Vec<u64> {
        self.groups.as_ref().map(|g| g.sizes()).unwrap_or_default()
    }

    /// The store, for plain commands (SCAN, pipelines, pub/sub); functions
    /// go through the calls below.
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    pub(super) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The name of this build's function library in Redis.
    pub(super) fn library_name(&self) -> &str {
        &self.scripts.library_name
    }

    /// True when the shards count their live locks (see the field).
    pub(super) fn counts_live(&self) -> bool {
        self.counts_live
    }

    /// Redis' clock now, as this replica estimates it.
    pub(super) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Learns Redis' clock from a reply's `now`.
    pub(super) fn observe(&self, redis_now_ms: i64) {
        self.clock.observe(redis_now_ms);
    }

    /// Whether this replica may call Redis for a request now, and if not,
    /// the real cause (see [`Readiness::ready`]).
    pub(super) fn ready(&self) -> Result<(), StoreError> {
        self.readiness.ready(&self.store)
    }

    pub(super) fn is_layout_verified(&self) -> bool {
        self.readiness.is_verified()
    }

    /// Calls a function of a shard (its fence key names the slot).
    pub(super) async fn call(
        &self,
        pick: Pick,
        key: &str,
        args: &[String],
    ) -> Result<Value, StoreError> {
        self.call_with(pick(&self.scripts), &[key], args).await
    }

    /// Calls a function on one lock (declaring its keys).
    pub(super) async fn call_lock(
        &self,
        pick: Pick,
        keys: &LockKeys,
        args: &[String],
    ) -> Result<Value, StoreError> {
        let declared = keys.declared(self.counts_live);
        self.call_with(pick(&self.scripts), &declared, args).await
    }

    /// Calls a function with the keys it declares: an operation of the
    /// hot path through group commit (when on), any other on its own.
    async fn call_with(
        &self,
        script: &LockScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let operation = self.scripts.operation(script);
        match &self.groups {
            Some(groups) if group::groups(operation) && !keys.is_empty() => {
                groups.run(script, operation, keys, &args).await
            }
            _ => self.store.run_script(script, keys, &args).await,
        }
    }

    /// [`Self::call_lock`] for a function that may grant (acquire,
    /// extend): with `--min-replicas-acked`, a grant is answered only once
    /// enough replicas acknowledged it (such calls go alone: no group
    /// commit, each holds its connection for its `WAIT`).
    pub(super) async fn call_granting(
        &self,
        pick: Pick,
        keys: &LockKeys,
        args: &[String],
        is_grant: fn(&Value) -> bool,
    ) -> Result<Value, StoreError> {
        if !self.store.waits_for_replicas() {
            return self.call_lock(pick, keys, args).await;
        }
        let declared = keys.declared(self.counts_live);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.store
            .run_granting_script(pick(&self.scripts), &declared, &args, is_grant)
            .await
    }

    /// Calls a function on several locks at once (a multi-lock's group:
    /// every lock's keys declared, lock after lock), alone (no group
    /// commit), waiting for replica acknowledgements of a grant as
    /// [`Self::call_granting`] does.
    pub(super) async fn call_locks(
        &self,
        pick: Pick,
        locks: &[LockKeys],
        args: &[String],
        is_grant: fn(&Value) -> bool,
    ) -> Result<Value, StoreError> {
        let declared: Vec<&str> = (locks.iter())
            .flat_map(|keys| keys.declared(self.counts_live))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let script = pick(&self.scripts);
        if self.store.waits_for_replicas() {
            return (self.store)
                .run_granting_script(script, &declared, &args, is_grant)
                .await;
        }
        self.store.run_script(script, &declared, &args).await
    }

    /// The answer-by argument of a call sent now: the caller's own limit,
    /// or the Redis command timeout (after which this replica answers
    /// UNAVAILABLE), whichever comes first.
    pub(super) fn answer_by(&self, caller: Option<Instant>) -> i64 {
        let timeout = self.store.command_timeout();
        let budget = caller.map_or(timeout, |at| {
            at.saturating_duration_since(Instant::now()).min(timeout)
        });
        self.clock.answer_by(budget)
    }

    /// Records this deployment's layout in Redis, or checks the one already
    /// there (create if absent, then compare): the shard count is fixed per
    /// deployment, since moving it would move every lock to another shard.
    /// Also learns Redis' clock. Run at start, at every health tick, and
    /// (through the connection check of `readiness.rs`) on every new
    /// connection, so a Redis that restarted empty is claimed again before
    /// anything else uses it, and a replica of another layout that claimed
    /// it first stops this one.
    pub(super) async fn verify_layout(&self) -> Result<(), LayoutError> {
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
    pub(super) async fn check_redis(&self) -> Result<(), LayoutError> {
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
        let declared = keys.declared(self.counts_live);
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
}

/// The error of a call that ran in Redis past its answer-by time: the
/// caller was (or is about to be) answered without it, nothing changed.
pub(super) fn late() -> StoreError {
    StoreError::Unavailable(
        "redis ran the request after its caller's deadline; nothing was granted".into(),
    )
}
