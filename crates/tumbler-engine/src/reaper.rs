//! [`Reaper`]: the background reaper. Every interval, the one replica
//! that holds the tumbler lock `tumbler-system/reaper` reaps every lock
//! (one SCAN of the lock keys, `lua/reap.lua` per shard batch), so what
//! nobody released is cleaned up even where no call touches it.
//!
//! It counts its rounds and what it removed in the process-wide metrics
//! registry itself (`metrics` crate; the exporter describes the names):
//! `tumbler_reaper_runs_total`, `tumbler_reaped_total{what}` and
//! `tumbler_reaper_lock_unavailable_total`.

use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::calls::Calls;
use super::locks::{GrantRef, Locks};
use super::walks::Walks;
use super::{AcquireRequest, EngineError, ExtendOutcome, LockId, ReapCounts, ops};
use super::{Holder, Kind, Ttl};
use crate::errors::OrTrouble;

/// The reaper of this replica (it reaps while it holds the reaper lock).
pub(super) struct Reaper {
    calls: Arc<Calls>,
    locks: Arc<Locks>,
    walks: Arc<Walks>,
}

impl Reaper {
    pub(super) fn new(calls: Arc<Calls>, locks: Arc<Locks>, walks: Arc<Walks>) -> Self {
        Reaper {
            calls,
            locks,
            walks,
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
    pub(super) async fn run(
        &self,
        interval: Duration,
        replica: String,
        shutdown: CancellationToken,
    ) {
        let lock = LockId::reaper();
        let lease_ms = (interval.as_millis() as u64).saturating_mul(3).max(1);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut kept_out = KeptOut::default();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            if !self.calls.is_layout_verified() {
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
        if let Err(err) = self.locks.release(&lock, &replica, None, None).await {
            tracing::debug!(error = %err, "could not hand the reaper lease over");
        }
    }

    /// Takes or renews the reaper lease.
    async fn take_reaper_lease(
        &self,
        lock: &LockId,
        replica: &str,
        lease_ms: u64,
    ) -> Result<Lease, EngineError> {
        let request = AcquireRequest {
            kind: Kind::parse("reaper").expect("a valid kind"),
            queue_ttl_ms: lease_ms,
            ..AcquireRequest::new(lock.clone(), Holder::stored(replica), Ttl::stored(lease_ms))
        };
        // A try-once attempt needs no Arc (it does not wait).
        let keys = self.locks.keys(lock);
        let answer = self
            .locks
            .attempt(&request, &keys, "", None)
            .await
            .or_trouble()?;
        Ok(match answer.outcome {
            ops::acquire::Outcome::Granted { already: false, .. } => {
                tracing::info!(%replica, "this replica is now the reaper");
                Lease::Held
            }
            ops::acquire::Outcome::Granted { already: true, .. } => {
                let grant = GrantRef {
                    lock,
                    holder: replica,
                    fencing_token: None,
                };
                match self
                    .locks
                    .extend(grant, Some(Ttl::stored(lease_ms)), None, None)
                    .await?
                {
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
        match self.walks.reap_matching(None, None).await {
            Ok(counts) => {
                count_reaped(&counts);
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
        counter!("tumbler_reaper_runs_total").increment(1);
    }
}

/// What one background reap removed: expired holders, dead waiters,
/// stale index entries (`tumbler_reaped_total`, by `what`).
fn count_reaped(counts: &ReapCounts) {
    for (what, n) in [
        ("expired_holders", counts.expired_holders),
        ("dead_waiters", counts.dead_waiters),
        ("stale_index_entries", counts.stale_index_entries),
    ] {
        if n > 0 {
            counter!("tumbler_reaped_total", "what" => what).increment(n);
        }
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
        counter!("tumbler_reaper_lock_unavailable_total").increment(1);
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
