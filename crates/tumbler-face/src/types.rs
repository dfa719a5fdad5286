//! The engine's vocabulary: typed requests and outcomes (its errors are in
//! `errors.rs`). They know nothing of gRPC, HTTP or Redis replies; the
//! handlers map them to their transport, the typed twins in `ops/` map
//! them to Redis.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// A lock, named within a namespace. Both are validated by their types.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockId {
    pub namespace: super::Namespace,
    pub name: super::LockName,
}

/// One lock of a multi-lock's set as a Release or Extend names it: the
/// lock, and the fencing token its grant must carry (None: any grant of
/// the holder; decision 0079).
pub type SetLock = (LockId, Option<u64>);

impl LockId {
    /// Checks both parts as a request gives them (an empty namespace is
    /// the default one).
    pub fn parse(
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Result<Self, super::Invalid> {
        Ok(LockId {
            namespace: super::Namespace::parse(namespace)?,
            name: super::LockName::parse(name)?,
        })
    }

    /// A lock named in Redis or in this replica's own records: both parts
    /// passed their checks when they were written.
    pub fn stored(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        LockId {
            namespace: super::Namespace::stored(namespace),
            name: super::LockName::stored(name),
        }
    }

    /// The lock that makes one replica at a time the reaper.
    pub fn reaper() -> Self {
        LockId::stored(super::REAPER_NAMESPACE, super::REAPER_LOCK)
    }
}

/// What kind of lock a request asks for, a grant holds or a waiter waits
/// for (decision 0074): a plain lock (mutex or semaphore), or one side of
/// a read/write lock. The lock's own rule is the letter in its header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// A mutex, or a semaphore of `limit`.
    #[default]
    Plain,
    /// Shared: with other readers (up to the lock's limit), never with a
    /// writer.
    Read,
    /// Exclusive: alone.
    Write,
}

impl LockMode {
    /// A read or write request (not a plain one).
    pub fn is_rw(self) -> bool {
        self != LockMode::Plain
    }
}

/// One permit of a lock, as stored in its grant record. (The engine writes
/// no JSON: transports show its proto message, `tumbler.v1.Grant`.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub holder: String,
    pub fencing_token: u64,
    pub slot: u32,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
    pub ttl_ms: u64,
    pub kind: String,
    pub metadata: BTreeMap<String, String>,
    /// Read or write for a grant of a read/write lock (read off the
    /// lock's header, or the request that got it); plain otherwise.
    pub mode: LockMode,
    /// How many of the lock's permits the grant holds (decision 0075).
    pub permits: u32,
    /// One slot per permit, ascending; `slot` is the first.
    pub slots: Vec<u32>,
    /// An election's grant: the digest of the secret that proves its
    /// leader (decision 0082), kept out of `metadata`.
    pub proof: Option<String>,
}

/// One step of a wait-for chain (decision 0077): `holder` waits for
/// `lock`, which `held_by` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitStep {
    pub holder: String,
    pub lock: String,
    pub held_by: String,
}

/// A chain of waits, each step's `held_by` the next step's `holder`.
pub type WaitChain = Vec<WaitStep>;

/// One page of a namespace's wait-for chains (decision 0081): the chains
/// among the page's edges, and where the next page starts (none: the last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitChainsPage {
    pub chains: Vec<WaitChain>,
    pub next: Option<u64>,
}

/// A waiting holder's edges in its namespace's wait-for registry: the
/// locks it waits for, each with the holders it waits on there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitEdge {
    pub holder: String,
    /// When its edge ends unless its replica renews it (Redis ms).
    pub expires_at_ms: i64,
    pub waits: Vec<(String, Vec<String>)>,
}

