//! A held set's release and extend as one call per slot group (invariant
//! 15, findings 11 and 12): `Data::release_many` is lua/release_many.lua
//! and `Data::extend_many` is lua/extend_many.lua, steps numbered as their
//! comments number them (step 0, a malformed call refused, is the
//! engine's to avoid: the model makes none). Each runs on the locks of one group, a bit each
//! (on one server the whole set; on the Cluster path one lock), and each
//! lock's part reuses the single-lock steps of `redis.rs` (release.lua's
//! steps 2–4, extend.lua's steps 5–6) within the one atomic step, so no
//! other call lands between two locks of a group. `run_held_call` is
//! what such a call does to the system: the set's holder moves on to the
//! next group, or, its extend answered `NOT_HELD`, releases the set's
//! other groups (the Cluster path) and stops acting on the set.

use crate::Config;
use crate::hand_over::Wake;
use crate::model::{Call, Phase, State};
use crate::multi::held;
use crate::redis::{Data, Id, Lock, Reply};
use crate::steps::{belief, publish};

/// The reply of a set's call and each lock's wake-up (its PUBLISHes).
pub struct SetEffects {
    pub reply: Reply,
    pub wakes: Vec<Wake>,
}

/// The model's locks in `group` (a bit each), in the acquire's order.
pub fn locks_of(group: u8) -> impl Iterator<Item = u8> {
    (0..2).filter(move |i| group & (1 << i) != 0)
}

/// Whether `lock` has a live grant of `holder` (with `token`, unless 0)
/// once its lapsed leases are purged.
fn held_with(lock: &Option<Lock>, now: u8, holder: Id, token: u32) -> bool {
    (lock.as_ref()).is_some_and(|l| {
        (l.holders.iter())
            .any(|g| g.holder == holder && g.expires > now && (token == 0 || g.token == token))
    })
}

impl Data {
    /// One lock's release.lua steps 2–4 (purge; only the holder's live
    /// grant with `token`, 0: any, is dropped; the permit handed over;
    /// settle).
    fn release_one(&mut self, now: u8, holder: Id, lock: u8, token: u32) -> (bool, Wake) {
        self.select(lock);
        let out = self.release(now, holder, token, None, None, None);
        self.select(lock);
        (matches!(out.reply, Reply::Ok { .. }), out.wake)
    }

    /// lua/release_many.lua: the locks of `group`, each pinned to its
    /// token in `tokens` (per model lock; 0: any grant of the holder).
    pub fn release_many(&mut self, now: u8, holder: Id, tokens: [u32; 2], group: u8) -> SetEffects {
        let (mut released, mut wakes) = (0, Vec::new());
        // 1. Lock after lock, release.lua's steps 2–4: its lapsed leases
        //    and dead waiters purged; only a live grant of the holder with
        //    the lock's token (if given) released, its permit handed to
        //    the next waiter in line; a status per lock (OK, NOT_HELD).
        for lock in locks_of(group) {
            let (ok, wake) = self.release_one(now, holder, lock, tokens[usize::from(lock)]);
            released |= u8::from(ok) << lock;
            wakes.push(wake);
        }
        // 2. The answer: OK when every lock was released, else NOT_HELD
        //    (the locks released stay released).
        SetEffects {
            reply: Reply::ReleasedMany {
                locks: group,
                released,
            },
            wakes,
        }
    }

    /// lua/extend_many.lua: the locks of `group` extended to `ttl` from
    /// now, each pinned to its token (0: any), all or nothing.
    pub fn extend_many(
        &mut self,
        now: u8,
        holder: Id,
        tokens: [u32; 2],
        ttl: u8,
        answer_by: u8,
        group: u8,
    ) -> SetEffects {
        // 1. Past the caller's answer-by time nothing changes.
        if answer_by != 0 && now > answer_by {
            return SetEffects {
                reply: Reply::Late,
                wakes: Vec::new(),
            };
        }
        // 2. Every lock loaded and purged (each lock's step below purges
        //    it first, and nothing runs between them); 3. does each have
        //    a live grant of the holder with its token?
        let lock = |d: &Data, i: u8| {
            if i == 0 {
                d.lock.clone()
            } else {
                d.second.clone()
            }
        };
        let whole =
            locks_of(group).all(|i| held_with(&lock(self, i), now, holder, tokens[usize::from(i)]));
        let mut wakes = Vec::new();
        if whole {
            // 3. Each extended: extend.lua's steps 5–6.
            for i in locks_of(group) {
                self.select(i);
                let out = self.extend(now, holder, tokens[usize::from(i)], ttl, 0);
                self.select(i);
                wakes.push(out.wake);
            }
            return SetEffects {
                reply: Reply::Ok { expires: now + ttl },
                wakes,
            };
        }
        // 4. A part not held, the set is broken: each lock whose grant
        //    matches is released (release.lua's step 4; 'lost' emitted
        //    where extend.lua would), and the caller told NOT_HELD.
        for i in locks_of(group) {
            wakes.push(self.release_one(now, holder, i, tokens[usize::from(i)]).1);
        }
        SetEffects {
            reply: Reply::NotHeld,
            wakes,
        }
    }
}

