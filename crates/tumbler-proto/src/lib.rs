//! Generated gRPC code for tumbler's API, package `tumbler.v1` (see
//! `proto/tumbler/v1/lock.proto` in the repository): the messages, the
//! `LockService` client and server, and the encoded descriptor set that
//! the server's reflection serves. Every message also implements serde's
//! `Serialize` and `Deserialize` with the proto3 JSON mapping (pbjson).
//!
//! Most Rust programs want the `tumbler-client` crate, which adds lock
//! guards, a lease watchdog, sessions and typed errors on top of these.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tumbler_proto::{AcquireRequest, lock_service_client::LockServiceClient};
//!
//! let mut client = LockServiceClient::connect("http://127.0.0.1:50051").await?;
//! let reply = client
//!     .acquire(AcquireRequest { name: "reports".into(), ttl_ms: Some(30_000), ..Default::default() })
//!     .await?
//!     .into_inner();
//! println!("token {:?}", reply.grant.map(|g| g.fencing_token));
//! # Ok(()) }
//! ```
#![allow(
    clippy::all,
    missing_docs,
    rustdoc::bare_urls,
    rustdoc::invalid_html_tags
)]

tonic::include_proto!("tumbler.v1");
// The proto3 JSON mapping (lowerCamel names, enums by name, 64-bit
// integers as strings) of every message above, as serde impls.
include!(concat!(env!("OUT_DIR"), "/tumbler.v1.serde.rs"));

pub mod metadata;
#[cfg(feature = "tokens")]
pub mod tokens;

/// The encoded descriptors of `proto/`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tumbler_descriptor.bin"));