/// A validated acquire request.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub lock: LockId,
    pub holder: super::Holder,
    pub limit: u32,
    /// The lease a grant gets.
    pub ttl: super::Ttl,
    pub kind: super::Kind,
    pub metadata: BTreeMap<String, String>,
    /// How long to wait for a permit; zero tries once.
    pub wait: Duration,
    /// How long a waiting request lives in Redis without a refresh.
    pub queue_ttl_ms: u64,
    /// Higher goes first; FIFO within a priority.
    pub priority: i32,
    /// Fair requests take their turn in the queue; barging ones take any
    /// free permit. Read/write requests are always fair, unless
    /// `prefer_readers`.
    pub fair: bool,
    /// Plain, or a read/write lock's read or write side (decision 0074).
    pub mode: LockMode,
    /// With [`LockMode::Read`] only: a reader that takes a free read
    /// permit at once even when writers wait (barging).
    pub prefer_readers: bool,
    /// How many of the lock's `limit` permits it takes (at least 1; more
    /// than 1 only for a plain request; decision 0075).
    pub permits: u32,
    /// When the caller stops listening (its deadline, less the time its
    /// answer needs): nothing may be granted after it. None: only the
    /// Redis command timeout bounds it.
    pub answer_by: Option<Instant>,
    /// Set for a session's stream: its epoch. The grant is refused
    /// ([`EngineError::SessionMoved`], nothing changed) when a newer stream
    /// of the session holds it, and taken over from an older one.
    pub session_epoch: Option<u64>,
    /// Cancelled when the caller may no longer wait (its token was
    /// revoked): a waiting acquire leaves the queue at its next wake-up
    /// point and answers [`EngineError::Stopped`]. Never cuts a function
    /// call short, so the caller learns of any grant that call made.
    pub stop: Option<tokio_util::sync::CancellationToken>,
    /// The holder is known to hold nothing else (an id this replica just
    /// made up): its wait cannot close a wait-for cycle, so it skips the
    /// deadlock check (decision 0077).
    pub holds_nothing: bool,
    /// A holder whose live grant this request takes over in one step
    /// (decision 0083): its permits pass to `holder` with a new token and
    /// this request's lease. None, or when it holds nothing: an ordinary
    /// acquire. A plain lock's, never an election's or a session's.
    pub takes_over: Option<super::Holder>,
}

impl AcquireRequest {
    /// A try-once, fair, plain acquire of one permit of a mutex (limit 1),
    /// kind `default`, no metadata, no deadline; set the rest with struct
    /// update syntax (a wait wants a `queue_ttl_ms` too).
    pub fn new(lock: LockId, holder: super::Holder, ttl: super::Ttl) -> AcquireRequest {
        AcquireRequest {
            lock,
            holder,
            limit: 1,
            ttl,
            kind: super::Kind::default_kind(),
            metadata: BTreeMap::new(),
            wait: Duration::ZERO,
            queue_ttl_ms: 0,
            priority: 0,
            fair: true,
            mode: LockMode::Plain,
            prefer_readers: false,
            permits: 1,
            answer_by: None,
            session_epoch: None,
            stop: None,
            holds_nothing: false,
            takes_over: None,
        }
    }
}

/// A validated multi-lock acquire (decision 0076): `req` says everything
/// but the names (its `lock` is the first of them; `mode` plain, one
/// permit), `names` the 2..=16 distinct locks of its namespace, in the
/// request's order.
#[derive(Clone, Debug)]
pub struct MultiAcquireRequest {
    pub req: AcquireRequest,
    pub names: Vec<super::LockName>,
}