/// Redis runs a held set's call of client `c` (its release or extend, one
/// slot group); `live`: its task is there for the answer, and makes the
/// next group's call.
pub(crate) fn run_held_call(cfg: &Config, s: &mut State, c: Id, call: Call, live: bool) {
    let now = s.now;
    let ci = usize::from(c);
    match call {
        Call::ExtendSet {
            groups,
            tokens,
            sent,
            until,
        } => {
            let group = cfg.group_of(c, groups);
            let before = held(s, c);
            let out = (s.redis).extend_many(now, c, cfg.set_tokens(&call), cfg.ttl, 0, group);
            for wake in out.wakes {
                publish(cfg, s, wake);
            }
            if !live {
                return;
            }
            let rest = groups & !group;
            let cl = &mut s.clients[ci];
            match out.reply {
                Reply::Ok { expires } if rest != 0 => {
                    cl.call = Some(Call::ExtendSet {
                        groups: rest,
                        tokens,
                        sent,
                        until: until.min(belief(sent, now, expires)),
                    });
                }
                Reply::Ok { expires } => {
                    if let Phase::Holding { token, .. } = cl.phase {
                        let until = until.min(belief(sent, now, expires));
                        cl.phase = Phase::Holding { token, until };
                        s.ghost.set_extended = true;
                    }
                }
                _ => {
                    // A part not held: extend_many let go of its group; the
                    // set's other groups (the Cluster path) are released,
                    // pinned to their tokens, and the caller told NOT_HELD
                    // (it stops acting on the set as it asks).
                    s.ghost.set_extend_broken |= before != 0;
                    let others = cfg.set_of(c) & !group;
                    cl.phase = Phase::Idle;
                    if others != 0 {
                        s.ghost.letting_go[ci] = true;
                        cl.call = Some(Call::ReleaseSet {
                            groups: others,
                            tokens,
                        });
                    } else {
                        s.round_over(c, cfg);
                    }
                }
            }
        }
        Call::ReleaseSet { groups, tokens } => {
            let group = cfg.group_of(c, groups);
            let part = |s: &State, lock: u8| {
                let l = if lock == 0 {
                    &s.redis.lock
                } else {
                    &s.redis.second
                };
                (l.as_ref()).and_then(|l| l.mine(c).map(|g| l.holders[g].token))
            };
            let before = [part(s, 0), part(s, 1)];
            let out = s.redis.release_many(now, c, cfg.set_tokens(&call), group);
            for wake in out.wakes {
                publish(cfg, s, wake);
            }
            let Reply::ReleasedMany { released, .. } = out.reply else {
                unreachable!("release_many answers a status per lock")
            };
            // A late release that finds the holder's newer grant of a
            // lock (its set taken again): pinned, it leaves it (finding
            // 10); unpinned, it takes it.
            for lock in locks_of(group) {
                let set_token = tokens[usize::from(lock)];
                let newer = before[usize::from(lock)].is_some_and(|t| t != set_token);
                s.ghost.stale_set_release_left |= newer && part(s, lock).is_some();
                s.ghost.newer_grant_released |= newer && released & (1 << lock) != 0;
            }
            let rest = groups & !group;
            if live && rest != 0 {
                s.clients[ci].call = Some(Call::ReleaseSet {
                    groups: rest,
                    tokens,
                });
            } else if live {
                // Answered: it no longer lets go of anything (a part it
                // holds from now on is one it does not know of).
                s.ghost.letting_go[ci] = false;
                s.round_over(c, cfg);
            }
        }
        other => unreachable!("not a held set's call: {other:?}"),
    }
}

impl Config {
    /// The tokens a held set's release or extend names, per model lock:
    /// the set's, unless the caller sends none (`unpinned_set_release`:
    /// 0, any grant of the holder).
    pub fn set_tokens(&self, call: &Call) -> [u32; 2] {
        match *call {
            Call::ExtendSet { tokens, .. } | Call::ReleaseSet { tokens, .. }
                if !self.unpinned_set_release =>
            {
                tokens
            }
            _ => [0; 2],
        }
    }

    /// The slot group of a held set's next call among the locks `groups`
    /// still to go: all of them on one server; on the Cluster path the
    /// first (each lock its own group, in the acquire's order).
    pub fn group_of(&self, c: Id, groups: u8) -> u8 {
        let groups = groups & self.set_of(c);
        if self.reservation == 0 {
            groups
        } else {
            groups & groups.wrapping_neg()
        }
    }
}
