//! What a session's stream is told and tells the engine (the engine's
//! `resume.rs` keeps the records, `sessions.rs` and `renewer.rs` the
//! grants): a new session's ticket, a resumed one, why a resume was
//! refused, how a stream ended, a grant the session lost and why, and
//! what a touch of the record found.

use std::time::Duration;

use crate::{EngineError, LockId};

/// A grant of a session that is gone, as the session's client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostGrant {
    pub lock: LockId,
    pub fencing_token: u64,
    pub reason: &'static str,
}

/// Why a grant could not be renewed.
pub const LOST_NOT_HELD: &str = "not held";
pub const LOST_UNAVAILABLE: &str = "redis unavailable";
/// The server ended the session (silent client, revoked token, oversized
/// command, shutdown) and released the grant.
pub const LOST_SESSION_ENDED: &str = "session ended";
/// Another stream resumed the session and holds the grant now: this
/// stream may no longer act on it (the grant itself lives on).
pub const LOST_MOVED: &str = "resumed elsewhere";
/// The session's record vanished from Redis (data lost): its grants went
/// with it.
pub const LOST_SESSION_GONE: &str = "session gone from redis";
/// Another lock of the grant's multi-lock set was lost: the grant is
/// released too, so no part of a broken set is kept (decision 0078).
pub const LOST_SET_BROKEN: &str = "set broken";

/// How long the grants of a session whose stream broke wait for a resume
/// before they are released as a dead client's. Short, so a client whose
/// process died frees its locks within a second, and long enough for a
/// client whose connection a proxy dropped to reconnect and resume.
pub const RESUME_GRACE: Duration = Duration::from_millis(500);

/// The reason given for a grant a resumed session may no longer renew
/// (its token lost the namespace).
pub const LOST_NOT_PERMITTED: &str = "not permitted";

/// A new session: its id (the holder of its grants), its resume secret
/// (told to the client once), and the epoch of the stream that serves it.
#[derive(Debug)]
pub struct SessionTicket {
    pub id: String,
    pub secret: String,
    pub epoch: u64,
}

/// A session taken back by a new stream.
#[derive(Debug)]
pub struct Resumed {
    pub epoch: u64,
    pub ttl_ms: u64,
    /// Grants kept (lock, fencing token), renewed by this replica now.
    pub kept: Vec<(LockId, u64)>,
    /// Grants that were gone, or may no longer be renewed.
    pub lost: Vec<LostGrant>,
}

/// Why a resume was refused (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("no such session: it was closed, or its TTL passed")]
    Gone,
    #[error("wrong resume secret, or a session of another token")]
    Refused,
    #[error("another stream resumed the session at the same time")]
    Moved,
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// How a session's stream ended, for its grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// Release the grants (closed by the client, or refused by the server).
    Release,
    /// A dead client: release (or leave for the lock-delay).
    Died,
    /// Keep the grants for the session TTL, resumable elsewhere.
    Keep,
}

/// What `session_touch` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// The calling stream still serves the session (kept alive).
    Ours,
    /// Another stream resumed it.
    Moved,
    /// The record is gone (Redis lost its data, or it was cleared).
    Gone,
}
