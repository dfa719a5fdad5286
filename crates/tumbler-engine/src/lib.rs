//! The lock engine: every lock operation as one Redis function call on one
//! shard, with typed inputs and outcomes, plus server-side waiting,
//! sessions, watchers and the background loops that serve them. The gRPC
//! and HTTP layers validate requests and map outcomes to replies; the
//! semantics (who gets a permit, queue order, fencing, expiry, cleanup)
//! live here and in `lua/`.
//!
//! The engine is a set of parts, each a type that owns its state behind
//! private fields and shows a small surface to the others; [`LockEngine`]
//! (this file) composes them and hands each call to the part that owns
//! what it touches. The parts, and what they own:
//! - `calls.rs` `Calls`: the store, the key layout, the
//!   function library, Redis' clock and readiness; the only way to call a
//!   Redis function, and the health check;
//! - `counting.rs` `Counting`: the per-minute counters not yet written
//!   (`tally.rs`) and their flusher;
//! - `changelog.rs` `Changelog`: which namespaces keep a changelog, where
//!   a namespace's events go (publish, record), and reading a page;
//! - `locks.rs` `Locks`: the calls on one lock (acquire once, release,
//!   extend, inspect, queue, dequeue, refresh, purge) and the limits they
//!   pass;
//! - `waiting.rs` `Waiting`: this replica's waiting RPCs (`waiters.rs`'s
//!   `Waiters`), an Acquire that waits, and the refresher;
//! - `deadlock.rs` `Deadlocks` (`Waiting`'s): wait-for cycles refused (decision 0077);
//! - `multi.rs` `Multi`: multi-locks, a set of locks taken all or
//!   nothing (decision 0076), its wait that holds nothing, and Release and
//!   Extend of a set;
//! - `walks.rs` `Walks`: the namespaces this replica noted as in use, and
//!   the walks over a namespace's shards (list, reap, clear, metrics);
//! - `resume.rs` `SessionKeeper`: session records and the ends of their
//!   grants (with the lock-delay); `renewer.rs` `Renewer`: the session
//!   grants this replica renews (`sessions.rs`'s `Sessions`) and the
//!   renewer loop;
//! - `watching.rs` `Watching`: this replica's Watch streams
//!   (`watchers.rs`'s `Watchers`), lease-end purges, a Watch's initial
//!   state, the watch registry;
//! - `election.rs` `Election`: leader election on a fair lock of limit 1
//!   (Proclaim's calls; the rest is the lock's own, seen as an election);
//! - `reaper.rs` `Reaper`: the background reaper and its metrics;
//! - `lifecycle.rs`: [`Running`], the loops spawned and stopped in order.
//!
//! Beside them: `types.rs` (requests, outcomes, errors), `names.rs`
//! (validated names), `ops/` (one typed twin per Redis function:
//! arguments, reply, parse), `records.rs` (the grant and waiter records),
//! `keys.rs`, `scripts.rs`, `clock.rs`, `readiness.rs`.
//!
//! The engine depends on nothing of the crate but `crate::store` and
//! `crate::wallclock`: no transport, no exporter (the reaper records its
//! metrics with the `metrics` crate, which the server's exporter reads).

pub mod wallclock;

/// The store layer, the one crate below the engine (not handed out).
use tumbler_store as store;

/// Settings the in-crate property tests share.
#[cfg(test)]
mod test_support {
    /// 2,000 cases, no regression files written.
    pub fn proptest_config() -> proptest::prelude::ProptestConfig {
        proptest::prelude::ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..Default::default()
        }
    }
}

