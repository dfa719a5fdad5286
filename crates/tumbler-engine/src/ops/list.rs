//! `lua/list.lua`: the live state of some locks of one shard.

use redis::Value;

use super::Reply;
use crate::LockSummary;
use crate::records::header_mode;
use crate::store::StoreError;

/// Redis' clock and the locks with anything live, in the order asked.
pub fn parse(value: Value) -> Result<(i64, Vec<LockSummary>), StoreError> {
    let mut reply = Reply::new("list", value)?;
    let now = reply.take()?;
    // `holders` counts permits in use (decision 0075: one per grant unless
    // a grant holds several).
    let found: Vec<(String, u32, u32, u32, i64, String)> = reply.take()?;
    let locks = found
        .into_iter()
        .map(
            |(name, holders, limit, waiters, next_expiry_at_ms, mode)| LockSummary {
                name,
                holders,
                limit,
                waiters,
                next_expiry_at_ms,
                mode: header_mode(&mode),
                permits_in_use: holders,
            },
        )
        .collect();
    Ok((now, locks))
}
