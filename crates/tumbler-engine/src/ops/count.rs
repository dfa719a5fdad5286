//! `lua/count.lua`: add a replica's counts to a namespace's per-minute
//! counters.

/// How many distinct 'kind|event' fields one minute of one namespace may
/// hold before further kinds count as 'other' (kinds are metrics labels).
pub const MAX_FIELDS: usize = 512;

/// The function's arguments: retention, the field cap, then the counts.
pub fn args(retention_ms: i64, counts: &[(String, u64)]) -> Vec<String> {
    let mut args = Vec::with_capacity(2 + 2 * counts.len());
    args.push(retention_ms.to_string());
    args.push(MAX_FIELDS.to_string());
    for (field, n) in counts {
        args.push(field.clone());
        args.push(n.to_string());
    }
    args
}
