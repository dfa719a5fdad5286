//! The engine's face as traits, one per capability handle: what the
//! handlers call, and what the engine (`tumbler-engine`'s `face.rs`)
//! implements. The handlers hold an `Arc<dyn EngineFace>` and so build
//! without the engine, the store or Redis (decision 0088). An async call
//! through a handle costs one boxed future (`async-trait`), nothing else.
//!
//! No handle hands out a part of the engine, its store or its key layout;
//! parameters are typed (`&Namespace`, `&Holder`, `&Kind`), and a debug
//! line's key names come from [`LockFace::key_names`].

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::changelog::{ChangelogPage, ChangelogQuery, ChangelogSettings};
use crate::sessions::{LostGrant, ResumeError, Resumed, SessionEnd, SessionTicket, Touch};
use crate::watchers::{Filter, LockEvent, WatchHandle};
use crate::{
    AcquireOutcome, AcquireRequest, ClearCounts, EngineError, ExtendOutcome, Holder, Kind,
    Leadership, ListCursor, ListPage, LockId, LockKeys, LockState, MetricsReport,
    MultiAcquireRequest, MultiOutcome, Namespace, ProclaimOutcome, QueueState, ReapCounts,
    ReleaseOutcome, SetLock, Ttl, WaitChainsPage,
};

/// The engine as the handlers see it: one handle per capability.
pub trait EngineFace: Send + Sync {
    /// One lock's calls: Acquire, Release, Extend, Inspect, Queue.
    fn locks(&self) -> &dyn LockFace;
    /// A multi-lock's calls: its set taken, released, extended.
    fn sets(&self) -> &dyn SetFace;
    /// Sessions: opened, resumed, and one stream's calls.
    fn session_calls(&self) -> &dyn SessionFace;
    /// Elections on a fair lock of limit 1.
    fn elections(&self) -> &dyn ElectionFace;
    /// The walks over a namespace (list, reap, clear, metrics), its
    /// changelog and its wait-for chains.
    fn walks(&self) -> &dyn WalkFace;
    /// Watch streams on this replica.
    fn watch(&self) -> &dyn WatchFace;
    /// This replica's own state (gauges, draining).
    fn health(&self) -> &dyn HealthFace;
}

/// One lock's calls ([`EngineFace::locks`]).
#[async_trait]
pub trait LockFace: Send + Sync {
    /// Takes a permit, trying once or waiting in this server (in the
    /// lock's queue) until granted or `req.wait` has passed; a
    /// `takes_over` request first tries to take the old holder's grant.
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, EngineError>;

