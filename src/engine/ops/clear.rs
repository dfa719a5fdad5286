//! `lua/clear.lua`: release some locks of one shard and drop their queues.

use redis::Value;

use super::{Reply, flag};
use crate::engine::ClearCounts;
use crate::store::StoreError;

pub fn args(watched: bool, names: &[String]) -> Vec<String> {
    let mut args = Vec::with_capacity(1 + names.len());
    args.push(flag(watched).to_owned());
    args.extend(names.iter().cloned());
    args
}

pub fn parse(value: Value) -> Result<ClearCounts, StoreError> {
    let mut reply = Reply::new("clear", value)?;
    Ok(ClearCounts {
        locks: reply.take()?,
        grants: reply.take()?,
        requests: reply.take()?,
    })
}
