//! How the dashboard fails: [`ApiError`] (a status, a code and a message,
//! sent as Connect's error JSON, `{"code": "invalid_argument", "message":
//! "..."}`, the one error dialect of the project). Its status and code
//! name come from the service's one table (`service/errors.rs`: engine
//! error kind → gRPC code → HTTP status and Connect name), so a full queue
//! is 429 here as it is RESOURCE_EXHAUSTED over gRPC, Redis trouble 503, a
//! reply the engine cannot read 500: never 400 for an internal error.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::service::errors::{describe, http_status};
use tumbler_engine::EngineError;

/// An endpoint's failure: a status and a message, as JSON.
#[derive(Clone, Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
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
impl From<tumbler_engine::Invalid> for ApiError {
    fn from(invalid: tumbler_engine::Invalid) -> Self {
        ApiError::bad_request(invalid.to_string())
    }
}

/// Redis trouble is logged and counted as the gRPC handlers do; a reply
/// the engine cannot read is not described to the caller.
impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        let (code, message) = describe(err, "dashboard", None);
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
