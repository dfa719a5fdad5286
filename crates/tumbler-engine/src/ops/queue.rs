//! `lua/queue.lua`: a lock's live waiting requests in grant order.

use redis::Value;

use super::Reply;
use crate::QueueState;
use crate::records::parse_waiter;
use crate::store::StoreError;

pub fn args(most: u32) -> Vec<String> {
    vec![most.to_string()]
}

pub fn parse(value: Value) -> Result<QueueState, StoreError> {
    let mut reply = Reply::new("queue", value)?;
    let now_ms = reply.take()?;
    let waiters = reply.take()?;
    let entries: Vec<(String, i64, String)> = reply.take()?;
    let requests = entries
        .iter()
        .zip(1..)
        .map(|((holder, expires_at, record), position)| {
            parse_waiter(holder, record, *expires_at, position)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(QueueState {
        now_ms,
        waiters,
        requests,
    })
}
