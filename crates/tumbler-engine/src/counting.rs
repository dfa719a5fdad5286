//! [`Counting`]: what every call leaves behind for its namespace: this
//! replica's per-minute lock counters ([`Tally`]) and their writing to
//! Redis, and the note that the namespace is in use (the registry the
//! walks read, `walks.rs`).
//!
//! Counters are counted in this replica and added to Redis once a second
//! (`lua/count.lua`, one call per namespace and minute), so a lock
//! operation costs Redis no counting command of its own. Every replica's
//! counts meet in the namespace's hash of the minute, which the Metrics
//! RPC reads (the Metrics walk writes this replica's first, so a client
//! sees its own operations counted at once).
//!
//! Outcomes the replica sees (acquired, denied, timed out, released,
//! extended, errors) are counted here directly; what only a script sees
//! (a lease that expired, a dead waiter or an old grant reaped, a grant or
//! request that a Clear removed) comes back in its reply, per kind, and is
//! counted here the same way.
//!
//! Why a std `Mutex`: held for a map update, never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::METRICS_RETENTION_MS;
use super::calls::Calls;
use super::ops;
use crate::store::StoreError;

/// How often a replica re-records a namespace it serves as in use.
const NAMESPACE_NOTE_EVERY: Duration = Duration::from_secs(60);
/// How long an unused namespace stays in the registry.
const NAMESPACE_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// Counts not yet written, and the calls that write them.
pub(super) struct Counting {
    tally: Tally,
    calls: Arc<Calls>,
    /// Namespaces this replica recorded as in use, and when.
    noted_namespaces: Mutex<HashMap<String, std::time::Instant>>,
}

impl Counting {
    pub(super) fn new(calls: Arc<Calls>) -> Self {
        Counting {
            tally: Tally::default(),
            calls,
            noted_namespaces: Mutex::default(),
        }
    }

    /// Records (at most once a minute per replica) that a namespace is in
    /// use, so the dashboard and the reaper know the namespaces.
    pub(super) async fn note_namespace(&self, namespace: &str) -> Result<(), StoreError> {
        let now = std::time::Instant::now();
        let due = {
            let noted = self.noted_namespaces.lock().unwrap();
            noted
                .get(namespace)
                .is_none_or(|at| now.duration_since(*at) >= NAMESPACE_NOTE_EVERY)
        };
        if !due {
            return Ok(());
        }
        let key = self.calls.layout().namespaces_key();
        let now_ms = self.calls.now_ms();
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(&key)
            .arg(now_ms)
            .arg(namespace)
            .ignore();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now_ms - NAMESPACE_RETENTION_MS)
            .ignore();
        pipe.cmd("PEXPIRE")
            .arg(&key)
            .arg(NAMESPACE_RETENTION_MS)
            .ignore();
        self.calls.store().pipeline::<()>(pipe).await?;
        self.noted_namespaces
            .lock()
            .unwrap()
            .insert(namespace.to_owned(), now);
        Ok(())
    }

    /// Counts one event of a kind at `now_ms` (Redis' clock, as a reply
    /// told it).
    pub(super) fn at(&self, namespace: &str, now_ms: i64, kind: &str, event: &str) {
        self.tally.add(namespace, now_ms, kind, event, 1);
    }

    /// Counts one event of a kind now.
    pub(super) fn now(&self, namespace: &str, kind: &str, event: &str) {
        self.at(namespace, self.calls.now_ms(), kind, event);
    }

    /// Counts what a function noted (expired leases, reaped waiters).
    pub(super) fn noted(&self, namespace: &str, now_ms: i64, noted: &[ops::Noted]) {
        for n in noted {
            self.at(namespace, now_ms, &n.kind, &n.event);
        }
    }

    /// Writes the counts made so far: one `count.lua` call per namespace
    /// and minute. Counts that cannot be written wait for the next round.
    pub(super) async fn flush(&self) {
        for batch in self.tally.take() {
            let key = self
                .calls
                .layout()
                .metrics_key(&batch.namespace, batch.minute_ms);
            let args = ops::count::args(METRICS_RETENTION_MS, &batch.counts);
            if let Err(err) = self.calls.call(|s| &s.count, &key, &args).await {
                tracing::debug!(error = %err, "per-minute counters not written yet");
                self.tally.put_back(batch);
            }
        }
    }

    /// Every second, [`Self::flush`]. It runs until aborted; the server
    /// then writes the last counts itself, after the last RPC.
    pub(super) async fn run_flusher(&self) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.flush().await;
        }
    }
}

