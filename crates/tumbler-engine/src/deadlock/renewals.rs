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
/// long each lives from a renewal.
type Edges = HashMap<String, HashMap<(String, String), Duration>>;

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
    pub(crate) fn add(self: &Arc<Self>, key: &str, holder: &str, request: &str, live: Duration) {
        let mut edges = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        let first = !edges.contains_key(key);
        let entry = (holder.to_owned(), request.to_owned());
        edges.entry(key.to_owned()).or_default().insert(entry, live);
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
            for chunk in now.chunks(wait_renew::MOST_EDGES) {
                let edges: Vec<Edge<'_>> = (chunk.iter())
                    .map(|(holder, request, live)| Edge {
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
        let shortest = edges
            .get(key)
            .and_then(|of_key| of_key.values().min().copied());
        match shortest {
            Some(live) => Some((live / 3).max(Duration::from_millis(10))),
            None => {
                edges.remove(key);
                None
            }
        }
    }

    fn snapshot(&self, key: &str) -> Option<Vec<(String, String, Duration)>> {
        let edges = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        let of_key = edges.get(key)?;
        Some(
            (of_key.iter())
                .map(|((holder, request), live)| (holder.clone(), request.clone(), *live))
                .collect(),
        )
    }
}
