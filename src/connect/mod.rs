//! The Connect protocol on the gRPC port: a transport that validates,
//! maps errors and traces, and nothing else. A Connect request
//! (`POST /tumbler.v1.LockService/<Method>`, `application/json` or
//! `application/proto`; Watch as `application/connect+json|proto`) is
//! turned into the gRPC request it stands for — its JSON into protobuf,
//! `Connect-Timeout-Ms` into `grpc-timeout`, its headers (the bearer token,
//! trace context) and the connection's extensions (client address,
//! connection state) kept — and sent through the same stack a gRPC call
//! goes through: the RPC layer (metrics, span, deadline), the auth
//! interceptor, the lock service's handlers. Their answer comes back as
//! Connect: the message as JSON or protobuf, a gRPC status as a Connect
//! error. `application/grpc*` requests pass straight on to tonic (and
//! `tonic-web` for gRPC-Web, further in).

mod errors;
mod json;
mod routes;
mod stream;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use tonic::Code;
use tower::ServiceExt;

pub use errors::ConnectError;
use routes::{Kind, Procedure};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Request = http::Request<tonic::body::Body>;
type Response = http::Response<tonic::body::Body>;

/// Serves Connect in front of the gRPC stack it wraps.
#[derive(Clone, Copy, Debug)]
pub struct ConnectLayer {
    /// The largest request body read, as gRPC's largest message
    /// (`--max-request-bytes`).
    pub max_request_bytes: usize,
}

impl<S> tower::Layer<S> for ConnectLayer {
    type Service = Connect<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Connect {
            inner,
            max_request_bytes: self.max_request_bytes,
        }
    }
}

/// See [`ConnectLayer`].
#[derive(Clone, Debug)]
pub struct Connect<S> {
    inner: S,
    max_request_bytes: usize,
}

impl<S, R> tower::Service<Request> for Connect<S>
where
    S: tower::Service<Request, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if content_type(request.headers()).starts_with("application/grpc") {
            let answer = self.inner.call(request);
            return Box::pin(async move { Ok(answer.await?.map(tonic::body::Body::new)) });
        }
        // The ready service answers this request; a clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.max_request_bytes;
        Box::pin(async move { Ok(serve(inner, request, limit).await) })
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
}

/// The codec a content type asks for, for a procedure of `kind`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Codec {
    Json,
    Proto,
}

fn codec(headers: &HeaderMap, kind: Kind) -> Option<Codec> {
    let value = content_type(headers).to_ascii_lowercase();
    let (media, params) = value.split_once(';').unwrap_or((&value, ""));
    let charset_ok = params.trim().is_empty() || params.trim() == "charset=utf-8";
    let codec = match (kind, media.trim()) {
        (Kind::Unary, "application/json") if charset_ok => Codec::Json,
        (Kind::Unary, "application/proto") => Codec::Proto,
        (Kind::ServerStreaming, "application/connect+json") if charset_ok => Codec::Json,
        (Kind::ServerStreaming, "application/connect+proto") => Codec::Proto,
        _ => return None,
    };
    Some(codec)
}

/// One Connect call, answered whatever happens.
async fn serve<S, R>(inner: S, request: Request, limit: usize) -> Response
where
    S: tower::Service<Request, Response = http::Response<R>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let path = request.uri().path();
    let Some(procedure) = routes::find(path) else {
        let message = match path.strip_prefix(routes::SERVICE_PREFIX) {
            Some("Session") => "Session is bidirectional streaming: gRPC only".to_owned(),
            _ => format!("no Connect procedure {path}"),
        };
        let mut response = ConnectError::new(Code::Unimplemented, message).into_response();
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    };
    if request.method() != Method::POST {
        let mut response =
            ConnectError::new(Code::Unimplemented, "Connect calls here are POST").into_response();
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let Some(codec) = codec(request.headers(), procedure.kind) else {
        let got = request.headers().get(header::CONTENT_TYPE);
        return ConnectError::unsupported_media_type(got.and_then(|v| v.to_str().ok()));
    };
    let answer = async {
        let grpc = grpc_request(procedure, codec, request, limit).await?;
        let response = inner
            .oneshot(grpc)
            .await
            .map_err(|e| ConnectError::internal(e.into().to_string()))?;
        match procedure.kind {
            Kind::Unary => unary_response(procedure, codec, response).await,
            Kind::ServerStreaming => Ok(stream::response(procedure, codec, response)),
        }
    };
    match answer.await {
        Ok(response) => response,
        Err(err) if procedure.kind == Kind::ServerStreaming => stream::failed(codec, &err),
        Err(err) => err.into_response(),
    }
}

/// Headers that belong to the HTTP exchange or to Connect itself, not to
/// the gRPC call's metadata.
const NOT_METADATA: [&str; 11] = [
    "content-type",
    "content-length",
    "content-encoding",
    "accept-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "host",
    "expect",
];

