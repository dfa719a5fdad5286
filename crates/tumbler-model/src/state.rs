//! The system's state: what each client (and the replica task serving
//! it) is doing, the calls sent to Redis and not run yet, Redis' data,
//! the fenced resource, and the ghost state the properties read.

use crate::Config;
use crate::Resource;
use crate::redis::{Data, Id};

/// What a client (and the replica task serving its RPC) is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Between requests (or about to make its first).
    Idle,
    /// In the lock's queue, its RPC open; woken by pub/sub or its timer.
    Waiting { answer_by: u8, retry_at: u8 },
    /// Holds a grant it believes valid while its own clock is before `until`.
    Holding { token: u32, until: u8 },
    /// Checked its lease (still valid) and is about to write with `token`.
    Writing { token: u32, until: u8 },
    /// Its requests are over.
    Done,
}

/// A call a replica task sent to Redis and Redis has not run yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Acquire {
        req: u8,
        sent: u8,
        answer_by: u8,
        epoch: u8,
        /// The replica that sent it (its request id names it).
        via: u8,
    },
    /// A writer asks READ for the grant it holds (acquire.lua step 4).
    Downgrade {
        req: u8,
        sent: u8,
        epoch: u8,
    },
    /// A replica gives back a grant handed to its request `req`, which is
    /// gone (release.lua with `handed`, pinned to the token).
    GiveBack {
        req: u8,
        token: u32,
    },
    Release {
        token: u32,
        epoch: u8,
    },
    Extend {
        token: u32,
        sent: u8,
    },
    /// An election's leader replaces its value under its term
    /// (lua/proclaim.lua).
    Proclaim {
        token: u32,
    },
    /// The request that leaves (finding 6: a place another request of the
    /// holder took over is left alone).
    Dequeue {
        req: u8,
    },
    SessionEnd {
        epoch: u8,
        token: u32,
    },
    SessionClaim,
    SessionTouch {
        epoch: u8,
    },
    Renew {
        token: u32,
        sent: u8,
        epoch: u8,
    },
    /// A multi-lock's call of lua/acquire_many.lua for the locks of
    /// `group` (a bit each: the whole set, or on the Cluster path one
    /// lock); `held`: the token of lock 0, taken earlier in the round.
    AcquireMany {
        req: u8,
        sent: u8,
        answer_by: u8,
        group: u8,
        held: u32,
    },
    /// The Cluster path: every part held, each extended to the lease
    /// (lua/extend.lua pinned to its token), lock 0 then lock 1; `until`:
    /// the earliest lease so far, as the client counts it.
    ExtendPart {
        lock: u8,
        tokens: [u32; 2],
        sent: u8,
        until: u8,
    },
    /// The Cluster path: a round refused after a part was taken releases
    /// it (lua/release.lua pinned to its token); then the caller waits
    /// (`queued`: its timer's time, 0: none) or is told no.
    RollBack {
        lock: u8,
        token: u32,
        queued: Option<u8>,
    },
    /// A multi-lock's release (lua/release_many.lua): one call for the
    /// locks of its slot group, each pinned to its lock's token from the
    /// set's grant (0: any grant of the holder,
    /// `Config::unpinned_set_release`). `groups`: the locks still to
    /// release, a bit each: on one server the whole set in one call; on
    /// the Cluster path one lock per call, lock 0 then lock 1.
    ReleaseSet {
        groups: u8,
        tokens: [u32; 2],
    },
    /// A set's extend (lua/extend_many.lua): one call per slot group, each
    /// lock pinned to its token, all or nothing within the call; `groups`:
    /// the locks still to extend (as `ReleaseSet`'s); `until`: the earliest
    /// lease so far, as the client counts it. A group answered not held
    /// lets go of itself in that call; on the Cluster path the set's other
    /// groups are released then (`ReleaseSet`).
    ExtendSet {
        groups: u8,
        tokens: [u32; 2],
        sent: u8,
        until: u8,
    },
}