mod calls;
pub mod changelog;
pub mod clock;
mod counting;
mod deadlock;
pub mod election;
mod errors;
pub mod group;
pub mod keys;
mod libraries;
mod lifecycle;
mod locks;
mod multi;
pub mod names;
pub mod ops;
mod readiness;
mod reaper;
pub mod records;
mod renewer;
pub mod resume;
pub mod scripts;
pub mod sessions;
pub mod tally;
mod types;
pub mod waiters;
mod waiting;
mod walks;
pub mod watchers;
mod watching;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::store::{Store, StoreError};
use calls::Calls;
use changelog::{Changelog, ChangelogPage, ChangelogQuery, ChangelogSettings};
use counting::Counting;
use deadlock::Deadlocks;
use election::Election;
use keys::Layout;
use libraries::Libraries;
use locks::{GrantRef, Locks};
use multi::Multi;
use ops::session_record::Touch;
use reaper::Reaper;
use renewer::Renewer;
use resume::{ResumeError, Resumed, SessionEnd, SessionKeeper, SessionTicket};
use sessions::{LostGrant, Sessions};
use waiters::Waiters;
use waiting::Waiting;
use walks::Walks;
use watchers::{Filter, LockEvent, Watchers};
use watching::Watching;

pub use errors::*;
pub use lifecycle::{EngineSettings, Running};
pub use names::{Holder, Invalid, Kind, LockName, Namespace, Ttl};
pub use records::{parse_grant, parse_waiter};
pub use types::*;

/// How long per-minute counters are kept.
pub const METRICS_RETENTION_MS: i64 = 24 * 3600 * 1000;

/// The tumbler lock that makes one replica at a time the reaper.
pub const REAPER_NAMESPACE: &str = "tumbler-system";
pub const REAPER_LOCK: &str = "reaper";

/// The lock engine: the parts, composed. Shared by all handlers; cheap to
/// use concurrently. Each method hands its work to the part that owns the
/// state it touches (see the module's notes).
pub struct LockEngine {
    calls: Arc<Calls>,
    counting: Arc<Counting>,
    changelog: Arc<Changelog>,
    locks: Arc<Locks>,
    waiting: Waiting,
    multi: Arc<Multi>,
    walks: Arc<Walks>,
    renewer: Arc<Renewer>,
    sessions: SessionKeeper,
    watching: Watching,
    reaper: Reaper,
    election: Election,
}

impl LockEngine {
    pub fn new(store: Store, layout: Layout, limits: WaitLimits) -> Self {
        Self::with_settings(store, layout, limits, ChangelogSettings::default())
    }

    fn with_settings(
        store: Store,
        layout: Layout,
        limits: WaitLimits,
        changelog: ChangelogSettings,
    ) -> Self {
        let calls = Arc::new(Calls::new(
            store,
            layout,
            limits.max_locks_per_shard > 0,
            &limits.group_commit,
        ));
        let counting = Arc::new(Counting::new(calls.clone()));
        let watchers = Watchers::new();
        let changelog = Arc::new(Changelog::new(changelog, watchers.clone(), calls.clone()));
        let locks = Arc::new(Locks::new(
            calls.clone(),
            counting.clone(),
            changelog.clone(),
            limits.max_waiters_per_lock,
            limits.max_locks_per_shard,
        ));
        let waiters = Waiters::new(
            limits.max_waiters_per_replica,
            limits.max_waiters_per_namespace,
        );
        let walks = Arc::new(Walks::new(
            calls.clone(),
            counting.clone(),
            changelog.clone(),
        ));
        let renewer = Arc::new(Renewer::new(
            calls.clone(),
            counting.clone(),
            changelog.clone(),
        ));
        // One wait-for registry's calls and renewals for single and
        // multi-lock waits alike.
        let deadlocks = Deadlocks::new(calls.clone(), locks.clone());
        let multi = Arc::new(Multi::new(
            (calls.clone(), locks.clone()),
            counting.clone(),
            changelog.clone(),
            waiters.clone(),
            deadlocks.clone(),
            limits.max_waiters_per_lock,
            limits.max_locks_per_shard,
        ));
        LockEngine {
            waiting: Waiting::new(waiters, locks.clone(), deadlocks, limits.hand_over),
            multi,
            sessions: SessionKeeper::new(
                renewer.clone(),
                limits.session_lock_delay_ms,
                calls.clone(),
                locks.clone(),
            ),
            renewer,
            watching: Watching::new(watchers, calls.clone(), locks.clone(), walks.clone()),
            reaper: Reaper::new(calls.clone(), locks.clone(), walks.clone()),
            election: Election::new(calls.clone(), counting.clone(), changelog.clone()),
            calls,
            counting,
            changelog,
            locks,
            walks,
        }
    }

