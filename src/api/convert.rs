//! Engine values across the gRPC boundary. Errors: the gRPC code of each
//! engine error kind is the one table ([`code`]; the dashboard turns these
//! codes into HTTP statuses), and [`describe`] is where Redis trouble is
//! logged and counted, once, whichever transport answers.

use tonic::{Code, Status};

use crate::engine::{EngineError, ErrorKind, LockId};

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
