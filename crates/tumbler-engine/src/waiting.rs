//! An Acquire that waits in the lock's queue, in this server: registered
//! with this replica's waiters before its first function call (so no
//! wake-up slips between), it sleeps until a grant is handed to it (the
//! call that freed the permit made it, decision 0068: no call of its own),
//! a wake-up names it, the first lease runs out (at the head of the
//! queue), its wait ends or the replica shuts down. No polling. A guard takes it out of the queue if its RPC
//! goes away while it waits; when the replica drains, the request keeps
//! its place for its queue TTL, for the same holder to take back through
//! another replica.
//!
//! [`Waiting`] owns this replica's waiting RPCs ([`Waiters`]: the
//! registry the subscriber wakes) and the refresher that keeps their
//! requests alive in Redis; the calls themselves are [`Locks`]'.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::deadlock::{Deadlocks, Recorded};
use super::keys::LockKeys;
use super::locks::{self, Locks};
use super::ops::acquire::Outcome;
use super::waiters::{Handed, Waiters};
use super::{AcquireOutcome, AcquireRequest, EngineError, LockId, records};
use crate::errors::{OrTrouble, store_failed};
use crate::store::StoreError;

/// A handed grant whose lease the hand-over cut at its request's liveness
/// deadline (`lua/shared/permits.lua` `hand_over`): it ends before the
/// lease asked, counted from the hand-over.
fn provisional(grant: &super::Grant) -> bool {
    grant.expires_at_ms < grant.acquired_at_ms.saturating_add(grant.ttl_ms as i64)
}

/// Acquires that wait in this server.
pub(super) struct Waiting {
    waiters: Arc<Waiters>,
    locks: Arc<Locks>,
    /// The wait-for registry a waiter that may hold other locks records
    /// its wait in (decision 0077).
    deadlocks: Deadlocks,
    /// Waiters name their request, so freed permits are handed to them.
    hand_over: bool,
}

