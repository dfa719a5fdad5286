//! The system around Redis: clients, the replica task serving each one,
//! the replicas' refreshers and session heartbeats, pub/sub, a fenced
//! resource, and the faults; with the ghost state the properties read.
//!
//! An explicit-state [`Model`] rather than stateright's actor framework:
//! every replica-to-Redis call is a value in the state (at most one per
//! client task, one refresh per replica, one heartbeat per session
//! stream, plus the calls orphaned by a crash or a timeout), and Redis
//! runs any of them next, so calls of different tasks are reordered
//! without a network of message multisets, which would multiply the
//! states by their arrival orders and add nothing the functions can see
//! (one task's calls are sequential: the engine awaits each).

use crate::Config;
use crate::hand_over::Mode;
use crate::redis::{Data, Id};
pub use crate::state::{Call, Client, Ghost, Phase, State};
use crate::steps::{publish, run_beat, run_call};
use stateright::Model;

/// The model's steps. Those run by Redis are named after the Lua function
/// they run; the others are a client's, a replica's or a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client makes a request: acquire through its replica.
    Request(Id),
    /// A waiter is woken (pub/sub or its timer at the earliest expiry) and
    /// tries again.
    Retry(Id),
    /// A waiter's answer-by time passed: told "not acquired", dequeued.
    Timeout(Id),
    /// A holder checks its lease by its own clock before acting.
    Check(Id),
    /// It writes to the fenced resource, then lets go.
    Write(Id),
    /// Its lease passed by its own clock: it knows it lost the grant.
    GiveUp(Id),
    /// A holder asks for a new lease.
    AskExtend(Id),
    /// A writer holding its grant asks READ for it (a downgrade).
    Downgrade(Id),
    /// A waiter's replica answers it with the grant handed to its request.
    TakeHanded(Id),
    /// A session client whose stream died resumes on another replica.
    Resume(Id),
    /// Redis runs a client task's call (named after its function; a
    /// multi-lock's extend, rollback and release are `Extend` and
    /// `Release`).
    Acquire(Id),
    AcquireMany(Id),
    Release(Id),
    Extend(Id),
    Proclaim(Id),
    Dequeue(Id),
    SessionEnd(Id),
    SessionClaim(Id),
    /// Redis runs the renewal a resume makes before it is answered.
    ResumeRenew(Id),
    /// Redis runs a session heartbeat's call.
    SessionTouch(Id),
    Renew(Id),
    /// Redis runs a call whose task is gone.
    Orphan(usize),
    /// Redis runs a replica's waiter refresh (lua/refresh.lua).
    Refresh(u8),
    /// Redis runs the reaper's call (lua/reap.lua).
    Reap,
    /// Pub/sub: the wake-up to a client's waiter is lost, or arrives twice.
    LoseWake(Id),
    DuplicateWake(Id),
    /// Faults.
    Crash(u8),
    Pause(Id),
    Unpause(Id),
    /// Asynchronous replication catches up.
    Replicate,
    /// Failover to the replica without WAIT: recent writes lost.
    Failover,
    /// Redis restarts without persistence: everything lost.
    RestartEmpty,
    /// The clock moves one tick.
    Tick,
}

const CRASH: usize = 0;
const PAUSE: usize = 1;
const LOSE_WAKE: usize = 2;
const DUP_WAKE: usize = 3;
const FAILOVER: usize = 4;
const RESTART: usize = 5;

impl Config {
    /// Requests a client makes: a session client one (its session id is
    /// its holder; a session is not used again once ended).
    pub(crate) fn rounds_of(&self, c: Id) -> u8 {
        if self.session(c) { 1 } else { self.rounds }
    }

    /// The replica named in an acquire: only the hand-over reads it (a
    /// handed grant goes to that replica), so without it every call names
    /// replica 0 and states that differ only there are one.
    fn via(&self, replica: u8) -> u8 {
        if self.hand_over { replica } else { 0 }
    }

    /// The call a client's request (or its retry) makes: an acquire, or
    /// a multi-lock's first acquire_many.
    fn request_call(&self, cl: &Client, c: Id, now: u8, answer_by: u8) -> Call {
        if self.is_set(c) {
            return self.first_many(c, cl.req, now, answer_by);
        }
        Call::Acquire {
            req: cl.req,
            sent: now,
            answer_by,
            epoch: cl.epoch,
            via: self.via(cl.replica),
        }
    }

