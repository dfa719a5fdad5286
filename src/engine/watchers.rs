//! Watchers of lock events on this replica (the Watch RPC). Scripts
//! publish each event on `<prefix>:events`; the replica's one pub/sub
//! connection subscribes to that channel only while someone here watches,
//! and hands each event to the watchers whose filter matches.
//!
//! Each watcher has a bounded buffer. A watcher that falls behind is
//! dropped (its stream ends with RESOURCE_EXHAUSTED) rather than slowing
//! anything: fan-out never waits.
//!
//! Why a std `Mutex`: held only to walk or change the list, never across
//! an `.await`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{mpsc, watch};

/// One lock event, as scripts publish it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockEvent {
    pub namespace: String,
    pub name: String,
    /// acquired, released, expired, queued or dequeued.
    pub event: String,
    pub holder: String,
    /// The grant's fencing token (0 for queue events).
    pub fencing_token: u64,
    /// Redis clock, Unix ms.
    pub at_ms: i64,
}

impl LockEvent {
    /// Parses `namespace\nname\nevent\nholder\ntoken\ntime_ms`.
    pub fn parse(payload: &str) -> Option<LockEvent> {
        let mut fields = payload.split('\n');
        Some(LockEvent {
            namespace: fields.next()?.to_owned(),
            name: fields.next()?.to_owned(),
            event: fields.next()?.to_owned(),
            holder: fields.next()?.to_owned(),
            fencing_token: fields.next()?.parse().ok()?,
            at_ms: fields.next()?.parse().ok()?,
        })
    }
}

/// Which events a watcher wants: one namespace, and one name or a prefix.
#[derive(Clone, Debug)]
pub struct Filter {
    pub namespace: String,
    pub name: Option<String>,
    pub prefix: String,
}

impl Filter {
    fn matches(&self, event: &LockEvent) -> bool {
        event.namespace == self.namespace
            && match &self.name {
                Some(name) => event.name == *name,
                None => event.name.starts_with(&self.prefix),
            }
    }
}

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
}

/// A registered watcher: its events, whether it was dropped for falling
/// behind, and the guard that unregisters it when dropped.
pub struct WatchHandle {
    pub events: mpsc::Receiver<LockEvent>,
    pub overflowed: Arc<AtomicBool>,
    pub guard: WatchGuard,
}

/// Unregisters its watcher when dropped.
pub struct WatchGuard {
    watchers: Arc<Watchers>,
    id: u64,
}

impl Drop for WatchGuard {
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
            guard: WatchGuard {
                watchers: self.clone(),
                id,
            },
        }
    }

    fn remove(&self, id: u64) {
        let mut list = self.list.lock().unwrap();
        list.retain(|w| w.id != id);
        if list.is_empty() {
            self.wanted.send_replace(false);
        }
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
        let mut list = self.list.lock().unwrap();
        list.retain(|watcher| {
            if !watcher.filter.matches(&event) {
                return true;
            }
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
    }
}