    /// Gives a grant back, pinned to its fencing token when given.
    async fn release(
        &self,
        lock: &LockId,
        holder: &Holder,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError>;

    /// Resets the remaining lease of `grant` (lock, holder) to `ttl` (or
    /// the grant's own ttl), for a caller that stops listening at
    /// `answer_by` (if it says).
    async fn extend(
        &self,
        grant: (&LockId, &Holder),
        ttl: Option<Ttl>,
        fencing_token: Option<u64>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError>;

    async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError>;

    /// The live waiting requests of a lock in grant order (at most `most`).
    async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError>;

    /// Counts a request that failed on Redis trouble (written to the
    /// shared counters with the others).
    fn record_error(&self, namespace: &Namespace, kind: &Kind);

    /// A lock's Redis key names, for the lines that name them (debug logs).
    fn key_names(&self, lock: &LockId) -> LockKeys;
}

/// A multi-lock's calls ([`EngineFace::sets`]; decisions 0076, 0079).
#[async_trait]
pub trait SetFace: Send + Sync {
    /// Takes every lock of the set or none, trying once or waiting in this
    /// server while holding nothing.
    async fn acquire(&self, req: MultiAcquireRequest) -> Result<MultiOutcome, EngineError>;

    /// Releases each lock of the set the holder holds, each pinned to its
    /// fencing token when it has one: Released only when every one was
    /// held (with its token).
    async fn release(
        &self,
        locks: &[SetLock],
        holder: &Holder,
    ) -> Result<ReleaseOutcome, EngineError>;

    /// Extends each lock of `set` (its locks, the holder; pinned the same
    /// way); NotHeld, with the set released, when one was not held.
    async fn extend(
        &self,
        set: (&[SetLock], &Holder),
        ttl: Option<Ttl>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError>;
}

/// One stream of a session: the session's id (which holds its grants)
/// and the stream's epoch, which every call of [`StreamCalls`] carries.
pub type Stream<'a> = (&'a Holder, u64);

/// Sessions ([`EngineFace::session_calls`]): opened, resumed, and the
/// calls of one stream ([`StreamCalls`], made by `stream`).
#[async_trait]
pub trait SessionFace: Send + Sync {
    /// Records a new session (owner: the token's name, '' without auth).
    async fn open(&self, owner: &str, ttl: Ttl) -> Result<SessionTicket, EngineError>;

    /// Takes a session back for a new stream; `claim` is the owner, and
    /// the session id and secret as the client sent them; `may_act` says
    /// whether the caller may still act in a namespace (a grant of one it
    /// may not is lost).
    async fn resume(
        &self,
        claim: (&str, &str, &str),
        may_act: &(dyn for<'n> Fn(&'n str) -> bool + Send + Sync),
        lost_tx: &mpsc::Sender<LostGrant>,
    ) -> Result<Resumed, ResumeError>;

    /// How many session grants this replica renews (a gauge).
    fn renewed_grants(&self) -> usize;

    // A stream's calls: see [`StreamCalls`], which names them.

    async fn touch(&self, stream: Stream<'_>, ttl_ms: u64) -> Result<Touch, EngineError>;

    async fn end(
        &self,
        stream: Stream<'_>,
        ttl_ms: u64,
        end: SessionEnd,
    ) -> (Vec<(LockId, u64)>, bool);

    fn grants(&self, stream: Stream<'_>) -> Vec<(LockId, u64)>;

    async fn acquire(
        &self,
        stream: Stream<'_>,
        req: &AcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<AcquireOutcome, EngineError>;

    async fn acquire_set(
        &self,
        stream: Stream<'_>,
        req: MultiAcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<MultiOutcome, EngineError>;

    async fn release(
        &self,
        stream: Stream<'_>,
        locks: &[LockId],
        field: &'static str,
    ) -> Result<ReleaseOutcome, EngineError>;

    async fn give_up(&self, stream: Stream<'_>, lost: &LostGrant);

    async fn release_one(
        &self,
        stream: Stream<'_>,
        lock: &LockId,
    ) -> Result<ReleaseOutcome, EngineError>;
}

impl dyn SessionFace + '_ {
    /// The calls of the stream that serves `session` (its id, which holds
    /// its grants) at `epoch`.
    pub fn stream<'a>(&'a self, session: &'a Holder, epoch: u64) -> StreamCalls<'a> {
        StreamCalls {
            face: self,
            stream: (session, epoch),
        }
    }
}

/// The calls of one session's stream ([`SessionFace`]'s `stream`). Every
/// call carries the stream's epoch: what a newer stream of the session
/// holds is refused ([`EngineError::SessionMoved`]) and left alone.
pub struct StreamCalls<'a> {
    face: &'a dyn SessionFace,
    stream: Stream<'a>,
}

impl StreamCalls<'_> {
    /// Keeps the session's record alive, or learns that another stream
    /// resumed it, or that it is gone.
    pub async fn touch(&self, ttl_ms: u64) -> Result<Touch, EngineError> {
        self.face.touch(self.stream, ttl_ms).await
    }

    /// The stream stops: its grants are released or left to live on for
    /// the TTL (see the engine's `resume.rs`).
    pub async fn end(&self, ttl_ms: u64, end: SessionEnd) -> (Vec<(LockId, u64)>, bool) {
        self.face.end(self.stream, ttl_ms, end).await
    }

    /// The grants this stream holds (lock, fencing token).
    pub fn grants(&self) -> Vec<(LockId, u64)> {
        self.face.grants(self.stream)
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
        self.face.acquire(self.stream, req, lost).await
    }

    /// A multi-lock for the session (decision 0078): the set taken as
    /// [`SetFace::acquire`] takes it, then kept as a set of session
    /// grants (named in the record with their set, renewed here, ended
    /// together). A set that names a lock the stream holds alone or in
    /// another set is refused ([`EngineError::SetMismatch`]).
    pub async fn acquire_set(
        &self,
        req: MultiAcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<MultiOutcome, EngineError> {
        self.face.acquire_set(self.stream, req, lost).await
    }

    /// A release command (`field`: `name` for one lock, `names` for
    /// several): a set the stream holds must be named whole.
    pub async fn release(
        &self,
        locks: &[LockId],
        field: &'static str,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.face.release(self.stream, locks, field).await
    }

    /// Releases one grant the session lost the right to keep (its set
    /// broke, [`crate::sessions::LOST_SET_BROKEN`], or its namespace was
    /// taken from the token), stops renewing it and takes it off the
    /// record.
    pub async fn give_up(&self, lost: &LostGrant) {
        self.face.give_up(self.stream, lost).await
    }

    /// Releases one grant of the session, stops renewing it and takes it
    /// off the session's record.
    pub async fn release_one(&self, lock: &LockId) -> Result<ReleaseOutcome, EngineError> {
        self.face.release_one(self.stream, lock).await
    }
}

/// Elections ([`EngineFace::elections`]): an election is a fair lock of
/// limit 1. Campaign is [`LockFace::acquire`] of the request
/// [`crate::election::campaign`] builds, its outcome read by
/// [`crate::election::campaign_outcome`].
#[async_trait]
pub trait ElectionFace: Send + Sync {
    /// Replaces the leader's value, when `who`'s candidate leads the
    /// election (its lock) with `term` and `proof` is the digest of its
    /// secret ([`EngineError::NotYours`] when it leads and the proof is
    /// another's).
    async fn proclaim(
        &self,
        who: (&LockId, &Holder),
        term: u64,
        value: &str,
        proof: &str,
    ) -> Result<ProclaimOutcome, EngineError>;

    /// Who leads the election now (None: nobody), and Redis' clock.
    async fn leader(&self, lock: &LockId) -> Result<(Option<Leadership>, i64), EngineError>;

    /// The leader steps down (a release pinned to its term, which wakes
    /// the next candidate); false when the candidate does not lead with
    /// `term`; [`EngineError::NotYours`] when it does and `proof` is not
    /// the digest of its secret.
    async fn resign(
        &self,
        who: (&LockId, &Holder),
        term: u64,
        proof: &str,
    ) -> Result<bool, EngineError>;
}

/// Walks over a namespace's shards, its changelog and its wait-for
/// chains ([`EngineFace::walks`]).
#[async_trait]
pub trait WalkFace: Send + Sync {
    /// The namespaces in use (recorded by the replicas that served them).
    async fn namespaces(&self) -> Result<Vec<String>, EngineError>;

    /// One page of a namespace's locks (in SCAN order), filtered by name
    /// prefix and by having waiters; `page` is its size and where it
    /// starts (none: at the first).
    async fn list(
        &self,
        namespace: &Namespace,
        prefix: &str,
        page: (u32, Option<ListCursor>),
        only_waiting: bool,
    ) -> Result<ListPage, EngineError>;

    /// Cleans up every lock of a namespace now; with `older_than_ms` also
    /// drops old grants and requests.
    async fn reap(
        &self,
        namespace: &Namespace,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError>;

    /// Releases every lock and drops every queue of a namespace, adding
    /// what it cleared to `done` batch by batch, so a clear that Redis
    /// interrupts still says how far it got (and running it again
    /// finishes the job).
    async fn clear(&self, namespace: &Namespace, done: &mut ClearCounts)
    -> Result<(), EngineError>;

    /// Per-minute counters of a namespace between two instants (`range`,
    /// inclusive minutes), as every replica added them (this replica's own
    /// first).
    async fn metrics(
        &self,
        namespace: &Namespace,
        range: (i64, i64),
        kind: Option<&Kind>,
    ) -> Result<MetricsReport, EngineError>;

    /// The changelog settings in force.
    fn changelog_settings(&self) -> &ChangelogSettings;

    /// One page of a namespace's changelog: events that match `query`,
    /// newest first, after `query.from`.
    async fn changelog(
        &self,
        namespace: &Namespace,
        query: &ChangelogQuery,
    ) -> Result<ChangelogPage, EngineError>;

    /// One page of a namespace's current wait-for chains (decisions 0077
    /// and 0081), from `page` (none: the first).
    async fn wait_chains(
        &self,
        namespace: &Namespace,
        page: Option<u64>,
    ) -> Result<WaitChainsPage, EngineError>;
}

/// Watch streams on this replica ([`EngineFace::watch`]).
#[async_trait]
pub trait WatchFace: Send + Sync {
    /// A watcher on this replica starts watching `namespace`: every
    /// replica's function calls publish its events from now on.
    async fn announce(&self, namespace: &Namespace) -> Result<(), EngineError>;

    /// A new watch of this replica's events (its buffer: `buffer` events).
    fn add(&self, filter: Filter, buffer: usize) -> WatchHandle;

    /// The current state of the locks a watcher wants, as events.
    async fn state(&self, filter: &Filter) -> Result<Vec<LockEvent>, EngineError>;
}

/// This replica's own state ([`EngineFace::health`]).
pub trait HealthFace: Send + Sync {
    /// Redis calls of the hot path so far, per batch size bucket (empty
    /// with group commit off).
    fn batch_sizes(&self) -> Vec<u64>;

    /// How many requests wait on this replica (a gauge).
    fn waiting(&self) -> usize;

    /// Cancelled when the replica starts to drain.
    fn draining(&self) -> CancellationToken;
}