    /// Builds the engine and spawns its loops (on the current runtime).
    pub fn start(store: Store, settings: EngineSettings) -> Running {
        let EngineSettings {
            layout,
            wait_limits,
            changelog,
            reap_interval,
            replica,
            library_grace,
        } = settings;
        let engine = Arc::new(Self::with_settings(
            store.clone(),
            layout,
            wait_limits,
            changelog,
        ));
        let libraries = library_grace.map(|grace| {
            let calls = engine.calls.clone();
            let own = calls.library_name().to_owned();
            Libraries::new(calls, own, grace)
        });
        Running::start(engine, store, reap_interval, replica, libraries)
    }

    // The state the server reads (gauges, shutdown signal, key names).

    /// A lock's Redis key names, for the lines that name them (debug logs).
    pub fn key_names(&self, lock: &LockId) -> keys::LockKeys {
        self.calls.layout().lock_keys(&lock.namespace, &lock.name)
    }

    pub fn waiters(&self) -> &Arc<Waiters> {
        self.waiting.waiters()
    }

    pub fn sessions(&self) -> &Sessions {
        self.renewer.sessions()
    }

    pub fn watchers(&self) -> &Arc<Watchers> {
        self.watching.watchers()
    }

    // Health (`calls.rs`).

    /// Records this deployment's layout in Redis, or checks the one already
    /// there (see `calls.rs`); also learns Redis' clock.
    pub async fn verify_layout(&self) -> Result<(), LayoutError> {
        self.calls.verify_layout().await
    }

    /// The health check: Redis answers, holds this deployment's layout
    /// record, and lets the configured user run the lock path. A failure's
    /// reason is kept for the readiness of every request.
    pub async fn check_redis(&self) -> Result<(), LayoutError> {
        self.calls.check_redis().await
    }

    pub fn is_layout_verified(&self) -> bool {
        self.calls.is_layout_verified()
    }

    /// Redis calls of the hot path so far, per batch size bucket
    /// ([`group::SIZE_BUCKETS`]; empty with group commit off).
    pub fn batch_sizes(&self) -> Vec<u64> {
        self.calls.batch_sizes()
    }

    // One lock (`locks.rs`, `waiting.rs`).

    /// Takes a permit, trying once or waiting in this server (in the
    /// lock's queue) until granted or `req.wait` has passed.
    pub async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, EngineError> {
        self.calls.ready()?;
        self.walks.note_namespace(&req.lock.namespace).await?;
        if let Some(old) = &req.takes_over
            && let Some(outcome) = self.locks.take_over(req, old.as_str()).await?
        {
            return Ok(outcome);
        }
        if req.wait.is_zero() {
            self.locks.acquire_once(req).await
        } else {
            self.waiting.acquire(req).await
        }
    }

    /// One page of a namespace's current wait-for chains (`deadlock.rs`,
    /// decisions 0077 and 0081), from `page` (none: the first).
    pub async fn wait_chains(
        &self,
        ns: &Namespace,
        page: Option<u64>,
    ) -> Result<WaitChainsPage, EngineError> {
        self.waiting.wait_chains(ns, page).await
    }

    /// Takes every lock of a multi-lock's set or none (decision 0076),
    /// trying once or waiting in this server while holding nothing.
    pub async fn acquire_many(
        self: &Arc<Self>,
        req: MultiAcquireRequest,
    ) -> Result<MultiOutcome, EngineError> {
        self.calls.ready()?;
        self.walks.note_namespace(&req.req.lock.namespace).await?;
        self.multi.acquire(req).await
    }

