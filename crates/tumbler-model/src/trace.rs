//! A model path as the Redis calls it makes: the function each step runs,
//! its caller and arguments, and the reply the model expects. This is the
//! input of the replay against the real functions on a real Redis (issue
//! 39, item 4: SAFETY.md, "Next"): every call of a trace is one `FCALL`,
//! and its reply must match the model's.

use crate::Config;
use crate::hand_over::{Mode, Wake};
use crate::model::{Action, Call, State};
use crate::redis::{Data, Effects, Id, Reply};
use crate::steps::alive_for;

/// One step of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A Lua function runs: its file's name, for whom, the call as the
    /// model made it, its read/write mode (an acquire's `r`/`w` flag;
    /// `None`: plain), and the reply the model expects.
    Function {
        function: &'static str,
        client: Id,
        call: Option<Call>,
        mode: Option<Mode>,
        reply: Option<Reply>,
        /// A release's caller replica, when one of its requests waits on
        /// the lock (decision 90): release.lua's `alive`.
        alive: Option<u8>,
    },
    /// A replica's `refresh.lua` for its waiters on `lock`; the ids no
    /// longer queued.
    Refresh {
        replica: u8,
        lock: u8,
        waiters: Vec<Id>,
        lost: Vec<Id>,
    },
    /// `reap.lua`.
    Reap,
    /// The step before handed a grant to `client`'s waiting request
    /// (decision 68), with the model's `token`: a replay learns the real
    /// token from the lock.
    Handed {
        client: Id,
        token: u32,
    },
    /// The clock moves a tick.
    Tick,
    /// Redis loses data: back to what its replica had, or everything.
    Failover,
    RestartEmpty,
}

/// The Lua file a call runs.
pub fn function(call: &Call) -> &'static str {
    match call {
        Call::Acquire { .. } | Call::Downgrade { .. } => "acquire",
        Call::Release { .. } | Call::GiveBack { .. } => "release",
        Call::Extend { .. } => "extend",
        Call::Proclaim { .. } => "proclaim",
        Call::Dequeue { .. } => "dequeue",
        Call::SessionEnd { .. } => "session_end",
        Call::SessionClaim => "session_claim",
        Call::SessionTouch { .. } => "session_touch",
        Call::Renew { .. } => "renew",
        Call::AcquireMany { .. } => "acquire_many",
        Call::ExtendPart { .. } => "extend",
        Call::RollBack { .. } => "release",
        Call::ExtendSet { .. } => "extend_many",
        Call::ReleaseSet { .. } => "release_many",
    }
}

/// The reply Redis gives `call` of client `c` in state `s`.
fn reply(cfg: &Config, s: &State, c: Id, call: Call) -> Option<Reply> {
    let mut data = s.redis.clone();
    let now = s.now;
    let on = |data: &mut Data, lock: u8, f: &dyn Fn(&mut Data) -> Reply| {
        data.select(lock);
        f(data)
    };
    if !cfg.is_set(c) {
        data.select(cfg.lock_of(c));
    }
    Some(match call {
        Call::AcquireMany {
            answer_by, group, ..
        } => (data.acquire_many(now, cfg.many_args(c, answer_by, group))).reply,
        Call::ExtendPart { lock, .. } => {
            let token = cfg.part_token(&call);
            on(&mut data, lock, &|d| {
                d.extend(now, c, token, cfg.ttl, 0).reply
            })
        }
        Call::RollBack { lock, .. } => {
            let token = cfg.part_token(&call);
            on(&mut data, lock, &|d| {
                d.release(now, c, token, None, None, None).reply
            })
        }
        Call::ExtendSet { groups, .. } => {
            let (tokens, group) = (cfg.set_tokens(&call), cfg.group_of(c, groups));
            (data.extend_many(now, c, tokens, cfg.ttl, 0, group)).reply
        }
        Call::ReleaseSet { groups, .. } => {
            let (tokens, group) = (cfg.set_tokens(&call), cfg.group_of(c, groups));
            data.release_many(now, c, tokens, group).reply
        }
        _ => return single(cfg, s, c, call).map(|effects| effects.reply),
    })
}

/// What a single lock's call of client `c` in state `s` does: its reply
/// and what it publishes (None for a multi-lock's calls, and for those
/// that answer no reply of this kind).
fn single(cfg: &Config, s: &State, c: Id, call: Call) -> Option<Effects> {
    if cfg.is_set(c) {
        return None;
    }
    let mut data = s.redis.clone();
    data.select(cfg.lock_of(c));
    let some = |e: u8| (e > 0).then_some(e);
    let now = s.now;
    Some(match call {
        Call::Acquire {
            req,
            answer_by,
            epoch,
            via,
            ..
        } => data.acquire(now, cfg.request_args(c, via, req, answer_by, epoch)),
        Call::Downgrade { epoch, .. } => data.acquire(now, cfg.downgrade_args(c, 0, epoch)),
        Call::Release { token, epoch } => {
            data.release(now, c, token, some(epoch), None, alive_for(cfg, s, c))
        }
        Call::GiveBack { req, token } => {
            data.release(now, c, token, None, Some(req), alive_for(cfg, s, c))
        }
        Call::Extend { token, .. } => data.extend(now, c, token, cfg.ttl, 0),
        Call::Proclaim { token } => data.proclaim(now, c, token),
        Call::Renew { token, epoch, .. } => data.renew(now, c, token, cfg.ttl, epoch),
        _ => return None,
    })
}

