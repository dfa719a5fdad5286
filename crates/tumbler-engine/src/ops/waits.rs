//! `lua/waits.lua`: one page of the live edges of a namespace's wait-for
//! registry (decisions 0077, 0081), for the dashboard's chains.

use redis::Value;

use super::Reply;
use crate::WaitEdge;
use crate::store::StoreError;

/// The page from `cursor` ("0" first): at most `most` fields scanned and
/// `most_bytes` of edges decoded.
pub fn args(cursor: &str, most: u32, most_bytes: u32) -> Vec<String> {
    vec![cursor.to_owned(), most.to_string(), most_bytes.to_string()]
}

/// The locks one holder waits for, each with the holders it waits on.
type Waits = Vec<(String, Vec<String>)>;

/// The page's live edges, and the cursor of the next page ("0": none).
pub fn parse(value: Value) -> Result<(Vec<WaitEdge>, String), StoreError> {
    let mut reply = Reply::new("waits", value)?;
    let _now: i64 = reply.take()?;
    let cursor: String = reply.take()?;
    let edges: Vec<(String, i64, Waits)> = reply.take()?;
    let edges = (edges.into_iter())
        .map(|(holder, expires_at_ms, waits)| WaitEdge {
            holder,
            expires_at_ms,
            waits,
        })
        .collect();
    Ok((edges, cursor))
}
