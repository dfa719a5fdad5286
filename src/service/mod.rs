//! The lock service between the proto and the engine, whatever the
//! transport: what every adapter (gRPC in `api`, Connect in `connect`, the
//! dashboard's JSON and pages) shares, so that each of them only
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

pub mod errors;
pub mod replies;
pub mod report;
pub mod requests;
pub mod validate;
pub mod watch;
