//! Watchers of lock events on this replica (the Watch RPC). Scripts
//! publish each event on `<prefix>:events`; the replica's one pub/sub
//! connection subscribes to that channel only while someone here watches,
//! and hands each event to the watchers whose filter matches.
//!
//! Each watcher has a bounded buffer. A watcher that falls behind is
//! dropped (its stream ends with RESOURCE_EXHAUSTED) rather than slowing
//! anything: fan-out never waits.
//!
//! Prompt expiry: a lease that nobody releases ends without any call on
//! the lock, so nothing would publish `expired` until some later call
//! touched it. A replica with a watcher on a lock therefore keeps the
//! lease ends of the grants it heard of (from `acquired`, `extended` and
//! the initial state; dropped again on `released`, `expired`, ...) and,
//! when one is due, calls `lua/purge.lua` on that lock, which drops what
//! has passed and publishes `expired` once (a second replica's purge
//! finds nothing left). Only watched locks cost anything: no Redis index
//! of lease ends exists for that.
//!
//! The calls these need (the lease-end purges, the initial state, the
//! registry of watched namespaces in Redis) are `watching.rs`'s.
//!
//! Why a std `Mutex`: held only to walk or change the list, never across
//! an `.await`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{Notify, mpsc, watch};

pub use tumbler_face::watchers::{
    Filter, HELD, LockEvent, STATE_MAX_LOCKS, SYNCED, WAITING, WatchGuard, WatchHandle,
};

struct Watcher {
    id: u64,
    filter: Filter,
    events: mpsc::Sender<LockEvent>,
    overflowed: Arc<AtomicBool>,
}

/// The registry of this replica's watchers.
pub struct Watchers {
    list: Mutex<Vec<Watcher>>,
    next_id: AtomicU64,
    /// True while anyone here watches: the subscriber follows it.
    wanted: watch::Sender<bool>,
    /// Namespaces some replica watches (this one's included): function
    /// calls on their locks publish events; others publish none.
    anywhere: RwLock<HashSet<String>>,
    /// Lease ends of the grants on locks watched here (prompt expiry).
    leases: Mutex<Leases>,
    /// Woken when a lease end earlier than the one waited for appears.
    leases_changed: Notify,
}

/// (namespace, lock name, holder): one grant. The holder '' stands for
/// "the lock's next lease end", which a purge reports.
type GrantKey = (String, String, String);

/// The lease ends of the grants on watched locks, by grant and in time
/// order. Bounded by the live grants of the locks watched here.
#[derive(Default)]
struct Leases {
    by_grant: HashMap<GrantKey, i64>,
    due: BTreeSet<(i64, GrantKey)>,
}

impl Leases {
    fn set(&mut self, key: GrantKey, at_ms: i64) -> bool {
        if let Some(old) = self.by_grant.insert(key.clone(), at_ms) {
            self.due.remove(&(old, key.clone()));
        }
        let earliest = self.due.first().is_none_or(|(first, _)| at_ms < *first);
        self.due.insert((at_ms, key));
        earliest
    }

    fn remove(&mut self, key: &GrantKey) {
        if let Some(at) = self.by_grant.remove(key) {
            self.due.remove(&(at, key.clone()));
        }
    }

    /// Takes the lease ends due by `now_ms`: the locks to purge.
    fn take_due(&mut self, now_ms: i64) -> HashSet<(String, String)> {
        let mut locks = HashSet::new();
        while let Some((at, _)) = self.due.first() {
            if *at > now_ms {
                break;
            }
            let (_, key) = self.due.pop_first().expect("a first entry");
            self.by_grant.remove(&key);
            locks.insert((key.0, key.1));
        }
        locks
    }
}

/// Unregisters its watcher when dropped (inside the face's
/// [`WatchGuard`]).
struct Unregister {
    watchers: Arc<Watchers>,
    id: u64,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.watchers.remove(self.id);
    }
}

impl Watchers {
    pub fn new() -> Arc<Self> {
        Arc::new(Watchers {
            list: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            wanted: watch::Sender::new(false),
            anywhere: RwLock::default(),
            leases: Mutex::default(),
            leases_changed: Notify::new(),
        })
    }

    /// The namespaces watched on this replica.
    pub fn namespaces(&self) -> Vec<String> {
        let list = self.list.lock().unwrap();
        let set: HashSet<&str> = list.iter().map(|w| w.filter.namespace.as_str()).collect();
        set.into_iter().map(str::to_owned).collect()
    }

    /// True when some replica watches the namespace.
    pub fn is_watched(&self, namespace: &str) -> bool {
        self.anywhere.read().unwrap().contains(namespace)
    }

    /// Learns that some replica watches the namespace.
    pub fn mark_watched(&self, namespace: &str) {
        if !self.is_watched(namespace) {
            self.anywhere.write().unwrap().insert(namespace.to_owned());
        }
    }

