//! Connect errors: a gRPC code (the service's one table of engine error
//! kinds decides it for everything the service answers) sent as
//! `{"code":"resource_exhausted","message":"…"}` with the HTTP status of
//! the Connect protocol, which is google.rpc.Code's: the same table
//! (`service/errors.rs`'s `http_status`) gives both.

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use tonic::Code;

use crate::service::errors::http_status;

/// A Connect error: its code and a message naming the cause.
#[derive(Clone, Debug)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

/// The body of a Connect error (also the `error` of a stream's end).
#[derive(Serialize)]
pub struct ErrorJson<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_argument(message: impl Into<String>) -> Self {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ConnectError::new(Code::Internal, message)
    }

    /// Connect's name of the code: gRPC's in lower case, but `canceled`.
    pub fn code_name(&self) -> &'static str {
        connect_code(self.code)
    }

    pub fn json(&self) -> ErrorJson<'_> {
        ErrorJson {
            code: self.code_name(),
            message: &self.message,
        }
    }

    /// The unary answer: the status Connect gives the code, the JSON body.
    pub fn into_response(self) -> http::Response<tonic::body::Body> {
        let (status, _) = http_status(self.code);
        let body = serde_json::to_vec(&self.json()).unwrap_or_default();
        let mut response = http::Response::new(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from(body),
        )));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    /// 415 for a content type Connect does not know here (`got`: the
    /// request's, if any), with a plain-text line naming what is expected
    /// (not JSON: the client may not read JSON at all).
    pub fn unsupported_media_type(got: Option<&str>) -> http::Response<tonic::body::Body> {
        let got = match got {
            Some(got) => format!("content-type {got:?} is not one tumbler answers here"),
            None => "the request has no content-type".to_owned(),
        };
        let line = format!(
            "{got}: send Connect calls as content-type application/json (or \
             application/proto), gRPC as application/grpc, gRPC-Web as application/grpc-web\n"
        );
        let mut response = http::Response::new(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from(line),
        )));
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response.headers_mut().insert(
            "accept-post",
            HeaderValue::from_static(
                "application/json, application/proto, application/grpc, application/grpc-web",
            ),
        );
        response
    }
}

impl From<tonic::Status> for ConnectError {
    fn from(status: tonic::Status) -> Self {
        ConnectError::new(status.code(), status.message())
    }
}

/// Connect's code names: the one table's.
fn connect_code(code: Code) -> &'static str {
    http_status(code).1
}
