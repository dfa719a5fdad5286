//! `lua/refresh.lua`: keep one replica's waiting requests on a lock alive.

use redis::Value;

use super::{Noted, Reply};
use crate::store::StoreError;

/// One call: this replica's requests on the lock and their queue TTLs.
pub struct Call<'a> {
    pub watched: super::Emit,
    pub requests: &'a [(String, u64)],
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(1 + 2 * self.requests.len());
        args.push(self.watched.arg());
        for (id, ttl) in self.requests {
            args.push(id.clone());
            args.push(ttl.to_string());
        }
        args
    }
}

/// The requests whose place was lost meanwhile, and what was noted.
#[derive(Debug)]
pub struct Answer {
    pub now: i64,
    pub lost: Vec<String>,
    pub noted: Vec<Noted>,
}

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("refresh", value)?;
    let now = reply.take()?;
    let lost = reply.until_marker()?;
    Ok(Answer {
        now,
        lost,
        noted: reply.noted()?,
    })
}
