//! The lock engine's face, below the engine (decision 0088): what the
//! handlers (`tumbler-service`) name of the engine, with nothing of Redis,
//! the store, the proto or a transport in its tree (`tests/repo/crates.rs`).
//! The engine (`tumbler-engine`) implements the traits and re-exports
//! every item here at its own paths; the handlers hold it as an
//! `Arc<dyn EngineFace>`.
//!
//! - [`names`]: validated values (`Namespace`, `Holder`, `Ttl`, …) and
//!   `Invalid`; `types.rs`: requests and outcomes;
//! - [`errors`]: [`EngineError`], its [`ErrorKind`] (the one error table's
//!   input) and [`StoreTrouble`], Redis trouble without the store's type;
//! - [`handles`]: one trait per capability handle ([`EngineFace`],
//!   [`LockFace`], [`SetFace`], [`SessionFace`], [`ElectionFace`],
//!   [`WalkFace`], [`WatchFace`], [`HealthFace`]);
//! - [`watchers`], [`sessions`], [`election`], [`changelog`]: what a
//!   Watch, a Session stream, an election and a changelog read are given;
//!   [`wallclock`]: this machine's clock, read in one place.

pub mod changelog;
pub mod election;
pub mod errors;
pub mod handles;
pub mod names;
pub mod sessions;
pub mod types;
pub mod wallclock;
pub mod watchers;

pub use errors::{EngineError, ErrorKind, StoreTrouble, TroubleKind};
pub use handles::{
    ElectionFace, EngineFace, HealthFace, LockFace, SessionFace, SetFace, StreamCalls, WalkFace,
    WatchFace,
};
pub use names::{Holder, Invalid, Kind, LockName, Namespace, Ttl};
pub use types::*;

/// The tumbler lock that makes one replica at a time the reaper.
pub const REAPER_NAMESPACE: &str = "tumbler-system";
pub const REAPER_LOCK: &str = "reaper";
