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

/// A grant of a session that is gone, as the session's client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostGrant {
    pub lock: LockId,
    pub fencing_token: u64,
    pub reason: &'static str,
}

/// Why a grant could not be renewed.
pub const LOST_NOT_HELD: &str = "not held";
pub const LOST_UNAVAILABLE: &str = "redis unavailable";
/// The server ended the session (silent client, revoked token, oversized
/// command, shutdown) and released the grant.
pub const LOST_SESSION_ENDED: &str = "session ended";
/// Another stream resumed the session and holds the grant now: this
/// stream may no longer act on it (the grant itself lives on).
pub const LOST_MOVED: &str = "resumed elsewhere";
/// The session's record vanished from Redis (data lost): its grants went
/// with it.
pub const LOST_SESSION_GONE: &str = "session gone from redis";

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
    in_flight: bool,
    lost: mpsc::Sender<LostGrant>,
}

/// One grant to renew: which, with what token, for how long.
#[derive(Clone, Debug)]
pub struct Renewal {
    pub key: GrantKey,
    pub token: u64,
    pub ttl: Duration,
}

/// This replica's session grants.
#[derive(Default)]
pub struct Sessions {
    grants: Mutex<HashMap<GrantKey, SessionGrant>>,
    changed: Notify,
}

fn key(session: &str, epoch: u64, lock: &LockId) -> GrantKey {
    GrantKey {
        session: session.to_owned(),
        epoch,
        lock: lock.clone(),
    }
}

impl Sessions {
    /// Starts renewing a grant just made for `session`.
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
    ) {
        self.grants.lock().unwrap().insert(
            key(session, epoch, lock),
            SessionGrant {
                token,
                ttl,
                renewed_at: granted_at,
                next_due: granted_at + ttl / 3,
                in_flight: false,
                lost,
            },
        );
        self.changed.notify_one();
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
    /// returns them (lock, token) so they can be released.
    pub fn end(&self, session: &str, epoch: u64) -> Vec<(LockId, u64)> {
        let mut grants = self.grants.lock().unwrap();
        let ended: Vec<GrantKey> = grants
            .keys()
            .filter(|k| k.session == session && k.epoch == epoch)
            .cloned()
            .collect();
        ended
            .into_iter()
            .filter_map(|k| grants.remove(&k).map(|g| (k.lock, g.token)))
            .collect()
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
            .filter(|g| !g.in_flight)
            .map(|g| g.next_due)
            .min();
        if earliest.is_none_or(|due| due > now) {
            return (Vec::new(), earliest);
        }
        let mut due = Vec::new();
        let mut next = None::<Instant>;
        for (key, grant) in grants.iter_mut() {
            if grant.in_flight {
                continue;
            }
            if grant.next_due <= now + grant.ttl / 6 {
                grant.in_flight = true;
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
            grant.in_flight = false;
        }
    }

    /// The grant is gone in Redis: stop renewing, tell its session.
    pub fn lost(&self, key: &GrantKey) {
        self.drop_lost(key, LOST_NOT_HELD);
    }

    /// A newer stream of the session holds the grant: stop renewing it
    /// here, tell this stream (which then ends).
    pub fn moved(&self, key: &GrantKey) {
        self.drop_lost(key, LOST_MOVED);
    }

    /// A renewal could not reach Redis. Retry soon, unless the lease has
    /// run out meanwhile: then the grant is lost.
    pub fn failed(&self, key: &GrantKey, now: Instant) {
        let expired = {
            let mut grants = self.grants.lock().unwrap();
            match grants.get_mut(key) {
                Some(grant) if now >= grant.renewed_at + grant.ttl => true,
                Some(grant) => {
                    grant.in_flight = false;
                    grant.next_due = now + (grant.ttl / 10).min(Duration::from_secs(1));
                    false
                }
                None => false,
            }
        };
        if expired {
            self.drop_lost(key, LOST_UNAVAILABLE);
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

    fn drop_lost(&self, key: &GrantKey, reason: &'static str) {
        let removed = self.grants.lock().unwrap().remove(key);
        if let Some(grant) = removed {
            // A full channel means the client stopped reading; its session
            // is being ended anyway.
            let _ = grant.lost.try_send(LostGrant {
                lock: key.lock.clone(),
                fencing_token: grant.token,
                reason,
            });
        }
    }

    /// Resolves when a grant was added (the renewer may need to wake
    /// sooner).
    pub async fn changed(&self) {
        self.changed.notified().await
    }
}
