//! The engine's walks over a namespace's shards: the registry of
//! namespaces in use, List (pages of SCAN steps), Reap, Clear and the
//! per-minute Metrics. Each step is one function call (or pipeline) on one
//! shard, in batches of at most `SHARD_BATCH` locks.
//!
//! The registry is written by every call's bookkeeping
//! (`Counting::note_namespace`, `counting.rs`); the walks read it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::calls::Calls;
use super::changelog::Changelog;
use super::counting::Counting;
use super::{
    ClearCounts, Counters, EngineError, ListCursor, ListPage, MetricsReport, MetricsRow,
    ReapCounts, ops,
};
use crate::errors::OrTrouble;
use crate::store::ScanCursor;

/// Locks one shard function call visits at most: bounds how long Redis is
/// busy with one call.
const SHARD_BATCH: usize = 100;
/// SCAN steps one List RPC makes at most (then it returns a page token).
const LIST_CALLS: usize = 64;
/// Keys one SCAN step looks at.
const SCAN_COUNT: u32 = 1000;

const MINUTE_MS: i64 = 60_000;

/// Walks over a namespace's shards, and the namespaces in use.
pub(super) struct Walks {
    calls: Arc<Calls>,
    counting: Arc<Counting>,
    /// Where a namespace's events go (the flags every call passes).
    changelog: Arc<Changelog>,
}

impl Walks {
    pub(super) fn new(
        calls: Arc<Calls>,
        counting: Arc<Counting>,
        changelog: Arc<Changelog>,
    ) -> Self {
        Walks {
            calls,
            counting,
            changelog,
        }
    }

    /// The namespaces in use (recorded by the replicas that served them).
    pub(super) async fn namespaces(&self) -> Result<Vec<String>, EngineError> {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(self.calls.layout().namespaces_key()).arg(0).arg(-1);
        self.calls.store().command(cmd).await.or_trouble()
    }

    /// Locks found by SCAN, grouped for shard functions: (the shard's
    /// fence key, which names the slot; the namespace; at most SHARD_BATCH
    /// lock names).
    fn shard_batches(&self, keys: &[String]) -> Vec<(String, String, Vec<String>)> {
        let mut by_shard: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
        for key in keys {
            if let Some((shard, namespace, name)) = self.calls.layout().parse_lock_key(key) {
                by_shard
                    .entry((shard, namespace))
                    .or_default()
                    .push(name.to_owned());
            }
        }
        let mut batches = Vec::new();
        for ((shard, namespace), names) in by_shard {
            for batch in names.chunks(SHARD_BATCH) {
                batches.push((
                    format!("{shard}:fence"),
                    namespace.to_owned(),
                    batch.to_vec(),
                ));
            }
        }
        batches
    }

