//! Session grants: grants whose lease this replica renews while their
//! client's Session stream is open, and releases when it ends.
//!
//! The renewer batches: every grant due for renewal (a third of its TTL
//! after the last renewal), together with those of the same shard due
//! soon after, goes to Redis in one `renew.lua` call per shard. Keeping
//! N grants alive costs about `shards × 3 / ttl` script calls per second,
//! not `N × 3 / ttl`.
//!
//! Why a std `Mutex`: held only for map updates, never across an `.await`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::LockId;

pub use tumbler_face::sessions::{
    LOST_MOVED, LOST_NOT_HELD, LOST_SESSION_ENDED, LOST_SESSION_GONE, LOST_SET_BROKEN,
    LOST_UNAVAILABLE, LostGrant,
};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GrantKey {
    pub session: String,
    /// The epoch of the stream that serves the session here (a session
    /// resumed on this same replica must not lose grants to its old
    /// stream's end).
    pub epoch: u64,
    pub lock: LockId,
}

struct SessionGrant {
    token: u64,
    ttl: Duration,
    /// When the last successful renewal was sent: the lease runs at least
    /// until this plus `ttl`.
    renewed_at: Instant,
    next_due: Instant,
    /// A renewal of it is on its way to Redis, which may run it until
    /// this instant (its answer-by time, with a margin); none when `None`.
    in_flight: Option<Instant>,
    lost: mpsc::Sender<LostGrant>,
    /// The multi-lock set it was taken with (an id unique in its session),
    /// none for a single grant: losing one lock of a set loses them all.
    set: Option<u64>,
}

/// One grant to renew: which, with what token, for how long.
#[derive(Clone, Debug)]
pub struct Renewal {
    pub key: GrantKey,
    pub token: u64,
    pub ttl: Duration,
}

/// This replica's session grants.
pub struct Sessions {
    grants: Mutex<HashMap<GrantKey, SessionGrant>>,
    changed: Notify,
    /// How long after it was taken a renewal may still run in Redis: the
    /// command timeout, past which its answer-by time refuses it, and a
    /// margin for the moments between taking it and sending it.
    flight: Duration,
    /// Grants of ended streams whose renewal was in flight at the end,
    /// with the instant it can no longer run: the end waits for them
    /// (`settled`), so no renewal lands after `session_end`.
    ending: Mutex<HashMap<GrantKey, Instant>>,
    landed: Notify,
}

fn key(session: &str, epoch: u64, lock: &LockId) -> GrantKey {
    GrantKey {
        session: session.to_owned(),
        epoch,
        lock: lock.clone(),
    }
}

impl Sessions {
    /// No session grants yet; renewals are sent with `command_timeout`.
    pub fn new(command_timeout: Duration) -> Self {
        Sessions {
            grants: Mutex::default(),
            changed: Notify::new(),
            flight: command_timeout + Duration::from_secs(1),
            ending: Mutex::default(),
            landed: Notify::new(),
        }
    }

