//! How the dashboard fails: [`ApiError`] (a status, a code and a message,
//! sent as Connect's error JSON, `{"code": "invalid_argument", "message":
//! "..."}`, the one error dialect of the project), and the one table from
//! gRPC codes to HTTP statuses and Connect's code names ([`http_status`])
//! that every refusal over HTTP, dashboard or Connect, goes through. Engine errors take the gRPC API's code first
//! ([`engine_code`]: `api::convert`'s table of engine error kinds), so a full
//! queue is 429 here as it is RESOURCE_EXHAUSTED there, Redis trouble 503,
//! a reply the engine cannot read 500: never 400 for an internal error.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::engine::EngineError;

/// An endpoint's failure: a status and a message, as JSON.
#[derive(Clone, Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
}

/// The one table: a gRPC code, its HTTP status (google.rpc.Code's HTTP
/// mapping, which is also Connect's) and its name in Connect's error JSON
/// (gRPC's in lower case, but `canceled`).
pub fn http_status(code: tonic::Code) -> (StatusCode, &'static str) {
    use tonic::Code;
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

/// The gRPC code of an engine error: the gRPC API's own table
/// (`api::convert::code`).
pub fn engine_code(err: &EngineError) -> tonic::Code {
    crate::api::convert::code(err.kind())
}

/// The HTTP status the dashboard answers for an engine error.
pub fn engine_error_status(err: &EngineError) -> StatusCode {
    http_status(engine_code(err)).0
}

impl ApiError {
    fn new(code: tonic::Code, message: impl Into<String>) -> Self {
        let (status, code) = http_status(code);
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(tonic::Code::InvalidArgument, message)
    }

    pub(super) fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(tonic::Code::PermissionDenied, message)
    }

    pub(super) fn admin_off() -> Self {
        ApiError::forbidden(ADMIN_OFF)
    }

    pub(super) fn cross_site() -> Self {
        ApiError::forbidden("cross-site requests are refused")
    }

    /// No valid token: one fixed message, whatever was wrong with it.
    pub(super) fn unauthenticated() -> Self {
        ApiError::new(tonic::Code::Unauthenticated, UNAUTHENTICATED)
    }
}

const ADMIN_OFF: &str = "admin actions are off: start tumbler with --dashboard-admin \
     (TUMBLER_DASHBOARD_ADMIN=true) to enable them";

const UNAUTHENTICATED: &str = "authentication required: send a valid token as \
     `authorization: Bearer <token>`, or log in at /dashboard/login";

/// The gRPC API's refusals keep their meaning and their message (a
/// validation failure is a 400, a namespace or role the token lacks a 403,
/// a token over its request rate a 429); an unauthenticated caller gets
/// the one fixed message.
impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        match status.code() {
            tonic::Code::Unauthenticated => ApiError::unauthenticated(),
            code => ApiError::new(code, status.message()),
        }
    }
}

/// A broken request rule: 400, naming the field.
impl From<crate::engine::Invalid> for ApiError {
    fn from(invalid: crate::engine::Invalid) -> Self {
        ApiError::bad_request(invalid.to_string())
    }
}

/// Redis trouble is logged and counted as the gRPC handlers do; a reply
/// the engine cannot read is not described to the caller.
impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        let (code, message) = crate::api::convert::describe(err, "dashboard", None);
        ApiError::new(code, message)
    }
}

/// The body of every JSON error: Connect's.
#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code,
            message: &self.message,
        };
        (self.status, no_store(), Json(body)).into_response()
    }
}

pub(super) type ApiResult<T = Response> = Result<T, ApiError>;

/// Dashboard answers are never cached.
pub(super) fn no_store() -> [(header::HeaderName, &'static str); 1] {
    [(header::CACHE_CONTROL, "no-store")]
}

/// A JSON answer from a view type.
pub(super) fn json_reply<T: Serialize>(value: T) -> ApiResult {
    Ok((no_store(), Json(value)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_are_never_400() {
        for code in [
            tonic::Code::Internal,
            tonic::Code::Unknown,
            tonic::Code::DataLoss,
        ] {
            assert_eq!(http_status(code).0, StatusCode::INTERNAL_SERVER_ERROR);
        }
        let err = ApiError::from(tonic::Status::internal("boom"));
        assert_eq!(
            (err.status, err.code),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
        let full = ApiError::from(EngineError::QueueFull(3));
        assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.code, "resource_exhausted");
    }
}
