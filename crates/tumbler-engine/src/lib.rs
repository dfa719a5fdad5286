//! The lock engine: every lock operation as one Redis function call on one
//! shard, with typed inputs and outcomes, plus server-side waiting,
//! sessions, watchers and the background loops that serve them. The gRPC
//! and HTTP layers validate requests and map outcomes to replies; the
//! semantics (who gets a permit, queue order, fencing, expiry, cleanup)
//! live here and in `lua/`.
//!
//! The engine is a set of parts, each a type that owns its state behind
//! private fields and shows a small surface to the others; [`LockEngine`]
//! (this file) composes them, and its face (`face.rs`) is a few handles
//! by capability (locks, sets, sessions, elections, walks, watch, health)
//! that hand each call to the part that owns what it touches, never the
//! part itself. The parts, and what they own:
//! - `calls.rs` `Calls`: the store, the key layout, the
//!   function library, Redis' clock and readiness; the only way to call a
//!   Redis function, and the health check;
//! - `counting.rs` `Counting`: the per-minute counters not yet written
//!   and their flusher, and the note that a namespace is in use;
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
//! - `walks.rs` `Walks`: the namespaces in use (as the replicas noted
//!   them), and the walks over a namespace's shards (list, reap, clear,
//!   metrics);
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
//! Beside them: `ops/` (one typed twin per Redis function: arguments,
//! reply, parse), `records.rs` (the grant and waiter records), `errors.rs`
//! (the store's error sorted into the face's), `keys.rs`, `scripts.rs`,
//! `clock.rs`, `readiness.rs`. The names, requests, outcomes and errors,
//! and the face's traits (`face.rs` implements them), live in the crate
//! below, `tumbler-face` (decision 0088), re-exported here at their paths.
//!
//! The engine depends on two crates of tumbler, the store and the face: no
//! transport, no exporter (the reaper records its metrics with the
//! `metrics` crate, which the server's exporter reads).

/// The face: the engine's names, requests, outcomes and errors, and the
/// traits the engine implements, in the crate below it (decision 0088),
/// re-exported at the paths they had here.
pub use tumbler_face::{names, wallclock};

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
mod face;
pub mod group;
pub mod keys;
mod libraries;
mod lifecycle;
mod locks;
mod multi;
pub mod ops;
mod readiness;
mod reaper;
pub mod records;
mod renewer;
pub mod resume;
pub mod scripts;
pub mod sessions;
mod upgrade;
pub mod waiters;
mod waiting;
mod walks;
pub mod watchers;
mod watching;

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use calls::Calls;
use changelog::{Changelog, ChangelogSettings};
use counting::Counting;
use deadlock::Deadlocks;
use election::Election;
use keys::Layout;
use libraries::Libraries;
use locks::Locks;
use multi::Multi;
use reaper::Reaper;
use renewer::Renewer;
use resume::SessionKeeper;
use waiters::Waiters;
use waiting::Waiting;
use walks::Walks;
use watchers::Watchers;
use watching::Watching;

use errors::OrTrouble;
pub use errors::{LayoutError, store_failed, trouble};
pub use lifecycle::{EngineSettings, Running, WaitLimits};
pub use records::{parse_grant, parse_waiter};
pub use tumbler_face::handles::*;
pub use tumbler_face::types::*;
pub use tumbler_face::{
    EngineError, ErrorKind, Holder, Invalid, Kind, LockName, Namespace, REAPER_LOCK,
    REAPER_NAMESPACE, StoreTrouble, TroubleKind, Ttl,
};
pub use upgrade::{UpgradeError, Upgraded, upgrade_layout};

/// How long per-minute counters are kept.
pub const METRICS_RETENTION_MS: i64 = 24 * 3600 * 1000;

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
        let waiters = Waiters::new(
            limits.max_waiters_per_replica,
            limits.max_waiters_per_namespace,
        );
        let locks = Arc::new(Locks::new(
            calls.clone(),
            counting.clone(),
            changelog.clone(),
            limits.max_waiters_per_lock,
            limits.max_locks_per_shard,
            waiters.clone(),
        ));
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

    // Internal parts, for the loops (`lifecycle.rs`).

    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        self.waiting.waiters()
    }

    pub(crate) fn watchers(&self) -> &Arc<Watchers> {
        self.watching.watchers()
    }

    // The loops, each until the replica shuts down (`lifecycle.rs`
    // spawns them).

    /// Keeps this replica's waiting requests alive (`waiting.rs`).
    pub(crate) async fn run_refresher(self: Arc<Self>) {
        self.waiting.run_refresher().await;
    }

    /// Keeps this replica's session grants alive (`renewer.rs`).
    pub(crate) async fn run_session_renewer(self: Arc<Self>) {
        let shutdown = self.shutdown_token();
        self.renewer.clone().run(shutdown).await;
    }

    /// Reaps every `interval` while this replica holds the reaper lock
    /// (`reaper.rs`); hands the lock over at shutdown.
    pub(crate) async fn run_reaper(self: Arc<Self>, interval: Duration, replica: String) {
        let shutdown = self.shutdown_token();
        self.reaper.run(interval, replica, shutdown).await;
    }

    /// Adds this replica's counts to the per-minute counters every second
    /// (`counting.rs`), until aborted.
    pub(crate) async fn run_metrics_flusher(self: Arc<Self>) {
        self.counting.run_flusher().await;
    }

    /// Keeps the watch registry (`watching.rs`).
    pub(crate) async fn run_watch_registry(self: Arc<Self>) {
        let shutdown = self.shutdown_token();
        self.watching.run_registry(shutdown).await;
    }

    /// Purges watched locks at their lease ends (`watching.rs`).
    pub(crate) async fn run_expiry_timers(self: Arc<Self>) {
        let shutdown = self.shutdown_token();
        self.watching.run_expiry_timers(shutdown).await;
    }

    /// Cancelled when the replica starts to drain.
    fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.waiting.waiters().shutdown_token().clone()
    }
}