/// One client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub phase: Phase,
    /// The replica serving it (its session's stream, its waiting RPC).
    pub replica: u8,
    /// Requests made so far (the current one's number).
    pub req: u8,
    /// Its RPC's outstanding call.
    pub call: Option<Call>,
    /// Its session heartbeat's outstanding call (touch, then renew).
    pub beat: Option<Call>,
    /// A pub/sub wake-up on its way to its waiter.
    pub wake: bool,
    /// Paused (GC, VM freeze) between its lease check and its write.
    pub paused: bool,
    /// Its session stream's epoch; 0: no live stream.
    pub epoch: u8,
    /// Requests that failed with their replica (each may be made again).
    pub retries: u8,
    /// Read/write: it believes its grant is the writer's (a downgrade
    /// clears it as it asks: it stops writing first).
    pub writer: bool,
    /// A grant handed to its waiting request, delivered to its replica and
    /// not yet answered: token, lease expiry and the end of the lease
    /// asked (later than the expiry for a provisional grant: decision 89).
    pub handed: Option<(u32, u8, u8)>,
    /// A multi-lock's tokens, per lock, while it holds its set (0: none).
    pub parts: [u32; 2],
    /// The extends its set's holder asked in the current request.
    pub extends: u8,
}

/// Facts about the run that no single state shows; the properties read them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// The highest fencing token granted so far.
    pub max_token: u32,
    pub token_went_back: bool,
    /// Per client: its request that reached Redis last, and when its place
    /// in line began (the order in which requests first reached Redis; a
    /// new request of a holder still in the queue keeps that holder's
    /// place, as the queue does).
    pub arrival: Vec<(u8, u8)>,
    pub arrivals: u8,
    /// Per client: the request that was answered "not acquired" (0: none).
    pub told_no: Vec<u8>,
    pub granted_after_no: bool,
    pub fifo_broken: bool,
    /// Per client: its session ended (session_end, or a claim found it over).
    pub session_over: Vec<bool>,
    pub renewed_after_end: bool,
    pub duplicate_grant: bool,
    /// Events the `sometimes` properties look for.
    pub waiter_granted: bool,
    pub dead_waiter_skipped: bool,
    /// A request that could only queue found its holder's entry past its
    /// request TTL, not purged, and kept its place (acquire.lua step 3).
    pub dead_place_kept: bool,
    pub resumed: bool,
    pub data_lost: bool,
    pub token_after_loss: bool,
    pub wake_lost: bool,
    /// Read/write: the token of the last grant downgraded.
    pub downgraded: Option<u32>,
    /// A grant was handed over by the call that freed its permit.
    pub handed: bool,
    /// A grant was handed to a request whose replica had died (nobody
    /// answers it or gives it back: it lasts its lease).
    pub handed_to_dead: bool,
    /// A grant was handed to a request past its request TTL (one the
    /// functions should have skipped as dead).
    pub handed_past_ttl: bool,
    /// A handed grant's lease ran past its request's liveness deadline
    /// (a waiter whose replica died would keep the lock for it).
    pub hand_past_deadline: bool,
    /// A provisional handed grant reached a live replica, which took it up.
    pub taken_up: bool,
    /// A grant past its request's liveness deadline was handed whole, by
    /// a call of the request's own replica (decision 90).
    pub handed_whole: bool,
    /// Election: the latest term granted and its lease's end as Redis
    /// set it (moved by an extend of that term).
    pub term: Option<(u32, u8)>,
    /// A proclaim or a resign was applied under a term that is not the
    /// latest, or whose lease had passed.
    pub lapsed_act: bool,
    /// The highest term (token) a client was told it holds, and whether a
    /// client was told a lower one after it.
    pub told_max: u32,
    pub terms_fell: bool,
    pub proclaimed: bool,
    pub proclaim_refused: bool,
    /// Weighted: a barging request granted while a head that does not fit
    /// waits; a waiter of several permits granted after waiting.
    pub passed_big_head: bool,
    pub weighted_waiter_granted: bool,
    /// prefer_readers: a barging reader granted while a writer waits (and
    /// one that had waited in the queue itself, woken).
    pub reader_passed_writer: bool,
    pub woken_reader_passed_writer: bool,
    /// Multi-locks, per client: since when it holds part of its set
    /// (some of its locks' live grants, not all; 0: not), and whether it
    /// lets go of a set it was granted (its release sent).
    pub partial_since: Vec<u8>,
    pub letting_go: Vec<bool>,
    /// A set was granted whole; a set refused (told no, or waiting)
    /// while its caller holds none of its locks; a part held alone
    /// lapsed with its lease (no release).
    pub set_granted: bool,
    pub set_refused_empty: bool,
    pub part_lapsed: bool,
    /// A multi-lock's rollback woke its own wait (finding 9).
    pub self_woken: bool,
    /// A set's extend renewed both locks; one found a part not held and
    /// let go of the set (the rest released, pinned to its tokens).
    pub set_extended: bool,
    pub set_extend_broken: bool,
    /// A crash cut a set's extend between its slot groups (the Cluster
    /// path: finding 11's path).
    pub set_extend_cut: bool,
    /// An orphaned acquire_many (an earlier request, its task gone) landed
    /// and granted the set or found it held (finding 12's first step).
    pub late_set_request: bool,
    /// A set's release pinned to its tokens found the holder's newer grant
    /// of that lock (a set taken again) and left it (finding 10's path).
    pub stale_set_release_left: bool,
    /// A set's release took a grant of the holder other than its set's
    /// (a newer one: finding 10 without tokens).
    pub newer_grant_released: bool,
}

