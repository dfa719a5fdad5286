//! `lua/inspect.lua`: a lock's live holders, limit, waiter count and mode.

use redis::Value;

use super::Reply;
use crate::LockState;
use crate::records::{header_mode, parse_grant};
use crate::store::StoreError;

pub fn parse(value: Value) -> Result<LockState, StoreError> {
    let mut reply = Reply::new("inspect", value)?;
    let now_ms = reply.take()?;
    let limit = reply.take()?;
    let waiters = reply.take()?;
    let live: Vec<(String, String)> = reply.take()?;
    // The header's limit field ('' from an older library: plain).
    let mode = header_mode(&reply.take_opt::<String>()?.unwrap_or_default());
    let mut holders = live
        .iter()
        .map(|(holder, record)| {
            parse_grant(holder, record).map(|mut grant| {
                grant.mode = mode;
                grant
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    holders.sort_by_key(|grant| grant.slot);
    let permits_in_use = holders.iter().map(|grant| grant.permits).sum();
    Ok(LockState {
        now_ms,
        limit,
        waiters,
        holders,
        mode,
        permits_in_use,
    })
}
