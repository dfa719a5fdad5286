//! tumbler's handlers, over the engine's face (`tumbler-face`: its types
//! and traits; the server hands the engine over as an `Arc<dyn
//! EngineFace>`), never the engine, the store or Redis
//! (`tests/repo/crates.rs` checks the crate's tree; decision 0088): the lock
//! service between the proto and the engine, whatever the transport, and
//! the gRPC adapter over it ([`api`]), with bearer-token access
//! ([`auth`]) and the service's metrics and RPC spans ([`observe`]).
//!
//! The service is what every adapter (gRPC in [`api`]; Connect and the
//! dashboard's JSON and pages in the server package) shares, so that each of them only
//! translates its transport and none imports another (DESIGN invariant
//! 16: one answer whatever the transport).
//!
//! - [`validate`]: the input rules, each broken one an `Invalid` naming its
//!   field, and [`requests`]: one parse per request message into the
//!   engine's typed request, within the deployment's [`validate::Limits`];
//! - [`replies`]: one builder per outcome into its proto message;
//! - [`errors`]: the one error table (engine error → kind → gRPC code →
//!   HTTP status and Connect name);
//! - [`report`]: what an outcome reports (per-kind metrics, span
//!   attributes, debug lines with the key names the engine gives);
//! - [`watch`]: the one watch of a caller's access that every waiting
//!   call and stream keeps while it runs.

pub mod api;
pub mod auth;
pub mod errors;
pub mod observe;
pub mod replies;
pub mod report;
pub mod requests;
pub mod validate;
pub mod watch;

// The engine's face (its names, requests, outcomes, errors and traits;
// the engine itself is handed over as an `Arc<dyn EngineFace>`) and the
// proto, under the names the handlers use.
use tumbler_face as engine;
use tumbler_proto as proto;

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
