//! The engine's background loops, each running until the replica shuts
//! down: the refresher (keeps this replica's waiting requests alive), the
//! session renewer (keeps session grants alive), the reaper (one replica
//! at a time cleans up what nobody released), the counter flusher (adds
//! this replica's per-minute counts to Redis) and the watch registry
//! (which namespaces some replica watches, so functions publish events
//! only for those).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::sessions::Renewal;
use super::{
    AcquireRequest, ExtendOutcome, LockEngine, LockId, METRICS_RETENTION_MS, keys, ops, waiters,
};
use crate::store::StoreError;

/// How long a namespace stays in the watch registry without a renewal.
const WATCHING_TTL_MS: i64 = 30_000;
/// How often a replica with watchers renews its namespaces there.
const WATCHING_RENEW_EVERY: Duration = Duration::from_secs(5);

impl LockEngine {
    /// Renews this replica's requests on one lock; returns the ids whose
    /// place was lost meanwhile.
    async fn refresh(&self, batch: &waiters::RefreshBatch) -> Result<Vec<String>, StoreError> {
        let call = ops::refresh::Call {
            watched: self.emits(&batch.namespace),
            requests: &batch.requests,
        };
        let reply = self
            .call_lock(&self.scripts.refresh, &batch.keys, &call.args())
            .await?;
        let answer = ops::refresh::parse(reply)?;
        self.clock.observe(answer.now);
        self.count_noted(&batch.namespace, answer.now, &answer.noted);
        Ok(answer.lost)
    }

