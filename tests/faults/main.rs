//! Redis in trouble and in other shapes: outages (a stalled Redis is `tests/redis_slow.rs`), TLS to Redis, Cluster, Sentinel, chaos, maintenance, rolling restarts of tumbler.
//!
//! One test binary per area (each file a module named as its tests were
//! before): the suite links a handful of binaries, not one per file.

#[path = "../common/mod.rs"]
pub mod common;

mod chaos;
mod cluster;
mod group_commit;
mod maintenance;
mod multi_cluster;
mod multi_stall;
mod redis_outage;
mod redis_tls;
mod rolling_restart;
mod sentinel;