    /// Releases each lock of a multi-lock's set the holder holds, each
    /// pinned to its fencing token when it has one (see `multi.rs`,
    /// decision 0079): Released only when every one was held (with its
    /// token).
    pub async fn release_many(
        &self,
        locks: &[SetLock],
        holder: &str,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.multi.release_set(locks, holder).await
    }

    /// Extends each lock of a multi-lock's set, each pinned to its fencing
    /// token when it has one (see `multi.rs`); NotHeld, with the set
    /// released (pinned the same way), when one was not held.
    pub async fn extend_many(
        &self,
        locks: &[SetLock],
        holder: &str,
        ttl: Option<Ttl>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        (self.multi).extend_set(locks, holder, ttl, answer_by).await
    }

    pub async fn release(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.locks.release(lock, holder, fencing_token, None).await
    }

    /// Resets the remaining lease to `ttl` (or the grant's own ttl).
    pub async fn extend(
        &self,
        lock: &LockId,
        holder: &str,
        ttl: Option<Ttl>,
        fencing_token: Option<u64>,
    ) -> Result<ExtendOutcome, EngineError> {
        self.extend_by(lock, holder, ttl, fencing_token, None).await
    }

    /// [`Self::extend`] for a caller that stops listening at `answer_by`.
    pub async fn extend_by(
        &self,
        lock: &LockId,
        holder: &str,
        ttl: Option<Ttl>,
        fencing_token: Option<u64>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        let grant = GrantRef {
            lock,
            holder,
            fencing_token,
        };
        self.locks.extend(grant, ttl, answer_by, None).await
    }

    pub async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError> {
        self.locks.inspect(lock).await
    }

    /// The live waiting requests of a lock in grant order (at most `most`).
    pub async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError> {
        self.locks.queue(lock, most).await
    }

    /// Counts a request that failed on Redis trouble (written to the
    /// shared counters with the others).
    pub fn record_error(&self, namespace: &str, kind: &str) {
        self.counting.now(namespace, kind, "errors");
    }

    // Walks over a namespace's shards (`walks.rs`).

    /// The namespaces in use (recorded by the replicas that served them).
    pub async fn namespaces(&self) -> Result<Vec<String>, EngineError> {
        self.walks.namespaces().await
    }

