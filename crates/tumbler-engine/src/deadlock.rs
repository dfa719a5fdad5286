//! [`Deadlocks`]: deadlock detection among waiters (decision 0077). A
//! holder that may hold other locks of its namespace records, when it
//! starts to wait, its edges in the namespace's wait-for registry (the
//! lock it waits for and the holders it waits on there) and walks the
//! edges from those holders (`lua/wait_for.lua`, one call). A walk that
//! comes back to it is a candidate cycle, read from snapshots that may
//! be stale, so every step is checked against the locks as they are now
//! (is the next holder still holding, is the waiter still queued and
//! still blocked by it) before the wait is refused. A race may miss a
//! cycle (it then ends by timeout, as without detection); a cycle that is
//! not there is never reported.
//!
//! A holder waits on a holder only when that holder alone keeps it out
//! ([`blocking`]): the holder of a mutex, a writer, every reader for a
//! writer, a grant of a semaphore without whose permits the request could
//! never fit. Then a cycle of such waits is a deadlock whatever the others
//! do.
//!
//! Bounded per tenant (decision 0081): an edge names at most
//! [`ops::wait_for::MOST_HOLDERS`] holders per lock (those that have held
//! longest), a namespace's registry at most [`BUDGET_BYTES`] (a wait past
//! it goes on unchecked), a walk at most 256 holders and [`WALK_BYTES`]
//! decoded; an edge lives a queue TTL unless its replica renews it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::calls::Calls;
use super::locks::Locks;
use crate::errors::OrTrouble;
use renewals::Renewals;

mod renewals;
use super::{AcquireRequest, EngineError, LockId, LockMode, LockState, WaitEdge, WaitStep, ops};

/// The bytes a namespace's wait-for registry may hold (holder names and
/// edges); a wait that would pass it is not recorded, so not checked.
pub const BUDGET_BYTES: u64 = 1 << 20;

/// The bytes of edges one walk decodes, at most (with at most 256 holders
/// visited): past either, the walk stops and misses what lies beyond.
pub const WALK_BYTES: u64 = 256 << 10;

/// Fields of the registry one page of chains scans, and the bytes of
/// edges it decodes, at most.
const PAGE_FIELDS: u32 = 50;
const PAGE_BYTES: u32 = 256 << 10;

/// The wait-for registry's calls (one per replica, shared by single and
/// multi-lock waits).
#[derive(Clone)]
pub(super) struct Deadlocks {
    calls: Arc<Calls>,
    locks: Arc<Locks>,
    renewals: Arc<Renewals>,
}

/// A wait whose edge is in the registry: kept alive by [`Renewals`] while
/// the wait outlasts its edge's life, removed when this is dropped (the
/// wait ended: granted, timed out, cancelled, refused).
pub(super) struct Recorded {
    calls: Arc<Calls>,
    renewals: Arc<Renewals>,
    key: String,
    holder: String,
    request: String,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        (self.renewals).remove(&self.key, &self.holder, &self.request);
        let (calls, key) = (self.calls.clone(), std::mem::take(&mut self.key));
        let args = ops::wait_end::args(&self.holder, &self.request);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Off the answer's path; an edge that stays ends at its expiry.
        runtime.spawn(async move {
            let removed = calls.call(|s| &s.wait_end, &key, &args).await;
            if let Err(err) = removed.and_then(ops::wait_end::parse) {
                tracing::debug!(error = %err, "a wait's edges left to their expiry");
            }
        });
    }
}

impl Deadlocks {
    pub(super) fn new(calls: Arc<Calls>, locks: Arc<Locks>) -> Self {
        let renewals = Renewals::new(calls.clone());
        Deadlocks {
            calls,
            locks,
            renewals,
        }
    }

