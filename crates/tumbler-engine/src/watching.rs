//! [`Watching`]: the calls behind this replica's Watch streams (the
//! streams themselves, their filters and buffers are `watchers.rs`'s
//! [`Watchers`]): the loop that purges a watched lock at its lease's end
//! (so `expired` is published when a lease ends rather than when some
//! later call touches the lock), a Watch's initial state, and the watch
//! registry in Redis (which namespaces any replica watches, so functions
//! publish events only for those).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::calls::Calls;
use super::locks::Locks;
use super::walks::Walks;
use super::watchers::{Filter, LockEvent, STATE_MAX_LOCKS, SYNCED, WAITING, Watchers};
use super::{EngineError, LockId, waiters};
use crate::store::StoreError;

/// Waiting requests per lock the initial state shows at most.
const STATE_MAX_WAITERS: u32 = 1000;
/// The least time between two purges of one lock (a purge that found its
/// lease not yet ended schedules the next one no sooner).
const PURGE_GAP_MS: i64 = 5;
/// How long a namespace stays in the watch registry without a renewal.
const WATCHING_TTL_MS: i64 = 30_000;
/// How often a replica with watchers renews its namespaces there.
const WATCHING_RENEW_EVERY: Duration = Duration::from_secs(5);

/// This replica's watchers and the calls that serve them.
pub(super) struct Watching {
    watchers: Arc<Watchers>,
    calls: Arc<Calls>,
    locks: Arc<Locks>,
    walks: Arc<Walks>,
}

impl Watching {
    pub(super) fn new(
        watchers: Arc<Watchers>,
        calls: Arc<Calls>,
        locks: Arc<Locks>,
        walks: Arc<Walks>,
    ) -> Self {
        Watching {
            watchers,
            calls,
            locks,
            walks,
        }
    }

    pub(super) fn watchers(&self) -> &Arc<Watchers> {
        &self.watchers
    }

    /// Purges watched locks at their lease ends until shutdown, so that
    /// `expired` is published when a lease ends rather than when some
    /// later call touches the lock (see the module's notes).
    pub(super) async fn run_expiry_timers(&self, shutdown: CancellationToken) {
        loop {
            let wait = match self.watchers.next_lease_end() {
                Some(at) => Duration::from_millis((at - self.calls.now_ms()).max(0) as u64),
                None => Duration::from_secs(3600),
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.watchers.lease_ends_changed() => continue,
                () = tokio::time::sleep(wait) => {}
            }
            let now = self.calls.now_ms();
            let due = self.watchers.take_due_lease_ends(now);
            for (namespace, name) in due {
                if !self.watchers.watched_here(&namespace, &name) {
                    continue;
                }
                let (locks, watchers, calls) = (
                    self.locks.clone(),
                    self.watchers.clone(),
                    self.calls.clone(),
                );
                tokio::spawn(async move {
                    let lock = LockId::stored(namespace, name);
                    match locks.purge(&lock).await {
                        Ok(Some(next)) => watchers.schedule(
                            &lock.namespace,
                            &lock.name,
                            "",
                            next.max(calls.now_ms() + PURGE_GAP_MS),
                        ),
                        Ok(None) => {}
                        Err(err) => {
                            tracing::debug!(error = %err, lock = %lock.name, "lease-end purge failed; retried");
                            watchers.schedule(
                                &lock.namespace,
                                &lock.name,
                                "",
                                calls.now_ms() + 100,
                            );
                        }
                    }
                });
            }
        }
    }

