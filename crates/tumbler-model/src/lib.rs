//! A model of tumbler's lock protocol, checked with stateright (issue 39).
//!
//! Redis is one atomic state machine whose steps are the Lua functions of
//! `lua/` ([`redis`]); clients, the replica tasks serving them, the
//! replicas' waiter refreshers and session heartbeats, pub/sub wake-ups, a
//! fenced resource and the faults are around it ([`model`]); the
//! invariants of DESIGN.md are stateright properties ([`properties`]).
//! SAFETY.md at the repository's root maps each invariant to its argument,
//! its property here and the tests that pin it.
//!
//! Read/write locks (invariant 13, decision 74) with `prefer_readers`,
//! the release's hand-over (decision 68), weighted permits (invariant 14,
//! decision 75) and election (invariant 12, decision 69: a campaign is a
//! fair acquire of limit 1, `proclaim` and a resign pinned to the term)
//! are modelled ([`hand_over`]), each behind a configuration option that
//! is off by default.
//!
//! Multi-locks (invariant 15, decision 76) are modelled in [`multi`]: a
//! second lock, `acquire_many` as one call for the whole set or, on the
//! Cluster path, one call per lock with a reservation, the extends and
//! the rollback; the set's release and extend, pinned per lock to its
//! tokens, as one call per slot group ([`set`]: lua/release_many.lua and
//! lua/extend_many.lua). Slots, `clear`, the namespace lock limit and metadata
//! (an election's value) are left out: they decide no property here.

pub mod hand_over;
pub mod model;
pub mod multi;
pub mod properties;
pub mod redis;
mod sessions;
pub mod set;
mod state;
mod steps;
pub mod trace;

pub use hand_over::Mode;
pub use model::{Action, Call, Client, Ghost, Phase, State};
pub use redis::Id;

use hand_over::Hand;
use redis::{AcquireArgs, Data};

/// The faults a run may suffer, each with its budget (how many times).
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// A replica crashes: its waiters and session streams stop refreshing;
    /// calls it sent may still reach Redis (their answers go nowhere).
    pub crash: u8,
    /// A client pauses between checking its lease and acting on it, for as
    /// long as the run lets time pass (the Jepsen case).
    pub pause: u8,
    /// A pub/sub wake-up is lost.
    pub lose_wake: u8,
    /// A pub/sub wake-up arrives twice.
    pub duplicate_wake: u8,
    /// Redis fails over to a replica that missed recent writes (no WAIT).
    pub failover: u8,
    /// Redis restarts empty (no persistence).
    pub restart_empty: u8,
    /// Calls may take longer than a tick (otherwise every call sent in a
    /// tick runs within it, in any order).
    pub slow_network: bool,
    /// A failover may happen within one clock tick (a clock that stands
    /// still across it: what `next_token` assumes away).
    pub failover_same_tick: bool,
}

