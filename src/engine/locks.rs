//! The engine's operations on one lock: acquire (once, or waiting in the
//! queue through `waiting.rs`), release, extend, inspect, queue, and a
//! waiter leaving the queue. Each is one call of its Redis function (its
//! typed twin in `ops/`) plus what the replica counts of it.

use std::sync::Arc;

use tokio::time::Instant;

use super::*;

/// A grant as a holder names it: the lock, the holder, and optionally the
/// fencing token it must have.
#[derive(Clone, Copy)]
pub(super) struct GrantRef<'a> {
    pub lock: &'a LockId,
    pub holder: &'a str,
    pub fencing_token: Option<u64>,
}

impl LockEngine {
    /// One acquire function call.
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &LockKeys,
        metadata: &str,
        wait_left: Option<Duration>,
    ) -> Result<ops::acquire::Answer, StoreError> {
        let call = ops::acquire::Call {
            req,
            metadata,
            answer_by: self.answer_by(req.answer_by),
            watched: self.emits(&req.lock.namespace),
            max_locks: self.max_locks_per_shard,
            wait: wait_left.map(|left| ops::acquire::Wait {
                left_ms: left.as_millis() as u64,
                max_waiters: self.max_waiters_per_lock,
            }),
        };
        let reply = self
            .call_granting(
                &self.scripts.acquire,
                &keys.declared(self.counts_live()),
                &call.args(),
                ops::acquire::is_grant,
            )
            .await?;
        let answer = ops::acquire::parse(reply)?;
        self.clock.observe(answer.now);
        self.count_noted(&req.lock.namespace, answer.now, &answer.noted);
        Ok(answer)
    }

    /// An attempt's outcome as this engine answers it: a grant, a refusal
    /// that is an error, or None (not granted: busy or queued).
    pub(super) fn settled(
        &self,
        req: &AcquireRequest,
        outcome: ops::acquire::Outcome,
    ) -> Result<Option<AcquireOutcome>, EngineError> {
        use ops::acquire::Outcome;
        Ok(match outcome {
            Outcome::Granted {
                grant,
                holders,
                already,
            } => {
                if already {
                    Some(AcquireOutcome::AlreadyHeld { grant, holders })
                } else {
                    self.count(&req.lock.namespace, &req.kind, "acquired");
                    Some(AcquireOutcome::Acquired { grant, holders })
                }
            }
            Outcome::Busy { .. } | Outcome::Queued { .. } => None,
            Outcome::QueueFull => return Err(EngineError::QueueFull(self.max_waiters_per_lock)),
            Outcome::NamespaceFull => return Err(EngineError::NamespaceFull),
            Outcome::LimitMismatch { lock_limit } => {
                return Err(EngineError::LimitMismatch {
                    lock_limit,
                    requested: req.limit,
                });
            }
            Outcome::Late => return Err(late().into()),
            Outcome::Moved => return Err(EngineError::SessionMoved),
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
        let metadata = records::metadata_arg(&req.metadata);
        self.note_namespace(&req.lock.namespace).await?;
        if !req.wait.is_zero() {
            return self.acquire_waiting(req, &keys, &metadata).await;
        }
        let answer = self.attempt(req, &keys, &metadata, None).await?;
        if let ops::acquire::Outcome::Busy {
            holders,
            next_expiry,
        } = answer.outcome
        {
            self.count(&req.lock.namespace, &req.kind, "denied");
            return Ok(AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms: next_expiry,
            });
        }
        self.settled(req, answer.outcome)?.ok_or_else(|| {
            StoreError::Protocol("acquire answered queued to a try-once call".into()).into()
        })
    }

    pub async fn release(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.release_as(lock, holder, fencing_token, None).await
    }

    /// [`Self::release`] for a session's stream of `epoch` (Some): refused
    /// with [`EngineError::SessionMoved`] when a newer stream holds it.
    pub(super) async fn release_as(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
        epoch: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let call = ops::release::Call {
            holder,
            token: fencing_token,
            watched: self.emits(&lock.namespace),
            epoch,
        };
        let reply = self
            .call_lock(&self.scripts.release, &keys, &call.args())
            .await?;
        let answer = ops::release::parse(reply)?;
        self.clock.observe(answer.now);
        self.count_noted(&lock.namespace, answer.now, &answer.noted);
        Ok(match answer.outcome {
            ops::release::Outcome::Released(grant) => {
                self.tally
                    .add(&lock.namespace, answer.now, &grant.kind, "released", 1);
                ReleaseOutcome::Released {
                    held_ms: answer.now - grant.acquired_at_ms,
                    kind: grant.kind,
                }
            }
            ops::release::Outcome::NotHeld => ReleaseOutcome::NotHeld,
            ops::release::Outcome::Moved => return Err(EngineError::SessionMoved),
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
        self.extend_by(lock, holder, ttl_ms, fencing_token, None)
            .await
    }

    /// [`Self::extend`] for a caller that stops listening at `answer_by`.
    pub async fn extend_by(
        &self,
        lock: &LockId,
        holder: &str,
        ttl_ms: Option<u64>,
        fencing_token: Option<u64>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        let grant = GrantRef {
            lock,
            holder,
            fencing_token,
        };
        self.extend_as(grant, ttl_ms, answer_by, None).await
    }

    /// [`Self::extend_by`] for a session's stream of `epoch` (Some):
    /// refused with [`EngineError::SessionMoved`] when a newer stream holds
    /// it.
    pub(super) async fn extend_as(
        &self,
        GrantRef {
            lock,
            holder,
            fencing_token,
        }: GrantRef<'_>,
        ttl_ms: Option<u64>,
        answer_by: Option<Instant>,
        epoch: Option<u64>,
    ) -> Result<ExtendOutcome, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let call = ops::extend::Call {
            holder,
            token: fencing_token,
            ttl_ms,
            answer_by: self.answer_by(answer_by),
            watched: self.emits(&lock.namespace),
            epoch,
        };
        let reply = self
            .call_granting(
                &self.scripts.extend,
                &keys.declared(self.counts_live()),
                &call.args(),
                ops::extend::is_grant,
            )
            .await?;
        let answer = ops::extend::parse(reply)?;
        self.clock.observe(answer.now);
        self.count_noted(&lock.namespace, answer.now, &answer.noted);
        match answer.outcome {
            ops::extend::Outcome::Extended(grant) => {
                self.tally
                    .add(&lock.namespace, answer.now, &grant.kind, "extended", 1);
                Ok(ExtendOutcome::Extended(grant))
            }
            ops::extend::Outcome::NotHeld => Ok(ExtendOutcome::NotHeld),
            ops::extend::Outcome::Late => Err(late().into()),
            ops::extend::Outcome::Moved => Err(EngineError::SessionMoved),
        }
    }

    pub async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let reply = self.call_lock(&self.scripts.inspect, &keys, &[]).await?;
        Ok(ops::inspect::parse(reply)?)
    }

    /// The live waiting requests of a lock in grant order (at most `most`).
    pub async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let reply = self
            .call_lock(&self.scripts.queue, &keys, &ops::queue::args(most))
            .await?;
        Ok(ops::queue::parse(reply)?)
    }

    /// Takes a waiting request out of the queue; returns the position it
    /// had (0 when it was not queued). A timed-out one is counted.
    pub(super) async fn dequeue(
        &self,
        lock: &LockId,
        keys: &LockKeys,
        holder: &str,
        timed_out: bool,
    ) -> Result<u32, StoreError> {
        let call = ops::dequeue::Call {
            id: holder,
            watched: self.emits(&lock.namespace),
        };
        let reply = self
            .call_lock(&self.scripts.dequeue, keys, &call.args())
            .await?;
        let answer = ops::dequeue::parse(reply)?;
        self.count_noted(&lock.namespace, answer.now, &answer.noted);
        if timed_out && answer.position > 0 {
            self.tally
                .add(&lock.namespace, answer.now, &answer.kind, "timed_out", 1);
        }
        Ok(answer.position)
    }
}
