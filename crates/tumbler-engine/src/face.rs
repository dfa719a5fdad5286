//! The engine's face: one handle per capability, each a view of the
//! parts that serve it ([`LockEngine::locks`], [`LockEngine::sets`],
//! [`LockEngine::session_calls`], [`LockEngine::elections`],
//! [`LockEngine::walks`], [`LockEngine::watch`], [`LockEngine::health`]).
//! None hands out a part, the store or the layout; parameters are typed
//! (`&Namespace`, `&Holder`, `&Kind`), and a debug line's key names come
//! from [`LockCalls::key_names`].

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use changelog::{ChangelogPage, ChangelogQuery, ChangelogSettings};
use locks::GrantRef;
use ops::session_record::Touch;
use resume::{ResumeError, Resumed, SessionEnd, SessionTicket};
use sessions::LostGrant;
use watchers::{Filter, LockEvent};

impl LockEngine {
    // The face: one handle per capability, each a view of the parts that
    // serve it. None hands out a part, the store or the layout.

    /// One lock's calls: Acquire, Release, Extend, Inspect, Queue.
    pub fn locks(&self) -> LockCalls<'_> {
        LockCalls(self)
    }

    /// A multi-lock's calls: its set taken, released, extended.
    pub fn sets(&self) -> SetCalls<'_> {
        SetCalls(self)
    }

    /// Sessions: opened, resumed, and one stream's calls.
    pub fn session_calls(&self) -> SessionCalls<'_> {
        SessionCalls(self)
    }

    /// Elections on a fair lock of limit 1 (`election.rs`).
    pub fn elections(&self) -> ElectionCalls<'_> {
        ElectionCalls(self)
    }

    /// The walks over a namespace (list, reap, clear, metrics), its
    /// changelog and its wait-for chains.
    pub fn walks(&self) -> WalkCalls<'_> {
        WalkCalls(self)
    }

    /// Watch streams on this replica (`watching.rs`).
    pub fn watch(&self) -> WatchCalls<'_> {
        WatchCalls(self)
    }

    /// Redis' health and the replica's own state (gauges, draining).
    pub fn health(&self) -> Health<'_> {
        Health(self)
    }
}

/// One lock's calls ([`LockEngine::locks`]).
pub struct LockCalls<'a>(&'a LockEngine);

impl LockCalls<'_> {
    /// Takes a permit, trying once or waiting in this server (in the
    /// lock's queue) until granted or `req.wait` has passed; a
    /// `takes_over` request first tries to take the old holder's grant.
    pub async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, EngineError> {
        let e = self.0;
        e.calls.ready()?;
        e.counting.note_namespace(&req.lock.namespace).await?;
        if let Some(old) = &req.takes_over
            && let Some(outcome) = e.locks.take_over(req, old.as_str()).await?
        {
            return Ok(outcome);
        }
        if req.wait.is_zero() {
            e.locks.acquire_once(req).await
        } else {
            e.waiting.acquire(req).await
        }
    }

    /// Gives a grant back, pinned to its fencing token when given.
    pub async fn release(
        &self,
        lock: &LockId,
        holder: &Holder,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        (self.0.locks)
            .release(lock, holder, fencing_token, None)
            .await
    }

    /// Resets the remaining lease to `ttl` (or the grant's own ttl), for a
    /// caller that stops listening at `answer_by` (if it says).
    pub async fn extend(
        &self,
        (lock, holder): (&LockId, &Holder),
        ttl: Option<Ttl>,
        fencing_token: Option<u64>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        let grant = GrantRef {
            lock,
            holder,
            fencing_token,
        };
        self.0.locks.extend(grant, ttl, answer_by, None).await
    }

    pub async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError> {
        self.0.locks.inspect(lock).await
    }

    /// The live waiting requests of a lock in grant order (at most `most`).
    pub async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError> {
        self.0.locks.queue(lock, most).await
    }

    /// Counts a request that failed on Redis trouble (written to the
    /// shared counters with the others).
    pub fn record_error(&self, namespace: &Namespace, kind: &Kind) {
        self.0.counting.now(namespace, kind, "errors");
    }

    /// A lock's Redis key names, for the lines that name them (debug logs).
    pub fn key_names(&self, lock: &LockId) -> keys::LockKeys {
        self.0.calls.layout().lock_keys(&lock.namespace, &lock.name)
    }
}

