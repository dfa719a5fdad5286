//! Engine values across the gRPC boundary: outcomes, grants, metrics rows
//! and lock events into their proto messages (one `From` each), and
//! errors. Errors: the gRPC code of each
//! engine error kind is the one table ([`code`]; the dashboard turns these
//! codes into HTTP statuses), and [`describe`] is where Redis trouble is
//! logged and counted, once, whichever transport answers.

use tonic::{Code, Status};

use crate::engine::{self, AcquireOutcome, EngineError, ErrorKind, LockId};
use crate::proto::{self, AcquireStatus, NotAcquiredReason};

/// The gRPC code of an engine error kind.
pub fn code(kind: ErrorKind) -> Code {
    match kind {
        // Nothing was granted: retry later or on another replica.
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::Exhausted => Code::ResourceExhausted,
        ErrorKind::Conflict => Code::FailedPrecondition,
        ErrorKind::Moved => Code::Aborted,
    }
}

/// The lock operation a failure happened in, for its log line.
pub struct LockAt<'a> {
    pub rpc: &'static str,
    pub lock: &'a LockId,
    pub holder: &'a str,
}

/// An engine error's code and the message its caller sees. Redis trouble
/// is logged (with the lock operation, when there is one) and counted
/// here (`transport` names who answers); a reply the engine could not
/// read is not described to the caller.
pub fn describe(
    err: EngineError,
    transport: &'static str,
    at: Option<LockAt<'_>>,
) -> (Code, String) {
    let kind = err.kind();
    let rpc = at.as_ref().map(|at| at.rpc);
    let namespace = at.as_ref().map(|at| at.lock.namespace.as_str());
    let lock_name = at.as_ref().map(|at| at.lock.name.as_str());
    let holder = at.as_ref().map(|at| at.holder);
    let message = match (kind, err.store_detail()) {
        (ErrorKind::Unavailable, Some(detail)) => {
            tracing::warn!(%detail, transport, rpc, namespace, lock_name, holder, "redis unavailable");
            crate::observe::redis_error("unavailable");
            format!("lock store unavailable: {detail}")
        }
        (ErrorKind::Internal, Some(detail)) => {
            tracing::error!(%detail, transport, rpc, namespace, lock_name, holder, "unexpected redis reply");
            crate::observe::redis_error("protocol");
            "lock store answered unexpectedly".to_owned()
        }
        _ => err.to_string(),
    };
    (code(kind), message)
}

/// The gRPC status of an engine error in a lock operation.
pub fn status_of(err: EngineError, at: Option<LockAt<'_>>) -> Status {
    let (code, message) = describe(err, "grpc", at);
    Status::new(code, message)
}

impl From<EngineError> for Status {
    fn from(err: EngineError) -> Status {
        status_of(err, None)
    }
}

impl From<engine::MetricsRow> for proto::MetricsRow {
    fn from(row: engine::MetricsRow) -> Self {
        let c = row.counters;
        proto::MetricsRow {
            minute_ms: row.minute_ms,
            kind: row.kind,
            acquired: c.acquired,
            denied: c.denied,
            timed_out: c.timed_out,
            released: c.released,
            extended: c.extended,
            expired: c.expired,
            reaped: c.reaped,
            errors: c.errors,
            cleared: c.cleared,
        }
    }
}

impl From<AcquireOutcome> for proto::AcquireResponse {
    fn from(outcome: AcquireOutcome) -> Self {
        match outcome {
            AcquireOutcome::Acquired { grant, holders } => proto::AcquireResponse {
                status: AcquireStatus::Acquired.into(),
                grant: Some(grant.into()),
                holders,
                ..Default::default()
            },
            AcquireOutcome::AlreadyHeld { grant, holders } => proto::AcquireResponse {
                status: AcquireStatus::AlreadyHeld.into(),
                grant: Some(grant.into()),
                holders,
                ..Default::default()
            },
            AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms,
            } => proto::AcquireResponse {
                status: AcquireStatus::NotAcquired.into(),
                reason: NotAcquiredReason::Busy.into(),
                holders,
                next_expiry_at_ms,
                ..Default::default()
            },
            AcquireOutcome::TimedOut {
                holders,
                next_expiry_at_ms,
                position,
            } => proto::AcquireResponse {
                status: AcquireStatus::NotAcquired.into(),
                reason: NotAcquiredReason::Timeout.into(),
                holders,
                next_expiry_at_ms,
                queue_position: position,
                ..Default::default()
            },
        }
    }
}

impl From<engine::Grant> for proto::Grant {
    fn from(grant: engine::Grant) -> Self {
        proto::Grant {
            holder: grant.holder,
            fencing_token: grant.fencing_token,
            slot: grant.slot,
            acquired_at_ms: grant.acquired_at_ms,
            expires_at_ms: grant.expires_at_ms,
            ttl_ms: grant.ttl_ms,
            kind: grant.kind,
            metadata: grant.metadata.into_iter().collect(),
        }
    }
}

impl From<engine::watchers::LockEvent> for proto::LockEvent {
    fn from(e: engine::watchers::LockEvent) -> Self {
        proto::LockEvent {
            namespace: e.namespace,
            name: e.name,
            event: e.event,
            holder: e.holder,
            fencing_token: e.fencing_token,
            at_ms: e.at_ms,
            slot: e.slot,
            kind: e.kind,
            metadata: e.metadata.into_iter().collect(),
            ttl_ms: e.ttl_ms,
            expires_at_ms: e.expires_at_ms,
            acquired_at_ms: e.acquired_at_ms,
            hold_ms: e.hold_ms,
            actor: e.actor,
        }
    }
}
