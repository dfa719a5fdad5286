//! The sessions' functions on the model's Redis: `lua/renew.lua` (a
//! session's grants renewed by its stream) and the session record's
//! `lua/session_*.lua`, each named after the file it mirrors, its steps
//! numbered as that file numbers them.

use crate::redis::{Data, Effects, Id, Reply, SessionRecord, answer, done, settle};

impl Data {
    /// lua/renew.lua, one group: the same grant (holder and token) gets a
    /// new lease; a stale stream's renewal is refused (MOVED).
    pub fn renew(&mut self, now: u8, holder: Id, token: u32, ttl: u8, epoch: u8) -> Effects {
        let Some(mut lock) = self.lock.take() else {
            return answer(Reply::NotHeld);
        };
        let fence = &mut self.fence;
        // 1. A lease that already passed is not brought back.
        let changed = lock.purge(now);
        // 2. Only the same grant is renewed.
        let out = match lock.mine(holder) {
            Some(i) if lock.holders[i].token == token => {
                let grant = &mut lock.holders[i];
                if grant.epoch > epoch {
                    done(Reply::Moved, &mut lock, fence, now, changed)
                } else {
                    grant.epoch = epoch;
                    grant.expires = now + ttl;
                    let reply = Reply::Ok { expires: now + ttl };
                    done(reply, &mut lock, fence, now, changed)
                }
            }
            _ => done(Reply::NotHeld, &mut lock, fence, now, changed),
        };
        self.lock = settle(lock);
        out
    }

    /// lua/session_open.lua: epoch 1.
    pub fn session_open(&mut self, now: u8, client: Id) {
        self.sessions[usize::from(client)] = Some(SessionRecord {
            epoch: 1,
            seen: now,
        });
    }

    /// lua/session_touch.lua: 1 kept, 0 resumed elsewhere, -1 gone.
    pub fn session_touch(&mut self, now: u8, client: Id, epoch: u8) -> i8 {
        match &mut self.sessions[usize::from(client)] {
            None => -1,
            Some(r) if r.epoch != epoch => 0,
            Some(r) => {
                r.seen = now;
                1
            }
        }
    }

    /// lua/session_claim.lua: the new epoch, or `None` when the session is
    /// over (gone, or silent past its TTL: then its record goes).
    pub fn session_claim(&mut self, now: u8, client: Id, ttl: u8) -> Option<u8> {
        let slot = &mut self.sessions[usize::from(client)];
        let record = slot.as_mut()?;
        // 2. Silent past its TTL: over.
        if now > record.seen + ttl {
            *slot = None;
            return None;
        }
        // 3. The new stream serves it from now on.
        record.epoch += 1;
        record.seen = now;
        Some(record.epoch)
    }

    /// lua/session_end.lua: true when ended (release its grants), false
    /// when another stream resumed it.
    pub fn session_end(&mut self, client: Id, epoch: u8) -> bool {
        let slot = &mut self.sessions[usize::from(client)];
        if slot.as_ref().map(|r| r.epoch) != Some(epoch) {
            return false;
        }
        *slot = None;
        true
    }
}