/// One model: the system's size, the lock's settings and the faults.
#[derive(Clone, Debug)]
pub struct Config {
    pub clients: u8,
    pub replicas: u8,
    /// The lock's limit (1: a mutex).
    pub limit: u8,
    /// Lease TTL, ticks.
    pub ttl: u8,
    /// Request TTL of a waiter (its liveness deadline from each refresh).
    pub queue_ttl: u8,
    /// How long an acquire waits (answer-by = request + wait); 0: try once.
    pub wait: u8,
    /// Requests per client (session clients make one).
    pub rounds: u8,
    /// The clock's bound, ticks (it starts at 1).
    pub max_time: u8,
    /// Fair (FIFO) requests, or barging ones.
    pub fair: bool,
    /// Per client (missing: 0); higher goes first.
    pub priorities: Vec<u8>,
    /// Per client: it holds its grant through a session (missing: no).
    pub sessions: Vec<bool>,
    /// Holders may extend their lease.
    pub extend: bool,
    /// The liveness bound checked (`properties::SERVED_IN_TIME`), ticks
    /// from a request to its grant; 0: not checked.
    pub served_within: u8,
    /// A session's end (session_end, then the releases) waits until the
    /// session's renewal in flight has run: the engine's behaviour
    /// (`Sessions::settled`). Off, the model is the engine before it,
    /// which the checker shows renewing a grant after its session ended
    /// (SAFETY.md, finding 1).
    pub end_awaits_renewals: bool,
    /// A client whose release was answered UNAVAILABLE (its replica
    /// crashed) sends it again before anything else, as the Rust client
    /// does; without it, the client goes on (and may ask again under the
    /// same holder id while the first release is still in flight).
    pub retry_release: bool,
    /// The reaper runs (lua/reap.lua) whenever it has something to do.
    pub reap: bool,
    /// Per client: READ or WRITE (missing or `None`: a plain request).
    /// Off (empty) by default, so the plain configurations are unchanged.
    pub modes: Vec<Option<Mode>>,
    /// A writer holding its grant may ask READ for it (a downgrade).
    pub downgrade: bool,
    /// The release hands the permit over (decision 68, `--hand-over`):
    /// waiting requests' records name their answer-by time, and the call
    /// that frees a permit grants the head and publishes the grant.
    pub hand_over: bool,
    /// Per client: permits it asks (missing or 0: 1; decision 75).
    pub permits: Vec<u8>,
    /// Per client: its requests barge (a plain request with `fair =
    /// false`; a reader: `prefer_readers`, flag `R`). Missing: as `fair`
    /// says for a plain request, fair for a read/write one.
    pub barging: Vec<bool>,
    /// An election (decision 69): the lock (limit 1, fair) is campaigned
    /// for; a leader that checked its lease writes with its term, then
    /// proclaims (lua/proclaim.lua) and resigns (release pinned to the
    /// term).
    pub election: bool,
    /// Per client: the locks it asks, a bit each (1: lock 0, 2: lock 1,
    /// 3: the set of both, a multi-lock); missing: lock 0 alone
    /// (decision 76, [`multi`]).
    pub locks: Vec<u8>,
    /// Multi-locks across Redis Cluster slots (decision 76): each lock its
    /// own slot group, taken in order with a reservation of this many
    /// ticks, then each extended to the lease; 0: the whole set in one
    /// call (one server or Sentinel).
    pub reservation: u8,
    /// Extends a multi-lock's holder may ask per request (the engine's
    /// `extend_set`: extend_many per slot group, each lock pinned to its
    /// token, the set let go when a part is not held); 0: none.
    pub set_extends: u8,
    /// A multi-lock's release names no token per lock (a caller that
    /// sends no `fencing_tokens`): each lock's release takes any grant of
    /// the holder, and a late one can take the holder's next set
    /// (finding 10). Off: each pinned to the set's token of that lock.
    pub unpinned_set_release: bool,
    pub faults: Faults,
}

impl Config {
    /// Two clients on two replicas, one fair lock of `limit`, no faults.
    pub fn small(limit: u8) -> Config {
        Config {
            clients: 2,
            replicas: 2,
            limit,
            ttl: 2,
            queue_ttl: 2,
            wait: 3,
            rounds: 1,
            max_time: 5,
            fair: true,
            priorities: Vec::new(),
            sessions: Vec::new(),
            extend: false,
            reap: false,
            modes: Vec::new(),
            downgrade: false,
            hand_over: false,
            permits: Vec::new(),
            barging: Vec::new(),
            election: false,
            locks: Vec::new(),
            reservation: 0,
            set_extends: 0,
            unpinned_set_release: false,
            served_within: 0,
            end_awaits_renewals: true,
            retry_release: true,
            faults: Faults::default(),
        }
    }
}

/// The configurations CI checks and the replay replays, by name.
impl Config {
    /// A mutex, two requests per client, extends and the reaper, 6 ticks.
    pub fn mutex() -> Config {
        Config {
            rounds: 2,
            max_time: 6,
            extend: true,
            reap: true,
            ..Config::small(1)
        }
    }

