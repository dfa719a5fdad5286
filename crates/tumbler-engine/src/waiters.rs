//! This replica's waiting Acquire RPCs: who waits on which lock, how each
//! one is woken, and the two background tasks that serve them.
//!
//! - The **subscriber** keeps ONE Redis pub/sub subscription per replica.
//!   A function that frees a permit hands it to the head of the queue
//!   itself (decision 0068) and publishes the grant,
//!   `+<queue key>\n<id>\n<request>\n<holders>\n<grant record>`: the
//!   replica whose waiting request it names hands it to that RPC, and a
//!   replica whose request is gone (cancelled, timed out) gives it back
//!   at once (unless an acquire of the same holder was answered with it
//!   meanwhile: `lua/release.lua`'s `handed`). A waiter that names no
//!   answer-by time is woken instead, `<queue key>\n<id>\n<id>…`, to call
//!   again (with every barging waiter of that lock). After a (re)subscription it wakes everyone, since
//!   messages may have been missed meanwhile; a waiter woken so finds its
//!   grant by calling again (HELD).
//! - The **refresher** keeps this replica's requests alive in Redis: per
//!   lock, one script call every queue_ttl/3 renews all local requests'
//!   liveness deadlines at once, purges what died elsewhere, hands over
//!   what is free and names the requests no longer queued (a grant whose
//!   message was lost: they call again and are answered it). Idle waiting costs Redis only
//!   these heartbeats: nobody polls.
//!
//! Why a std `Mutex`: it is held only for map updates, never across an
//! `.await`, so a blocking lock is cheaper than an async one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::keys::LockKeys;

/// A message on the wake channel that is not a wake-up: a replica
/// announces that it now watches the namespace that follows.
pub const WATCH_ANNOUNCEMENT: &str = "!watch\n";

/// A grant handed to a waiting request inside the call that freed its
/// permit (the record as the lock stores it, and the lock's holders then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handed {
    pub record: String,
    pub holders: u32,
}

/// Where a handed grant waits for its RPC to take it.
type HandedSlot = Arc<Mutex<Option<Handed>>>;

/// A handed grant whose request is gone: the lock's queue key, the holder,
/// the grant's fencing token and the request, to be given back at once.
pub type Orphan = (String, String, u64, String);

/// What the replica does with an [`Orphan`] (set by `Waiting`: a release).
type OrphanHandler = Arc<dyn Fn(Orphan) + Send + Sync>;

/// One waiting RPC.
struct Entry {
    registration: u64,
    notify: Arc<Notify>,
    handed: HandedSlot,
    queue_ttl_ms: u64,
    fair: bool,
}

/// The local waiters of one lock.
struct LockWaiters {
    keys: LockKeys,
    namespace: String,
    name: String,
    /// Holder id → its waiting RPCs (normally one).
    by_holder: HashMap<String, Vec<Entry>>,
    next_refresh: Instant,
}

impl LockWaiters {
    fn refresh_every(&self) -> Duration {
        let shortest = self
            .by_holder
            .values()
            .flatten()
            .map(|e| e.queue_ttl_ms)
            .min()
            .unwrap_or(3_000);
        Duration::from_millis((shortest / 3).max(10))
    }
}

/// Why a waiter could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    TooManyWaiters(usize),
    TooManyInNamespace(usize),
    ShuttingDown,
}

/// Work for the refresher: one lock's keys, name and local requests.
pub struct RefreshBatch {
    pub keys: LockKeys,
    pub namespace: String,
    pub name: String,
    pub requests: Vec<(String, u64)>,
}

/// The registry of this replica's waiters.
pub struct Waiters {
    /// Queue key → that lock's local waiters.
    locks: Mutex<HashMap<String, LockWaiters>>,
    count: AtomicUsize,
    max_waiters: usize,
    /// Namespace → its waiters on this replica (only namespaces with any).
    per_namespace: Mutex<HashMap<String, usize>>,
    max_per_namespace: usize,
    next_registration: AtomicU64,
    /// Tells the refresher that a lock needs refreshing sooner.
    refresh_changed: Notify,
    shutdown: CancellationToken,
    /// This replica's part of every request id it makes (random per
    /// process): a handed grant naming a request of it that is gone is
    /// this replica's to give back.
    replica: String,
    orphans: Mutex<Option<OrphanHandler>>,
}