impl Waiting {
    pub(super) fn new(
        waiters: Arc<Waiters>,
        locks: Arc<Locks>,
        deadlocks: Deadlocks,
        hand_over: bool,
    ) -> Self {
        // A grant handed to a request of this replica whose RPC is gone
        // goes back at once (pinned to its token).
        let giving_back = locks.clone();
        waiters.on_orphan(Arc::new(move |(queue_key, holder, token, request)| {
            let locks = giving_back.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        locks.give_back(&queue_key, &holder, token, &request).await
                    });
                }
                Err(_) => tracing::warn!(holder, "a handed grant left to its lease"),
            }
        }));
        Waiting {
            waiters,
            locks,
            deadlocks,
            hand_over,
        }
    }

    /// This replica's waiting RPCs (and its shutdown signal).
    pub(super) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    /// Takes a permit, waiting in the lock's queue until granted or
    /// `req.wait` (not zero) has passed; the caller checked readiness and
    /// noted the namespace.
    pub(super) async fn acquire(
        &self,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, EngineError> {
        let keys = &self.locks.keys(&req.lock);
        let metadata = &records::metadata_arg(&req.metadata);
        let deadline = Instant::now() + req.wait;
        // Registered before the first call: no wake-up is missed.
        let registration = self.waiters.register(
            &req.lock.namespace,
            keys,
            &req.lock.name,
            &req.holder,
            req.queue_ttl_ms,
            req.fair,
        )?;
        let request = registration.request().to_owned();
        // Its caller is told no at the end of its wait or at its deadline:
        // no permit may be handed to it after that.
        let answer_by = req.answer_by.map_or(deadline, |at| at.min(deadline));
        // Leaves the queue if this future is dropped (client cancelled,
        // deadline passed) or fails while queued.
        let mut queued = QueuedGuard {
            locks: self.locks.clone(),
            waiters: self.waiters.clone(),
            lock: req.lock.clone(),
            keys: keys.clone(),
            holder: req.holder.to_string(),
            request: request.clone(),
            armed: false,
        };
        // Its edges in the wait-for registry while it waits (removed when
        // this is dropped); checked once, once it has waited
        // `deadlock_check_after` (a wait that ends sooner, as a hot lock's
        // do, pays nothing for detection: decision 0077).
        let mut _recorded: Option<Recorded> = None;
        let mut checked = req.holds_nothing;
        let check_at = Instant::now() + deadlock_check_after(req.wait);
        loop {
            let wait_left = deadline.saturating_duration_since(Instant::now());
            let wait = locks::Waiting {
                left: wait_left,
                request: &request,
                answer_by: self.hand_over.then_some(answer_by),
            };
            let answer = self
                .locks
                .attempt(req, keys, metadata, Some(wait))
                .await
                .or_trouble()?;
            let (holders, next_expiry, position) = match answer.outcome {
                Outcome::Queued {
                    holders,
                    next_expiry,
                    position,
                } => (holders, next_expiry, position),
                outcome => {
                    // A grant handed to it meanwhile is the one this call
                    // found (HELD): it is answered, never given back.
                    registration.take_handed();
                    // Queued before and holding now: its grant was handed
                    // to it (a hand-over whose message it missed).
                    let outcome = match outcome {
                        Outcome::Granted {
                            grant,
                            holders,
                            downgraded,
                            ..
                        } if queued.armed => Outcome::Granted {
                            grant,
                            holders,
                            already: false,
                            downgraded,
                        },
                        outcome => outcome,
                    };
                    queued.armed = false;
                    return self.locks.settled(req, outcome)?.ok_or_else(|| {
                        store_failed(StoreError::Protocol(
                            "acquire answered busy to a waiting call".into(),
                        ))
                    });
                }
            };
            queued.armed = true;
            if !checked && Instant::now() >= check_at {
                checked = true;
                let left = deadline.saturating_duration_since(Instant::now());
                match self.deadlocks.check(req, &request, left).await {
                    Ok(recorded) => _recorded = recorded,
                    Err(EngineError::Deadlock(cycle)) => {
                        // Refused: nothing of it stays in the queue (a
                        // grant handed meanwhile ended the cycle: it is
                        // the answer).
                        queued.armed = false;
                        self.locks
                            .dequeue(&req.lock, keys, &req.holder, Some(&request), false)
                            .await
                            .or_trouble()?;
                        if let Some(handed) = registration.take_handed() {
                            if let Some(outcome) = self.handed(req, &handed)? {
                                return Ok(outcome);
                            }
                            self.give_back(req, &request, &handed).await;
                        }
                        return Err(EngineError::Deadlock(cycle));
                    }
                    // A failed check only misses a cycle: the wait goes on.
                    Err(err) => {
                        tracing::warn!(error = %err, lock = %req.lock.name, "deadlock check failed")
                    }
                }
            }
            // At the head, also wake when the first lease runs out, so an
            // expiry hands over without a release. (Only the head can be
            // granted; it wakes the next one while permits remain.)
            let expiry = (next_expiry > 0 && position == 1).then(|| {
                Instant::now() + Duration::from_millis((next_expiry - answer.now).max(0) as u64 + 1)
            });
            tokio::select! {
                () = registration.notified() => {
                    if let Some(handed) = registration.take_handed()
                        && let Some(outcome) = self.handed(req, &handed)?
                    {
                        queued.armed = false;
                        return Ok(outcome);
                    }
                    // A provisional grant: the next attempt takes it up
                    // (HELD, with the lease asked; lapsed, it is in line
                    // again).
                }
                () = sleep_until_some(expiry) => {}
                // Still waiting when the deadlock check is due: one more
                // attempt (a permit may have freed), then the check.
                () = sleep_until_some((!checked).then_some(check_at)) => {}
                () = tokio::time::sleep_until(deadline) => {
                    queued.armed = false;
                    let had = self.locks.dequeue(&req.lock, keys, &req.holder, Some(&request), true).await.or_trouble()?;
                    // A grant handed over before its answer-by time and
                    // delivered meanwhile is still its caller's; a
                    // provisional one, not taken up, goes back.
                    if let Some(handed) = registration.take_handed() {
                        if let Some(outcome) = self.handed(req, &handed)? {
                            return Ok(outcome);
                        }
                        self.give_back(req, &request, &handed).await;
                    }
                    return Ok(AcquireOutcome::TimedOut {
                        holders,
                        next_expiry_at_ms: next_expiry,
                        position: if had > 0 { had } else { position },
                    });
                }
                () = stopped(req.stop.as_ref()) => {
                    // The caller may no longer wait (its token was
                    // revoked): leave the queue, grant nothing more (a
                    // grant handed meanwhile goes back with the
                    // registration).
                    queued.armed = false;
                    self.locks.dequeue(&req.lock, keys, &req.holder, Some(&request), false).await.or_trouble()?;
                    return Err(EngineError::Stopped);
                }
                () = self.waiters.shutdown_token().cancelled() => {
                    // The replica drains: the request keeps its place for
                    // its queue TTL, so the same holder retried on another
                    // replica takes it back (or it is dropped as dead).
                    // A provisional grant handed meanwhile is left to its
                    // deadline, for that retry to take up (HELD).
                    queued.armed = false;
                    if let Some(handed) = registration.take_handed()
                        && let Some(outcome) = self.handed(req, &handed)?
                    {
                        return Ok(outcome);
                    }
                    return Err(EngineError::ShuttingDown);
                }
            }
        }
    }

    /// One page of a namespace's current wait-for chains (`deadlock.rs`).
    pub(super) async fn wait_chains(
        &self,
        namespace: &super::Namespace,
        page: Option<u64>,
    ) -> Result<super::WaitChainsPage, EngineError> {
        self.deadlocks.chains(namespace, page).await
    }

    /// A grant handed to this waiting RPC, as its answer; None for a
    /// provisional one (its lease cut at the request's liveness deadline:
    /// decision 0089), which is this RPC's only once taken up: the next
    /// attempt, an acquire of the holder, finds it (HELD) and extends it
    /// to the lease asked.
    fn handed(
        &self,
        req: &AcquireRequest,
        handed: &Handed,
    ) -> Result<Option<AcquireOutcome>, EngineError> {
        let grant = records::parse_grant(req.holder.as_ref(), &handed.record).or_trouble()?;
        if provisional(&grant) {
            return Ok(None);
        }
        let outcome = Outcome::Granted {
            grant,
            holders: handed.holders,
            already: false,
            downgraded: false,
        };
        Ok(Some(
            self.locks
                .settled(req, outcome)?
                .expect("a grant is an outcome"),
        ))
    }

    /// Gives back a provisional grant handed to this RPC, which ends
    /// before taking it up (its wait ended, a deadlock refused it), pinned
    /// to its token and to `request`.
    async fn give_back(&self, req: &AcquireRequest, request: &str, handed: &Handed) {
        match records::parse_grant(req.holder.as_ref(), &handed.record) {
            Ok(grant) => {
                (self.locks)
                    .give_back_to(&req.lock, req.holder.as_ref(), grant.fencing_token, request)
                    .await
            }
            Err(err) => tracing::warn!(error = %err, "a handed grant that cannot be read"),
        }
    }

    /// Keeps this replica's waiting requests alive until the replica shuts
    /// down (the waiters' shutdown signal): per lock, one function call
    /// every queue_ttl/3.
    pub(super) async fn run_refresher(&self) {
        let shutdown = self.waiters.shutdown_token().clone();
        loop {
            let (due, next) = self.waiters.take_due(Instant::now());
            let mut calls = tokio::task::JoinSet::new();
            for batch in due {
                let (locks, waiters) = (self.locks.clone(), self.waiters.clone());
                calls.spawn(async move {
                    match locks.refresh(&batch).await {
                        Ok(lost) if !lost.is_empty() => {
                            // Their place is gone: let them queue again.
                            let lost: Vec<&str> = lost.iter().map(String::as_str).collect();
                            waiters.wake(&batch.keys.queue, &lost);
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
}

pub(super) async fn stopped(stop: Option<&tokio_util::sync::CancellationToken>) {
    match stop {
        Some(stop) => stop.cancelled().await,
        None => std::future::pending().await,
    }
}

/// How long a wait lasts before its deadlock check (decision 0077): a
/// tenth of the wait, at least 50 ms and at most a second. A cycle is
/// refused that soon after it closes, long before the wait would time out;
/// a wait that ends sooner (a hot lock's) never pays for the check.
pub(super) fn deadlock_check_after(wait: Duration) -> Duration {
    (wait / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

pub(super) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Takes a waiting request out of the queue when its RPC goes away while
/// queued (dropped future: client cancelled, deadline passed, error).
struct QueuedGuard {
    locks: Arc<Locks>,
    waiters: Arc<Waiters>,
    lock: LockId,
    keys: LockKeys,
    holder: String,
    /// Its request id: a place another request of the holder took over
    /// is left alone (finding 6).
    request: String,
    armed: bool,
}

impl Drop for QueuedGuard {
    fn drop(&mut self) {
        // On a draining replica the request keeps its place (see above).
        if !self.armed || self.waiters.shutdown_token().is_cancelled() {
            return;
        }
        let locks = self.locks.clone();
        let (lock, keys, holder) = (self.lock.clone(), self.keys.clone(), self.holder.clone());
        let request = self.request.clone();
        tokio::spawn(async move {
            if let Err(err) = locks
                .dequeue(&lock, &keys, &holder, Some(&request), false)
                .await
            {
                // Its liveness deadline will drop it instead.
                tracing::warn!(error = %err, lock = %lock.name, "leaving the queue failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::deadlock_check_after;
    use std::time::Duration;

    #[test]
    fn the_deadlock_check_comes_after_a_tenth_of_the_wait_within_bounds() {
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(deadlock_check_after(ms(1)), ms(50));
        assert_eq!(deadlock_check_after(ms(300)), ms(50));
        assert_eq!(deadlock_check_after(ms(2_000)), ms(200));
        assert_eq!(deadlock_check_after(ms(30_000)), ms(1_000));
    }
}