/// What a multi-lock acquire ended with. Not granted: `index` is the
/// first busy lock (in the request's order), with its holders and the
/// earliest lease end of a busy lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiOutcome {
    /// Every lock granted, in the request's order (`already`: every one
    /// was the holder's before: the same grants).
    Acquired {
        grants: Vec<(super::LockName, Grant)>,
        holders: u32,
        already: bool,
    },
    Busy {
        index: usize,
        holders: u32,
        next_expiry_at_ms: i64,
    },
    TimedOut {
        index: usize,
        holders: u32,
        next_expiry_at_ms: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// A new grant; `holders` counts live holders including it.
    Acquired { grant: Grant, holders: u32 },
    /// The holder already held a live grant: that grant, unchanged.
    AlreadyHeld { grant: Grant, holders: u32 },
    /// Tried once: every permit is taken (or the queue goes first).
    Busy {
        holders: u32,
        next_expiry_at_ms: i64,
    },
    /// Waited until the wait ended; `position` was its place in the queue.
    TimedOut {
        holders: u32,
        next_expiry_at_ms: i64,
        position: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The grant is gone; it was held this long (Redis clock).
    Released {
        kind: String,
        held_ms: i64,
    },
    NotHeld,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    Extended(Grant),
    NotHeld,
}

/// What Inspect sees of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    pub now_ms: i64,
    pub limit: u32,
    pub waiters: u32,
    /// Live holders, by slot.
    pub holders: Vec<Grant>,
    /// The lock's rule: plain, Read (readers hold it, or it is only
    /// waited for) or Write (its writer holds it).
    pub mode: LockMode,
    /// The permits of the live holders, summed (decision 0075).
    pub permits_in_use: u32,
}

/// One live waiting request, as the Queue RPC shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedRequest {
    pub holder: String,
    pub position: u32,
    pub priority: i32,
    pub enqueued_at_ms: i64,
    /// When the request is dropped unless its replica refreshes it.
    pub expires_at_ms: i64,
    /// When its RPC stops waiting.
    pub wait_deadline_ms: i64,
    pub fair: bool,
    pub kind: String,
    /// What it asks for: plain, read or write.
    pub mode: LockMode,
    /// How many permits it asks for.
    pub permits: u32,
}

/// What the Queue RPC sees of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueState {
    pub now_ms: i64,
    pub waiters: u32,
    pub requests: Vec<QueuedRequest>,
}

/// One lock in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSummary {
    pub name: String,
    pub holders: u32,
    pub limit: u32,
    pub waiters: u32,
    pub next_expiry_at_ms: i64,
    /// A read/write lock's mode: Write while its writer holds it, Read
    /// while readers hold it or it is only waited for; Plain otherwise.
    pub mode: LockMode,
    /// The permits of the live holders, summed (decision 0075).
    pub permits_in_use: u32,
}

/// Where a listing goes on: a deployment-wide SCAN position, and the last
/// key listed from the batch found there (a page that ended inside a batch
/// reads it again and goes on after that key, in byte order; keys that
/// come and go meanwhile cannot shift it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListCursor {
    pub node: u32,
    pub position: u64,
    /// Empty: from the batch's start.
    pub after: String,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPage {
    pub locks: Vec<LockSummary>,
    /// None when the listing is complete.
    pub next: Option<ListCursor>,
    pub now_ms: i64,
}

/// What a reap removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReapCounts {
    pub expired_holders: u64,
    pub dead_waiters: u64,
    /// Locks whose key was gone by the time the reaper looked at them.
    pub stale_index_entries: u64,
    pub old_grants: u64,
    pub old_waiters: u64,
    pub locks_visited: u64,
}

impl ReapCounts {
    pub fn add(&mut self, other: &ReapCounts) {
        self.expired_holders += other.expired_holders;
        self.dead_waiters += other.dead_waiters;
        self.stale_index_entries += other.stale_index_entries;
        self.old_grants += other.old_grants;
        self.old_waiters += other.old_waiters;
        self.locks_visited += other.locks_visited;
    }

    /// Anything removed at all.
    pub fn removed_any(&self) -> bool {
        self.expired_holders + self.dead_waiters + self.old_grants + self.old_waiters > 0
    }
}

/// What a clear removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClearCounts {
    pub locks: u64,
    pub grants: u64,
    pub requests: u64,
}

/// The events counted per minute and kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub acquired: u64,
    pub denied: u64,
    pub timed_out: u64,
    pub released: u64,
    pub extended: u64,
    pub expired: u64,
    pub reaped: u64,
    /// Grants and waiting requests removed by a Clear.
    pub cleared: u64,
    pub errors: u64,
    /// Read/write writers that asked READ (their grant is a reader's now;
    /// not counted as acquired).
    pub downgraded: u64,
}