/// A registered waiter; unregisters itself when dropped.
pub struct Registration {
    waiters: Arc<Waiters>,
    namespace: String,
    queue_key: String,
    holder: String,
    id: u64,
    notify: Arc<Notify>,
    handed: HandedSlot,
    request: String,
}

impl Registration {
    /// Resolves when a wake-up arrives (one that arrived since the last
    /// call is not lost: Notify keeps a permit).
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// This waiting RPC's request id (`<replica>.<n>`), unique per process
    /// and across replicas.
    pub fn request(&self) -> &str {
        &self.request
    }

    /// The grant handed to this request, if one came (taken: it is the
    /// RPC's now, not the registry's to give back).
    pub fn take_handed(&self) -> Option<Handed> {
        self.handed.lock().unwrap().take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.waiters
            .unregister(&self.queue_key, &self.holder, self.id);
        self.waiters.leave_namespace(&self.namespace);
    }
}

impl Waiters {
    pub fn new(max_waiters: usize, max_per_namespace: usize) -> Arc<Self> {
        Arc::new(Waiters {
            locks: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
            max_waiters,
            per_namespace: Mutex::new(HashMap::new()),
            max_per_namespace,
            next_registration: AtomicU64::new(1),
            refresh_changed: Notify::new(),
            shutdown: CancellationToken::new(),
            replica: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
            orphans: Mutex::new(None),
        })
    }

    /// Sets what is done with a handed grant whose request is gone.
    pub fn on_orphan(&self, handler: OrphanHandler) {
        *self.orphans.lock().unwrap() = Some(handler);
    }

    fn orphaned(&self, queue_key: &str, holder: &str, request: &str, handed: &Handed) {
        let Some(token) = crate::records::parse_grant(holder, &handed.record)
            .ok()
            .map(|g| g.fencing_token)
        else {
            tracing::warn!(holder, "a handed grant that cannot be read");
            return;
        };
        let handler = self.orphans.lock().unwrap().clone();
        match handler {
            Some(handler) => handler((
                queue_key.to_owned(),
                holder.to_owned(),
                token,
                request.to_owned(),
            )),
            None => tracing::warn!(holder, "a handed grant with nobody to give it back"),
        }
    }

    /// This replica's part of its request ids when one of its requests
    /// waits on the lock of `queue_key` right now: a call of this replica
    /// that hands that lock over knows the waiter's replica alive (decision
    /// 0090), so the grant need not be provisional.
    pub fn waits_here(&self, queue_key: &str) -> Option<&str> {
        let locks = self.locks.lock().unwrap();
        locks
            .contains_key(queue_key)
            .then_some(self.replica.as_str())
    }

