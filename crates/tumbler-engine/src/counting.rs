//! [`Counting`]: this replica's per-minute lock counters (`tally.rs`) and
//! their writing to Redis. Every part that sees an outcome (acquired,
//! denied, timed out, released, extended, errors) or gets one back from a
//! function (what it noted: expired leases, dead waiters, reaped grants)
//! counts it here; the flusher adds the counts to the shared per-minute
//! hashes once a second (`lua/count.lua`), and the Metrics walk writes
//! them first so a client sees its own operations counted at once.

use std::sync::Arc;
use std::time::Duration;

use super::METRICS_RETENTION_MS;
use super::calls::Calls;
use super::ops;
use super::tally::Tally;

/// Counts not yet written, and the calls that write them.
pub(super) struct Counting {
    tally: Tally,
    calls: Arc<Calls>,
}

impl Counting {
    pub(super) fn new(calls: Arc<Calls>) -> Self {
        Counting {
            tally: Tally::default(),
            calls,
        }
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
