//! What callers meet at the door: auth, TLS on the ports, HTTP/2 edge cases and connection limits, slow bodies, the dashboard.
//!
//! One test binary per area (each file a module named as its tests were
//! before): the suite links a handful of binaries, not one per file.

#[path = "../common/mod.rs"]
pub mod common;

mod auth;
mod batch;
mod connect;
mod dashboard;
mod edge;
mod multi_attack;
mod origin;
mod revocation;
mod slow;
mod tls;
