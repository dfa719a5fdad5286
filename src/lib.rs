//! tumbler: a gRPC lock service that fronts Redis. Mutexes, semaphores and
//! fenced leases for services written in any language.
//!
//! Layers, top to bottom: [`api`] (gRPC handlers: validate, call the
//! engine, map the outcome) → [`engine`] (lock semantics: one Redis
//! function per operation in one library built from `lua/`, key layout;
//! the crate `tumbler-engine`) → [`store`] (pooled Redis connections; the
//! crate `tumbler-store`). Each of the two lower layers is a crate, so
//! neither can name what is above it.
//! [`server`] wires them with health and reflection; [`dev`] runs a private
//! redis-server for `tumbler dev` and the tests.

pub mod api;
pub mod auth;
pub mod config;
pub mod connect;
pub mod dashboard;
pub mod dev;
pub mod http;
pub mod limits;
pub mod observe;
pub mod origin;
pub mod proto;
pub mod server;
pub mod service;
pub mod telemetry;
pub mod tls;
/// The engine layer (`crates/tumbler-engine`): no gRPC, no web.
pub use tumbler_engine as engine;
pub use tumbler_engine::wallclock;
/// The store layer (`crates/tumbler-store`): connections, no locks.
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
