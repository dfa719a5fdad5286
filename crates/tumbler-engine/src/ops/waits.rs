//! `lua/waits.lua`: the live edges of a namespace's wait-for registry
//! (decision 0077), for the dashboard's chains.

use redis::Value;

use super::Reply;
use crate::WaitEdge;
use crate::store::StoreError;

pub fn args(most: u32) -> Vec<String> {
    vec![most.to_string()]
}

/// The locks one holder waits for, each with the holders it waits on.
type Waits = Vec<(String, Vec<String>)>;

pub fn parse(value: Value) -> Result<Vec<WaitEdge>, StoreError> {
    let mut reply = Reply::new("waits", value)?;
    let _now: i64 = reply.take()?;
    let edges: Vec<(String, i64, Waits)> = reply.take()?;
    Ok(edges
        .into_iter()
        .map(|(holder, expires_at_ms, waits)| WaitEdge {
            holder,
            expires_at_ms,
            waits,
        })
        .collect())
}
