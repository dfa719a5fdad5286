//! [`Locks`]: the engine's operations on one lock: acquire once (waiting
//! in the queue is `waiting.rs`'s, built on these), release, extend,
//! inspect, queue, a waiter leaving the queue, this replica's waiters
//! kept alive (`refresh`) and a watched lock purged at a lease's end.
//! Each is one call of its Redis function (its typed twin in `ops/`),
//! plus what the replica counts of it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::calls::{Calls, late};
use super::changelog::Changelog;
use super::counting::Counting;
use super::keys::LockKeys;
use super::waiters::Waiters;
use super::{
    AcquireOutcome, AcquireRequest, EngineError, ExtendOutcome, LockId, LockState, QueueState,
    ReleaseOutcome, ops, records, waiters,
};
use crate::errors::{OrTrouble, store_failed};
use crate::store::StoreError;

/// A grant as a holder names it: the lock, the holder, and optionally the
/// fencing token it must have.
#[derive(Clone, Copy)]
pub(super) struct GrantRef<'a> {
    pub lock: &'a LockId,
    pub holder: &'a str,
    pub fencing_token: Option<u64>,
}

/// The waiting part of an acquire call.
#[derive(Clone, Copy)]
pub(super) struct Waiting<'a> {
    /// How long the caller still waits.
    pub left: Duration,
    /// The waiting RPC's request id.
    pub request: &'a str,
    /// When its caller is told no (its wait's end or its deadline): no
    /// permit is handed to it after that (None: not a hand-over waiter).
    pub answer_by: Option<Instant>,
}

/// Calls on one lock, and the limits they pass to Redis.
pub(super) struct Locks {
    calls: Arc<Calls>,
    counting: Arc<Counting>,
    /// Where a namespace's events go (the flags every call passes).
    changelog: Arc<Changelog>,
    /// Waiting requests one lock's queue may hold.
    max_waiters_per_lock: u32,
    /// Locks a namespace may have per shard (0: no limit).
    max_locks_per_shard: u64,
    /// This replica's waiting requests: a release of a lock one of them
    /// waits on says so (decision 0090).
    waiters: Arc<Waiters>,
}

impl Locks {
    pub(super) fn new(
        calls: Arc<Calls>,
        counting: Arc<Counting>,
        changelog: Arc<Changelog>,
        max_waiters_per_lock: u32,
        max_locks_per_shard: u64,
        waiters: Arc<Waiters>,
    ) -> Self {
        Locks {
            calls,
            counting,
            changelog,
            max_waiters_per_lock,
            max_locks_per_shard,
            waiters,
        }
    }

    /// The keys of a lock.
    pub(super) fn keys(&self, lock: &LockId) -> LockKeys {
        self.calls.layout().lock_keys(&lock.namespace, &lock.name)
    }

