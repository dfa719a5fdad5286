//! tumbler: a gRPC lock service that fronts Redis. Mutexes, semaphores and
//! fenced leases for services written in any language.
//!
//! Layers, top to bottom: the adapters ([`api`], gRPC, and [`service`],
//! the transport-neutral layer under every adapter, in the crate
//! `tumbler-service`; [`connect`] and [`dashboard`] here) → the engine's
//! face (its types and traits; the crate `tumbler-face`) → the engine
//! (lock semantics: one Redis function per operation in one library built
//! from `lua/`, key layout; the crate `tumbler-engine`) → the store
//! (pooled Redis connections; the crate `tumbler-store`). Each lower layer
//! is a crate, so none can name what is above it, and the handlers'
//! crate has no engine, store or Redis in its tree: it is handed the
//! engine as an `Arc<dyn EngineFace>`. This package keeps the wiring
//! ([`server`]: the engine built and handed over), the flags, TLS,
//! connection limits and the HTTP port;
//! [`dev`] runs a private redis-server for `tumbler dev` and the tests.

pub mod config;
pub mod connect;
pub mod dashboard;
pub mod dev;
pub mod http;
pub mod limits;
pub mod origin;
pub mod proto;
pub mod server;
pub mod telemetry;
pub mod tls;
/// The handlers (`crates/tumbler-service`): the service layer, the gRPC
/// adapter, bearer-token access and the service's metrics.
pub use tumbler_service::{self as service, api, auth, observe};