    /// One page of a namespace's locks (in SCAN order), filtered by name
    /// prefix and by having waiters.
    pub async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        page_size: u32,
        from: Option<ListCursor>,
        only_waiting: bool,
    ) -> Result<ListPage, EngineError> {
        self.walks
            .list(namespace, prefix, page_size, from, only_waiting)
            .await
    }

    /// Cleans up every lock of a namespace now; with `older_than_ms` also
    /// drops old grants and requests.
    pub async fn reap(
        &self,
        namespace: &str,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError> {
        self.walks.reap(namespace, older_than_ms).await
    }

    /// Releases every lock and drops every queue of a namespace.
    pub async fn clear(&self, namespace: &str) -> Result<ClearCounts, EngineError> {
        self.walks.clear(namespace).await
    }

    /// [`Self::clear`], adding what it cleared to `done` batch by batch,
    /// so a clear that Redis interrupts still says how far it got (and
    /// running it again finishes the job).
    pub async fn clear_counting(
        &self,
        namespace: &str,
        done: &mut ClearCounts,
    ) -> Result<(), EngineError> {
        self.walks.clear_counting(namespace, done).await
    }

    /// Per-minute counters of a namespace between two instants (inclusive
    /// minutes), as every replica added them (this replica's own first).
    pub async fn metrics(
        &self,
        namespace: &str,
        from_ms: i64,
        to_ms: i64,
        kind: Option<&str>,
    ) -> Result<MetricsReport, EngineError> {
        self.walks.metrics(namespace, from_ms, to_ms, kind).await
    }

    // The changelog (`changelog.rs`).

    /// The changelog settings in force.
    pub fn changelog_settings(&self) -> &ChangelogSettings {
        self.changelog.settings()
    }

    /// One page of a namespace's changelog: events that match `query`,
    /// newest first, after `query.from`.
    pub async fn changelog(
        &self,
        namespace: &str,
        query: &ChangelogQuery,
    ) -> Result<ChangelogPage, EngineError> {
        self.changelog.page(namespace, query).await
    }

    // Watches (`watching.rs`).

    /// A watcher on this replica starts watching `namespace`: every
    /// replica's function calls publish its events from now on.
    pub async fn announce_watch(&self, namespace: &str) -> Result<(), StoreError> {
        self.watching.announce(namespace).await
    }

    /// The current state of the locks a watcher wants, as events.
    pub async fn watch_state(&self, filter: &Filter) -> Result<Vec<LockEvent>, EngineError> {
        self.watching.watch_state(filter).await
    }

    // Sessions (`resume.rs`).

    /// Records a new session (owner: the token's name, '' without auth).
    pub async fn open_session(&self, owner: &str, ttl: Ttl) -> Result<SessionTicket, EngineError> {
        self.sessions.open(owner, ttl.ms()).await
    }

    /// Takes a session back for a new stream (see `resume.rs`).
    pub async fn resume_session(
        &self,
        owner: &str,
        session: &str,
        secret: &str,
        may_act: impl Fn(&str) -> bool,
        lost_tx: &mpsc::Sender<LostGrant>,
    ) -> Result<Resumed, ResumeError> {
        self.sessions
            .resume(owner, session, secret, may_act, lost_tx)
            .await
    }

    /// Keeps the record of a session this stream serves alive, or learns
    /// that another stream resumed it, or that it is gone.
    pub async fn touch_session(
        &self,
        session: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<Touch, EngineError> {
        self.sessions.touch(session, epoch, ttl_ms).await
    }

    /// The stream that serves a session stops: its grants are released or
    /// left to live on for the TTL (see `resume.rs`).
    pub async fn end_session(
        &self,
        session: &str,
        epoch: u64,
        ttl_ms: u64,
        end: SessionEnd,
    ) -> (Vec<(LockId, u64)>, bool) {
        self.sessions.end(session, epoch, ttl_ms, end).await
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
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<AcquireOutcome, EngineError> {
        debug_assert_eq!(
            req.session_epoch,
            Some(epoch),
            "the request names its stream's epoch"
        );
        let outcome = self.acquire(req).await?;
        self.sessions
            .keep_grant(session, epoch, req, &outcome, lost)
            .await?;
        Ok(outcome)
    }

    /// A multi-lock for a session (decision 0078): the set taken as
    /// [`Self::acquire_many`] takes it, then its grants kept as a set of
    /// session grants (named in the record with their set, renewed here,
    /// ended together). A set that names a lock the stream holds alone or
    /// in another set is refused ([`EngineError::SetMismatch`]).
    pub async fn session_acquire_many(
        self: &Arc<Self>,
        session: &str,
        epoch: u64,
        req: MultiAcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<MultiOutcome, EngineError> {
        let namespace = req.req.lock.namespace.clone();
        let locks: Vec<LockId> = (req.names.iter())
            .map(|name| LockId {
                namespace: namespace.clone(),
                name: name.clone(),
            })
            .collect();
        let set = self.sessions.set_for(session, epoch, &locks)?;
        let ttl = req.req.ttl;
        let outcome = self.acquire_many(req).await?;
        self.sessions
            .keep_set((session, epoch), (&namespace, ttl, set), &outcome, lost)
            .await?;
        Ok(outcome)
    }

    /// A session's release command (`field`: `name` for one lock, `names`
    /// for several): a set it holds must be named whole (see
    /// `resume/sets.rs`).
    pub async fn session_release_named(
        &self,
        session: &str,
        epoch: u64,
        locks: &[LockId],
        field: &str,
    ) -> Result<ReleaseOutcome, EngineError> {
        (self.sessions)
            .release_named(session, epoch, locks, field)
            .await
    }

    /// Releases a session grant whose multi-lock set broke
    /// ([`sessions::LOST_SET_BROKEN`]).
    pub async fn session_release_broken(&self, session: &str, epoch: u64, lost: &LostGrant) {
        self.sessions.release_broken(session, epoch, lost).await
    }

    /// Releases one grant of a session, stops renewing it and takes it off
    /// the session's record.
    pub async fn session_release(
        &self,
        session: &str,
        epoch: u64,
        lock: &LockId,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.sessions.release(session, epoch, lock).await
    }

    // Leader election (`election.rs`): an election is a fair lock of
    // limit 1. Campaign is [`Self::acquire`] of the request
    // [`election::campaign`] builds, its outcome read by
    // [`election::campaign_outcome`].

    /// Replaces the leader's value, when `candidate` leads with `term`
    /// and `proof` is the digest of its secret ([`EngineError::NotYours`]
    /// when it leads and the proof is another's).
    pub async fn proclaim(
        &self,
        lock: &LockId,
        candidate: &str,
        term: u64,
        value: &str,
        proof: &str,
    ) -> Result<ProclaimOutcome, EngineError> {
        self.election
            .proclaim(lock, candidate, term, value, proof)
            .await
    }

    /// Who leads the election now (None: nobody), and Redis' clock.
    pub async fn leader(&self, lock: &LockId) -> Result<(Option<Leadership>, i64), EngineError> {
        let state = self.locks.inspect(lock).await?;
        let now_ms = state.now_ms;
        Ok((election::leader_of(state), now_ms))
    }

    /// The leader steps down (a release pinned to its term, which wakes
    /// the next candidate); false when `candidate` does not lead with
    /// `term`; [`EngineError::NotYours`] when it does and `proof` is not
    /// the digest of its secret.
    pub async fn resign(
        &self,
        lock: &LockId,
        candidate: &str,
        term: u64,
        proof: &str,
    ) -> Result<bool, EngineError> {
        let outcome = self
            .locks
            .release_proved(lock, candidate, term, proof)
            .await?;
        Ok(matches!(outcome, ReleaseOutcome::Released { .. }))
    }

    // The loops, each until the replica shuts down (`lifecycle.rs`
    // spawns them).

    /// Keeps this replica's waiting requests alive (`waiting.rs`).
    pub async fn run_refresher(self: Arc<Self>) {
        self.waiting.run_refresher().await;
    }

    /// Keeps this replica's session grants alive (`renewer.rs`).
    pub async fn run_session_renewer(self: Arc<Self>) {
        let shutdown = self.shutdown_token();
        self.renewer.clone().run(shutdown).await;
    }

    /// Reaps every `interval` while this replica holds the reaper lock
    /// (`reaper.rs`); hands the lock over at shutdown.
    pub async fn run_reaper(self: Arc<Self>, interval: Duration, replica: String) {
        let shutdown = self.shutdown_token();
        self.reaper.run(interval, replica, shutdown).await;
    }

    /// Adds this replica's counts to the per-minute counters every second
    /// (`counting.rs`), until aborted.
    pub async fn run_metrics_flusher(self: Arc<Self>) {
        self.counting.run_flusher().await;
    }

    /// Keeps the watch registry (`watching.rs`).
    pub async fn run_watch_registry(self: Arc<Self>) {
        let shutdown = self.shutdown_token();
        self.watching.run_registry(shutdown).await;
    }

    /// Purges watched locks at their lease ends (`watching.rs`).
    pub async fn run_expiry_timers(self: Arc<Self>) {
        let shutdown = self.shutdown_token();
        self.watching.run_expiry_timers(shutdown).await;
    }

    /// Cancelled when the replica starts to drain.
    fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.waiting.waiters().shutdown_token().clone()
    }
}
