//! [`Multi`]: multi-locks (decision 0076), several locks of one namespace
//! taken for one holder all or nothing.
//!
//! On one server or Sentinel every lock of the set goes in ONE call of
//! `lua/acquire_many.lua`, atomic. On a Redis Cluster the set is split
//! into slot groups, taken in one global order (slot, then name), each
//! group one atomic call with a short lease (the reservation,
//! [`reservation`]); only when every group is held are the grants extended
//! to the full ttl. A group refused: the groups taken are released again
//! (holder- and token-checked) and the caller waits. A replica that dies
//! between the steps leaves its groups to lapse with their reservation.
//!
//! Waiting holds nothing: a set that cannot be taken whole leaves a
//! wake-up place at the tail of each busy lock's queue (its record names
//! no request, so hand-over wakes it and never grants it), and the
//! caller tries the whole set again when a call on one of its locks wakes
//! it or a lease of a busy lock ends ([`Multi::wait_for_set`]). Two callers
//! asking overlapping sets in any order therefore never deadlock. It does
//! not queue for a turn: a waiting multi-lock competes with single
//! acquires as a barging request does.
//!
//! The work runs on its own task: an RPC that goes away (cancelled, past
//! its deadline) stops it at its next step, and a grant that lands after
//! that is released again, so a caller that is gone holds nothing.
//!
//! A held set's Release and Extend, each lock pinned to its token when
//! asked (decision 0079), one call per slot group as the acquire makes
//! (`lua/release_many.lua`, `lua/extend_many.lua`): [`held`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::calls::{Calls, late};
use super::changelog::Changelog;
use super::counting::Counting;
use super::deadlock::{Deadlocks, Recorded};
use super::keys::LockKeys;
use super::locks::{GrantRef, Locks};
use super::waiters::{Registration, Waiters};
use super::waiting::{sleep_until_some, stopped};
use super::{
    AcquireRequest, EngineError, ExtendOutcome, Grant, LockId, LockName, MultiAcquireRequest,
    MultiOutcome, ops, records,
};
use crate::errors::{OrTrouble, store_failed};
use crate::store::StoreError;
use slot::cluster_slot;

mod held;
mod slot;

/// The longest a set's part may be held as a reservation, whatever the
/// command timeout (a crashed replica's parts lapse by then).
const MAX_RESERVATION: Duration = Duration::from_secs(10);

/// Multi-lock calls, and the limits they pass to Redis.
pub(super) struct Multi {
    calls: Arc<Calls>,
    locks: Arc<Locks>,
    counting: Arc<Counting>,
    changelog: Arc<Changelog>,
    waiters: Arc<Waiters>,
    max_waiters_per_lock: u32,
    max_locks_per_shard: u64,
    /// The wait-for registry its waits are recorded in (decision 0077).
    deadlocks: Deadlocks,
}

/// The locks of one call: their keys and their places in the request.
struct Group {
    keys: Vec<LockKeys>,
    at: Vec<usize>,
}

/// One try of the whole set.
enum Round {
    Granted {
        grants: Vec<Grant>,
        holders: u32,
        already: bool,
    },
    Busy {
        index: usize,
        holders: u32,
        next_expiry: i64,
    },
}

impl Multi {
    pub(super) fn new(
        (calls, locks): (Arc<Calls>, Arc<Locks>),
        counting: Arc<Counting>,
        changelog: Arc<Changelog>,
        waiters: Arc<Waiters>,
        deadlocks: Deadlocks,
        max_waiters_per_lock: u32,
        max_locks_per_shard: u64,
    ) -> Self {
        Multi {
            deadlocks,
            calls,
            locks,
            counting,
            changelog,
            waiters,
            max_waiters_per_lock,
            max_locks_per_shard,
        }
    }