impl Counters {
    pub fn add_event(&mut self, event: &str, n: u64) {
        let slot = match event {
            "acquired" => &mut self.acquired,
            "denied" => &mut self.denied,
            "timed_out" => &mut self.timed_out,
            "released" => &mut self.released,
            "extended" => &mut self.extended,
            "expired" => &mut self.expired,
            "reaped" => &mut self.reaped,
            "cleared" => &mut self.cleared,
            "errors" => &mut self.errors,
            "downgraded" => &mut self.downgraded,
            _ => return,
        };
        *slot += n;
    }

    /// Adds another row's counts to these.
    pub fn add(&mut self, other: &Counters) {
        self.acquired += other.acquired;
        self.denied += other.denied;
        self.timed_out += other.timed_out;
        self.released += other.released;
        self.extended += other.extended;
        self.expired += other.expired;
        self.reaped += other.reaped;
        self.cleared += other.cleared;
        self.errors += other.errors;
        self.downgraded += other.downgraded;
    }
}

/// One kind's counters over one minute (or, in totals, over the range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsRow {
    pub minute_ms: i64,
    pub kind: String,
    pub counters: Counters,
}

/// What the Metrics RPC reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsReport {
    pub minutes: Vec<MetricsRow>,
    pub totals: Vec<MetricsRow>,
    /// Every kind together over the range (kind `*`).
    pub overall: MetricsRow,
}

/// One term of one election's leader (`election.rs`): the grant of the
/// election's lock, seen as a leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub candidate: String,
    /// The grant's fencing token.
    pub term: u64,
    /// The grant's metadata entry `""` (empty when none was given).
    pub value: String,
    pub elected_at_ms: i64,
    pub expires_at_ms: i64,
    pub ttl_ms: u64,
}

/// What a Campaign came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CampaignOutcome {
    /// The candidate leads (newly, or a retry of its own campaign: the
    /// same term).
    Elected(Leadership),
    /// The wait ended first; `position` was its last place in line.
    NotElected { position: u32 },
}

/// What a Proclaim came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProclaimOutcome {
    Proclaimed(Leadership),
    /// The candidate does not lead with that term: nothing changed.
    NotLeader,
}

/// One change of an election, as Observe tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderChange {
    /// None when nobody leads after the change.
    pub leader: Option<Leadership>,
    /// current, elected, proclaimed, resigned, expired or removed.
    pub event: &'static str,
    /// Redis clock.
    pub at_ms: i64,
    /// The term that ended (resigned, expired, removed); 0 otherwise.
    pub ended_term: u64,
}

/// The Redis keys of one lock, as the engine's layout names them (`keys.rs`),
/// all with the hash tag of its shard (a function on the lock declares
/// them: [`LockKeys::declared`]); the handlers print them in debug lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKeys {
    /// HASH: the whole lock in one key — its header (limit, holders,
    /// earliest expiry, highest slot, arrivals, key expiry), a grant per
    /// holder (`h:<holder>`), slot → holder for semaphores, and each
    /// waiting request's liveness deadline and record (`w:<request>`,
    /// layout v4).
    pub lock: String,
    /// ZSET of waiting requests in grant order; exists only while someone waits.
    pub queue: String,
    /// STRING (per shard) last fencing token handed out.
    pub fence: String,
    /// ZSET (per shard) of live locks, kept only with a per-namespace lock
    /// limit.
    pub live: String,
}

impl LockKeys {
    /// The keys a function on this lock declares, so that Redis Cluster
    /// checks them all before it runs (a slot half-migrated answers
    /// ASK/TRYAGAIN instead of running a script that would fail midway):
    /// lock, queue, fence, and the live-lock ZSET when asked.
    pub fn declared(&self, with_live: bool) -> Vec<&str> {
        let mut keys = vec![self.lock.as_str(), self.queue.as_str(), self.fence.as_str()];
        if with_live {
            keys.push(&self.live);
        }
        keys
    }
}
