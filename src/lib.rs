//! tumbler: a gRPC lock service that fronts Redis. Mutexes, semaphores and
//! fenced leases for services written in any language.
//!
//! Layers, top to bottom: [`api`] (gRPC handlers: validate, call the
//! engine, map the outcome) → [`engine`] (lock semantics: one Redis
//! function per operation in one library built from `lua/`, key layout)
//! → [`store`] (pooled Redis connections).
//! [`server`] wires them with health and reflection; [`dev`] runs a private
//! redis-server for `tumbler dev` and the tests.

pub mod api;
pub mod auth;
pub mod config;
pub mod connect;
pub mod dashboard;
pub mod dev;
pub mod engine;
pub mod http;
pub mod limits;
pub mod observe;
pub mod proto;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod wallclock;

/// The store layer is its own crate (`crates/tumbler-store`): it cannot
/// name the engine or anything above it.
pub use tumbler_store as store;

/// Settings the in-crate property tests share.
#[cfg(test)]
mod test_support {
    /// 2,000 cases, no regression files written.
    pub fn proptest_config() -> proptest::prelude::ProptestConfig {
        proptest::prelude::ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..Default::default()
        }
    }
}
