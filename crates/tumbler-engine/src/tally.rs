//! Per-minute lock counters, counted in this replica and added to Redis
//! once a second (`lua/count.lua`, one call per namespace and minute), so
//! a lock operation costs Redis no counting command of its own. Every
//! replica's counts meet in the namespace's hash of the minute, which the
//! Metrics RPC reads.
//!
//! Outcomes the replica sees (acquired, denied, timed out, released,
//! extended, errors) are counted here directly; what only a script sees
//! (a lease that expired, a dead waiter or an old grant reaped, a grant or
//! request that a Clear removed) comes back in its reply, per kind, and is
//! counted here the same way.
//!
//! Why a std `Mutex`: held for a map update, never across an `.await`.

use std::collections::HashMap;
use std::sync::Mutex;

/// Counts not yet written.
#[derive(Default)]
pub struct Tally {
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
pub struct Batch {
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