/// Counts not yet written.
#[derive(Default)]
pub(super) struct Tally {
    pending: Mutex<Pending>,
}

/// namespace → minute ms → 'kind|event' → n. Nested by namespace and
/// field (looked up by `&str`, with `field` as the reused buffer) so that
/// counting an event already seen this minute allocates nothing: it runs
/// on every lock operation.
#[derive(Default)]
struct Pending {
    counts: HashMap<String, HashMap<i64, HashMap<String, u64>>>,
    field: String,
}

impl Pending {
    fn add(&mut self, namespace: &str, minute_ms: i64, field: &str, n: u64) {
        if !self.counts.contains_key(namespace) {
            self.counts.insert(namespace.to_owned(), HashMap::new());
        }
        let minute = (self.counts.get_mut(namespace).expect("inserted above"))
            .entry(minute_ms)
            .or_default();
        match minute.get_mut(field) {
            Some(count) => *count += n,
            None => {
                minute.insert(field.to_owned(), n);
            }
        }
    }
}

/// One namespace-minute's counts, as written in one call.
pub(super) struct Batch {
    pub namespace: String,
    pub minute_ms: i64,
    pub counts: Vec<(String, u64)>,
}

const MINUTE_MS: i64 = 60_000;

impl Tally {
    /// Counts `n` events of a kind at `at_ms` (Redis clock).
    pub fn add(&self, namespace: &str, at_ms: i64, kind: &str, event: &str, n: u64) {
        if n == 0 {
            return;
        }
        let minute = at_ms - at_ms.rem_euclid(MINUTE_MS);
        let mut pending = self.pending.lock().unwrap();
        let mut field = std::mem::take(&mut pending.field);
        field.clear();
        field.push_str(kind);
        field.push('|');
        field.push_str(event);
        pending.add(namespace, minute, &field, n);
        pending.field = field;
    }

    /// Everything counted so far, taken out.
    pub fn take(&self) -> Vec<Batch> {
        let pending = std::mem::take(&mut self.pending.lock().unwrap().counts);
        let mut batches = Vec::new();
        for (namespace, minutes) in pending {
            for (minute_ms, counts) in minutes {
                batches.push(Batch {
                    namespace: namespace.clone(),
                    minute_ms,
                    counts: counts.into_iter().collect(),
                });
            }
        }
        batches
    }

    /// Puts back a batch that could not be written (Redis trouble): it
    /// goes with the next round.
    pub fn put_back(&self, batch: Batch) {
        let mut pending = self.pending.lock().unwrap();
        for (field, n) in batch.counts {
            pending.add(&batch.namespace, batch.minute_ms, &field, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_meet_per_namespace_minute_and_field() {
        let tally = Tally::default();
        tally.add("a", 120_001, "jobs", "acquired", 1);
        tally.add("a", 179_999, "jobs", "acquired", 2);
        tally.add("a", 180_000, "jobs", "acquired", 1);
        tally.add("b", 120_000, "jobs", "released", 0);
        let mut batches = tally.take();
        batches.sort_by_key(|b| b.minute_ms);
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].minute_ms, 120_000);
        assert_eq!(batches[0].counts, vec![("jobs|acquired".to_owned(), 3)]);
        assert!(tally.take().is_empty());
        tally.put_back(batches.remove(0));
        assert_eq!(tally.take()[0].counts[0].1, 3);
    }
}
