//! Typed errors: one enum, matched on its variants, never on message text.

use std::time::Duration;

/// Why an acquire ended without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAcquiredReason {
    /// A try-once request (no wait) found every permit taken, or fair
    /// waiters ahead of it.
    Busy,
    /// The wait (or the call's deadline) ended without a grant.
    Timeout,
}

/// Everything a call of this crate can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not granted: every permit is taken ([`NotAcquiredReason::Busy`])
    /// or the wait ran out ([`NotAcquiredReason::Timeout`]). Not a failure of
    /// the service: the server answered.
    #[error("{name}: not acquired ({reason:?}, {holders} holder(s))")]
    NotAcquired {
        /// The lock's name.
        name: String,
        /// Busy or timeout.
        reason: NotAcquiredReason,
        /// Holders when the server answered (0 when the deadline cut the call).
        holders: u32,
        /// The last queue position of a wait that timed out (0 if none).
        queue_position: u32,
    },
    /// The grant is gone: the server answered NOT_HELD to a renewal
    /// (expired, reaped, cleared, force-released), or renewals failed until
    /// the lease ran out. Stop relying on the lock: another holder may
    /// have it.
    #[error("{name}: lock lost by {holder} (token {fencing_token}): {reason}")]
    LockLost {
        /// The lock's name.
        name: String,
        /// The holder id of the grant.
        holder: String,
        /// The grant's fencing token.
        fencing_token: u64,
        /// Why: "not held", "renewals failed until the lease ran out (…)", or
        /// a session's `GrantLost` reason.
        reason: String,
    },
    /// The server refused the request's input; the message starts with the
    /// field it names (e.g. `priority: …`).
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The server's message: `<field>: <rule>`.
        message: String,
    },
    /// A missing, unknown or expired token, or one that may not act on
    /// this namespace (gRPC PERMISSION_DENIED or UNAUTHENTICATED).
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// The server's message.
        message: String,
    },
    /// The server, or its Redis, stayed unreachable until the call's
    /// deadline (retries included). Nothing was applied by the failed tries.
    #[error("unavailable: {message}")]
    Unavailable {
        /// The last failure's message.
        message: String,
    },
    /// The call was cancelled by its [`CancellationToken`](crate::CancellationToken),
    /// or a session's waiting acquire was stopped.
    #[error("cancelled")]
    Cancelled,
    /// A session's stream is over and could not be resumed (its TTL passed,
    /// the server refused the resume, or [`Session::close`](crate::Session::close) was called).
    #[error("session over: {reason}")]
    SessionOver {
        /// Why the session ended.
        reason: String,
    },
    /// A waiting acquire was refused because its wait would have closed a
    /// cycle in the namespace's wait-for graph (gRPC ABORTED whose message
    /// starts `deadlock: `): the holder holds a lock that another waiter,
    /// directly or along a chain, waits for. Nothing of the request stayed
    /// queued; release what the holder holds (or take locks in one global
    /// order) and try again.
    #[error("{message}")]
    Deadlock {
        /// The server's message, naming the cycle:
        /// `deadlock: holder "a" waits for lock "x" held by "b", …`.
        message: String,
    },
    /// Any other gRPC status (FAILED_PRECONDITION for a limit that differs
    /// from the lock's, RESOURCE_EXHAUSTED, …).
    #[error("{}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// The endpoint could not be parsed, or TLS could not be set up.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// An endpoint that is not a URI.
    #[error("invalid endpoint {0:?}")]
    InvalidEndpoint(String),
    /// A bearer token that cannot be sent as an HTTP header value.
    #[error("invalid token: not a valid header value")]
    InvalidToken,
}

impl Error {
    /// True for a wait refused as a deadlock ([`Error::Deadlock`]).
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Error::Deadlock { .. })
    }

    /// True for a try-once refusal ([`NotAcquiredReason::Busy`]).
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Error::NotAcquired {
                reason: NotAcquiredReason::Busy,
                ..
            }
        )
    }

    /// True for a wait that ended without a grant.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::NotAcquired {
                reason: NotAcquiredReason::Timeout,
                ..
            }
        )
    }

    /// The gRPC code the server (or the transport) answered, when the error
    /// came from one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::InvalidArgument { .. } => Some(tonic::Code::InvalidArgument),
            Error::PermissionDenied { .. } => Some(tonic::Code::PermissionDenied),
            Error::Unavailable { .. } => Some(tonic::Code::Unavailable),
            Error::Cancelled => Some(tonic::Code::Cancelled),
            Error::Deadlock { .. } => Some(tonic::Code::Aborted),
            Error::Status(status) => Some(status.code()),
            _ => None,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            tonic::Code::InvalidArgument => Error::InvalidArgument { message },
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
                Error::PermissionDenied { message }
            }
            tonic::Code::Unavailable => Error::Unavailable { message },
            tonic::Code::Unknown if cut_by_transport(&status) => Error::Unavailable { message },
            tonic::Code::Cancelled => Error::Cancelled,
            tonic::Code::Aborted if message.starts_with("deadlock: ") => {
                Error::Deadlock { message }
            }
            _ => Error::Status(status),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// UNAVAILABLE: the server was not reached or its Redis was down; nothing
/// was applied, so the same request may be sent again. Also a call cut by
/// its connection (the server died with the call in flight: tonic reports
/// UNKNOWN with the local transport error as its source, which a status
/// sent by a server never has): it may have been applied, and sending it
/// again is safe because every request this crate retries is idempotent
/// (the same holder, the same fencing token).
pub(crate) fn retryable(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable || cut_by_transport(status)
}

fn cut_by_transport(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unknown && std::error::Error::source(status).is_some()
}

/// The retry schedule for UNAVAILABLE: full jitter, `initial` doubling up to
/// `max`, until the call's deadline.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first delay's ceiling.
    pub initial: Duration,
    /// The largest delay's ceiling.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): a random duration
    /// up to `min(max, initial * 2^attempt)`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let random = uuid::Uuid::new_v4().as_u128() as u64;
        let nanos = ceiling.as_nanos() as u64;
        Duration::from_nanos(if nanos == 0 { 0 } else { random % (nanos + 1) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aborted_deadlock_is_its_own_variant_and_other_aborts_stay_statuses() {
        let message = r#"deadlock: holder "b" waits for lock "x" held by "a", "a" waits for lock "y" held by "b""#;
        let err = Error::from(tonic::Status::aborted(message));
        assert!(err.is_deadlock(), "{err:?}");
        assert_eq!(err.code(), Some(tonic::Code::Aborted));
        assert_eq!(err.to_string(), message);
        let moved = Error::from(tonic::Status::aborted(
            "this session was resumed on another stream",
        ));
        assert!(
            !moved.is_deadlock() && matches!(moved, Error::Status(_)),
            "{moved:?}"
        );
    }
}
