//! `lua/reap.lua`: clean up some locks of one shard now.

use redis::Value;

use super::{Noted, Reply, flag};
use crate::ReapCounts;
use crate::store::StoreError;

pub struct Call<'a> {
    /// Also drop grants and requests older than this (ms).
    pub older_than_ms: Option<u64>,
    pub watched: super::Emit,
    /// The shard's live locks are counted (a per-namespace lock limit).
    pub live: bool,
    pub names: &'a [String],
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(2 + self.names.len());
        args.push(super::optional(self.older_than_ms));
        args.push(self.watched.arg());
        args.push(flag(self.live).to_owned());
        args.extend(self.names.iter().cloned());
        args
    }
}

pub fn parse(value: Value) -> Result<(ReapCounts, Vec<Noted>), StoreError> {
    let mut reply = Reply::new("reap", value)?;
    let counts = ReapCounts {
        expired_holders: reply.take()?,
        dead_waiters: reply.take()?,
        stale_index_entries: reply.take()?,
        old_grants: reply.take()?,
        old_waiters: reply.take()?,
        locks_visited: reply.take()?,
    };
    Ok((counts, reply.noted()?))
}
