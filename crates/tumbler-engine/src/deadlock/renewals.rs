//! [`Renewals`]: the wait-for edges this replica keeps alive (decision
//! 0081). An edge lives one queue TTL unless renewed, so a crashed
//! replica's edges leave with its waiting requests; the live ones are
//! renewed per namespace, all of them in one call (`lua/wait_renew.lua`)
//! every third of the shortest life among them, so idle waiting costs
//! Redis one call per namespace and period, whatever the number of waiters
//! (as the queue's heartbeat is one per lock, decision 0021).
//!
//! Why a std `Mutex`: held only to add, remove or copy entries, never
//! across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::calls::Calls;
use crate::ops::wait_renew::{self, Edge};

/// The edges to renew, by registry key, then by (holder, request): how
/// long each lives from a renewal, and about how many bytes it holds.
type Edges = HashMap<String, HashMap<(String, String), (Duration, usize)>>;

/// The bytes of edges one renewal call copies, at most (with at most
/// `wait_renew::MOST_EDGES` edges): a few milliseconds of Redis' time for
/// the largest edges, one call for a namespace's small ones.
const CALL_BYTES: usize = 256 << 10;

pub(crate) struct Renewals {
    calls: Arc<Calls>,
    edges: Mutex<Edges>,
}

impl Renewals {
    pub(crate) fn new(calls: Arc<Calls>) -> Arc<Self> {
        Arc::new(Renewals {
            calls,
            edges: Mutex::new(HashMap::new()),
        })
    }

    /// Keeps an edge alive from now on; the first of a registry starts its
    /// renewing task.
    pub(crate) fn add(
        self: &Arc<Self>,
        key: &str,
        (holder, request): (&str, &str),
        live: Duration,
        bytes: usize,
    ) {
        let mut edges = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        let first = !edges.contains_key(key);
        let entry = (holder.to_owned(), request.to_owned());
        edges
            .entry(key.to_owned())
            .or_default()
            .insert(entry, (live, bytes));
        drop(edges);
        if first {
            let renewals = self.clone();
            let key = key.to_owned();
            tokio::spawn(async move { renewals.renew(key).await });
        }
    }

    /// The edge's wait ended: renewed no more.
    pub(crate) fn remove(&self, key: &str, holder: &str, request: &str) {
        let mut edges = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(of_key) = edges.get_mut(key) {
            of_key.remove(&(holder.to_owned(), request.to_owned()));
        }
    }

    /// One registry's task: every third of the shortest life, its edges
    /// renewed; it ends (and leaves the map) once none is left.
    async fn renew(&self, key: String) {
        loop {
            let Some(every) = self.period(&key) else {
                return;
            };
            tokio::time::sleep(every).await;
            let Some(now) = self.snapshot(&key) else {
                return;
            };
            for chunk in chunks(&now) {
                let edges: Vec<Edge<'_>> = (chunk.iter())
                    .map(|(holder, request, live, _)| Edge {
                        holder,
                        request,
                        live_ms: live.as_millis() as u64,
                    })
                    .collect();
                let renewed = self
                    .calls
                    .call(|s| &s.wait_renew, &key, &wait_renew::args(&edges))
                    .await;
                if let Err(err) = renewed.and_then(wait_renew::parse) {
                    tracing::debug!(error = %err, "wait-for edges not renewed");
                }
            }
        }
    }

    /// A third of the shortest life among the registry's edges (at least
    /// 10 ms); none when it has none left, and then it leaves the map (under
    /// the lock, so an `add` after it starts a new task).
    fn period(&self, key: &str) -> Option<Duration> {
        let mut edges = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        let shortest =
            (edges.get(key)).and_then(|of_key| of_key.values().map(|(live, _)| *live).min());
        match shortest {
            Some(live) => Some((live / 3).max(Duration::from_millis(10))),
            None => {
                edges.remove(key);
                None
            }
        }
    }

    fn snapshot(&self, key: &str) -> Option<Vec<Renewal>> {
        let edges = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        let of_key = edges.get(key)?;
        Some(
            (of_key.iter())
                .map(|((holder, request), (live, bytes))| {
                    (holder.clone(), request.clone(), *live, *bytes)
                })
                .collect(),
        )
    }
}

/// One edge to renew: holder, request, life, bytes.
type Renewal = (String, String, Duration, usize);

/// The edges split into calls of at most `wait_renew::MOST_EDGES` edges
/// and about [`CALL_BYTES`] bytes each.
fn chunks(edges: &[Renewal]) -> Vec<&[Renewal]> {
    let mut calls = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, edge) in edges.iter().enumerate() {
        let full =
            i - start == wait_renew::MOST_EDGES || (i > start && bytes + edge.3 > CALL_BYTES);
        if full {
            calls.push(&edges[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += edge.3;
    }
    if start < edges.len() {
        calls.push(&edges[start..]);
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(n: usize, bytes: usize) -> Vec<Renewal> {
        (0..n)
            .map(|i| {
                (
                    format!("h{i}"),
                    "r".to_owned(),
                    Duration::from_secs(5),
                    bytes,
                )
            })
            .collect()
    }

    #[test]
    fn small_edges_go_in_one_call_and_large_ones_by_their_bytes() {
        let sizes = |edges: &[Renewal]| chunks(edges).iter().map(|c| c.len()).collect::<Vec<_>>();
        assert_eq!(sizes(&edges(100, 100)), [100]);
        assert_eq!(sizes(&edges(300, 100)), [256, 44]);
        // 4.5 KB edges: 58 of them fill 256 KiB.
        assert_eq!(sizes(&edges(120, 4_500)), [58, 58, 4]);
        assert!(chunks(&[]).is_empty());
    }
}