    /// Waiting RPCs on this replica right now.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a waiter before its first script call, so no wake-up can
    /// slip between the call and the wait.
    pub fn register(
        self: &Arc<Self>,
        namespace: &str,
        keys: &LockKeys,
        name: &str,
        holder: &str,
        queue_ttl_ms: u64,
        fair: bool,
    ) -> Result<Registration, RegisterError> {
        if self.shutdown.is_cancelled() {
            return Err(RegisterError::ShuttingDown);
        }
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.max_waiters {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(RegisterError::TooManyWaiters(self.max_waiters));
        }
        {
            let mut per_namespace = self.per_namespace.lock().unwrap();
            let waiting = per_namespace.entry(namespace.to_owned()).or_default();
            if *waiting >= self.max_per_namespace {
                drop(per_namespace);
                self.count.fetch_sub(1, Ordering::AcqRel);
                return Err(RegisterError::TooManyInNamespace(self.max_per_namespace));
            }
            *waiting += 1;
        }
        let id = self.next_registration.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let handed = HandedSlot::default();
        let first_refresh = Instant::now() + Duration::from_millis((queue_ttl_ms / 3).max(10));
        {
            let mut locks = self.locks.lock().unwrap();
            let lock = locks
                .entry(keys.queue.clone())
                .or_insert_with(|| LockWaiters {
                    keys: keys.clone(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    by_holder: HashMap::new(),
                    next_refresh: first_refresh,
                });
            lock.next_refresh = lock.next_refresh.min(first_refresh);
            lock.by_holder
                .entry(holder.to_owned())
                .or_default()
                .push(Entry {
                    registration: id,
                    notify: notify.clone(),
                    handed: handed.clone(),
                    queue_ttl_ms,
                    fair,
                });
        }
        self.refresh_changed.notify_one();
        Ok(Registration {
            waiters: self.clone(),
            namespace: namespace.to_owned(),
            queue_key: keys.queue.clone(),
            holder: holder.to_owned(),
            id,
            notify,
            handed,
            request: format!("{}.{id:x}", self.replica),
        })
    }

    fn leave_namespace(&self, namespace: &str) {
        let mut per_namespace = self.per_namespace.lock().unwrap();
        if let Some(waiting) = per_namespace.get_mut(namespace) {
            *waiting -= 1;
            if *waiting == 0 {
                per_namespace.remove(namespace);
            }
        }
    }

    fn unregister(&self, queue_key: &str, holder: &str, id: u64) {
        let mut gone = None;
        {
            let mut locks = self.locks.lock().unwrap();
            let Some(lock) = locks.get_mut(queue_key) else {
                return;
            };
            if let Some(entries) = lock.by_holder.get_mut(holder) {
                if let Some(i) = entries.iter().position(|e| e.registration == id) {
                    let entry = entries.remove(i);
                    self.count.fetch_sub(1, Ordering::AcqRel);
                    // A grant handed to it that its RPC never took.
                    gone = entry.handed.lock().unwrap().take();
                }
                if entries.is_empty() {
                    lock.by_holder.remove(holder);
                }
            }
            if lock.by_holder.is_empty() {
                locks.remove(queue_key);
            }
        }
        if let Some(handed) = gone {
            let request = format!("{}.{id:x}", self.replica);
            self.orphaned(queue_key, holder, &request, &handed);
        }
    }

    /// A grant handed to request `request` of `holder`: to its RPC if it
    /// still waits here, given back if it was this replica's and is gone,
    /// ignored if it is another replica's.
    fn hand(&self, queue_key: &str, holder: &str, request: &str, handed: Handed) {
        let Some(id) = (request.split_once('.'))
            .filter(|(replica, _)| *replica == self.replica)
            .and_then(|(_, id)| u64::from_str_radix(id, 16).ok())
        else {
            return; // another replica's request
        };
        {
            let locks = self.locks.lock().unwrap();
            let entry = (locks.get(queue_key))
                .and_then(|lock| lock.by_holder.get(holder))
                .and_then(|entries| entries.iter().find(|e| e.registration == id));
            if let Some(entry) = entry {
                *entry.handed.lock().unwrap() = Some(handed);
                entry.notify.notify_one();
                return;
            }
        }
        self.orphaned(queue_key, holder, request, &handed);
    }

    /// Wakes the named requests of a lock, and its barging waiters (who
    /// take any free permit, whatever their place).
    pub fn wake(&self, queue_key: &str, ids: &[&str]) {
        let locks = self.locks.lock().unwrap();
        let Some(lock) = locks.get(queue_key) else {
            return;
        };
        for id in ids {
            for entry in lock.by_holder.get(*id).into_iter().flatten() {
                entry.notify.notify_one();
            }
        }
        for entry in lock.by_holder.values().flatten().filter(|e| !e.fair) {
            entry.notify.notify_one();
        }
    }

    /// Wakes every local waiter (after notifications may have been missed).
    pub fn wake_all(&self) {
        let locks = self.locks.lock().unwrap();
        for entry in locks.values().flat_map(|l| l.by_holder.values().flatten()) {
            entry.notify.notify_one();
        }
    }

    /// Handles one pub/sub message: a handed grant
    /// (`+<queue key>\n<id>\n<request>\n<holders>\n<grant record>`, the
    /// record last: its metadata follows a newline) or a wake-up
    /// (`<queue key>\n<id>\n<id>…`).
    pub fn handle_message(&self, payload: &str) {
        if let Some(handed) = payload.strip_prefix('+') {
            let mut parts = handed.splitn(5, '\n');
            let (Some(queue_key), Some(holder), Some(request), Some(holders), Some(record)) = (
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
            ) else {
                tracing::warn!("unreadable hand-over message");
                return;
            };
            let handed = Handed {
                record: record.to_owned(),
                holders: holders.parse().unwrap_or(1),
            };
            self.hand(queue_key, holder, request, handed);
            return;
        }
        let mut parts = payload.split('\n');
        if let Some(queue_key) = parts.next() {
            let ids: Vec<&str> = parts.collect();
            self.wake(queue_key, &ids);
        }
    }

    /// The locks due for a refresh now (their next one is scheduled), and
    /// when the next lock falls due.
    pub fn take_due(&self, now: Instant) -> (Vec<RefreshBatch>, Option<Instant>) {
        let mut locks = self.locks.lock().unwrap();
        let mut due = Vec::new();
        let mut next = None::<Instant>;
        for lock in locks.values_mut() {
            if lock.next_refresh <= now {
                lock.next_refresh = now + lock.refresh_every();
                due.push(RefreshBatch {
                    keys: lock.keys.clone(),
                    namespace: lock.namespace.clone(),
                    name: lock.name.clone(),
                    requests: lock
                        .by_holder
                        .iter()
                        .filter_map(|(holder, entries)| {
                            let ttl = entries.iter().map(|e| e.queue_ttl_ms).min()?;
                            Some((holder.clone(), ttl))
                        })
                        .collect(),
                });
            }
            next = Some(next.map_or(lock.next_refresh, |n| n.min(lock.next_refresh)));
        }
        (due, next)
    }

    /// Resolves when a new waiter may need an earlier refresh.
    pub async fn refresh_changed(&self) {
        self.refresh_changed.notified().await
    }

    /// Ends all waiting: waiters answer UNAVAILABLE so clients retry on
    /// another replica; no new waiter is accepted.
    pub fn shut_down(&self) {
        self.shutdown.cancel();
    }

    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }
}

