//! Engine values across the gRPC boundary. Errors: the gRPC code of each
//! engine error kind is the one table ([`code`]; the dashboard turns these
//! codes into HTTP statuses), and [`describe`] is where Redis trouble is
//! logged and counted, once, whichever transport answers.

use tonic::{Code, Status};

use crate::engine::{EngineError, ErrorKind};

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

/// An engine error's code and the message its caller sees. Redis trouble
/// is logged and counted here (`transport` names who answers); a reply
/// the engine could not read is not described to the caller.
pub fn describe(err: EngineError, transport: &'static str) -> (Code, String) {
    let kind = err.kind();
    let message = match (kind, err.store_detail()) {
        (ErrorKind::Unavailable, Some(detail)) => {
            tracing::warn!(%detail, transport, "redis unavailable");
            crate::observe::redis_error("unavailable");
            format!("lock store unavailable: {detail}")
        }
        (ErrorKind::Internal, Some(detail)) => {
            tracing::error!(%detail, transport, "unexpected redis reply");
            crate::observe::redis_error("protocol");
            "lock store answered unexpectedly".to_owned()
        }
        _ => err.to_string(),
    };
    (code(kind), message)
}

impl From<EngineError> for Status {
    fn from(err: EngineError) -> Status {
        let (code, message) = describe(err, "grpc");
        Status::new(code, message)
    }
}