    /// The waiters replica `r` refreshes on `lock`: those of its clients
    /// waiting for it (a multi-lock waits on each lock of its set).
    pub(crate) fn refreshed(&self, s: &State, r: u8, lock: u8) -> Vec<Id> {
        (s.clients.iter().enumerate())
            .filter(|(i, cl)| {
                let asks = self.set_of(*i as Id) & (1 << lock) != 0;
                asks && cl.replica == r && matches!(cl.phase, Phase::Waiting { .. })
            })
            .map(|(i, _)| i as Id)
            .collect()
    }

    fn budget(&self, fault: usize) -> u8 {
        let f = &self.faults;
        [
            f.crash,
            f.pause,
            f.lose_wake,
            f.duplicate_wake,
            f.failover,
            f.restart_empty,
        ][fault]
    }
}

impl Model for Config {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let free_budget = |f: usize| s.used[f] < self.budget(f);
        for (i, cl) in s.clients.iter().enumerate() {
            let c = i as Id;
            let alive = s.alive[usize::from(cl.replica)];
            match cl.phase {
                Phase::Idle
                    if cl.call.is_none() && alive && cl.req < self.rounds_of(c) + cl.retries =>
                {
                    out.push(Action::Request(c))
                }
                Phase::Waiting {
                    answer_by,
                    retry_at,
                } => {
                    let timer = retry_at > 0 && s.now >= retry_at;
                    if cl.call.is_none() && alive && (cl.wake || timer) {
                        out.push(Action::Retry(c));
                    }
                    if cl.call.is_none() && alive && cl.handed.is_some() {
                        out.push(Action::TakeHanded(c));
                    }
                    // (A multi-lock's round runs to its end first.)
                    let between = !self.is_set(c) || cl.call.is_none();
                    if s.now > answer_by && alive && between {
                        out.push(Action::Timeout(c));
                    }
                    if (cl.wake || cl.handed.is_some()) && free_budget(LOSE_WAKE) {
                        out.push(Action::LoseWake(c));
                    }
                    if cl.wake && cl.call.is_none() && free_budget(DUP_WAKE) {
                        out.push(Action::DuplicateWake(c));
                    }
                }
                Phase::Holding { until, .. } => {
                    if s.now < until && cl.call.is_none() {
                        out.push(Action::Check(c));
                        let extends = if self.is_set(c) {
                            cl.extends < self.set_extends
                        } else {
                            self.extend
                        };
                        if extends && alive {
                            out.push(Action::AskExtend(c));
                        }
                        if self.downgrade && cl.writer && alive {
                            out.push(Action::Downgrade(c));
                        }
                    }
                    if s.now >= until && cl.call.is_none() {
                        out.push(Action::GiveUp(c));
                    }
                }
                Phase::Writing { .. } => {
                    // (With `end_awaits_renewals`, a session's end waits
                    // for its renewal in flight.)
                    let renewing = self.session(c) && self.end_awaits_renewals && cl.beat.is_some();
                    if !cl.paused && cl.call.is_none() && !renewing {
                        out.push(Action::Write(c));
                        if free_budget(PAUSE) {
                            out.push(Action::Pause(c));
                        }
                    } else if cl.paused {
                        out.push(Action::Unpause(c));
                    }
                }
                _ => {}
            }
            let stream_gone = self.session(c) && cl.epoch == 0 && cl.phase != Phase::Done;
            if stream_gone && cl.call.is_none() && s.alive.iter().any(|&a| a) {
                out.push(Action::Resume(c));
            }
            match cl.call {
                Some(Call::Acquire { .. } | Call::Downgrade { .. }) => out.push(Action::Acquire(c)),
                Some(Call::AcquireMany { .. }) => out.push(Action::AcquireMany(c)),
                Some(Call::Release { .. } | Call::RollBack { .. } | Call::ReleaseSet { .. }) => {
                    out.push(Action::Release(c))
                }
                Some(Call::Extend { .. } | Call::ExtendPart { .. } | Call::ExtendSet { .. }) => {
                    out.push(Action::Extend(c))
                }
                Some(Call::Proclaim { .. }) => out.push(Action::Proclaim(c)),
                Some(Call::Dequeue { .. }) => out.push(Action::Dequeue(c)),
                Some(Call::SessionEnd { .. }) => out.push(Action::SessionEnd(c)),
                Some(Call::SessionClaim) => out.push(Action::SessionClaim(c)),
                Some(Call::Renew { .. }) => out.push(Action::ResumeRenew(c)),
                _ => {}
            }
            match cl.beat {
                Some(Call::SessionTouch { .. }) => out.push(Action::SessionTouch(c)),
                Some(Call::Renew { .. }) => out.push(Action::Renew(c)),
                _ => {}
            }
        }
        for i in 0..s.orphans.len() {
            out.push(Action::Orphan(i));
        }
        for (r, &due) in s.refresh.iter().enumerate() {
            if due {
                out.push(Action::Refresh(r as u8));
            }
        }
        if self.reap {
            let mut lock = s.redis.lock.clone();
            if lock.as_mut().is_some_and(|l| l.purge(s.now)) {
                out.push(Action::Reap);
            }
        }
        if free_budget(CRASH) && s.alive.iter().filter(|&&a| a).count() > 1 {
            for (r, &a) in s.alive.iter().enumerate() {
                if a {
                    out.push(Action::Crash(r as u8));
                }
            }
        }
        let room = s.now < self.max_time;
        if self.budget(FAILOVER) > 0 && s.synced != s.redis {
            out.push(Action::Replicate);
        }
        if free_budget(FAILOVER) && (room || self.faults.failover_same_tick) && s.synced != s.redis
        {
            out.push(Action::Failover);
        }
        if free_budget(RESTART) && room {
            out.push(Action::RestartEmpty);
        }
        let writing = s
            .clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Writing { .. }) && !c.paused);
        // A waiter's answer-by timer fires before the clock moves on.
        let overdue = (s.clients.iter())
            .any(|c| matches!(c.phase, Phase::Waiting { answer_by, .. } if s.now > answer_by));
        if room && !writing && !overdue && (self.faults.slow_network || !s.busy()) {
            out.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now;
        match action {
            Action::Request(c) => {
                s.ghost.letting_go[usize::from(c)] = false;
                let cl = s.client(c);
                cl.req += 1;
                let answer_by = if self.wait > 0 { now + self.wait } else { 0 };
                cl.call = Some(self.request_call(cl, c, now, answer_by));
                if self.wait > 0 {
                    cl.phase = Phase::Waiting {
                        answer_by,
                        retry_at: 0,
                    };
                }
            }
            Action::Retry(c) | Action::DuplicateWake(c) => {
                if action == Action::DuplicateWake(c) {
                    s.used[DUP_WAKE] += 1;
                }
                let cl = s.client(c);
                let Phase::Waiting { answer_by, .. } = cl.phase else {
                    return None;
                };
                cl.wake = action != Action::Retry(c);
                cl.phase = Phase::Waiting {
                    answer_by,
                    retry_at: 0,
                };
                cl.call = Some(self.request_call(cl, c, now, answer_by));
            }
            Action::Timeout(c) => {
                let cl = s.client(c);
                let req = cl.req;
                if let Some(call) = cl.call.take() {
                    s.orphans.push((c, call));
                }
                let writer = self.mode(c) == Some(Mode::Write);
                let cl = s.client(c);
                cl.wake = false;
                cl.call = Some(Call::Dequeue { req });
                let handed = cl.handed.take();
                if let Some((token, until, full)) = handed
                    && until >= full
                {
                    // A grant handed over before its answer-by time and
                    // delivered meanwhile is still its caller's.
                    cl.phase = Phase::Holding { token, until };
                    cl.writer = writer;
                    s.told(self, token);
                } else {
                    // A provisional one (decision 89) is given back, not
                    // taken up: the caller is told no.
                    if let Some((token, ..)) = handed {
                        s.orphans.push((c, Call::GiveBack { req, token }));
                    }
                    s.ghost.told_no[usize::from(c)] = req;
                    s.round_over(c, self);
                }
            }
            Action::TakeHanded(c) => {
                let writer = self.mode(c) == Some(Mode::Write);
                let cl = s.client(c);
                let (token, expires, full) = cl.handed.take()?;
                if expires < full {
                    // A provisional grant (decision 89): its replica takes
                    // it up before it answers, with the waiting request's
                    // call again (answered HELD, with the lease asked).
                    let Phase::Waiting { answer_by, .. } = cl.phase else {
                        return None;
                    };
                    cl.call = Some(self.request_call(cl, c, now, answer_by));
                    s.ghost.taken_up = true;
                } else {
                    // Its lease as the grant says (the same clock).
                    cl.phase = Phase::Holding {
                        token,
                        until: expires,
                    };
                    cl.writer = writer;
                    cl.wake = false;
                    s.told(self, token);
                }
            }
            Action::Downgrade(c) => {
                let cl = s.client(c);
                // It stops writing as it asks.
                cl.writer = false;
                cl.call = Some(Call::Downgrade {
                    req: cl.req,
                    sent: now,
                    epoch: cl.epoch,
                });
            }
            Action::Check(c) => {
                let cl = s.client(c);
                let Phase::Holding { token, until } = cl.phase else {
                    return None;
                };
                cl.phase = Phase::Writing { token, until };
            }
            Action::Write(c) => {
                let cl = s.client(c);
                let Phase::Writing { token, .. } = cl.phase else {
                    return None;
                };
                let epoch = cl.epoch;
                // A reader reads: only writers (and plain holders) write;
                // the resource is lock 0's.
                let reads = (self.mode(c).is_some() && !cl.writer) || self.set_of(c) & 1 == 0;
                cl.phase = Phase::Idle;
                // An election's leader proclaims under its term, then
                // resigns; a multi-lock releases its set (release_many per
                // slot group).
                cl.call = Some(if self.is_set(c) {
                    Call::ReleaseSet {
                        groups: self.set_of(c),
                        tokens: cl.parts,
                    }
                } else if self.session(c) {
                    Call::SessionEnd { epoch, token }
                } else if self.election {
                    Call::Proclaim { token }
                } else {
                    Call::Release { token, epoch: 0 }
                });
                if !reads {
                    s.resource.write(token, c);
                }
                s.ghost.letting_go[usize::from(c)] = self.is_set(c);
            }
            Action::GiveUp(c) => s.round_over(c, self),
            Action::AskExtend(c) => {
                let cl = s.client(c);
                let Phase::Holding { token, .. } = cl.phase else {
                    return None;
                };
                cl.call = Some(if self.is_set(c) {
                    // A set's extend (the engine's `extend_set`): extend_many
                    // per slot group.
                    cl.extends += 1;
                    Call::ExtendSet {
                        groups: self.set_of(c),
                        tokens: cl.parts,
                        sent: now,
                        until: u8::MAX,
                    }
                } else {
                    Call::Extend { token, sent: now }
                });
            }
            Action::Resume(c) => {
                let r = s.alive.iter().position(|&a| a)?;
                let cl = s.client(c);
                cl.replica = r as u8;
                cl.call = Some(Call::SessionClaim);
            }
            Action::Acquire(c)
            | Action::AcquireMany(c)
            | Action::Release(c)
            | Action::Extend(c)
            | Action::Proclaim(c)
            | Action::Dequeue(c)
            | Action::SessionEnd(c)
            | Action::SessionClaim(c) => {
                let call = s.client(c).call.take()?;
                run_call(self, &mut s, c, call, true);
            }
            Action::ResumeRenew(c) => {
                let call = s.client(c).call.take()?;
                run_beat(self, &mut s, c, call, true);
            }
            Action::SessionTouch(c) | Action::Renew(c) => {
                let call = s.client(c).beat.take()?;
                run_beat(self, &mut s, c, call, true);
            }
            Action::Orphan(i) => {
                let (c, call) = s.orphans.remove(i);
                match call {
                    Call::SessionTouch { .. } | Call::Renew { .. } => {
                        run_beat(self, &mut s, c, call, false)
                    }
                    _ => run_call(self, &mut s, c, call, false),
                }
            }
            Action::Refresh(r) => {
                s.refresh[usize::from(r)] = false;
                for lock in 0..self.lock_count() {
                    let ids = self.refreshed(&s, r, lock);
                    s.redis.select(lock);
                    s.ghost.dead_waiter_skipped |= s.dead_waiters();
                    let (lost, wake) = s.redis.refresh(now, &ids, self.queue_ttl);
                    s.redis.select(lock);
                    for id in lost {
                        // The engine wakes a waiter whose place was lost: it joins again.
                        s.client(id).wake = true;
                    }
                    publish(self, &mut s, wake);
                }
            }
            Action::Reap => {
                let wake = s.redis.reap(now);
                publish(self, &mut s, wake);
            }
            Action::LoseWake(c) => {
                s.used[LOSE_WAKE] += 1;
                let cl = s.client(c);
                // A hand-over's message is lost as a wake-up is: the grant
                // waits for the waiter's next call (HELD) or its lease.
                cl.wake = false;
                cl.handed = None;
                s.ghost.wake_lost = true;
            }
            Action::Crash(r) => {
                s.used[CRASH] += 1;
                s.alive[usize::from(r)] = false;
                s.refresh[usize::from(r)] = false;
                let next = s.alive.iter().position(|&a| a)? as u8;
                for i in 0..s.clients.len() {
                    let cl = &mut s.clients[i];
                    if cl.replica != r {
                        continue;
                    }
                    // Its calls may still reach Redis; their answers go nowhere.
                    let calls: Vec<Call> =
                        cl.call.take().into_iter().chain(cl.beat.take()).collect();
                    cl.wake = false;
                    // A grant handed to it is left to its lease.
                    cl.handed = None;
                    if cl.epoch > 0 {
                        // The session's stream is gone; the client may resume it.
                        cl.epoch = 0;
                    } else {
                        cl.replica = next;
                    }
                    if matches!(cl.phase, Phase::Waiting { .. }) {
                        // The waiting RPC fails (UNAVAILABLE); the client may ask again.
                        cl.phase = Phase::Idle;
                        cl.retries += 1;
                    }
                    for call in calls {
                        // A release answered UNAVAILABLE is sent again
                        // through the next replica (the clients retry it
                        // until they get an answer); the first may still land.
                        if let (Call::Release { .. }, false, true) =
                            (call, self.session(i as Id), self.retry_release)
                        {
                            s.clients[i].call = Some(call);
                        }
                        // A multi-lock's release is sent again whole
                        // (every group of the set, from the first).
                        if let (Call::ReleaseSet { tokens, .. }, true) = (call, self.retry_release)
                        {
                            let groups = self.set_of(i as Id);
                            s.clients[i].call = Some(Call::ReleaseSet { groups, tokens });
                        }
                        // A set's extend cut between its groups (the
                        // Cluster path: finding 11's path).
                        if let Call::ExtendSet { groups, .. } = call {
                            s.ghost.set_extend_cut |= groups != self.set_of(i as Id);
                        }
                        s.orphans.push((i as Id, call));
                    }
                }
            }
            Action::Pause(c) => {
                s.used[PAUSE] += 1;
                s.client(c).paused = true;
            }
            Action::Unpause(c) => s.client(c).paused = false,
            Action::Replicate => s.synced = s.redis.clone(),
            Action::Failover => {
                s.used[FAILOVER] += 1;
                s.redis = s.synced.clone();
                s.ghost.data_lost = true;
                if !self.faults.failover_same_tick {
                    // A failover takes longer than a tick (Sentinel's down-after).
                    s.now += 1;
                }
            }
            Action::RestartEmpty => {
                s.used[RESTART] += 1;
                s.redis = Data {
                    sessions: vec![None; s.clients.len()],
                    ..Data::default()
                };
                s.synced = s.redis.clone();
                s.ghost.data_lost = true;
                s.now += 1;
            }
            Action::Tick => {
                s.now += 1;
                for r in 0..s.alive.len() {
                    let waiting = (s.clients.iter()).any(|cl| {
                        usize::from(cl.replica) == r && matches!(cl.phase, Phase::Waiting { .. })
                    });
                    s.refresh[r] = s.alive[r] && waiting;
                }
                for cl in s.clients.iter_mut() {
                    if cl.epoch > 0 && cl.phase != Phase::Done && cl.beat.is_none() {
                        cl.beat = Some(Call::SessionTouch { epoch: cl.epoch });
                    }
                }
            }
        }
        if !self.locks.is_empty() {
            crate::multi::track_sets(self, &mut s);
        }
        Some(s)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        crate::properties::all()
    }
}
