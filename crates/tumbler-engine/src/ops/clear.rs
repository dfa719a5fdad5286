//! `lua/clear.lua`: release some locks of one shard and drop their queues.

use redis::Value;

use super::{Noted, Reply};
use crate::ClearCounts;
use crate::store::StoreError;

pub fn args(watched: super::Emit, names: &[String]) -> Vec<String> {
    let mut args = Vec::with_capacity(1 + names.len());
    args.push(watched.arg());
    args.extend(names.iter().cloned());
    args
}

/// What the call cleared, and its 'cleared' events per kind for the
/// counters (one per grant and per request).
pub fn parse(value: Value) -> Result<(ClearCounts, Vec<Noted>), StoreError> {
    let mut reply = Reply::new("clear", value)?;
    let counts = ClearCounts {
        locks: reply.take()?,
        grants: reply.take()?,
        requests: reply.take()?,
    };
    Ok((counts, reply.noted()?))
}