/// The Redis side of a path (as `Path::into_vec` gives it: each state
/// with the action taken from it).
pub fn trace(cfg: &Config, path: &[(State, Option<Action>)]) -> Vec<Step> {
    let mut steps = Vec::new();
    for (s, action) in path {
        let Some(action) = action else { continue };
        let client = |c: Id| &s.clients[usize::from(c)];
        let call = match *action {
            Action::Acquire(c)
            | Action::AcquireMany(c)
            | Action::Release(c)
            | Action::Extend(c)
            | Action::Proclaim(c)
            | Action::Dequeue(c)
            | Action::SessionEnd(c)
            | Action::SessionClaim(c)
            | Action::ResumeRenew(c) => client(c).call.map(|call| (c, call)),
            Action::SessionTouch(c) | Action::Renew(c) => client(c).beat.map(|call| (c, call)),
            Action::Orphan(i) => s.orphans.get(i).copied(),
            Action::Refresh(r) => {
                for lock in 0..cfg.lock_count() {
                    let waiters = cfg.refreshed(s, r, lock);
                    let mut data = s.redis.clone();
                    data.select(lock);
                    let (lost, wake) = data.refresh(s.now, &waiters, cfg.queue_ttl);
                    steps.push(Step::Refresh {
                        replica: r,
                        lock,
                        waiters,
                        lost,
                    });
                    push_handed(&mut steps, &wake);
                }
                None
            }
            Action::Reap => {
                steps.push(Step::Reap);
                let mut data = s.redis.clone();
                data.select(0);
                push_handed(&mut steps, &data.reap(s.now));
                None
            }
            Action::Tick => {
                steps.push(Step::Tick);
                None
            }
            Action::Failover => {
                steps.push(Step::Failover);
                None
            }
            Action::RestartEmpty => {
                steps.push(Step::RestartEmpty);
                None
            }
            _ => None,
        };
        if let Some((c, call)) = call {
            let reply = reply(cfg, s, c, call);
            let mode = match call {
                Call::Acquire { .. } => cfg.mode(c),
                Call::Downgrade { .. } => Some(Mode::Read),
                _ => None,
            };
            let alive = match call {
                Call::Release { .. } | Call::GiveBack { .. } if !cfg.is_set(c) => {
                    alive_for(cfg, s, c)
                }
                _ => None,
            };
            steps.push(Step::Function {
                function: function(&call),
                client: c,
                call: Some(call),
                mode,
                reply,
                alive,
            });
            if let Some(wake) = wake(cfg, s, c, call) {
                push_handed(&mut steps, &wake);
            }
        }
    }
    steps
}

/// A [`Step::Handed`] per grant `wake` hands over.
fn push_handed(steps: &mut Vec<Step>, wake: &Wake) {
    for h in &wake.handed {
        steps.push(Step::Handed {
            client: h.holder,
            token: h.token,
        });
    }
}

/// What a single lock's call of client `c` in state `s` publishes (the
/// grants it hands over among it); None for a multi-lock's calls.
fn wake(cfg: &Config, s: &State, c: Id, call: Call) -> Option<Wake> {
    match call {
        Call::Dequeue { req } if !cfg.is_set(c) => {
            let mut data = s.redis.clone();
            data.select(cfg.lock_of(c));
            Some(data.dequeue(s.now, c, req))
        }
        call => single(cfg, s, c, call).map(|effects| effects.wake),
    }
}

/// A path of `cfg` chosen at random (a small LCG from `seed`, so a path
/// is named by its seed), up to `steps` steps or a state without
/// successors.
pub fn random_walk(cfg: &Config, seed: u64, steps: usize) -> Vec<(State, Option<Action>)> {
    use stateright::Model;
    let mut rng = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut state = cfg.init_states().remove(0);
    let mut path = Vec::new();
    for _ in 0..steps {
        let mut next = cfg.next_steps(&state);
        if next.is_empty() {
            break;
        }
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let (action, after) = next.swap_remove((rng >> 33) as usize % next.len());
        path.push((state, Some(action)));
        state = after;
    }
    path.push((state, None));
    path
}

/// The path the checker finds for property `name` of `cfg` (a
/// counterexample of an `always`, an example of a `sometimes`).
pub fn discovery(cfg: &Config, name: &'static str) -> Option<Vec<(State, Option<Action>)>> {
    use stateright::{Checker, Model};
    let checker = cfg.clone().checker().spawn_bfs().join();
    checker.discovery(name).map(|path| path.into_vec())
}
