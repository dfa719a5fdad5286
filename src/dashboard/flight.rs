//! Single flight for the dashboard's costly reads (the overview's walk, a
//! changelog page): requests that want the same answer while one is being
//! made wait for it rather than make their own, the answer is kept for a
//! short while after it is made (errors too, so a failing Redis is not
//! asked more often either), and at most a few answers of one kind are
//! made at once on a replica, whatever they are.
//!
//! Why a std `Mutex`: held only to find or add an entry, never across an
//! `.await`; the wait for an answer is on the entry's `OnceCell`.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, Semaphore};

use super::errors::ApiError;

/// An answer still unmade after this long (its requests all went away
/// while it was made and nobody asked again) is forgotten.
const STALLED: Duration = Duration::from_secs(60);

/// The answers of one kind, by what they answer.
pub(super) struct Flights<K, V> {
    entries: Mutex<HashMap<K, Arc<Entry<V>>>>,
    passes: Semaphore,
    fresh_for: Duration,
}

/// One answer: being made until `done` is set.
struct Entry<V> {
    started: Instant,
    done: OnceCell<Done<V>>,
}

struct Done<V> {
    at: Instant,
    result: Result<V, ApiError>,
}

impl<V> Entry<V> {
    /// Whether a request arriving `now` may use this answer: it is being
    /// made, or was made less than `fresh_for` ago.
    fn usable(&self, now: Instant, fresh_for: Duration) -> bool {
        match self.done.get() {
            Some(done) => now.duration_since(done.at) < fresh_for,
            None => now.duration_since(self.started) < STALLED,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Flights<K, V> {
    /// Answers kept `fresh_for` after they are made, at most `passes`
    /// made at once.
    pub(super) fn new(passes: usize, fresh_for: Duration) -> Self {
        Flights {
            entries: Mutex::new(HashMap::new()),
            passes: Semaphore::new(passes),
            fresh_for,
        }
    }

    /// The answer to `key`: the last one if it is fresh, the one being
    /// made if one is, else the one `make` makes now.
    pub(super) async fn get<F, Fut>(&self, key: K, make: F) -> Result<V, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, ApiError>>,
    {
        let entry = self.entry(key);
        let done = entry
            .done
            .get_or_init(|| async {
                // Never closed, so always a permit.
                let _permit = self.passes.acquire().await.ok();
                Done {
                    result: make().await,
                    at: Instant::now(),
                }
            })
            .await;
        done.result.clone()
    }

    /// The entry a request for `key` joins; old entries of every key are
    /// dropped on the way, so the map holds only what was asked for within
    /// the last `fresh_for` or so.
    fn entry(&self, key: K) -> Arc<Entry<V>> {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, entry| entry.usable(now, self.fresh_for));
        entries
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Entry {
                    started: now,
                    done: OnceCell::new(),
                })
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_requests_share_one_answer_and_fresh_ones_are_kept() {
        let flights: Flights<&str, usize> = Flights::new(1, Duration::from_millis(200));
        let made = AtomicUsize::new(0);
        let make = || async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(made.fetch_add(1, Ordering::SeqCst))
        };
        let answers = futures::future::join_all((0..8).map(|_| flights.get("a", make))).await;
        assert!(answers.iter().all(|a| a.as_ref().ok() == Some(&0)));
        assert_eq!(flights.get("a", make).await.ok(), Some(0), "still fresh");
        assert_eq!(flights.get("b", make).await.ok(), Some(1), "another key");
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(flights.get("a", make).await.ok(), Some(2), "made again");
        assert_eq!(made.load(Ordering::SeqCst), 3);
    }
}