    /// A read/write lock of limit 2 (invariant 13, decision 74): three
    /// clients of `modes`, one request each; a writer may downgrade.
    pub fn read_write(modes: [Mode; 3], hand_over: bool) -> Config {
        Config {
            clients: 3,
            modes: modes.map(Some).to_vec(),
            downgrade: true,
            hand_over,
            ..Config::small(2)
        }
    }

    /// Weighted permits (invariant 14, decision 75): limit 3, three
    /// clients asking 2, 1 and 2 permits, one request each; `barging`:
    /// the client of one permit barges (`fair = false`).
    pub fn weighted(barging: bool) -> Config {
        Config {
            clients: 3,
            permits: vec![2, 1, 2],
            barging: vec![false, barging, false],
            ..Config::small(3)
        }
    }

    /// An election (invariant 12, decision 69): two candidates campaign
    /// (a fair acquire of limit 1), the leader extends, writes with its
    /// term, proclaims, then resigns; `pause`: pauses between a leader's
    /// check and its write.
    pub fn election(pause: u8) -> Config {
        let mut cfg = Config {
            election: true,
            extend: true,
            ..Config::small(1)
        };
        cfg.faults.pause = pause;
        cfg
    }

    /// `prefer_readers` (decision 74): a writer, a fair reader and a
    /// reader that prefers readers (a barging reader), one request each.
    pub fn prefer_readers(limit: u8) -> Config {
        Config {
            clients: 3,
            modes: vec![Some(Mode::Write), Some(Mode::Read), Some(Mode::Read)],
            barging: vec![false, false, true],
            ..Config::small(limit)
        }
    }

    /// Multi-locks (invariant 15, decision 76): client 0 asks the set of
    /// locks 0 and 1, client 1 lock 1 alone, client 2 (with `observer`)
    /// lock 0 alone; one request each, lease 3 ticks; the set's holder
    /// may extend it once. `reservation`: 0, the set in one call; else the
    /// Cluster path with that reservation.
    pub fn multi(reservation: u8, observer: bool, crash: u8) -> Config {
        let mut cfg = Config {
            clients: if observer { 3 } else { 2 },
            locks: vec![3, 2, 1],
            reservation,
            ttl: 3,
            set_extends: 1,
            ..Config::small(1)
        };
        cfg.faults.crash = crash;
        cfg
    }

    /// Finding 10's configuration: the set's client and the client of
    /// lock 1, two requests each trying once, one crash, `max_time`
    /// ticks, no extends; `unpinned`: the set's release names no token
    /// per lock.
    pub fn multi_retake(unpinned: bool, max_time: u8) -> Config {
        Config {
            rounds: 2,
            max_time,
            wait: 0,
            set_extends: 0,
            unpinned_set_release: unpinned,
            ..Config::multi(0, false, 1)
        }
    }
}

impl Config {
    /// The locks client `c` asks, a bit each.
    pub fn set_of(&self, c: Id) -> u8 {
        self.locks.get(usize::from(c)).copied().unwrap_or(1)
    }

    /// Whether client `c` asks a multi-lock (more than one lock).
    pub fn is_set(&self, c: Id) -> bool {
        self.set_of(c).count_ones() > 1
    }

    /// The lock a single-lock client asks (0 or 1).
    pub fn lock_of(&self, c: Id) -> u8 {
        u8::from(self.set_of(c) & 1 == 0)
    }

    /// The locks the model has: 2 when any client asks lock 1.
    pub fn lock_count(&self) -> u8 {
        if self.locks.iter().any(|&l| l & 2 != 0) {
            2
        } else {
            1
        }
    }

    pub(crate) fn session(&self, c: Id) -> bool {
        self.sessions.get(usize::from(c)).copied().unwrap_or(false)
    }

    /// Client `c`'s mode (`None`: plain).
    pub fn mode(&self, c: Id) -> Option<Mode> {
        self.modes.get(usize::from(c)).copied().flatten()
    }

    /// Permits client `c` asks.
    pub fn weight(&self, c: Id) -> u8 {
        self.permits
            .get(usize::from(c))
            .copied()
            .unwrap_or(1)
            .max(1)
    }