    /// Takes every lock of the set or none, trying once (`wait` zero) or
    /// waiting in this server; the caller checked readiness and noted the
    /// namespace. Runs on its own task (see the module's head).
    pub(super) async fn acquire(
        self: &Arc<Self>,
        req: MultiAcquireRequest,
    ) -> Result<MultiOutcome, EngineError> {
        let gone = CancellationToken::new();
        let _dropped = gone.clone().drop_guard();
        let multi = self.clone();
        let task = tokio::spawn(async move {
            let outcome = multi.acquire_here(&req, &gone).await;
            if gone.is_cancelled()
                && let Ok(MultiOutcome::Acquired { grants, .. }) = &outcome
            {
                // Its caller is gone: nothing stays held for it.
                multi.release_grants(&req, grants).await;
            }
            outcome
        });
        task.await
            .map_err(|e| store_failed(StoreError::Protocol(format!("multi-lock task: {e}"))))
            .and_then(|outcome| outcome)
    }

    async fn acquire_here(
        &self,
        req: &MultiAcquireRequest,
        gone: &CancellationToken,
    ) -> Result<MultiOutcome, EngineError> {
        let groups = self.groups(req);
        if req.req.wait.is_zero() {
            return Ok(match self.round(req, &groups, false).await? {
                Round::Granted {
                    grants,
                    holders,
                    already,
                } => self.granted(req, grants, holders, already),
                Round::Busy {
                    index,
                    holders,
                    next_expiry,
                } => {
                    self.counting
                        .now(&req.req.lock.namespace, &req.req.kind, "denied");
                    MultiOutcome::Busy {
                        index,
                        holders,
                        next_expiry_at_ms: next_expiry,
                    }
                }
            });
        }
        self.wait_for_set(req, &groups, gone).await
    }

    /// The waiting multi-lock: registered on every lock of its set before
    /// its first call (no wake-up slips between), it tries the whole set,
    /// and while a lock is busy sleeps until a call on that lock wakes it,
    /// the first busy lease ends, its wait ends or its caller is gone. It holds nothing while it sleeps, but its holder may hold
    /// other locks: its first wait is recorded as an edge of the wait-for
    /// graph (the holder waits for the holders of lock `index`) and
    /// refused when it closes a cycle (decision 0077).
    async fn wait_for_set(
        &self,
        req: &MultiAcquireRequest,
        groups: &[Group],
        gone: &CancellationToken,
    ) -> Result<MultiOutcome, EngineError> {
        let base = &req.req;
        let deadline = Instant::now() + base.wait;
        let keys: Vec<LockKeys> = (req.names.iter())
            .map(|name| self.calls.layout().lock_keys(&base.lock.namespace, name))
            .collect();
        let mut registrations: Vec<Registration> = Vec::with_capacity(keys.len());
        for (name, keys) in req.names.iter().zip(&keys) {
            registrations.push(self.waiters.register(
                &base.lock.namespace,
                keys,
                name,
                &base.holder,
                base.queue_ttl_ms,
                false,
            )?);
        }
        // Its wake-up places leave the queues whatever ends the wait.
        let _places = PlacesGuard {
            locks: self.locks.clone(),
            namespace: base.lock.namespace.clone(),
            names: req.names.clone(),
            keys,
            holder: base.holder.to_string(),
        };
        // Its edge in the wait-for registry while it waits (removed when
        // this is dropped); checked once, at its first busy round.
        let mut _recorded: Option<Recorded> = None;
        let mut checked = base.holds_nothing;
        let request = uuid::Uuid::new_v4().to_string();
        loop {
            let (index, holders, next_expiry) = match self.round(req, groups, true).await? {
                Round::Granted {
                    grants,
                    holders,
                    already,
                } => return Ok(self.granted(req, grants, holders, already)),
                Round::Busy {
                    index,
                    holders,
                    next_expiry,
                } => (index, holders, next_expiry),
            };
            if !checked {
                checked = true;
                let busy = AcquireRequest {
                    lock: LockId {
                        namespace: base.lock.namespace.clone(),
                        name: req.names[index].clone(),
                    },
                    ..base.clone()
                };
                let left = deadline.saturating_duration_since(Instant::now());
                match self.deadlocks.check(&busy, &request, left).await {
                    Ok(recorded) => _recorded = recorded,
                    // Refused: it holds nothing of the set, and its wake-up
                    // places leave with their guard.
                    Err(EngineError::Deadlock(cycle)) => return Err(EngineError::Deadlock(cycle)),
                    Err(err) => {
                        tracing::warn!(error = %err, "deadlock check of a multi-lock failed")
                    }
                }
            }
            let expiry = (next_expiry > 0).then(|| {
                let left = (next_expiry - self.calls.now_ms()).max(0) as u64 + 1;
                Instant::now() + Duration::from_millis(left)
            });
            // Only the busy lock's wake-ups can let the set through. The
            // others' may be its own doing (on a Cluster, the release of a
            // group it took and rolled back wakes its own place there):
            // waking on those would retry at once, over and over.
            tokio::select! {
                () = registrations[index].notified() => {}
                () = sleep_until_some(expiry) => {}
                () = tokio::time::sleep_until(deadline) => {
                    self.counting.now(&base.lock.namespace, &base.kind, "timed_out");
                    return Ok(MultiOutcome::TimedOut {
                        index,
                        holders,
                        next_expiry_at_ms: next_expiry,
                    });
                }
                () = gone.cancelled() => return Err(EngineError::Stopped),
                () = stopped(base.stop.as_ref()) => return Err(EngineError::Stopped),
                () = self.waiters.shutdown_token().cancelled() => {
                    return Err(EngineError::ShuttingDown);
                }
            }
        }
    }

