//! `lua/blockers.lua`: a bounded look at a lock's live grants for a
//! deadlock check (decision 0081), in inspect's shape.

use redis::Value;

use crate::LockState;
use crate::store::StoreError;

/// Grants a check reads, at most, and the lock's fields it scans for them.
pub const MOST_GRANTS: u32 = 64;
pub const MOST_FIELDS: u32 = 256;

pub fn args(holder: &str) -> Vec<String> {
    vec![
        holder.to_owned(),
        MOST_GRANTS.to_string(),
        MOST_FIELDS.to_string(),
    ]
}

/// The grants found (not every grant of a big lock), with the lock's
/// limit and mode; `waiters` is not counted (0).
pub fn parse(value: Value) -> Result<LockState, StoreError> {
    super::inspect::parse(value)
}