/// Pumps pub/sub messages from Redis until shutdown: wake-ups into
/// `waiters`, and (subscribed only while someone here watches) lock events
/// into `watchers`. One connection for both.
pub async fn run_subscriber(
    waiters: Arc<Waiters>,
    watchers: Arc<super::watchers::Watchers>,
    store: crate::store::Store,
    wake_channel: String,
    events_channel: String,
) {
    let mut backoff = Duration::from_millis(100);
    let mut wanted = watchers.wanted();
    while !waiters.shutdown.is_cancelled() {
        let mut channels = vec![wake_channel.as_str()];
        if *wanted.borrow_and_update() {
            channels.push(events_channel.as_str());
        }
        match store.subscribe(&channels).await {
            Ok((mut sink, mut messages)) => {
                backoff = Duration::from_millis(100);
                tracing::debug!(?channels, "subscribed");
                waiters.wake_all();
                loop {
                    tokio::select! {
                        () = waiters.shutdown.cancelled() => return,
                        changed = wanted.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            let want = *wanted.borrow_and_update();
                            let switched = if want {
                                sink.subscribe(&events_channel).await
                            } else {
                                sink.unsubscribe(&events_channel).await
                            };
                            if switched.is_err() {
                                break;
                            }
                        }
                        message = messages.next() => match message {
                            Some(message) => {
                                let Ok(payload) = message.get_payload::<String>() else {
                                    tracing::warn!("unreadable pub/sub message");
                                    continue;
                                };
                                if message.get_channel_name() == events_channel {
                                    watchers.dispatch(&payload);
                                } else if let Some(namespace) = payload.strip_prefix(WATCH_ANNOUNCEMENT) {
                                    watchers.mark_watched(namespace);
                                } else {
                                    waiters.handle_message(&payload);
                                }
                            }
                            None => break,
                        },
                    }
                }
                tracing::warn!("pub/sub subscription lost; resubscribing");
            }
            Err(err) => tracing::debug!(error = %err, "cannot subscribe yet"),
        }
        tokio::select! {
            () = waiters.shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