/// The gRPC request a Connect request stands for.
async fn grpc_request(
    procedure: &Procedure,
    codec: Codec,
    request: Request,
    limit: usize,
) -> Result<Request, ConnectError> {
    let (parts, body) = request.into_parts();
    for name in ["content-encoding", "connect-content-encoding"] {
        if let Some(encoding) = parts.headers.get(name)
            && encoding != "identity"
        {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!("{name} {encoding:?} is not supported: send bodies uncompressed"),
            ));
        }
    }
    let timeout = match parts.headers.get("connect-timeout-ms") {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .filter(|v| (1..=10).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    ConnectError::invalid_argument(
                        "Connect-Timeout-Ms: expected 1 to 10 digits (milliseconds)",
                    )
                })?,
        ),
        None => None,
    };
    let body = read_body(body, limit).await?;
    let message = match procedure.kind {
        Kind::Unary => body,
        Kind::ServerStreaming => stream::request_message(body)?,
    };
    let message = match codec {
        Codec::Json => Bytes::from((procedure.request_from_json)(&message)?),
        Codec::Proto => message,
    };
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).map_err(|_| too_large(limit))?);
    frame.put_slice(&message);

    let mut headers = HeaderMap::with_capacity(parts.headers.len() + 3);
    for (name, value) in &parts.headers {
        let name_str = name.as_str();
        if !NOT_METADATA.contains(&name_str) && !name_str.starts_with("connect-") {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    if let Some(ms) = timeout
        && let Ok(value) = HeaderValue::from_str(&format!("{ms}m"))
    {
        headers.insert("grpc-timeout", value);
    }
    let mut grpc = http::Request::new(tonic::body::Body::new(http_body_util::Full::new(
        frame.freeze(),
    )));
    *grpc.method_mut() = Method::POST;
    *grpc.uri_mut() = parts.uri;
    *grpc.version_mut() = http::Version::HTTP_2;
    *grpc.headers_mut() = headers;
    *grpc.extensions_mut() = parts.extensions;
    Ok(grpc)
}

fn too_large(limit: usize) -> ConnectError {
    ConnectError::new(
        Code::ResourceExhausted,
        format!("request body larger than the {limit}-byte limit (--max-request-bytes)"),
    )
}

/// The whole request body, at most `limit` bytes.
async fn read_body(body: tonic::body::Body, limit: usize) -> Result<Bytes, ConnectError> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) => Err(if err.is::<http_body_util::LengthLimitError>() {
            too_large(limit)
        } else if let Some(status) = err.downcast_ref::<tonic::Status>() {
            ConnectError::new(status.code(), status.message())
        } else {
            ConnectError::new(Code::Cancelled, format!("reading the request body: {err}"))
        }),
    }
}

/// A gRPC status in `headers` (trailers, or a trailers-only answer's
/// headers), other than OK, as a Connect error.
fn grpc_error(headers: &HeaderMap) -> Option<ConnectError> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    if code == Code::Ok {
        return None;
    }
    let message = headers
        .get("grpc-message")
        .map(|m| {
            percent_encoding::percent_decode(m.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some(ConnectError::new(code, message))
}

/// The gRPC answer's own metadata (not its framing) for the Connect
/// answer's headers; trailers get Connect's `trailer-` prefix.
fn copy_metadata(from: &HeaderMap, to: &mut HeaderMap, prefix: &str) {
    for (name, value) in from {
        let name_str = name.as_str();
        if name_str.starts_with("grpc-") || NOT_METADATA.contains(&name_str) {
            continue;
        }
        match HeaderName::try_from(format!("{prefix}{name_str}")) {
            Ok(name) => {
                to.append(name, value.clone());
            }
            Err(_) => continue,
        }
    }
}

async fn unary_response<R>(
    procedure: &Procedure,
    codec: Codec,
    response: http::Response<R>,
) -> Result<Response, ConnectError>
where
    R: http_body::Body<Data = Bytes>,
    R::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    if let Some(err) = grpc_error(&parts.headers) {
        return Err(err);
    }
    let collected = body.collect().await.map_err(|e| body_error(e.into()))?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    if let Some(err) = grpc_error(&trailers) {
        return Err(err);
    }
    let data = collected.to_bytes();
    let message = stream::frames(&data)
        .next()
        .ok_or_else(|| ConnectError::internal("tumbler's reply had no message"))??;
    let (body, content_type) = match codec {
        Codec::Json => (
            Bytes::from((procedure.response_to_json)(&message)?),
            "application/json",
        ),
        Codec::Proto => (message, "application/proto"),
    };
    let mut response = http::Response::new(tonic::body::Body::new(http_body_util::Full::new(body)));
    copy_metadata(&parts.headers, response.headers_mut(), "");
    copy_metadata(&trailers, response.headers_mut(), "trailer-");
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

/// A failure while reading the service's answer.
fn body_error(err: BoxError) -> ConnectError {
    match err.downcast::<tonic::Status>() {
        Ok(status) => ConnectError::from(*status),
        Err(err) => ConnectError::internal(err.to_string()),
    }
}
