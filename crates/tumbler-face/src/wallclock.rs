//! This machine's wall clock in Unix milliseconds: the one place it is
//! read. Lock times themselves come from Redis' clock (see
//! the engine's `clock.rs`, which corrects this one by the offset it observes);
//! this is for what has no Redis answer at hand (a metrics range).

/// Milliseconds since the Unix epoch on this machine's clock (0 for a
/// clock set before 1970).
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