    /// One page of a namespace's locks (in SCAN order), filtered by name
    /// prefix and by having waiters.
    pub(super) async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        page_size: u32,
        from: Option<ListCursor>,
        only_waiting: bool,
    ) -> Result<ListPage, EngineError> {
        self.calls.ready().or_trouble()?;
        let pattern = self
            .calls
            .layout()
            .lock_pattern(Some(namespace), prefix, only_waiting);
        let mut cursor = from.unwrap_or_default();
        let mut locks = Vec::new();
        let mut now_ms = self.calls.now_ms();
        for _ in 0..LIST_CALLS {
            let at = ScanCursor {
                node: cursor.node,
                position: cursor.position,
            };
            let (mut keys, next) = self
                .calls
                .store()
                .scan(at, &pattern, SCAN_COUNT)
                .await
                .or_trouble()?;
            // In a stable order, so a page that ends inside a batch can
            // read it again and go on after the last key it listed.
            keys.sort();
            keys.dedup();
            let fresh: Vec<String> = keys
                .into_iter()
                .filter(|key| cursor.after.is_empty() || *key > cursor.after)
                .collect();
            // Each key is at most one lock: looking at no more keys than
            // the page has room for keeps the page within its size.
            let looked = &fresh[..fresh.len().min(page_size as usize - locks.len())];
            for (fence, _, names) in self.shard_batches(looked) {
                let reply = self
                    .calls
                    .call(|s| &s.list, &fence, &names)
                    .await
                    .or_trouble()?;
                let (now, found) = ops::list::parse(reply).or_trouble()?;
                now_ms = now;
                locks.extend(found);
            }
            let next = match looked.last() {
                Some(last) if looked.len() < fresh.len() => Some(ListCursor {
                    node: cursor.node,
                    position: cursor.position,
                    after: last.clone(),
                }),
                _ => next.map(|next| ListCursor {
                    node: next.node,
                    position: next.position,
                    after: String::new(),
                }),
            };
            match next {
                Some(next) if locks.len() < page_size as usize => cursor = next,
                next => {
                    return Ok(ListPage {
                        locks,
                        next,
                        now_ms,
                    });
                }
            }
        }
        Ok(ListPage {
            locks,
            next: Some(cursor),
            now_ms,
        })
    }

    /// Cleans up every lock of a namespace now (every namespace when
    /// None): a SCAN of the lock keys, then `lua/reap.lua` per shard batch;
    /// with `older_than_ms` also drops old grants and requests.
    pub(super) async fn reap(
        &self,
        namespace: &str,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError> {
        self.reap_matching(Some(namespace), older_than_ms).await
    }

    pub(super) async fn reap_matching(
        &self,
        namespace: Option<&str>,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError> {
        self.calls.ready().or_trouble()?;
        let pattern = self.calls.layout().lock_pattern(namespace, "", false);
        let mut total = ReapCounts::default();
        let mut cursor = Some(ScanCursor::default());
        while let Some(at) = cursor {
            let (keys, next) = self
                .calls
                .store()
                .scan(at, &pattern, SCAN_COUNT)
                .await
                .or_trouble()?;
            cursor = next;
            for (fence, namespace, names) in self.shard_batches(&keys) {
                let call = ops::reap::Call {
                    older_than_ms,
                    watched: self.changelog.emits(&namespace),
                    live: self.calls.counts_live(),
                    names: &names,
                };
                let reply = self
                    .calls
                    .call(|s| &s.reap, &fence, &call.args())
                    .await
                    .or_trouble()?;
                let (counts, noted) = ops::reap::parse(reply).or_trouble()?;
                self.counting.noted(&namespace, self.calls.now_ms(), &noted);
                total.add(&counts);
            }
        }
        Ok(total)
    }

    /// Releases every lock and drops every queue of a namespace, in
    /// batches (a SCAN of its lock keys), adding what it cleared to `done`
    /// batch by batch, so a clear that Redis interrupts still says how far
    /// it got. It is
    /// resumable: a cleared lock has no keys left, so running it again
    /// finds only what is left and finishes the job.
    pub(super) async fn clear(
        &self,
        namespace: &str,
        done: &mut ClearCounts,
    ) -> Result<(), EngineError> {
        self.calls.ready().or_trouble()?;
        let pattern = self.calls.layout().lock_pattern(Some(namespace), "", false);
        let watched = self.changelog.emits(namespace);
        let mut cursor = Some(ScanCursor::default());
        while let Some(at) = cursor {
            let (keys, next) = self
                .calls
                .store()
                .scan(at, &pattern, SCAN_COUNT)
                .await
                .or_trouble()?;
            cursor = next;
            for (fence, _, names) in self.shard_batches(&keys) {
                let args = ops::clear::args(watched, &names);
                let (counts, noted) = ops::clear::parse(
                    self.calls
                        .call(|s| &s.clear, &fence, &args)
                        .await
                        .or_trouble()?,
                )
                .or_trouble()?;
                self.counting.noted(namespace, self.calls.now_ms(), &noted);
                done.locks += counts.locks;
                done.grants += counts.grants;
                done.requests += counts.requests;
            }
        }
        Ok(())
    }

    /// Per-minute counters of a namespace between two instants (inclusive
    /// minutes), as every replica added them: this replica's own counts
    /// are written first (so a client sees its own operations counted at
    /// once), other replicas' within a second of being made.
    pub(super) async fn metrics(
        &self,
        namespace: &str,
        from_ms: i64,
        to_ms: i64,
        kind: Option<&str>,
    ) -> Result<MetricsReport, EngineError> {
        self.calls.ready().or_trouble()?;
        self.counting.flush().await;
        let first = from_ms - from_ms.rem_euclid(MINUTE_MS);
        let minutes: Vec<i64> = (first..=to_ms).step_by(MINUTE_MS as usize).collect();
        // One pipeline: a namespace's counters share one slot.
        let mut pipe = redis::pipe();
        for minute in &minutes {
            pipe.cmd("HGETALL")
                .arg(self.calls.layout().metrics_key(namespace, *minute));
        }
        let counts: Vec<HashMap<String, u64>> =
            self.calls.store().pipeline(pipe).await.or_trouble()?;
        let mut sums: BTreeMap<(i64, String), Counters> = BTreeMap::new();
        for (minute, fields) in minutes.iter().zip(counts) {
            for (field, n) in fields {
                let Some((field_kind, event)) = field.rsplit_once('|') else {
                    continue;
                };
                if kind.is_some_and(|k| k != field_kind) {
                    continue;
                }
                sums.entry((*minute, field_kind.to_owned()))
                    .or_default()
                    .add_event(event, n);
            }
        }
        let mut totals: BTreeMap<String, Counters> = BTreeMap::new();
        let minutes = sums
            .into_iter()
            .map(|((minute_ms, kind), counters)| {
                totals.entry(kind.clone()).or_default().add(&counters);
                MetricsRow {
                    minute_ms,
                    kind,
                    counters,
                }
            })
            .collect();
        let mut overall = MetricsRow {
            minute_ms: first,
            kind: "*".into(),
            counters: Counters::default(),
        };
        let totals = totals
            .into_iter()
            .map(|(kind, counters)| {
                overall.counters.add(&counters);
                MetricsRow {
                    minute_ms: first,
                    kind,
                    counters,
                }
            })
            .collect();
        Ok(MetricsReport {
            minutes,
            totals,
            overall,
        })
    }
}