    /// Whether client `c`'s requests barge.
    pub fn barges(&self, c: Id) -> bool {
        // A waiting multi-lock does not queue for a turn (decision 76).
        if self.is_set(c) {
            return true;
        }
        match self.barging.get(usize::from(c)) {
            Some(&b) => b,
            None => self.mode(c).is_none() && !self.fair,
        }
    }

    pub(crate) fn priority(&self, c: Id) -> u8 {
        self.priorities.get(usize::from(c)).copied().unwrap_or(0)
    }

    pub(crate) fn initial(&self) -> State {
        let n = usize::from(self.clients);
        let mut redis = Data {
            sessions: vec![None; n],
            ..Data::default()
        };
        let clients = (0..self.clients)
            .map(|c| {
                let session = self.session(c);
                if session {
                    // lua/session_open.lua, before the model starts.
                    redis.session_open(1, c);
                }
                Client {
                    phase: Phase::Idle,
                    replica: c % self.replicas,
                    req: 0,
                    call: None,
                    beat: None,
                    wake: false,
                    paused: false,
                    epoch: u8::from(session),
                    retries: 0,
                    writer: false,
                    handed: None,
                    parts: [0; 2],
                    extends: 0,
                }
            })
            .collect();
        let synced = if self.faults.failover > 0 {
            redis.clone()
        } else {
            Data::default()
        };
        State {
            // The clock starts at 1: a token is never 0.
            now: 1,
            redis,
            synced,
            alive: vec![true; usize::from(self.replicas)],
            refresh: vec![false; usize::from(self.replicas)],
            clients,
            orphans: Vec::new(),
            resource: Resource::default(),
            used: [0; 6],
            ghost: Ghost {
                arrival: vec![(0, 0); n],
                told_no: vec![0; n],
                session_over: vec![false; n],
                partial_since: vec![0; n],
                letting_go: vec![false; n],
                ..Ghost::default()
            },
        }
    }

    pub fn acquire_args(&self, c: Id, req: u8, answer_by: u8, epoch: u8) -> AcquireArgs {
        AcquireArgs {
            holder: c,
            req,
            ttl: self.ttl,
            answer_by,
            limit: self.limit,
            fair: !self.barges(c),
            priority: self.priority(c),
            queue_ttl: (self.wait > 0).then_some(self.queue_ttl),
            epoch: (epoch > 0).then_some(epoch),
            mode: self.mode(c),
            permits: self.weight(c),
            hand: None,
        }
    }

    /// The arguments of request `req` of client `c` sent by replica `via`:
    /// with the hand-over, a waiting request's record names its
    /// answer-by time (and the replica, in its request id).
    pub fn request_args(&self, c: Id, via: u8, req: u8, answer_by: u8, epoch: u8) -> AcquireArgs {
        let mut a = self.acquire_args(c, req, answer_by, epoch);
        if self.hand_over && self.wait > 0 {
            a.hand = Some(Hand {
                answer_by,
                via,
                ttl: self.ttl,
                epoch,
            });
        }
        a
    }

    /// A writer's downgrade: an acquire READ for the grant it holds,
    /// trying once.
    pub fn downgrade_args(&self, c: Id, req: u8, epoch: u8) -> AcquireArgs {
        AcquireArgs {
            mode: Some(Mode::Read),
            queue_ttl: None,
            answer_by: 0,
            ..self.acquire_args(c, req, 0, epoch)
        }
    }
}

/// A resource that remembers the highest fencing token it accepted and
/// refuses writes with a lower one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Resource {
    /// The highest token accepted, and who wrote with it.
    pub last: Option<(u32, Id)>,
    /// A write was refused (its token was below the highest seen).
    pub refused: bool,
    /// Two different holders wrote with the same token (so the resource
    /// could not tell them apart): what fencing must never allow.
    pub confused: bool,
}

impl Resource {
    /// A write by `holder` with `token`.
    pub fn write(&mut self, token: u32, holder: Id) {
        match self.last {
            Some((highest, _)) if token < highest => self.refused = true,
            Some((highest, who)) if token == highest && who != holder => self.confused = true,
            _ => self.last = Some((token, holder)),
        }
    }
}
