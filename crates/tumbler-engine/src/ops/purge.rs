//! `lua/purge.lua`: a watched lock at the end of a lease.

use redis::Value;

use super::Reply;
use crate::store::StoreError;

pub fn args(watched: super::Emit) -> Vec<String> {
    vec![watched.arg()]
}

/// The reply: Redis' clock, when the next lease may end (None: nobody
/// holds the lock) and what the call noted for the counters.
pub type Answer = super::Answer<Option<i64>>;

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("purge", value)?;
    let now = reply.take()?;
    let next: i64 = reply.take()?;
    Ok(Answer {
        now,
        outcome: (next > 0).then_some(next),
        noted: reply.noted()?,
    })
}
