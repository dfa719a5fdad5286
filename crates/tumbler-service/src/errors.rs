//! The one error table, for every transport: an engine error's kind
//! ([`EngineError::kind`]) → its gRPC code ([`code`]) → the HTTP status
//! and Connect code name of that code ([`http_status`], google.rpc.Code's
//! HTTP mapping, which is also the Connect protocol's). gRPC answers the
//! code, Connect and the dashboard the status and the name, so a full
//! queue is RESOURCE_EXHAUSTED there and 429 `resource_exhausted` here,
//! Redis trouble 503, a reply the engine cannot read 500: never 400 for an
//! internal error. [`describe`] is where Redis trouble is logged and
//! counted, once, whichever transport answers; [`invalid`] is a broken
//! request rule.

use http::StatusCode;
use tonic::{Code, Status};

use crate::engine::{self, EngineError, ErrorKind, LockId};

/// A broken request rule: INVALID_ARGUMENT, naming the field.
pub fn invalid(invalid: engine::Invalid) -> Status {
    Status::invalid_argument(invalid.to_string())
}

/// The gRPC code of an engine error kind.
pub fn code(kind: ErrorKind) -> Code {
    match kind {
        // Nothing was granted: retry later or on another replica.
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::Exhausted => Code::ResourceExhausted,
        ErrorKind::Conflict => Code::FailedPrecondition,
        ErrorKind::Moved => Code::Aborted,
        ErrorKind::Stopped => Code::Cancelled,
        // The wait would close a wait-for cycle (decision 0077): refused
        // at once, the message names the cycle; retry after letting go.
        ErrorKind::Deadlock => Code::Aborted,
        // An election's grant acted on without its secret (decision 0082).
        ErrorKind::NotYours => Code::PermissionDenied,
    }
}

/// A gRPC code's HTTP status (google.rpc.Code's HTTP mapping, which is
/// also Connect's) and its name in Connect's error JSON (gRPC's in lower
/// case, but `canceled`).
pub fn http_status(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::Ok => (StatusCode::OK, "ok"),
        Code::Cancelled => (client_closed(), "canceled"),
        Code::Unknown => (StatusCode::INTERNAL_SERVER_ERROR, "unknown"),
        Code::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_argument"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded"),
        Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        Code::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
        Code::FailedPrecondition => (StatusCode::BAD_REQUEST, "failed_precondition"),
        Code::Aborted => (StatusCode::CONFLICT, "aborted"),
        Code::OutOfRange => (StatusCode::BAD_REQUEST, "out_of_range"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "unimplemented"),
        Code::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Code::DataLoss => (StatusCode::INTERNAL_SERVER_ERROR, "data_loss"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
    }
}

/// 499 Client Closed Request (nginx's; google.rpc.Code's for CANCELLED).
fn client_closed() -> StatusCode {
    StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
}

/// The gRPC code of an engine error: its kind's.
pub fn engine_code(err: &EngineError) -> Code {
    code(err.kind())
}

/// The HTTP status of an engine error: its code's.
pub fn engine_error_status(err: &EngineError) -> StatusCode {
    http_status(engine_code(err)).0
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

/// The gRPC status of an engine error outside a lock operation.
pub fn status(err: EngineError) -> Status {
    status_of(err, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are gRPC's, lower case (Connect spells `canceled`), and
    /// the statuses are Connect's (google.rpc.Code's) for every code.
    #[test]
    fn names_and_statuses_are_connects() {
        for i in 1..=16 {
            let code = Code::from_i32(i);
            let grpc_name = format!("{code:?}");
            let name = http_status(code).1;
            assert!(
                name.replace('_', "") == grpc_name.to_ascii_lowercase()
                    || (name, code) == ("canceled", Code::Cancelled)
            );
        }
        let status = |code| http_status(code).0.as_u16();
        assert_eq!(
            [
                Code::Cancelled,
                Code::InvalidArgument,
                Code::DeadlineExceeded,
                Code::ResourceExhausted,
                Code::FailedPrecondition,
                Code::Unimplemented,
                Code::Unavailable,
                Code::Unauthenticated,
                Code::PermissionDenied
            ]
            .map(status),
            [499, 400, 504, 429, 400, 501, 503, 401, 403]
        );
    }

    #[test]
    fn internal_errors_are_never_400() {
        for code in [Code::Internal, Code::Unknown, Code::DataLoss] {
            assert_eq!(http_status(code).0, StatusCode::INTERNAL_SERVER_ERROR);
        }
        let full = EngineError::QueueFull(3);
        assert_eq!(engine_error_status(&full), StatusCode::TOO_MANY_REQUESTS);
    }
}