    /// Learns every namespace that some replica watches (the registry's
    /// word, plus this replica's own).
    pub fn set_watched(&self, mut anywhere: HashSet<String>) {
        anywhere.extend(self.namespaces());
        *self.anywhere.write().unwrap() = anywhere;
    }

    /// Adds a watcher with room for `buffer` unread events.
    pub fn add(self: &Arc<Self>, filter: Filter, buffer: usize) -> WatchHandle {
        let (events, receiver) = mpsc::channel(buffer.max(1));
        let overflowed = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut list = self.list.lock().unwrap();
        list.push(Watcher {
            id,
            filter,
            events,
            overflowed: overflowed.clone(),
        });
        self.wanted.send_replace(true);
        WatchHandle {
            events: receiver,
            overflowed,
            guard: WatchGuard::new(Unregister {
                watchers: self.clone(),
                id,
            }),
        }
    }

    fn remove(&self, id: u64) {
        let mut list = self.list.lock().unwrap();
        list.retain(|w| w.id != id);
        if list.is_empty() {
            self.wanted.send_replace(false);
            *self.leases.lock().unwrap() = Leases::default();
        }
    }

    /// True when a watcher on this replica wants the lock's events.
    pub fn watched_here(&self, namespace: &str, name: &str) -> bool {
        let list = self.list.lock().unwrap();
        list.iter().any(|w| w.filter.matches_lock(namespace, name))
    }

    /// Remembers when a grant's lease ends (or, with holder '', when the
    /// lock's next lease may end), to purge the lock then.
    pub fn schedule(&self, namespace: &str, name: &str, holder: &str, at_ms: i64) {
        let key = (namespace.to_owned(), name.to_owned(), holder.to_owned());
        if self.leases.lock().unwrap().set(key, at_ms) {
            self.leases_changed.notify_one();
        }
    }

    /// Follows a relayed event in the lease ends: a grant that starts or
    /// moves its lease is scheduled, one that ends is forgotten.
    fn track(&self, event: &LockEvent) {
        match event.event.as_str() {
            "acquired" | "extended" if event.expires_at_ms > 0 => {
                self.schedule(
                    &event.namespace,
                    &event.name,
                    &event.holder,
                    event.expires_at_ms,
                );
            }
            "released" | "expired" | "reaped" | "cleared" | "lost" => {
                let key = (
                    event.namespace.clone(),
                    event.name.clone(),
                    event.holder.clone(),
                );
                self.leases.lock().unwrap().remove(&key);
            }
            _ => {}
        }
    }

    /// The earliest lease end scheduled (Redis ms).
    pub(super) fn next_lease_end(&self) -> Option<i64> {
        self.leases.lock().unwrap().due.first().map(|(at, _)| *at)
    }

    /// Returns when a lease end was scheduled or dropped.
    pub(super) async fn lease_ends_changed(&self) {
        self.leases_changed.notified().await;
    }

    /// Takes the lease ends due by `now_ms` (Redis ms): the locks to purge.
    pub(super) fn take_due_lease_ends(&self, now_ms: i64) -> HashSet<(String, String)> {
        self.leases.lock().unwrap().take_due(now_ms)
    }

    /// Follows whether anyone watches (for the subscriber).
    pub fn wanted(&self) -> watch::Receiver<bool> {
        self.wanted.subscribe()
    }

    /// Hands one published event to the watchers that want it; drops a
    /// watcher whose buffer is full.
    pub fn dispatch(&self, payload: &str) {
        let Some(event) = LockEvent::parse(payload) else {
            tracing::warn!("unreadable lock event");
            return;
        };
        let mut matched = false;
        let mut list = self.list.lock().unwrap();
        list.retain(|watcher| {
            if !watcher.filter.matches(&event) {
                return true;
            }
            matched = true;
            match watcher.events.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    watcher.overflowed.store(true, Ordering::Release);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        if list.is_empty() {
            self.wanted.send_replace(false);
        }
        drop(list);
        if matched {
            self.track(&event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ends_move_with_their_grant_and_come_due_in_order() {
        let key = |name: &str, holder: &str| ("ns".to_owned(), name.to_owned(), holder.to_owned());
        let mut leases = Leases::default();
        assert!(leases.set(key("a", "h1"), 300));
        assert!(
            leases.set(key("b", "h1"), 100),
            "earlier than any: wake the loop"
        );
        assert!(!leases.set(key("a", "h2"), 200));
        // Extended: the old end is gone.
        leases.set(key("b", "h1"), 400);
        assert_eq!(leases.due.first().map(|(at, _)| *at), Some(200));
        // Released: forgotten.
        leases.remove(&key("a", "h2"));
        assert!(leases.take_due(299).is_empty());
        let due = leases.take_due(400);
        let expected: HashSet<_> = [
            ("ns".to_owned(), "a".to_owned()),
            ("ns".to_owned(), "b".to_owned()),
        ]
        .into();
        assert_eq!(due, expected);
        assert!(leases.by_grant.is_empty() && leases.due.is_empty());
    }
}