/// A multi-lock's calls ([`LockEngine::sets`]; decisions 0076, 0079).
pub struct SetCalls<'a>(&'a LockEngine);

impl SetCalls<'_> {
    /// Takes every lock of the set or none, trying once or waiting in this
    /// server while holding nothing.
    pub async fn acquire(&self, req: MultiAcquireRequest) -> Result<MultiOutcome, EngineError> {
        let e = self.0;
        e.calls.ready()?;
        e.counting.note_namespace(&req.req.lock.namespace).await?;
        e.multi.acquire(req).await
    }

    /// Releases each lock of the set the holder holds, each pinned to its
    /// fencing token when it has one: Released only when every one was
    /// held (with its token).
    pub async fn release(
        &self,
        locks: &[SetLock],
        holder: &Holder,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.0.multi.release_set(locks, holder).await
    }

    /// Extends each lock of the set (pinned the same way); NotHeld, with
    /// the set released, when one was not held.
    pub async fn extend(
        &self,
        (locks, holder): (&[SetLock], &Holder),
        ttl: Option<Ttl>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        (self.0.multi)
            .extend_set(locks, holder, ttl, answer_by)
            .await
    }
}

/// Sessions ([`LockEngine::session_calls`]; `resume.rs`).
pub struct SessionCalls<'a>(&'a LockEngine);

impl<'a> SessionCalls<'a> {
    /// Records a new session (owner: the token's name, '' without auth).
    pub async fn open(&self, owner: &str, ttl: Ttl) -> Result<SessionTicket, EngineError> {
        self.0.sessions.open(owner, ttl.ms()).await
    }

    /// Takes a session back for a new stream (see `resume.rs`); `session`
    /// and `secret` as the client sent them.
    pub async fn resume(
        &self,
        (owner, session, secret): (&str, &str, &str),
        may_act: impl Fn(&str) -> bool,
        lost_tx: &mpsc::Sender<LostGrant>,
    ) -> Result<Resumed, ResumeError> {
        (self.0.sessions)
            .resume(owner, session, secret, may_act, lost_tx)
            .await
    }

    /// The calls of the stream that serves `session` (its id, which holds
    /// its grants) at `epoch`.
    pub fn stream(&self, session: &'a Holder, epoch: u64) -> StreamCalls<'a> {
        StreamCalls {
            engine: self.0,
            session,
            epoch,
        }
    }

    /// How many session grants this replica renews (a gauge).
    pub fn renewed_grants(&self) -> usize {
        self.0.renewer.sessions().len()
    }
}

/// The calls of one session's stream ([`SessionCalls::stream`]). Every
/// call carries the stream's epoch: what a newer stream of the session
/// holds is refused ([`EngineError::SessionMoved`]) and left alone.
pub struct StreamCalls<'a> {
    engine: &'a LockEngine,
    session: &'a Holder,
    epoch: u64,
}