    /// A waiting request's check, once it is queued: its edges recorded
    /// (kept while the returned guard lives) and, when they close a cycle
    /// that is verified, the cycle (`Err(EngineError::Deadlock)`).
    pub(super) async fn check(
        &self,
        req: &AcquireRequest,
        request: &str,
        left: Duration,
    ) -> Result<Option<Recorded>, EngineError> {
        // 1. Who keeps it out now (none: it closes no cycle, records
        // nothing), from a bounded look at the lock's grants.
        let state = self.locks.blockers(&req.lock, &req.holder).await?;
        let waits_on = blocking(&state, &req.holder, req.mode, req.permits);
        if waits_on.is_empty() {
            return Ok(None);
        }
        // 2. Its edge recorded (it lives a queue TTL unless renewed, so a
        // dead replica's edges go with its requests), the walk from it.
        let key = self.calls.layout().waits_key(&req.lock.namespace);
        let live = match req.queue_ttl_ms {
            0 => left,
            ttl => left.min(Duration::from_millis(ttl)),
        };
        let waits = [(req.lock.name.to_string(), waits_on)];
        let call = ops::wait_for::Call {
            holder: &req.holder,
            request,
            live_ms: live.as_millis() as u64,
            budget_bytes: BUDGET_BYTES,
            walk_bytes: WALK_BYTES,
            waits: &waits,
        };
        let reply = self
            .calls
            .call(|s| &s.wait_for, &key, &call.args())
            .await
            .or_trouble()?;
        let cycle = match ops::wait_for::parse(reply).or_trouble()? {
            ops::wait_for::Found::OverBudget => {
                tracing::debug!(namespace = %req.lock.namespace, "wait-for registry at its budget: a wait not checked");
                return Ok(None);
            }
            ops::wait_for::Found::Nothing => Vec::new(),
            ops::wait_for::Found::Cycle(cycle) => cycle,
        };
        if live < left {
            // About what the edge holds: its holder, request and waits.
            let bytes = (waits.iter())
                .map(|(lock, holders)| {
                    let kept = &holders[..holders.len().min(ops::wait_for::MOST_HOLDERS)];
                    lock.len() + kept.iter().map(|h| h.len() + 3).sum::<usize>() + 8
                })
                .sum::<usize>()
                + req.holder.len()
                + request.len()
                + 16;
            (self.renewals).add(&key, (&req.holder, request), live, bytes);
        }
        let recorded = Recorded {
            calls: self.calls.clone(),
            renewals: self.renewals.clone(),
            key,
            holder: req.holder.to_string(),
            request: request.to_owned(),
        };
        // 3. A candidate is refused only when it holds now.
        if !cycle.is_empty() && self.verified(&req.lock.namespace, &cycle).await? {
            return Err(EngineError::Deadlock(cycle));
        }
        Ok(Some(recorded))
    }