    /// One acquire function call; `wait`: the waiting call's time left,
    /// and for a hand-over waiter its request id and when its caller is
    /// told no (decision 0068).
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &LockKeys,
        metadata: &str,
        wait: Option<Waiting<'_>>,
    ) -> Result<ops::acquire::Answer, StoreError> {
        let call = ops::acquire::Call {
            req,
            metadata,
            answer_by: self.calls.answer_by(req.answer_by),
            watched: self.changelog.emits(&req.lock.namespace),
            max_locks: self.max_locks_per_shard,
            wait: wait.map(|w| ops::acquire::Wait {
                left_ms: w.left.as_millis() as u64,
                max_waiters: self.max_waiters_per_lock,
                request: w.request.to_owned(),
                hand_answer_by: w.answer_by.map(|at| {
                    self.calls.now_ms()
                        + at.saturating_duration_since(Instant::now()).as_millis() as i64
                }),
            }),
        };
        let reply = self
            .calls
            .call_granting(|s| &s.acquire, keys, &call.args(), ops::acquire::is_grant)
            .await?;
        let answer = ops::acquire::parse(reply)?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&req.lock.namespace, answer.now, &answer.noted);
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
                mut grant,
                holders,
                already,
                downgraded,
            } => {
                // A grant's mode is what its request asked (a writer that
                // asks READ was downgraded: its grant reads now).
                grant.mode = req.mode;
                if already {
                    Some(AcquireOutcome::AlreadyHeld { grant, holders })
                } else {
                    // A downgrade is no new grant: counted as itself, and
                    // its release once, against the write it began as.
                    let event = if downgraded { "downgraded" } else { "acquired" };
                    self.counting.now(&req.lock.namespace, &req.kind, event);
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
            Outcome::ModeMismatch { rw_lock: true } => return Err(EngineError::RwLockNeedsMode),
            Outcome::ModeMismatch { rw_lock: false } => {
                return Err(EngineError::PlainLockHasNoMode);
            }
            Outcome::Upgrade => return Err(EngineError::UpgradeRefused),
            Outcome::Late => return Err(store_failed(late())),
            Outcome::Moved => return Err(EngineError::SessionMoved),
        })
    }

    /// Takes a permit if one is free now (a try-once Acquire: `req.wait`
    /// is zero); the caller checked readiness and noted the namespace.
    pub(super) async fn acquire_once(
        &self,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, EngineError> {
        let keys = self.keys(&req.lock);
        let metadata = records::metadata_arg(&req.metadata);
        let answer = self
            .attempt(req, &keys, &metadata, None)
            .await
            .or_trouble()?;
        if let ops::acquire::Outcome::Busy {
            holders,
            next_expiry,
        } = answer.outcome
        {
            self.counting.now(&req.lock.namespace, &req.kind, "denied");
            return Ok(AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms: next_expiry,
            });
        }
        self.settled(req, answer.outcome)?.ok_or_else(|| {
            store_failed(StoreError::Protocol(
                "acquire answered queued to a try-once call".into(),
            ))
        })
    }

    /// Acquire's `takes_over` (decision 0083): `old`'s live grant passes
    /// to the request's holder in one call. None when `old` holds none (or
    /// the holder holds one already): the caller then acquires as usual.
    pub(super) async fn take_over(
        &self,
        req: &AcquireRequest,
        old: &str,
    ) -> Result<Option<AcquireOutcome>, EngineError> {
        use ops::take_over::Outcome;
        let keys = self.keys(&req.lock);
        let metadata = records::metadata_arg(&req.metadata);
        let call = ops::take_over::Call {
            req,
            old,
            metadata: &metadata,
            answer_by: self.calls.answer_by(req.answer_by),
            watched: self.changelog.emits(&req.lock.namespace),
        };
        let reply = self
            .calls
            .call_granting(
                |s| &s.take_over,
                &keys,
                &call.args(),
                ops::take_over::is_grant,
            )
            .await
            .or_trouble()?;
        let answer = ops::take_over::parse(reply).or_trouble()?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&req.lock.namespace, answer.now, &answer.noted);
        Ok(match answer.outcome {
            Outcome::TookOver { grant, holders } => {
                // Counted as a release of the old grant and a new grant.
                self.counting
                    .now(&req.lock.namespace, &req.kind, "released");
                self.counting
                    .now(&req.lock.namespace, &req.kind, "acquired");
                Some(AcquireOutcome::Acquired { grant, holders })
            }
            Outcome::NotHeld => None,
            Outcome::LimitMismatch { lock_limit } => {
                return Err(EngineError::LimitMismatch {
                    lock_limit,
                    requested: req.limit,
                });
            }
            Outcome::ModeMismatch => return Err(EngineError::RwLockNeedsMode),
            Outcome::NotYours => return Err(EngineError::NotPassed),
            Outcome::Late => return Err(store_failed(late())),
        })
    }

    /// Releases a grant; for a session's stream of `epoch` (Some), refused
    /// with [`EngineError::SessionMoved`] when a newer stream holds it.
    pub(super) async fn release(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
        epoch: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.release_as(lock, holder, fencing_token, epoch, None, None)
            .await
    }

    /// [`Self::release`] of an election's grant by its leader, proved by
    /// the digest of its secret (Resign, decision 0082).
    pub(super) async fn release_proved(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: u64,
        proof: &str,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.release_as(lock, holder, Some(fencing_token), None, None, Some(proof))
            .await
    }

    /// [`Self::release`], for `handed`: a request of this replica that was
    /// handed the grant and is gone (decision 0068).
    async fn release_as(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
        epoch: Option<u64>,
        handed: Option<&str>,
        proof: Option<&str>,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.calls.ready().or_trouble()?;
        let keys = self.keys(lock);
        let call = ops::release::Call {
            holder,
            token: fencing_token,
            watched: self.changelog.emits(&lock.namespace),
            epoch,
            handed,
            proof,
            alive: self.waiters.waits_here(&keys.queue),
        };
        let reply = self
            .calls
            .call_lock(|s| &s.release, &keys, &call.args())
            .await
            .or_trouble()?;
        let answer = ops::release::parse(reply).or_trouble()?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&lock.namespace, answer.now, &answer.noted);
        Ok(match answer.outcome {
            ops::release::Outcome::Released(grant) => {
                self.counting
                    .at(&lock.namespace, answer.now, &grant.kind, "released");
                ReleaseOutcome::Released {
                    held_ms: answer.now - grant.acquired_at_ms,
                    kind: grant.kind,
                }
            }
            ops::release::Outcome::NotHeld => ReleaseOutcome::NotHeld,
            ops::release::Outcome::Moved => return Err(EngineError::SessionMoved),
            ops::release::Outcome::NotYours => return Err(EngineError::NotYours),
        })
    }

    /// Resets the remaining lease to `ttl` (or the grant's own ttl),
    /// for a caller that stops listening at `answer_by`; for a session's
    /// stream of `epoch` (Some), refused with [`EngineError::SessionMoved`]
    /// when a newer stream holds it.
    pub(super) async fn extend(
        &self,
        GrantRef {
            lock,
            holder,
            fencing_token,
        }: GrantRef<'_>,
        ttl: Option<crate::Ttl>,
        answer_by: Option<Instant>,
        epoch: Option<u64>,
    ) -> Result<ExtendOutcome, EngineError> {
        self.calls.ready().or_trouble()?;
        let keys = self.keys(lock);
        let call = ops::extend::Call {
            holder,
            token: fencing_token,
            ttl_ms: ttl.map(crate::Ttl::ms),
            answer_by: self.calls.answer_by(answer_by),
            watched: self.changelog.emits(&lock.namespace),
            epoch,
        };
        let reply = self
            .calls
            .call_granting(|s| &s.extend, &keys, &call.args(), ops::extend::is_grant)
            .await
            .or_trouble()?;
        let answer = ops::extend::parse(reply).or_trouble()?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&lock.namespace, answer.now, &answer.noted);
        match answer.outcome {
            ops::extend::Outcome::Extended(grant) => {
                self.counting
                    .at(&lock.namespace, answer.now, &grant.kind, "extended");
                Ok(ExtendOutcome::Extended(grant))
            }
            ops::extend::Outcome::NotHeld => Ok(ExtendOutcome::NotHeld),
            ops::extend::Outcome::Late => Err(store_failed(late())),
            ops::extend::Outcome::Moved => Err(EngineError::SessionMoved),
        }
    }

    pub(super) async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError> {
        self.calls.ready().or_trouble()?;
        let keys = self.keys(lock);
        let reply = self
            .calls
            .call_lock(|s| &s.inspect, &keys, &[])
            .await
            .or_trouble()?;
        ops::inspect::parse(reply).or_trouble()
    }

    /// Some of a lock's live grants other than `holder`'s, for a deadlock
    /// check: at most `ops::blockers::MOST_GRANTS`, whatever the lock's size.
    pub(super) async fn blockers(
        &self,
        lock: &LockId,
        holder: &str,
    ) -> Result<LockState, EngineError> {
        self.calls.ready().or_trouble()?;
        let keys = self.keys(lock);
        let reply = self
            .calls
            .call_lock(|s| &s.blockers, &keys, &ops::blockers::args(holder))
            .await
            .or_trouble()?;
        ops::blockers::parse(reply).or_trouble()
    }

    /// The live waiting requests of a lock in grant order (at most `most`).
    pub(super) async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError> {
        self.calls.ready().or_trouble()?;
        let keys = self.keys(lock);
        let reply = self
            .calls
            .call_lock(|s| &s.queue, &keys, &ops::queue::args(most))
            .await
            .or_trouble()?;
        ops::queue::parse(reply).or_trouble()
    }

    /// Takes a waiting request out of the queue (only if its place is
    /// still `request`'s, when named); returns the position it had (0 when
    /// it was not queued). A timed-out one is counted.
    pub(super) async fn dequeue(
        &self,
        lock: &LockId,
        keys: &LockKeys,
        holder: &str,
        request: Option<&str>,
        timed_out: bool,
    ) -> Result<u32, StoreError> {
        let call = ops::dequeue::Call {
            id: holder,
            watched: self.changelog.emits(&lock.namespace),
            request,
        };
        let reply = self
            .calls
            .call_lock(|s| &s.dequeue, keys, &call.args())
            .await?;
        let answer = ops::dequeue::parse(reply)?;
        self.counting
            .noted(&lock.namespace, answer.now, &answer.noted);
        if timed_out && answer.position > 0 {
            self.counting
                .at(&lock.namespace, answer.now, &answer.kind, "timed_out");
        }
        Ok(answer.position)
    }

    /// Renews this replica's requests on one lock; returns the ids whose
    /// place was lost meanwhile.
    pub(super) async fn refresh(
        &self,
        batch: &waiters::RefreshBatch,
    ) -> Result<Vec<String>, StoreError> {
        let call = ops::refresh::Call {
            watched: self.changelog.emits(&batch.namespace),
            requests: &batch.requests,
        };
        let reply = self
            .calls
            .call_lock(|s| &s.refresh, &batch.keys, &call.args())
            .await?;
        let answer = ops::refresh::parse(reply)?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&batch.namespace, answer.now, &answer.noted);
        Ok(answer.lost)
    }

    /// Gives back a grant handed to `request`, whose RPC is gone (the lock
    /// named by its queue key), pinned to the grant's token, and only
    /// while no other answer claimed it (an acquire of the same holder
    /// answered HELD).
    pub(super) async fn give_back(&self, queue_key: &str, holder: &str, token: u64, request: &str) {
        let Some((_, namespace, name)) = self.calls.layout().parse_lock_key(queue_key) else {
            tracing::warn!(queue_key, "a handed grant of an unknown lock");
            return;
        };
        self.give_back_to(&LockId::stored(namespace, name), holder, token, request)
            .await
    }

    /// [`Self::give_back`] on a lock named by its id.
    pub(super) async fn give_back_to(
        &self,
        lock: &LockId,
        holder: &str,
        token: u64,
        request: &str,
    ) {
        let released = self
            .release_as(lock, holder, Some(token), None, Some(request), None)
            .await;
        if let Err(err) = released {
            // Its lease ends it instead.
            tracing::warn!(error = %err, lock = %lock.name, "giving back a handed grant failed");
        }
    }

    /// One lease-end purge of a watched lock (`lua/purge.lua`); returns
    /// when its next lease may end (None: nobody holds it).
    pub(super) async fn purge(&self, lock: &LockId) -> Result<Option<i64>, StoreError> {
        self.calls.ready()?;
        let keys = self.keys(lock);
        let args = ops::purge::args(self.changelog.emits(&lock.namespace));
        let reply = self.calls.call_lock(|s| &s.purge, &keys, &args).await?;
        let answer = ops::purge::parse(reply)?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&lock.namespace, answer.now, &answer.noted);
        Ok(answer.outcome)
    }
}