impl StreamCalls<'_> {
    /// Keeps the session's record alive, or learns that another stream
    /// resumed it, or that it is gone.
    pub async fn touch(&self, ttl_ms: u64) -> Result<Touch, EngineError> {
        (self.engine.sessions)
            .touch(self.session, self.epoch, ttl_ms)
            .await
    }

    /// The stream stops: its grants are released or left to live on for
    /// the TTL (see `resume.rs`).
    pub async fn end(&self, ttl_ms: u64, end: SessionEnd) -> (Vec<(LockId, u64)>, bool) {
        (self.engine.sessions)
            .end(self.session, self.epoch, ttl_ms, end)
            .await
    }

    /// The grants this stream holds (lock, fencing token).
    pub fn grants(&self) -> Vec<(LockId, u64)> {
        (self.engine.renewer.sessions()).grants_of(self.session, self.epoch)
    }

    /// Acquires for the session: the holder is the session id, the lease
    /// the session TTL, and a grant is named in the session's record (so
    /// any replica can resume it) and renewed by this replica from now on
    /// (lost grants are reported on `lost`). A grant that cannot be named
    /// in the record is released again and the call fails.
    pub async fn acquire(
        &self,
        req: &AcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<AcquireOutcome, EngineError> {
        debug_assert_eq!(req.session_epoch, Some(self.epoch), "the stream's epoch");
        let outcome = self.engine.locks().acquire(req).await?;
        (self.engine.sessions)
            .keep_grant(self.session, self.epoch, req, &outcome, lost)
            .await?;
        Ok(outcome)
    }

    /// A multi-lock for the session (decision 0078): the set taken as
    /// [`SetCalls::acquire`] takes it, then kept as a set of session
    /// grants (named in the record with their set, renewed here, ended
    /// together). A set that names a lock the stream holds alone or in
    /// another set is refused ([`EngineError::SetMismatch`]).
    pub async fn acquire_set(
        &self,
        req: MultiAcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<MultiOutcome, EngineError> {
        let (session, epoch) = (self.session.as_str(), self.epoch);
        let namespace = req.req.lock.namespace.clone();
        let locks: Vec<LockId> = (req.names.iter())
            .map(|name| LockId {
                namespace: namespace.clone(),
                name: name.clone(),
            })
            .collect();
        let set = self.engine.sessions.set_for(session, epoch, &locks)?;
        let ttl = req.req.ttl;
        let outcome = self.engine.sets().acquire(req).await?;
        (self.engine.sessions)
            .keep_set((session, epoch), (&namespace, ttl, set), &outcome, lost)
            .await?;
        Ok(outcome)
    }

    /// A release command (`field`: `name` for one lock, `names` for
    /// several): a set the stream holds must be named whole.
    pub async fn release(
        &self,
        locks: &[LockId],
        field: &'static str,
    ) -> Result<ReleaseOutcome, EngineError> {
        (self.engine.sessions)
            .release_named(self.session, self.epoch, locks, field)
            .await
    }

    /// Releases one grant the session lost the right to keep (its set
    /// broke, [`sessions::LOST_SET_BROKEN`], or its namespace was taken
    /// from the token), stops renewing it and takes it off the record.
    pub async fn give_up(&self, lost: &LostGrant) {
        (self.engine.sessions)
            .release_broken(self.session, self.epoch, lost)
            .await
    }

    /// Releases one grant of the session, stops renewing it and takes it
    /// off the session's record.
    pub async fn release_one(&self, lock: &LockId) -> Result<ReleaseOutcome, EngineError> {
        (self.engine.sessions)
            .release(self.session, self.epoch, lock)
            .await
    }
}

/// Elections ([`LockEngine::elections`]): an election is a fair lock of
/// limit 1. Campaign is [`LockCalls::acquire`] of the request
/// [`election::campaign`] builds, its outcome read by
/// [`election::campaign_outcome`].
pub struct ElectionCalls<'a>(&'a LockEngine);

impl ElectionCalls<'_> {
    /// Replaces the leader's value, when `candidate` leads with `term`
    /// and `proof` is the digest of its secret ([`EngineError::NotYours`]
    /// when it leads and the proof is another's).
    pub async fn proclaim(
        &self,
        (lock, candidate): (&LockId, &Holder),
        term: u64,
        value: &str,
        proof: &str,
    ) -> Result<ProclaimOutcome, EngineError> {
        (self.0.election)
            .proclaim(lock, candidate, term, value, proof)
            .await
    }

    /// Who leads the election now (None: nobody), and Redis' clock.
    pub async fn leader(&self, lock: &LockId) -> Result<(Option<Leadership>, i64), EngineError> {
        let state = self.0.locks.inspect(lock).await?;
        let now_ms = state.now_ms;
        Ok((election::leader_of(state), now_ms))
    }

    /// The leader steps down (a release pinned to its term, which wakes
    /// the next candidate); false when `candidate` does not lead with
    /// `term`; [`EngineError::NotYours`] when it does and `proof` is not
    /// the digest of its secret.
    pub async fn resign(
        &self,
        (lock, candidate): (&LockId, &Holder),
        term: u64,
        proof: &str,
    ) -> Result<bool, EngineError> {
        let outcome = (self.0.locks)
            .release_proved(lock, candidate, term, proof)
            .await?;
        Ok(matches!(outcome, ReleaseOutcome::Released { .. }))
    }
}

/// Walks over a namespace's shards (`walks.rs`), its changelog and its
/// wait-for chains ([`LockEngine::walks`]).
pub struct WalkCalls<'a>(&'a LockEngine);