    /// Keeps this replica's waiting requests alive until shutdown: per
    /// lock, one function call every queue_ttl/3.
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
                    .shard_of(&renewal.key.lock.namespace, &renewal.key.lock.name);
                by_shard
                    .entry((renewal.key.lock.namespace.to_string(), shard))
                    .or_default()
                    .push(renewal);
            }
            for ((namespace, shard), renewals) in by_shard {
                for batch in renewals.chunks(BATCH) {
                    let engine = self.clone();
                    let keys = self.layout.shard_keys(&namespace, shard);
                    let batch = batch.to_vec();
                    let namespace = namespace.clone();
                    calls.spawn(async move { engine.renew(&namespace, &keys, &batch).await });
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
    async fn renew(&self, namespace: &str, keys: &keys::ShardKeys, batch: &[Renewal]) {
        let sent_at = Instant::now();
        let items: Vec<ops::renew::Item> = batch
            .iter()
            .map(|r| ops::renew::Item {
                name: &r.key.lock.name,
                holder: &r.key.session,
                token: r.token,
                ttl_ms: r.ttl.as_millis() as u64,
                epoch: r.key.epoch,
            })
            .collect();
        match self.renew_call(namespace, keys, &items).await {
            Ok(ops::renew::Outcome::Renewed { lost, moved }) => {
                for (i, renewal) in batch.iter().enumerate() {
                    if lost.contains(&i) {
                        self.sessions.lost(&renewal.key);
                    } else if moved.contains(&i) {
                        self.sessions.moved(&renewal.key);
                    } else {
                        self.sessions.renewed(&renewal.key, sent_at);
                    }
                }
            }
            Ok(ops::renew::Outcome::Late) => self.renewals_failed(batch, "ran late"),
            Err(err) => self.renewals_failed(batch, &err.to_string()),
        }
    }

    /// Renews grants of one shard now (a resumed session's): the indexes
    /// of those that are gone, and of those a newer stream holds.
    pub(super) async fn renew_items(
        &self,
        namespace: &str,
        shard: u32,
        items: &[ops::renew::Item<'_>],
    ) -> Result<(Vec<usize>, Vec<usize>), super::EngineError> {
        let keys = self.layout.shard_keys(namespace, shard);
        match self.renew_call(namespace, &keys, items).await? {
            ops::renew::Outcome::Renewed { lost, moved } => Ok((lost, moved)),
            ops::renew::Outcome::Late => Err(super::late().into()),
        }
    }

    /// One `renew.lua` call.
    async fn renew_call(
        &self,
        namespace: &str,
        keys: &keys::ShardKeys,
        items: &[ops::renew::Item<'_>],
    ) -> Result<ops::renew::Outcome, StoreError> {
        let call = ops::renew::Call {
            answer_by: self.answer_by(None),
            live: self.counts_live(),
            watched: self.emits(namespace),
            items,
        };
        let answer = self
            .call(&self.scripts.renew, &keys.fence, &call.args())
            .await
            .and_then(ops::renew::parse)?;
        self.clock.observe(answer.now);
        self.count_noted(namespace, answer.now, &answer.noted);
        Ok(answer.outcome)
    }

    fn renewals_failed(&self, batch: &[Renewal], why: &str) {
        tracing::warn!(error = %why, grants = batch.len(), "renewing session grants failed");
        let now = Instant::now();
        for renewal in batch {
            self.sessions.failed(&renewal.key, now);
        }
    }

    /// The background reaper: every `interval`, the replica that holds the
    /// tumbler lock `tumbler-system/reaper` reaps every lock (one SCAN of
    /// the lock keys). Its lease is three intervals long and renewed each
    /// round, so when that replica dies another one takes over within
    /// three intervals; a replica shutting down releases it at once.
    ///
    /// A replica that cannot take the lock while no reaper with such a
    /// lease holds it (Redis failing, a holder with a longer lease or
    /// another limit) for longer than one lease logs an error and counts
    /// `tumbler_reaper_lock_unavailable_total` each round until it can:
    /// reaping may have stopped everywhere.
    pub async fn run_reaper(self: Arc<Self>, interval: Duration, replica: String) {
        let lock = LockId::reaper();
        let lease_ms = (interval.as_millis() as u64).saturating_mul(3).max(1);
        let shutdown = self.waiters.shutdown_token().clone();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut kept_out = KeptOut::default();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            if !self.is_layout_verified() {
                continue;
            }
            let lease = self.take_reaper_lease(&lock, &replica, lease_ms).await;
            match &lease {
                Ok(Lease::Held) => self.reap_everything().await,
                Ok(Lease::Elsewhere) => {}
                Ok(Lease::Blocked(why)) => tracing::debug!(%why, "reaper lock unavailable"),
                Err(err) => tracing::debug!(error = %err, "reaper lock unavailable"),
            }
            let blocked = match lease {
                Ok(Lease::Held | Lease::Elsewhere) => None,
                Ok(Lease::Blocked(why)) => Some(why),
                Err(err) => Some(err.to_string()),
            };
            kept_out.round(blocked, Duration::from_millis(lease_ms));
        }
        if let Err(err) = self.release(&lock, &replica, None).await {
            tracing::debug!(error = %err, "could not hand the reaper lease over");
        }
    }

    /// Takes or renews the reaper lease.
    async fn take_reaper_lease(
        &self,
        lock: &LockId,
        replica: &str,
        lease_ms: u64,
    ) -> Result<Lease, super::EngineError> {
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
            answer_by: None,
            session_epoch: None,
            stop: None,
        };
        // A try-once attempt needs no Arc (it does not wait).
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let answer = self.attempt(&request, &keys, "", None).await?;
        Ok(match answer.outcome {
            ops::acquire::Outcome::Granted { already: false, .. } => {
                tracing::info!(%replica, "this replica is now the reaper");
                Lease::Held
            }
            ops::acquire::Outcome::Granted { already: true, .. } => {
                match self.extend(lock, replica, Some(lease_ms), None).await? {
                    ExtendOutcome::Extended(_) => Lease::Held,
                    ExtendOutcome::NotHeld => Lease::Elsewhere,
                }
            }
            // A reaper's lease ends within one lease (and a round) from
            // now; anything held longer is not a reaper like this one.
            ops::acquire::Outcome::Busy { next_expiry, .. }
                if next_expiry - answer.now > (lease_ms + lease_ms / 3) as i64 =>
            {
                Lease::Blocked(format!(
                    "held for {} ms more, past a reaper's lease of {lease_ms} ms",
                    next_expiry - answer.now
                ))
            }
            ops::acquire::Outcome::Busy { .. } => Lease::Elsewhere,
            ops::acquire::Outcome::LimitMismatch { lock_limit } => {
                Lease::Blocked(format!("held with limit {lock_limit}"))
            }
            other => Lease::Blocked(format!("{other:?}")),
        })
    }

    async fn reap_everything(&self) {
        match self.reap_matching(None, None).await {
            Ok(counts) => {
                crate::observe::reaped(
                    counts.expired_holders,
                    counts.dead_waiters,
                    counts.stale_index_entries,
                );
                if counts.removed_any() {
                    tracing::info!(
                        expired_holders = counts.expired_holders,
                        dead_waiters = counts.dead_waiters,
                        locks_visited = counts.locks_visited,
                        "reaped"
                    );
                }
            }
            Err(err) => tracing::warn!(error = %err, "reaping failed"),
        }
        crate::observe::reaper_run();
    }

    /// Every second, adds the counts this replica made to the shared
    /// per-minute counters: one `count.lua` call per namespace and minute.
    /// Counts that cannot be written wait for the next round. It runs
    /// until aborted; the server then writes the last counts itself
    /// ([`Self::flush_counts`]), after the last RPC.
    pub async fn run_metrics_flusher(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.flush_counts().await;
        }
    }

    /// Writes the counts made so far (see [`Self::run_metrics_flusher`]).
    pub async fn flush_counts(&self) {
        for batch in self.tally.take() {
            let key = self.layout.metrics_key(&batch.namespace, batch.minute_ms);
            let args = ops::count::args(METRICS_RETENTION_MS, &batch.counts);
            if let Err(err) = self.call(&self.scripts.count, &key, &args).await {
                tracing::debug!(error = %err, "per-minute counters not written yet");
                self.tally.put_back(batch);
            }
        }
    }

    /// Keeps the watch registry: this replica's watched namespaces are
    /// renewed there every few seconds, and every second it learns which
    /// namespaces any replica watches (announcements on the wake channel
    /// tell it sooner: see [`Self::announce_watch`]).
    pub async fn run_watch_registry(self: Arc<Self>) {
        let shutdown = self.waiters.shutdown_token().clone();
        let mut renewed_at: Option<Instant> = None;
        loop {
            let local = self.watchers.namespaces();
            let due = renewed_at.is_none_or(|at| at.elapsed() >= WATCHING_RENEW_EVERY);
            if !local.is_empty() && due && self.register_watching(&local).await.is_ok() {
                renewed_at = Some(Instant::now());
            }
            let mut read = redis::cmd("ZRANGEBYSCORE");
            read.arg(self.layout.watching_key())
                .arg(self.clock.now_ms())
                .arg("+inf");
            match self.store.command::<Vec<String>>(read).await {
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
    async fn register_watching(&self, namespaces: &[String]) -> Result<(), StoreError> {
        let key = self.layout.watching_key();
        let now = self.clock.now_ms();
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
        self.store.pipeline::<()>(pipe).await
    }

    /// A watcher on this replica starts watching `namespace`: record it in
    /// the registry and tell every replica at once (on the wake channel),
    /// so their function calls publish its events from now on.
    pub async fn announce_watch(&self, namespace: &str) -> Result<(), StoreError> {
        self.watchers.mark_watched(namespace);
        self.register_watching(&[namespace.to_owned()]).await?;
        let mut publish = redis::cmd("PUBLISH");
        publish
            .arg(self.layout.wake_channel())
            .arg(format!("{}{namespace}", waiters::WATCH_ANNOUNCEMENT));
        self.store.command::<i64>(publish).await?;
        Ok(())
    }
}

/// What a reaper round found about the reaper lock.
enum Lease {
    /// This replica holds it: reap.
    Held,
    /// Another reaper holds it, with a reaper's lease.
    Elsewhere,
    /// Nobody can take it: why.
    Blocked(String),
}

/// How long this replica's reaper has been kept from its lock.
#[derive(Default)]
struct KeptOut {
    since: Option<Instant>,
    alerted: bool,
}

impl KeptOut {
    /// Notes one round (`blocked`: why the lock could not be taken);
    /// past one lease of being kept out, logs once and counts each round.
    fn round(&mut self, blocked: Option<String>, lease: Duration) {
        let Some(why) = blocked else {
            if self.alerted {
                tracing::info!("the reaper lock is available again");
            }
            *self = KeptOut::default();
            return;
        };
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < lease {
            return;
        }
        crate::observe::reaper_lock_unavailable();
        if !self.alerted {
            self.alerted = true;
            tracing::error!(
                %why,
                for_ms = since.elapsed().as_millis() as u64,
                "the reaper cannot take its lock (tumbler-system/reaper); reaping may have stopped on every replica"
            );
        }
    }
}
