//! The Rust client of [tumbler](https://github.com/tumbler/tumbler), a gRPC
//! lock service on Redis: mutexes, semaphores, fair queues and fenced
//! leases shared by services in any language.
//!
//! - [`Client`]: one endpoint and namespace, an optional bearer token and
//!   TLS; every call retried on UNAVAILABLE (a restart, a replica switch)
//!   until its deadline.
//! - [`Lock`]: a grant as a guard, released on drop, with its fencing
//!   token and a watchdog that renews the lease every third of it and
//!   rides out a server restart; [`Lock::lost`] resolves the moment the
//!   grant is known to be gone.
//! - Safe retries: the holder id is made by the client ([`new_holder`]),
//!   so a retried acquire is the same request (the server answers
//!   ALREADY_HELD with the same grant), never a second permit.
//! - Cancellation: dropping an acquire's future, or cancelling its
//!   [`CancellationToken`], takes the
//!   request out of the server's queue at once.
//! - Read/write locks: [`LockRequest::read`] / [`LockRequest::write`]
//!   ([`Mode`]), [`Lock::mode`], [`Lock::downgrade`].
//! - Multi-locks: [`Client::lock_all`] takes several locks or none; the
//!   [`LockSet`] guard has a fencing token per lock, is renewed by the
//!   same watchdog and released as one set.
//! - [`Session`]: grants renewed by the server while the client's stream
//!   lives, released at once when it closes, resumed on another replica
//!   with the same tokens when the stream breaks.
//! - [`Election`]: leader election (campaign, leader, observe); the
//!   [`Leadership`] guard carries the term (a fencing token), renews its
//!   lease like a [`Lock`], says when it is lost, and resigns on drop.
//! - [`Error`]: one typed enum.
//!
//! ```no_run
//! use std::time::Duration;
//! use tumbler_client::{Client, Error};
//!
//! # async fn run() -> Result<(), Error> {
//! let client = Client::builder("127.0.0.1:50051").namespace("billing").connect().await?;
//! match client.lock("invoices/42").wait(Duration::from_secs(5)).ttl(Duration::from_secs(3)).acquire().await {
//!     Ok(lock) => {
//!         println!("holding with fencing token {}", lock.fencing_token());
//!         // ... work; the watchdog keeps the lease alive ...
//!         lock.release().await?;
//!     }
//!     Err(e) if e.is_timeout() => println!("someone else has it"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod client;
mod election;
mod error;
mod lock;
mod multi;
mod session;

pub use client::{Bearer, Client, ClientBuilder, Stub};
pub use election::{Election, Leadership};
pub use error::{Backoff, Error, NotAcquiredReason, Result};
pub use lock::{Lock, LockRequest, Mode, new_holder};
pub use multi::{LockSet, LockSetRequest};
pub use session::{Session, SessionBuilder, SessionEvent, SessionGrant, SessionId};
pub use tokio_util::sync::CancellationToken;
pub use tonic::transport::{Certificate, ClientTlsConfig, Identity};
/// The generated types of the API (`tumbler.v1`), for the raw [`Stub`].
pub use tumbler_proto as proto;