    /// Every step of a cycle as the locks are now: the waiter still
    /// queued on the lock, and the next holder still keeping it out.
    async fn verified(
        &self,
        namespace: &super::Namespace,
        cycle: &[WaitStep],
    ) -> Result<bool, EngineError> {
        for step in cycle {
            let Ok(lock) = LockId::parse(namespace.to_string(), step.lock.clone()) else {
                return Ok(false);
            };
            let queue = match self.locks.queue(&lock, u32::MAX).await {
                Ok(queue) => queue,
                Err(err @ EngineError::Store(_)) => return Err(err),
                Err(_) => return Ok(false),
            };
            let Some(waiting) = queue.requests.iter().find(|r| r.holder == step.holder) else {
                return Ok(false);
            };
            let state = match self.locks.inspect(&lock).await {
                Ok(state) => state,
                Err(err @ EngineError::Store(_)) => return Err(err),
                Err(_) => return Ok(false),
            };
            if !blocking(&state, &step.holder, waiting.mode, waiting.permits)
                .contains(&step.held_by)
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One page of the namespace's current wait-for chains, for the
    /// dashboard: from each holder nobody waits on, its edges followed
    /// while the holder it waits on waits too (a cycle ends where it comes
    /// round), among the page's edges (a chain across pages is cut).
    pub(super) async fn chains(
        &self,
        namespace: &super::Namespace,
        page: Option<u64>,
    ) -> Result<super::WaitChainsPage, EngineError> {
        self.calls.ready().or_trouble()?;
        let key = self.calls.layout().waits_key(namespace);
        let cursor = page.unwrap_or(0).to_string();
        let args = ops::waits::args(&cursor, PAGE_FIELDS, PAGE_BYTES);
        let reply = self
            .calls
            .call(|s| &s.waits, &key, &args)
            .await
            .or_trouble()?;
        let (edges, next) = ops::waits::parse(reply).or_trouble()?;
        Ok(super::WaitChainsPage {
            chains: chains(&edges),
            next: next.parse().ok().filter(|&c: &u64| c != 0),
        })
    }
}

/// The holders that alone keep a request of `holder` (its mode, its
/// permits) out of a lock: a writer's grant, every grant for a writer, a
/// grant without whose permits the request could never fit.
pub(super) fn blocking(
    state: &LockState,
    holder: &str,
    mode: LockMode,
    permits: u32,
) -> Vec<String> {
    let others = state.holders.iter().filter(|grant| grant.holder != holder);
    let alone = |grant: &&super::Grant| match (mode, grant.mode) {
        (LockMode::Write, _) | (_, LockMode::Write) => true,
        _ => grant.permits.max(1) > state.limit.saturating_sub(permits.max(1)),
    };
    // Those that have held longest first: an edge keeps the first few.
    let mut found: Vec<(i64, &str)> = (others.filter(alone))
        .map(|g| (g.acquired_at_ms, g.holder.as_str()))
        .collect();
    found.sort();
    let mut holders: Vec<String> = Vec::with_capacity(found.len());
    for (_, holder) in found {
        if !holders.iter().any(|h| h == holder) {
            holders.push(holder.to_owned());
        }
    }
    holders
}

/// Chains from the registry's edges: each starts at a waiting holder
/// nobody waits on (or, for holders only on cycles, at the least of
/// them) and follows a holder waited on that waits too (else the first).
pub(super) fn chains(edges: &[WaitEdge]) -> Vec<Vec<WaitStep>> {
    let by_holder: BTreeMap<&str, &WaitEdge> =
        edges.iter().map(|e| (e.holder.as_str(), e)).collect();
    let waited_on: BTreeSet<&str> = edges
        .iter()
        .flat_map(|e| e.waits.iter().flat_map(|(_, holders)| holders))
        .map(String::as_str)
        .collect();
    let mut covered = BTreeSet::new();
    let mut chains = Vec::new();
    let starts = (by_holder.keys().copied())
        .filter(|h| !waited_on.contains(h))
        .chain(by_holder.keys().copied());
    for start in starts {
        if covered.contains(start) {
            continue;
        }
        let mut chain = Vec::new();
        let mut seen = BTreeSet::new();
        let mut at = start;
        while let Some(edge) = by_holder.get(at) {
            if !seen.insert(at) {
                break;
            }
            covered.insert(at);
            // The lock and holder to follow: one that waits too, if any.
            let pairs = || {
                (edge.waits.iter())
                    .flat_map(|(lock, holders)| holders.iter().map(move |h| (lock, h)))
            };
            let Some((lock, next)) = pairs()
                .find(|(_, h)| by_holder.contains_key(h.as_str()))
                .or_else(|| pairs().next())
            else {
                break;
            };
            chain.push(WaitStep {
                holder: at.to_owned(),
                lock: lock.clone(),
                held_by: next.clone(),
            });
            at = next.as_str();
        }
        if !chain.is_empty() {
            chains.push(chain);
        }
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(holder: &str, lock: &str, holders: &[&str]) -> WaitEdge {
        WaitEdge {
            holder: holder.into(),
            expires_at_ms: 0,
            waits: vec![(lock.into(), holders.iter().map(|h| h.to_string()).collect())],
        }
    }

    fn text(chain: &[WaitStep]) -> String {
        let mut out = chain[0].holder.clone();
        for step in chain {
            out.push_str(&format!(" -> {} ({})", step.lock, step.held_by));
        }
        out
    }

    #[test]
    fn chains_start_where_nobody_waits_and_cycles_come_round() {
        let edges = [
            edge("a", "x", &["b"]),
            edge("b", "y", &["c"]),
            edge("p", "q", &["r"]),
            edge("r", "s", &["p"]),
        ];
        let found: Vec<String> = chains(&edges).iter().map(|c| text(c)).collect();
        assert_eq!(found, ["a -> x (b) -> y (c)", "p -> q (r) -> s (p)"]);
    }

    fn state(limit: u32, grants: &[(&str, LockMode, u32)]) -> LockState {
        let holders = (grants.iter())
            .map(|&(holder, mode, permits)| super::super::Grant {
                holder: holder.into(),
                fencing_token: 1,
                slot: 1,
                acquired_at_ms: 0,
                expires_at_ms: 1,
                ttl_ms: 1,
                kind: "default".into(),
                metadata: Default::default(),
                mode,
                permits,
                slots: vec![1],
                proof: None,
            })
            .collect();
        LockState {
            now_ms: 0,
            limit,
            waiters: 0,
            holders,
            mode: LockMode::Plain,
            permits_in_use: grants.iter().map(|g| g.2).sum(),
        }
    }

    #[test]
    fn only_a_holder_that_alone_keeps_a_request_out_is_waited_on() {
        use LockMode::*;
        // A mutex's holder; never the request's own holder.
        assert_eq!(
            blocking(&state(1, &[("b", Plain, 1)]), "a", Plain, 1),
            ["b"]
        );
        assert!(blocking(&state(1, &[("a", Plain, 1)]), "a", Plain, 1).is_empty());
        // A semaphore either of whose holders can free a permit: nobody.
        let two = state(2, &[("b", Plain, 1), ("c", Plain, 1)]);
        assert!(blocking(&two, "a", Plain, 1).is_empty());
        // ... unless the request needs every permit: both.
        assert_eq!(blocking(&two, "a", Plain, 2), ["b", "c"]);
        // Weighted: a grant of 3 of 4 keeps out a request of 2; one of 1 does not.
        let four = state(4, &[("big", Plain, 3), ("small", Plain, 1)]);
        assert_eq!(blocking(&four, "a", Plain, 2), ["big"]);
        // Read/write: a writer waits on every reader, a reader on the writer.
        let readers = state(3, &[("r1", Read, 1), ("r2", Read, 1)]);
        assert_eq!(blocking(&readers, "w", Write, 1), ["r1", "r2"]);
        assert!(blocking(&readers, "r3", Read, 1).is_empty());
        assert_eq!(blocking(&state(3, &[("w", Write, 1)]), "r", Read, 1), ["w"]);
    }
}