impl WalkCalls<'_> {
    /// The namespaces in use (recorded by the replicas that served them).
    pub async fn namespaces(&self) -> Result<Vec<String>, EngineError> {
        self.0.walks.namespaces().await
    }

    /// One page of a namespace's locks (in SCAN order), filtered by name
    /// prefix and by having waiters.
    pub async fn list(
        &self,
        namespace: &Namespace,
        prefix: &str,
        (page_size, from): (u32, Option<ListCursor>),
        only_waiting: bool,
    ) -> Result<ListPage, EngineError> {
        (self.0.walks)
            .list(namespace, prefix, page_size, from, only_waiting)
            .await
    }

    /// Cleans up every lock of a namespace now; with `older_than_ms` also
    /// drops old grants and requests.
    pub async fn reap(
        &self,
        namespace: &Namespace,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError> {
        self.0.walks.reap(namespace, older_than_ms).await
    }

    /// Releases every lock and drops every queue of a namespace, adding
    /// what it cleared to `done` batch by batch, so a clear that Redis
    /// interrupts still says how far it got (and running it again
    /// finishes the job).
    pub async fn clear(
        &self,
        namespace: &Namespace,
        done: &mut ClearCounts,
    ) -> Result<(), EngineError> {
        self.0.walks.clear(namespace, done).await
    }

    /// Per-minute counters of a namespace between two instants (inclusive
    /// minutes), as every replica added them (this replica's own first).
    pub async fn metrics(
        &self,
        namespace: &Namespace,
        (from_ms, to_ms): (i64, i64),
        kind: Option<&Kind>,
    ) -> Result<MetricsReport, EngineError> {
        let kind = kind.map(Kind::as_str);
        self.0.walks.metrics(namespace, from_ms, to_ms, kind).await
    }

    /// The changelog settings in force.
    pub fn changelog_settings(&self) -> &ChangelogSettings {
        self.0.changelog.settings()
    }

    /// One page of a namespace's changelog: events that match `query`,
    /// newest first, after `query.from`.
    pub async fn changelog(
        &self,
        namespace: &Namespace,
        query: &ChangelogQuery,
    ) -> Result<ChangelogPage, EngineError> {
        self.0.changelog.page(namespace, query).await
    }

    /// One page of a namespace's current wait-for chains (`deadlock.rs`,
    /// decisions 0077 and 0081), from `page` (none: the first).
    pub async fn wait_chains(
        &self,
        namespace: &Namespace,
        page: Option<u64>,
    ) -> Result<WaitChainsPage, EngineError> {
        self.0.waiting.wait_chains(namespace, page).await
    }
}

/// Watch streams ([`LockEngine::watch`]; `watching.rs`).
pub struct WatchCalls<'a>(&'a LockEngine);

impl WatchCalls<'_> {
    /// A watcher on this replica starts watching `namespace`: every
    /// replica's function calls publish its events from now on.
    pub async fn announce(&self, namespace: &Namespace) -> Result<(), EngineError> {
        Ok(self.0.watching.announce(namespace).await?)
    }

    /// A new watch of this replica's events (its buffer: `buffer` events).
    pub fn add(&self, filter: Filter, buffer: usize) -> watchers::WatchHandle {
        self.0.watchers().add(filter, buffer)
    }

    /// The current state of the locks a watcher wants, as events.
    pub async fn state(&self, filter: &Filter) -> Result<Vec<LockEvent>, EngineError> {
        self.0.watching.watch_state(filter).await
    }
}

/// Redis' health and this replica's own state ([`LockEngine::health`]).
pub struct Health<'a>(&'a LockEngine);

impl Health<'_> {
    /// Records this deployment's layout in Redis, or checks the one already
    /// there (see `calls.rs`); also learns Redis' clock.
    pub async fn verify_layout(&self) -> Result<(), LayoutError> {
        self.0.calls.verify_layout().await
    }

    /// The health check: Redis answers, holds this deployment's layout
    /// record, and lets the configured user run the lock path. A failure's
    /// reason is kept for the readiness of every request.
    pub async fn check_redis(&self) -> Result<(), LayoutError> {
        self.0.calls.check_redis().await
    }

    /// Redis calls of the hot path so far, per batch size bucket
    /// ([`group::SIZE_BUCKETS`]; empty with group commit off).
    pub fn batch_sizes(&self) -> Vec<u64> {
        self.0.calls.batch_sizes()
    }

    /// How many requests wait on this replica (a gauge).
    pub fn waiting(&self) -> usize {
        self.0.waiters().len()
    }

    /// Cancelled when the replica starts to drain.
    pub fn draining(&self) -> tokio_util::sync::CancellationToken {
        self.0.shutdown_token()
    }
}
