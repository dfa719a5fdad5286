//! The engine's lifecycle: [`LockEngine::start`] builds the engine and
//! [`Running::start`] spawns the loops that serve it; [`Running::shutdown`]
//! stops them in a set order. The server only wires ports to the running
//! engine.
//!
//! The loops (each in the part whose state it serves: `waiters.rs`,
//! `waiting.rs`, `resume.rs`, `watching.rs`, `counting.rs`, `reaper.rs`):
//! the replica's one pub/sub subscriber (wake-ups, and lock events while
//! someone here watches), the waiter refresher, the session renewer, the
//! watch registry, the expiry timers of watched leases, the per-minute
//! counter flusher, the keeper of the function libraries (`libraries.rs`)
//! and, when the replica reaps, the reaper.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::LockEngine;
use super::changelog::ChangelogSettings;
use super::keys::Layout;
use super::libraries::Libraries;
use super::waiters::run_subscriber;
use crate::store::Store;

/// How long shutdown waits for the last counts to be written, and for the
/// reaper to hand its lease over.
const SHUTDOWN_STEP: Duration = Duration::from_secs(2);

/// What a running engine is made of, besides its store.
pub struct EngineSettings {
    pub layout: Layout,
    pub wait_limits: WaitLimits,
    pub changelog: ChangelogSettings,
    /// Reap every this often (one replica at a time does), or never.
    pub reap_interval: Option<Duration>,
    /// This replica's name (the reaper's lock holder).
    pub replica: String,
    /// Delete tumbler function libraries no replica has named for this
    /// long (`libraries.rs`), or never.
    pub library_grace: Option<Duration>,
}

/// An engine with its loops running. Dropped without `shutdown`, it stops
/// its loops at once.
pub struct Running {
    engine: Arc<LockEngine>,
    loops: Vec<JoinHandle<()>>,
    reaper: Option<JoinHandle<()>>,
}

impl Running {
    /// Spawns the engine's loops (on the current runtime): the reaper too
    /// when `reap_interval` is set.
    pub(super) fn start(
        engine: Arc<LockEngine>,
        store: Store,
        reap_interval: Option<Duration>,
        replica: String,
        libraries: Option<Libraries>,
    ) -> Running {
        let layout = engine.calls.layout();
        let mut loops = vec![
            tokio::spawn(run_subscriber(
                engine.waiters().clone(),
                engine.watchers().clone(),
                store,
                layout.wake_channel(),
                layout.events_channel(),
            )),
            tokio::spawn(engine.clone().run_refresher()),
            tokio::spawn(engine.clone().run_metrics_flusher()),
            tokio::spawn(engine.clone().run_session_renewer()),
            tokio::spawn(engine.clone().run_watch_registry()),
            tokio::spawn(engine.clone().run_expiry_timers()),
        ];
        loops.extend(libraries.map(|libraries| tokio::spawn(libraries.run())));
        let reaper =
            reap_interval.map(|every| tokio::spawn(engine.clone().run_reaper(every, replica)));
        Running {
            engine,
            loops,
            reaper,
        }
    }

    pub fn engine(&self) -> &Arc<LockEngine> {
        &self.engine
    }

    /// Tells waiting Acquires and Session streams to move elsewhere (they
    /// answer UNAVAILABLE and keep their place and grants in Redis); the
    /// start of a drain. Serving goes on for short RPCs.
    pub fn drain(&self) {
        self.engine.waiters().shut_down();
    }

    /// Stops the engine, in this order: waiters and sessions told to move
    /// (as `drain`), the loops stopped, this replica's last per-minute
    /// counts written, the reaper given time to hand its lease over (each
    /// of the last two at most two seconds).
    pub async fn shutdown(mut self) {
        self.drain();
        for task in self.loops.drain(..) {
            task.abort();
        }
        if tokio::time::timeout(SHUTDOWN_STEP, self.engine.counting.flush())
            .await
            .is_err()
        {
            tracing::warn!("the last per-minute counts could not be written");
        }
        if let Some(reaper) = self.reaper.take() {
            let _ = tokio::time::timeout(SHUTDOWN_STEP, reaper).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in self.loops.drain(..).chain(self.reaper.take()) {
            task.abort();
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
    /// Group commit: the hot path's operations of one slot share a call
    /// when more than one is ready (`group.rs`).
    pub group_commit: crate::group::GroupCommit,
    /// A permit freed while someone waits goes to the head of the queue in
    /// the call that freed it (decision 0068); off, the head is woken to
    /// call again. On, a waiter whose replica died within its request TTL
    /// before the release may be handed the lock and keep it for that
    /// grant's lease (SAFETY.md, invariant 7), so it is off by default.
    pub hand_over: bool,
}