/// The whole system's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The Redis clock (ticks); clients and replicas read the same time.
    pub now: u8,
    pub redis: Data,
    /// What the Redis replica has received (asynchronous replication);
    /// a failover without WAIT promotes it.
    pub synced: Data,
    pub alive: Vec<bool>,
    /// Per replica: its waiter refresh is in flight.
    pub refresh: Vec<bool>,
    pub clients: Vec<Client>,
    /// Calls whose task is gone (replica crash, answered timeout): Redis
    /// may still run them.
    pub orphans: Vec<(Id, Call)>,
    pub resource: Resource,
    /// Faults used so far, in the order of `Faults`' budgets.
    pub used: [u8; 6],
    pub ghost: Ghost,
}

impl State {
    pub(crate) fn client(&mut self, c: Id) -> &mut Client {
        &mut self.clients[usize::from(c)]
    }

    /// Whether a replica task has a call in flight that a tick must wait
    /// for (the network delivers within a tick unless it is slow).
    pub(crate) fn busy(&self) -> bool {
        self.refresh.iter().any(|&r| r)
            || (self.clients.iter())
                .any(|c| c.call.is_some() || c.beat.is_some() || c.wake || c.handed.is_some())
    }

    /// Whether the queue holds a waiter past its deadline (the next call
    /// on the lock skips it).
    pub(crate) fn dead_waiters(&self) -> bool {
        self.dead_waiters_on(&self.redis.lock)
    }

    /// Whether `lock` (either of the model's) holds a waiter past its
    /// deadline.
    pub(crate) fn dead_waiters_on(&self, lock: &Option<crate::redis::Lock>) -> bool {
        (lock.as_ref()).is_some_and(|l| l.queue.iter().any(|w| w.deadline <= self.now))
    }

    /// A client is told it holds the grant of `token` (its term; kept for
    /// an election only, so other configurations' states do not split).
    pub(crate) fn told(&mut self, cfg: &Config, token: u32) {
        if !cfg.election {
            return;
        }
        let g = &mut self.ghost;
        g.terms_fell |= token < g.told_max;
        g.told_max = g.told_max.max(token);
    }

    /// The client's current request is over: another one, or done.
    pub(crate) fn round_over(&mut self, c: Id, cfg: &Config) {
        let client = self.client(c);
        // A wake-up still on its way finds no waiter.
        client.wake = false;
        client.writer = false;
        client.parts = [0; 2];
        client.extends = 0;
        client.phase = if client.req < cfg.rounds_of(c) + client.retries {
            Phase::Idle
        } else {
            Phase::Done
        };
    }
}