    /// Starts renewing a grant just made for `session` (`set`: the
    /// multi-lock set it belongs to).
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &self,
        session: &str,
        epoch: u64,
        lock: &LockId,
        token: u64,
        ttl: Duration,
        granted_at: Instant,
        lost: mpsc::Sender<LostGrant>,
        set: Option<u64>,
    ) {
        self.grants.lock().unwrap().insert(
            key(session, epoch, lock),
            SessionGrant {
                token,
                ttl,
                renewed_at: granted_at,
                next_due: granted_at + ttl / 3,
                in_flight: None,
                lost,
                set,
            },
        );
        self.changed.notify_one();
    }

    /// The multi-lock set a grant of a session's stream belongs to, with
    /// every lock of it held here; None for a single grant (or none).
    pub fn set_of(&self, session: &str, epoch: u64, lock: &LockId) -> Option<(u64, Vec<LockId>)> {
        let grants = self.grants.lock().unwrap();
        let set = grants.get(&key(session, epoch, lock))?.set?;
        let mut members: Vec<LockId> = grants
            .iter()
            .filter(|(k, g)| k.session == session && k.epoch == epoch && g.set == Some(set))
            .map(|(k, _)| k.lock.clone())
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Some((set, members))
    }

    /// Whether a session's stream holds a grant of `lock` here.
    pub fn holds(&self, session: &str, epoch: u64, lock: &LockId) -> bool {
        (self.grants.lock().unwrap()).contains_key(&key(session, epoch, lock))
    }

    /// Stops renewing one grant (released by its session); its token.
    pub fn remove(&self, session: &str, epoch: u64, lock: &LockId) -> Option<u64> {
        self.grants
            .lock()
            .unwrap()
            .remove(&key(session, epoch, lock))
            .map(|g| g.token)
    }

    /// Stops renewing every grant of a session's stream that ended;
    /// returns them (lock, token) so they can be released. A renewal of
    /// one still in flight is remembered until it lands: see `settled`.
    pub fn end(&self, session: &str, epoch: u64) -> Vec<(LockId, u64)> {
        let mut grants = self.grants.lock().unwrap();
        let ended: Vec<GrantKey> = grants
            .keys()
            .filter(|k| k.session == session && k.epoch == epoch)
            .cloned()
            .collect();
        let mut ending = self.ending.lock().unwrap();
        ended
            .into_iter()
            .filter_map(|k| {
                let grant = grants.remove(&k)?;
                if let Some(until) = grant.in_flight {
                    ending.insert(k.clone(), until);
                }
                Some((k.lock, grant.token))
            })
            .collect()
    }

    /// Resolves when no renewal of an ended stream's grants can still run
    /// in Redis: each has landed (answered or failed), or its answer-by
    /// time has passed. Ending a session's record before that could let a
    /// renewal sent just before the end extend a grant after it.
    pub async fn settled(&self, session: &str, epoch: u64) {
        loop {
            let landed = self.landed.notified();
            let until = {
                let now = Instant::now();
                let mut ending = self.ending.lock().unwrap();
                ending.retain(|_, until| *until > now);
                ending
                    .iter()
                    .filter(|(k, _)| k.session == session && k.epoch == epoch)
                    .map(|(_, until)| *until)
                    .max()
            };
            let Some(until) = until else { return };
            tokio::select! {
                () = landed => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// A renewal of `key` came back (whatever its answer): an end waiting
    /// for it may go on.
    fn land(&self, key: &GrantKey) {
        if self.ending.lock().unwrap().remove(key).is_some() {
            self.landed.notify_waiters();
        }
    }

    /// The grants a session's stream holds here (lock, token).
    pub fn grants_of(&self, session: &str, epoch: u64) -> Vec<(LockId, u64)> {
        self.grants
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.session == session && k.epoch == epoch)
            .map(|(k, g)| (k.lock.clone(), g.token))
            .collect()
    }

    /// Session grants held on this replica now.
    pub fn len(&self) -> usize {
        self.grants.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The grants to renew now. Nothing until one is due; then every grant
    /// due within a sixth of its TTL goes with it (renewing a little early
    /// costs nothing, and grants acquired at scattered moments end up
    /// renewed together, a batch per shard, instead of a trickle of small
    /// calls). Also when the next one falls due.
    pub fn take_due(&self, now: Instant) -> (Vec<Renewal>, Option<Instant>) {
        let mut grants = self.grants.lock().unwrap();
        let earliest = grants
            .values()
            .filter(|g| g.in_flight.is_none())
            .map(|g| g.next_due)
            .min();
        if earliest.is_none_or(|due| due > now) {
            return (Vec::new(), earliest);
        }
        let mut due = Vec::new();
        let mut next = None::<Instant>;
        for (key, grant) in grants.iter_mut() {
            if grant.in_flight.is_some() {
                continue;
            }
            if grant.next_due <= now + grant.ttl / 6 {
                grant.in_flight = Some(now + self.flight);
                due.push(Renewal {
                    key: key.clone(),
                    token: grant.token,
                    ttl: grant.ttl,
                });
            } else {
                next = Some(next.map_or(grant.next_due, |n| n.min(grant.next_due)));
            }
        }
        (due, next)
    }

    /// A renewal sent at `sent_at` succeeded.
    pub fn renewed(&self, key: &GrantKey, sent_at: Instant) {
        if let Some(grant) = self.grants.lock().unwrap().get_mut(key) {
            grant.renewed_at = sent_at;
            grant.next_due = sent_at + grant.ttl / 3;
            grant.in_flight = None;
        }
        self.land(key);
    }

    /// The grant is gone in Redis: stop renewing, tell its session.
    pub fn lost(&self, key: &GrantKey) {
        self.drop_lost(key, LOST_NOT_HELD);
        self.land(key);
    }

    /// A newer stream of the session holds the grant: stop renewing it
    /// here, tell this stream (which then ends).
    pub fn moved(&self, key: &GrantKey) {
        self.drop_lost(key, LOST_MOVED);
        self.land(key);
    }

    /// A renewal could not reach Redis, or Redis refused it as late. Retry
    /// soon, unless the lease has run out meanwhile: then the grant is
    /// lost. Only a refusal (`answered`) says it cannot run any more; a
    /// call that failed on the way may still run until its answer-by time.
    pub fn failed(&self, key: &GrantKey, now: Instant, answered: bool) {
        let expired = {
            let mut grants = self.grants.lock().unwrap();
            match grants.get_mut(key) {
                Some(grant) if now >= grant.renewed_at + grant.ttl => true,
                Some(grant) => {
                    grant.in_flight = None;
                    grant.next_due = now + (grant.ttl / 10).min(Duration::from_secs(1));
                    false
                }
                None => false,
            }
        };
        if expired {
            self.drop_lost(key, LOST_UNAVAILABLE);
        }
        if answered {
            self.land(key);
        }
    }

    /// Grants whose lease ran out while a renewal hung are lost.
    pub fn expire_overdue(&self, now: Instant) {
        let overdue: Vec<GrantKey> = self
            .grants
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, g)| now >= g.renewed_at + g.ttl)
            .map(|(k, _)| k.clone())
            .collect();
        for key in overdue {
            self.drop_lost(&key, LOST_UNAVAILABLE);
        }
    }

    /// Stops renewing a grant that is gone and tells its stream. A lock of
    /// a multi-lock set takes the rest of its set with it (unless a newer
    /// stream holds them all): each is told lost as `LOST_SET_BROKEN`, and
    /// the stream releases it (decision 0078).
    fn drop_lost(&self, key: &GrantKey, reason: &'static str) {
        let mut grants = self.grants.lock().unwrap();
        let Some(grant) = grants.remove(key) else {
            return;
        };
        let siblings: Vec<GrantKey> = match grant.set {
            Some(set) if reason != LOST_MOVED => (grants.iter())
                .filter(|(k, g)| {
                    k.session == key.session && k.epoch == key.epoch && g.set == Some(set)
                })
                .map(|(k, _)| k.clone())
                .collect(),
            _ => Vec::new(),
        };
        // A full channel means the client stopped reading; its session
        // is being ended anyway.
        let _ = grant.lost.try_send(LostGrant {
            lock: key.lock.clone(),
            fencing_token: grant.token,
            reason,
        });
        for sibling in siblings {
            if let Some(other) = grants.remove(&sibling) {
                let _ = other.lost.try_send(LostGrant {
                    lock: sibling.lock,
                    fencing_token: other.token,
                    reason: LOST_SET_BROKEN,
                });
            }
        }
    }

    /// Resolves when a grant was added (the renewer may need to wake
    /// sooner).
    pub async fn changed(&self) {
        self.changed.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    /// A session's grant whose renewal is in flight, and its stream ended.
    fn ended_in_flight(sessions: &Sessions) -> (GrantKey, mpsc::Receiver<LostGrant>) {
        let lock = LockId::parse("", "l").unwrap();
        let (lost, lost_rx) = mpsc::channel(1);
        let start = Instant::now();
        sessions.add("s", 1, &lock, 7, TTL, start, lost, None);
        let (due, _) = sessions.take_due(start + TTL / 3);
        assert_eq!(due.len(), 1, "the grant is due a third of its TTL on");
        assert_eq!(sessions.end("s", 1), vec![(lock, 7)]);
        (due[0].key.clone(), lost_rx)
    }

    /// Whether `settled` resolves within a moment of (paused) time.
    async fn settles_now(sessions: &Sessions) -> bool {
        tokio::time::timeout(Duration::from_millis(1), sessions.settled("s", 1))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_waits_for_the_renewal_in_flight_to_come_back() {
        let sessions = Sessions::new(Duration::from_secs(5));
        let (key, _lost) = ended_in_flight(&sessions);
        assert!(
            !settles_now(&sessions).await,
            "the renewal is still on its way"
        );
        sessions.renewed(&key, Instant::now());
        assert!(settles_now(&sessions).await);
        assert!(
            sessions.is_empty(),
            "a renewal after the end renews nothing here"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_waits_for_a_failed_renewal_until_it_cannot_run_any_more() {
        let sessions = Sessions::new(Duration::from_secs(5));
        let (key, _lost) = ended_in_flight(&sessions);
        // Failed on the way: Redis may still run it until its answer-by
        // time (the command timeout from when it was taken, and a margin).
        sessions.failed(&key, Instant::now(), false);
        assert!(!settles_now(&sessions).await);
        let waited = Instant::now();
        sessions.settled("s", 1).await;
        assert!(
            waited.elapsed() >= Duration::from_secs(5),
            "{:?}",
            waited.elapsed()
        );
        // Refused as late by Redis: it can never run, so no wait.
        let (key, _lost) = ended_in_flight(&sessions);
        sessions.failed(&key, Instant::now(), true);
        assert!(settles_now(&sessions).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lock_of_a_set_takes_the_rest_of_its_set_and_nothing_else() {
        let sessions = Sessions::new(Duration::from_secs(5));
        let (lost, mut told) = mpsc::channel(8);
        let lock = |name: &str| LockId::parse("", name).unwrap();
        let now = Instant::now();
        let sets = [
            ("a", 1, Some(9)),
            ("b", 2, Some(9)),
            ("c", 3, Some(8)),
            ("e", 5, Some(8)),
        ];
        for (name, token, set) in sets {
            sessions.add("s", 1, &lock(name), token, TTL, now, lost.clone(), set);
        }
        sessions.add("s", 1, &lock("d"), 4, TTL, now, lost.clone(), None);
        let key = |name: &str| key("s", 1, &lock(name));
        assert_eq!(
            sessions.set_of("s", 1, &lock("b")),
            Some((9, vec![lock("a"), lock("b")]))
        );
        sessions.lost(&key("a"));
        let mut seen = Vec::new();
        while let Ok(grant) = told.try_recv() {
            seen.push((grant.lock.name.to_string(), grant.reason));
        }
        assert_eq!(
            seen,
            [("a".into(), LOST_NOT_HELD), ("b".into(), LOST_SET_BROKEN)]
        );
        let mut left: Vec<String> = (sessions.grants_of("s", 1).into_iter())
            .map(|(lock, _)| lock.name.to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["c", "d", "e"], "another set and a single grant stay");
        // A lock taken over by a newer stream breaks nothing.
        sessions.moved(&key("c"));
        assert_eq!(told.try_recv().map(|g| g.reason), Ok(LOST_MOVED));
        assert!(told.try_recv().is_err());
        assert!(sessions.holds("s", 1, &lock("e")));
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_with_nothing_in_flight_does_not_wait() {
        let sessions = Sessions::new(Duration::from_secs(5));
        let (lost, _rx) = mpsc::channel(1);
        let lock = LockId::parse("", "l").unwrap();
        sessions.add("s", 1, &lock, 7, TTL, Instant::now(), lost, None);
        assert_eq!(sessions.end("s", 1).len(), 1);
        assert!(settles_now(&sessions).await);
    }
}