    /// The current state of the locks a watcher wants, as events: one
    /// `held` per live grant, one `waiting` per live waiting request, then
    /// one `synced`. Their lease ends are scheduled like relayed grants'.
    /// With a prefix, at most [`STATE_MAX_LOCKS`] locks are shown.
    pub(super) async fn watch_state(&self, filter: &Filter) -> Result<Vec<LockEvent>, EngineError> {
        let names = match &filter.name {
            Some(name) => vec![name.to_string()],
            None => {
                let mut names = Vec::new();
                let mut from = None;
                loop {
                    let left = STATE_MAX_LOCKS - names.len();
                    let page = self
                        .walks
                        .list(
                            &filter.namespace,
                            &filter.prefix,
                            left.min(500) as u32,
                            from,
                            false,
                        )
                        .await?;
                    names.extend(page.locks.into_iter().map(|l| l.name));
                    match page.next {
                        Some(next) if names.len() < STATE_MAX_LOCKS => from = Some(next),
                        _ => break,
                    }
                }
                names.sort();
                names.dedup();
                names
            }
        };
        let mut events = Vec::new();
        let mut now_ms = self.calls.now_ms();
        for name in names {
            let lock = LockId::stored(filter.namespace.clone(), name);
            let state = self.locks.inspect(&lock).await?;
            now_ms = state.now_ms;
            for grant in state.holders {
                self.watchers.schedule(
                    &lock.namespace,
                    &lock.name,
                    &grant.holder,
                    grant.expires_at_ms,
                );
                events.push(LockEvent::held(&lock, grant, state.now_ms));
            }
            if state.waiters > 0 {
                let queue = self.locks.queue(&lock, STATE_MAX_WAITERS).await?;
                for request in queue.requests {
                    events.push(LockEvent {
                        namespace: lock.namespace.to_string(),
                        name: lock.name.to_string(),
                        event: WAITING.into(),
                        holder: request.holder,
                        at_ms: queue.now_ms,
                        kind: request.kind,
                        mode: request.mode,
                        ..LockEvent::default()
                    });
                }
            }
        }
        events.push(LockEvent {
            namespace: filter.namespace.to_string(),
            event: SYNCED.into(),
            at_ms: now_ms,
            ..LockEvent::default()
        });
        Ok(events)
    }

    /// Keeps the watch registry: this replica's watched namespaces are
    /// renewed there every few seconds, and every second it learns which
    /// namespaces any replica watches (announcements on the wake channel
    /// tell it sooner: see [`Self::announce`]).
    pub(super) async fn run_registry(&self, shutdown: CancellationToken) {
        let mut renewed_at: Option<Instant> = None;
        loop {
            let local = self.watchers.namespaces();
            let due = renewed_at.is_none_or(|at| at.elapsed() >= WATCHING_RENEW_EVERY);
            if !local.is_empty() && due && self.register(&local).await.is_ok() {
                renewed_at = Some(Instant::now());
            }
            let mut read = redis::cmd("ZRANGEBYSCORE");
            read.arg(self.calls.layout().watching_key())
                .arg(self.calls.now_ms())
                .arg("+inf");
            match self.calls.store().command::<Vec<String>>(read).await {
                Ok(anywhere) => self
                    .watchers
                    .set_watched(anywhere.into_iter().collect::<HashSet<_>>()),
                Err(err) => tracing::debug!(error = %err, "watch registry not read"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Records namespaces as watched by this replica for a while.
    async fn register(&self, namespaces: &[String]) -> Result<(), StoreError> {
        let key = self.calls.layout().watching_key();
        let now = self.calls.now_ms();
        let mut pipe = redis::pipe();
        let mut add = redis::cmd("ZADD");
        add.arg(&key).arg("GT");
        for namespace in namespaces {
            add.arg(now + WATCHING_TTL_MS).arg(namespace);
        }
        pipe.add_command(add).ignore();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now)
            .ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(WATCHING_TTL_MS).ignore();
        self.calls.store().pipeline::<()>(pipe).await
    }

    /// A watcher on this replica starts watching `namespace`: record it in
    /// the registry and tell every replica at once (on the wake channel),
    /// so their function calls publish its events from now on.
    pub(super) async fn announce(&self, namespace: &str) -> Result<(), StoreError> {
        self.watchers.mark_watched(namespace);
        self.register(&[namespace.to_owned()]).await?;
        let mut publish = redis::cmd("PUBLISH");
        publish
            .arg(self.calls.layout().wake_channel())
            .arg(format!("{}{namespace}", waiters::WATCH_ANNOUNCEMENT));
        self.calls.store().command::<i64>(publish).await?;
        Ok(())
    }
}
