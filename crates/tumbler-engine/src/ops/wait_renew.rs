//! `lua/wait_renew.lua`: the edges a replica keeps alive in one
//! namespace's wait-for registry, in one call (decision 0081), so one whose
//! replica died leaves within its queue TTL.

use redis::Value;

use crate::store::StoreError;

/// Edges one call renews, at most (a replica with more calls again, one
/// call after another; `deadlock/renewals.rs` also keeps a call's edges
/// to about 256 KiB).
pub const MOST_EDGES: usize = 256;

/// One edge to renew: its holder, its request, how long it lives from now.
pub struct Edge<'a> {
    pub holder: &'a str,
    pub request: &'a str,
    pub live_ms: u64,
}

pub fn args(edges: &[Edge<'_>]) -> Vec<String> {
    let mut args = Vec::with_capacity(edges.len() * 3);
    for edge in edges {
        args.push(edge.holder.to_owned());
        args.push(edge.request.to_owned());
        args.push(edge.live_ms.max(1).to_string());
    }
    args
}

/// How many of them were still there (and this request's) and live on.
pub fn parse(value: Value) -> Result<u64, StoreError> {
    match value {
        Value::Int(n) => Ok(n.max(0) as u64),
        other => Err(StoreError::Protocol(format!(
            "wait_renew answered {other:?}"
        ))),
    }
}
