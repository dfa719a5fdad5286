//! Who may take a freed permit, and what a call that freed one does with
//! it: shared/permits.lua `wake_eligible` (publish the head's id; its replica
//! calls again) or, for a waiter whose record names an answer-by time,
//! `hand_over` (grant the head inside the same call and publish the grant
//! to its replica: decision 68). With read/write locks (decision 74) "a
//! permit is free" depends on the head's mode: a writer needs no grant
//! held, a reader no writer and fewer than `limit` grants; the hand-over
//! stops at a head that does not fit (golang's rule: a reader behind a
//! waiting writer waits). With weighted permits (decision 75) "free"
//! counts permits: a request of k fits while the permits in use and k stay
//! within the limit, and a head of k that does not fit stops the hand-over
//! too. A head that does not fit while some permits are free publishes a
//! wake-up for the lock's barging waiters (a plain request with
//! `fair = false`, a reader that prefers readers), which may take them.

use crate::redis::{Grant, Id, Lock, next_token};

/// A read/write request's mode (decision 74). A plain request has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Read,
    Write,
}

/// What a waiter's record says a handed grant is made of (decision 68):
/// present only when its replica runs the hand-over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hand {
    /// Redis tick after which its caller is told no: past it the head
    /// leaves the queue instead of being granted.
    pub answer_by: u8,
    /// The replica whose request it is (the request id names it).
    pub via: u8,
    pub ttl: u8,
    /// Its session stream's epoch (0: none).
    pub epoch: u8,
}

/// A grant made by the hand-over, as its message names it
/// (`+<queue key>\n<id>\n<request>\n<holders>\n<grant>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handed {
    pub holder: Id,
    pub req: u8,
    pub via: u8,
    pub token: u32,
    /// Its lease's end: the lease asked (`full`) or, when that ends after
    /// the request's liveness deadline, that deadline (a provisional grant,
    /// decision 89: its replica takes it up before it answers).
    pub expires: u8,
    pub full: u8,
    /// The request's liveness deadline when it was handed.
    pub deadline: u8,
    /// Handed by a call of the request's own replica, which knows it
    /// alive: the lease asked, never provisional (decision 90).
    pub whole: bool,
    /// Its request was past its request TTL (dead) when it was handed.
    pub dead: bool,
}

/// What a call publishes: a wake-up for the head (its replica calls
/// again), one for the lock's barging waiters only (`<queue key>` with no
/// id: the head does not fit, but free permits may suit them), and the
/// grants it handed over. Every wake-up message wakes the lock's barging
/// waiters too (the engine's `Waiters::wake`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wake {
    pub wake: Option<Id>,
    pub barging: bool,
    pub handed: Vec<Handed>,
}

impl Wake {
    pub fn none() -> Wake {
        Wake::default()
    }
}

impl Lock {
    /// Permits in use (the header's `holders`: a grant of k counts k).
    pub fn in_use(&self) -> u8 {
        self.holders.iter().map(|g| g.permits).sum()
    }

    /// shared/permits.lua `room`: a writer needs no grant held; a reader no writer
    /// and a free permit; a plain request of `k` permits `k` free ones.
    pub fn room(&self, mode: Option<Mode>, k: u8) -> bool {
        match mode {
            Some(Mode::Write) => self.holders.is_empty(),
            _ => {
                self.in_use() + k <= self.limit
                    && (mode.is_none() || self.mode != Some(Mode::Write))
            }
        }
    }

    /// shared/permits.lua `any_room`: room for a reader or a plain request of one.
    pub fn any_room(&self) -> bool {
        self.in_use() < self.limit && self.mode != Some(Mode::Write)
    }

    /// A read/write lock whose last grant went is held by nobody: its
    /// header says `r` again (held by readers, or only waited for).
    pub(crate) fn vacate(&mut self) {
        if self.mode == Some(Mode::Write) && self.holders.is_empty() {
            self.mode = Some(Mode::Read);
        }
    }
}

/// shared/permits.lua `wake_eligible` and `hand_over`: while a permit is free and
/// the head of the queue fits, a head whose record names no answer-by is
/// woken (and the call stops there); otherwise it leaves the queue and,
/// unless its caller is past its answer-by time, is granted with a fresh
/// token. A head that does not fit stops it; a writer waiting for
/// readers, or a head of several permits, wakes the barging waiters.
pub fn hand_over(lock: &mut Lock, fence: &mut Option<u32>, now: u8) -> Wake {
    hand_over_from(lock, fence, now, None)
}