    /// The set's call groups: one on one server or Sentinel; on a Redis
    /// Cluster one per slot, in the global order (slot, then name) every
    /// caller takes them in.
    fn groups(&self, req: &MultiAcquireRequest) -> Vec<Group> {
        let namespace = &req.req.lock.namespace;
        self.groups_of(req.names.iter().map(|name| (namespace, name)))
    }

    /// The call groups of a set's locks (each's namespace and name, in the
    /// request's order): [`Self::groups`]'s, for a set as Release and
    /// Extend name it too.
    fn groups_of<'a>(
        &self,
        names: impl Iterator<Item = (&'a super::Namespace, &'a LockName)>,
    ) -> Vec<Group> {
        let layout = self.calls.layout();
        let mut locks: Vec<(u16, &LockName, usize, LockKeys)> = names
            .enumerate()
            .map(|(at, (namespace, name))| {
                let keys = layout.lock_keys(namespace, name);
                let slot = if self.calls.store().is_cluster() {
                    cluster_slot(&keys.lock)
                } else {
                    0
                };
                (slot, name, at, keys)
            })
            .collect();
        locks.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let mut groups: Vec<(u16, Group)> = Vec::new();
        for (slot, _, at, keys) in locks {
            match groups.last_mut() {
                Some((last, group)) if *last == slot => {
                    group.keys.push(keys);
                    group.at.push(at);
                }
                _ => groups.push((
                    slot,
                    Group {
                        keys: vec![keys],
                        at: vec![at],
                    },
                )),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// One try of the whole set: every group in order, each with the
    /// reservation when there are several, then every grant extended to
    /// the full ttl; a group refused (or a reservation lost) releases
    /// what was taken.
    async fn round(
        &self,
        req: &MultiAcquireRequest,
        groups: &[Group],
        waiting: bool,
    ) -> Result<Round, EngineError> {
        let base = &req.req;
        let lease = match groups.len() {
            1 => base.ttl.ms(),
            n => base.ttl.ms().min(self.reservation(n).as_millis() as u64),
        };
        let mut grants: Vec<Option<Grant>> = vec![None; req.names.len()];
        let mut holders = 0;
        let mut already = true;
        for (i, group) in groups.iter().enumerate() {
            if i > 0 {
                pause_between_groups().await;
            }
            let answer = match self.call(req, group, lease, waiting).await {
                Ok(answer) => answer,
                Err(err) => {
                    self.roll_back(req, &grants).await;
                    return Err(err);
                }
            };
            use ops::acquire_many::Outcome;
            let refusal = match answer.outcome {
                Outcome::Granted {
                    grants: taken,
                    already: all_held,
                } => {
                    already &= all_held;
                    for ((grant, lock_holders), &at) in taken.into_iter().zip(&group.at) {
                        if at == 0 {
                            holders = lock_holders;
                        }
                        grants[at] = Some(grant);
                    }
                    continue;
                }
                Outcome::Busy {
                    index,
                    holders,
                    next_expiry,
                    ..
                } => Ok(Round::Busy {
                    index: group.at[index.min(group.at.len() - 1)],
                    holders,
                    next_expiry,
                }),
                Outcome::QueueFull => Err(EngineError::QueueFull(self.max_waiters_per_lock)),
                Outcome::NamespaceFull => Err(EngineError::NamespaceFull),
                Outcome::LimitMismatch { lock_limit, .. } => Err(EngineError::LimitMismatch {
                    lock_limit,
                    requested: base.limit,
                }),
                Outcome::ModeMismatch { .. } => Err(EngineError::RwLockNeedsMode),
                Outcome::Late => Err(store_failed(late())),
            };
            self.roll_back(req, &grants).await;
            return refusal;
        }
        // A lock its holder held already keeps what remained of its lease:
        // in a set taken anew it is extended with the rest, or lapses first.
        let latest = (grants.iter().flatten()).map(|g| g.expires_at_ms).max();
        let uneven = (grants.iter().flatten()).any(|g| Some(g.expires_at_ms) != latest);
        if !already && (groups.len() > 1 || uneven) {
            // Every part held: each extended to the full ttl (a part whose
            // reservation lapsed meanwhile refuses, and the set goes back).
            for (at, slot) in grants.iter_mut().enumerate() {
                let grant = slot.as_mut().expect("every group granted");
                let lock = LockId {
                    namespace: base.lock.namespace.clone(),
                    name: req.names[at].clone(),
                };
                let extended = self
                    .locks
                    .extend(
                        GrantRef {
                            lock: &lock,
                            holder: &base.holder,
                            fencing_token: Some(grant.fencing_token),
                        },
                        Some(base.ttl),
                        base.answer_by,
                        None,
                    )
                    .await;
                match extended {
                    Ok(ExtendOutcome::Extended(full)) => *grant = full,
                    Ok(ExtendOutcome::NotHeld) => {
                        self.roll_back(req, &grants).await;
                        return Ok(Round::Busy {
                            index: at,
                            holders: 0,
                            next_expiry: 0,
                        });
                    }
                    Err(err) => {
                        self.roll_back(req, &grants).await;
                        return Err(err);
                    }
                }
            }
        }
        Ok(Round::Granted {
            grants: grants.into_iter().map(|g| g.expect("granted")).collect(),
            holders,
            already,
        })
    }

    /// One call of `acquire_many` for a group.
    async fn call(
        &self,
        req: &MultiAcquireRequest,
        group: &Group,
        lease_ms: u64,
        waiting: bool,
    ) -> Result<ops::acquire_many::Answer, EngineError> {
        let base = &req.req;
        let metadata = records::metadata_arg(&base.metadata);
        let call = ops::acquire_many::Call {
            holder: &base.holder,
            ttl_ms: base.ttl.ms(),
            lease_ms,
            answer_by: self.calls.answer_by(base.answer_by),
            limit: base.limit,
            kind: &base.kind,
            metadata: &metadata,
            watched: self.changelog.emits(&base.lock.namespace),
            keys_per_lock: self.keys_per_lock(),
            max_locks: self.max_locks_per_shard,
            wait: waiting.then_some((base.queue_ttl_ms, self.max_waiters_per_lock)),
        };
        let reply = self
            .calls
            .call_locks(
                |s| &s.acquire_many,
                &group.keys,
                &call.args(),
                ops::acquire_many::is_grant,
            )
            .await
            .or_trouble()?;
        let answer = ops::acquire_many::parse(reply, &base.holder).or_trouble()?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&base.lock.namespace, answer.now, &answer.noted);
        Ok(answer)
    }

    /// Keys each lock of a call declares (5, or 6 with live locks counted).
    fn keys_per_lock(&self) -> usize {
        if self.calls.counts_live() { 4 } else { 3 }
    }

    /// How long the parts of a set spanning `groups` slots are reserved
    /// before the whole set is extended: every call of the round (a group
    /// each, then an extend each) may take up to the command timeout
    /// before this replica gives up on it, bounded by [`MAX_RESERVATION`].
    fn reservation(&self, groups: usize) -> Duration {
        let calls = 2 * groups as u32;
        (self.calls.store().command_timeout() * calls).min(MAX_RESERVATION)
    }

    /// The answer of a granted set: counted per lock, named per grant.
    fn granted(
        &self,
        req: &MultiAcquireRequest,
        grants: Vec<Grant>,
        holders: u32,
        already: bool,
    ) -> MultiOutcome {
        if !already {
            for _ in &grants {
                self.counting
                    .now(&req.req.lock.namespace, &req.req.kind, "acquired");
            }
        }
        MultiOutcome::Acquired {
            grants: req.names.iter().cloned().zip(grants).collect(),
            holders,
            already,
        }
    }

    /// Releases the grants a round took before it was refused.
    async fn roll_back(&self, req: &MultiAcquireRequest, grants: &[Option<Grant>]) {
        let taken: Vec<(LockName, Grant)> = (req.names.iter().zip(grants))
            .filter_map(|(name, grant)| Some((name.clone(), grant.clone()?)))
            .collect();
        self.release_grants(req, &taken).await;
    }

    /// Releases grants of the set, each pinned to its token (a failure
    /// leaves that one to its lease).
    async fn release_grants(&self, req: &MultiAcquireRequest, grants: &[(LockName, Grant)]) {
        for (name, grant) in grants {
            let lock = LockId {
                namespace: req.req.lock.namespace.clone(),
                name: name.clone(),
            };
            let released = self
                .locks
                .release(&lock, &req.req.holder, Some(grant.fencing_token), None)
                .await;
            if let Err(err) = released {
                tracing::warn!(error = %err, lock = %lock.name, "releasing part of a multi-lock failed; it lapses with its lease");
            }
        }
    }
}

/// Takes the set's wake-up places out of its locks' queues when its wait
/// ends, however it ends (a place nobody takes out lapses with its queue
/// TTL).
struct PlacesGuard {
    locks: Arc<Locks>,
    namespace: super::Namespace,
    names: Vec<LockName>,
    keys: Vec<LockKeys>,
    holder: String,
}

impl Drop for PlacesGuard {
    fn drop(&mut self) {
        let locks = self.locks.clone();
        let namespace = self.namespace.clone();
        let names = std::mem::take(&mut self.names);
        let keys = std::mem::take(&mut self.keys);
        let holder = std::mem::take(&mut self.holder);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            for (name, keys) in names.into_iter().zip(&keys) {
                let lock = LockId {
                    namespace: namespace.clone(),
                    name,
                };
                if let Err(err) = locks.dequeue(&lock, keys, &holder, None, false).await {
                    tracing::warn!(error = %err, lock = %lock.name, "leaving a multi-lock's wake-up place failed");
                }
            }
        });
    }
}

/// A test hook, honoured only in debug builds: `TUMBLER_TEST_MULTI_PAUSE_MS`
/// pauses a cross-slot multi-lock between its groups (so a test can kill
/// the replica there).
async fn pause_between_groups() {
    if cfg!(debug_assertions)
        && let Some(ms) = std::env::var("TUMBLER_TEST_MULTI_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