/// [`hand_over`] by a call of replica `alive` (Some when one of its
/// requests waits on the lock: release.lua's `alive`, decision 90): a
/// request of that replica is handed the lease asked.
pub fn hand_over_from(
    lock: &mut Lock,
    fence: &mut Option<u32>,
    now: u8,
    alive: Option<u8>,
) -> Wake {
    let mut out = Wake::none();
    while lock.any_room() {
        let Some(head) = lock.queue.first() else {
            break;
        };
        let k = if lock.limit > 1 { head.permits } else { 1 };
        if !lock.room(head.mode, k) {
            out.barging = lock.mode == Some(Mode::Read) || k > 1;
            break;
        }
        let Some(hand) = head.hand else {
            out.wake = Some(head.id);
            break;
        };
        let w = lock.queue.remove(0);
        // Past its answer-by time, or its liveness deadline (its replica
        // is not known alive): it leaves the queue ungranted.
        if now > hand.answer_by || w.deadline <= now {
            continue;
        }
        let token = next_token(fence, now);
        // Its replica is known alive only until the liveness deadline: a
        // lease that ends later is provisional up to it (decision 89).
        let full = now + hand.ttl;
        let whole = alive == Some(hand.via);
        let expires = if whole { full } else { full.min(w.deadline) };
        lock.holders.push(Grant {
            holder: w.id,
            token,
            expires,
            full,
            epoch: hand.epoch,
            handed: Some(w.req),
            permits: k,
        });
        lock.holders.sort();
        if w.mode.is_some() {
            lock.mode = w.mode;
        }
        out.handed.push(Handed {
            holder: w.id,
            req: w.req,
            via: hand.via,
            token,
            expires,
            full,
            deadline: w.deadline,
            dead: w.deadline <= now,
            whole,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    //! The read/write rules of acquire.lua step by step (decision 74),
    //! on the model's Redis: what the checker's clients do not try.

    use super::*;
    use crate::redis::{AcquireArgs, Data, Reply};

    fn ask(holder: Id, mode: Option<Mode>) -> AcquireArgs {
        AcquireArgs {
            holder,
            req: 1,
            ttl: 5,
            answer_by: 0,
            limit: 2,
            fair: true,
            priority: 0,
            queue_ttl: Some(5),
            epoch: None,
            mode,
            permits: 1,
            hand: None,
        }
    }

    fn data() -> Data {
        Data {
            sessions: vec![None; 4],
            ..Data::default()
        }
    }

    const R: Option<Mode> = Some(Mode::Read);
    const W: Option<Mode> = Some(Mode::Write);

    #[test]
    fn readers_share_a_writer_waits_and_a_reader_behind_it_waits_too() {
        let mut d = data();
        assert!(matches!(
            d.acquire(1, ask(0, R)).reply,
            Reply::Acquired { .. }
        ));
        assert!(matches!(
            d.acquire(1, ask(1, W)).reply,
            Reply::Queued { .. }
        ));
        // Room for a reader (limit 2), but a writer waits ahead of it.
        assert!(matches!(
            d.acquire(1, ask(2, R)).reply,
            Reply::Queued { .. }
        ));
        // The reader goes: the writer alone may come in, and is woken.
        let out = d.release(2, 0, 0, None, None, None);
        assert_eq!(out.wake.wake, Some(1));
        assert!(matches!(
            d.acquire(2, ask(1, W)).reply,
            Reply::Acquired { .. }
        ));
        assert_eq!(d.lock.as_ref().unwrap().mode, W);
        assert!(matches!(
            d.acquire(2, ask(2, R)).reply,
            Reply::Queued { .. }
        ));
    }

    #[test]
    fn a_downgrade_keeps_the_token_and_lets_the_readers_behind_in() {
        let mut d = data();
        let Reply::Acquired { token, .. } = d.acquire(1, ask(0, W)).reply else {
            panic!("not granted")
        };
        assert!(matches!(
            d.acquire(1, ask(1, R)).reply,
            Reply::Queued { .. }
        ));
        let out = d.acquire(
            2,
            AcquireArgs {
                queue_ttl: None,
                ..ask(0, R)
            },
        );
        assert!(matches!(out.reply, Reply::Downgraded { token: t, .. } if t == token));
        assert_eq!(out.wake.wake, Some(1));
        assert!(matches!(
            d.acquire(2, ask(1, R)).reply,
            Reply::Acquired { .. }
        ));
        assert_eq!(d.lock.as_ref().unwrap().holders.len(), 2);
    }

    #[test]
    fn an_upgrade_and_a_mixed_mode_rule_are_refused() {
        let mut d = data();
        d.acquire(1, ask(0, R));
        let before = d.clone();
        assert_eq!(d.acquire(1, ask(0, W)).reply, Reply::UpgradeRefused);
        assert_eq!(d.acquire(1, ask(1, None)).reply, Reply::ModeMismatch);
        assert_eq!(d, before, "nothing changed");
        // A plain lock refuses read/write requests while anyone holds it.
        let mut d = data();
        d.acquire(1, ask(0, None));
        assert_eq!(d.acquire(1, ask(1, R)).reply, Reply::ModeMismatch);
    }

    #[test]
    fn the_hand_over_grants_a_run_of_readers_and_stops_at_a_writer() {
        let mut d = data();
        let hand = |holder| AcquireArgs {
            hand: Some(Hand {
                answer_by: 9,
                via: 0,
                ttl: 5,
                epoch: 0,
            }),
            ..ask(holder, if holder == 3 { W } else { R })
        };
        assert!(matches!(
            d.acquire(1, ask(0, W)).reply,
            Reply::Acquired { .. }
        ));
        for c in 1..4 {
            assert!(matches!(d.acquire(1, hand(c)).reply, Reply::Queued { .. }));
        }
        let out = d.release(2, 0, 0, None, None, None);
        let handed: Vec<Id> = out.wake.handed.iter().map(|h| h.holder).collect();
        assert_eq!(handed, [1, 2]);
        let lock = d.lock.as_ref().unwrap();
        assert_eq!((lock.mode, lock.queue.len()), (R, 1));
        // The readers' leases pass; the writer at the head is past its
        // answer-by time: it leaves instead of being granted.
        let out = d.release(10, 1, 0, None, None, None);
        assert_eq!(out.reply, Reply::NotHeld);
        assert!(out.wake.handed.is_empty());
        assert_eq!(d.lock, None);
    }
}
