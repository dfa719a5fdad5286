//! The gRPC port's side of the rule (`super`): [`OriginLayer`], in front
//! of Connect and tonic-web, which answers a listed origin's preflight,
//! adds CORS headers to its answers, and refuses what the rule refuses in
//! the protocol the request speaks.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::{PortRule, Refusal, Verdict};
use crate::proto::metadata;

/// Request headers a browser page may send (the preflight's
/// Access-Control-Allow-Headers): Connect's, gRPC-Web's, the bearer token
/// and trace context.
const ALLOW_HEADERS: &str = "content-type, connect-protocol-version, connect-timeout-ms, x-grpc-web, x-user-agent, grpc-timeout, authorization, traceparent, tracestate";

/// How long a browser may keep a preflight's answer (seconds).
const MAX_AGE: &str = "600";

/// Answer headers a listed origin's page may read: gRPC-Web's status
/// (trailers-only answers carry it in headers) and the service's own
/// metadata, as headers and as Connect's `trailer-` headers.
pub(super) fn expose_headers() -> HeaderValue {
    let names = [
        "grpc-status",
        "grpc-message",
        "grpc-status-details-bin",
        metadata::HEALTH_REASON,
        metadata::CLEARED_LOCKS,
        metadata::CLEARED_GRANTS,
        metadata::CLEARED_REQUESTS,
    ];
    let trailers = names[3..].iter().map(|n| format!("trailer-{n}"));
    let all: Vec<String> = names
        .iter()
        .map(|n| n.to_string())
        .chain(trailers)
        .collect();
    HeaderValue::from_str(&all.join(", ")).expect("header names are visible ASCII")
}

impl PortRule {
    /// The preflight's answer for a listed origin.
    fn preflight(&self, origin: HeaderValue, headers: &HeaderMap) -> Response {
        let mut response = http::Response::new(tonic::body::Body::empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        let out = response.headers_mut();
        out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        out.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("POST"),
        );
        out.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
        out.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, self.expose.clone());
        out.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE),
        );
        // Chromium's private network access: a listed page may reach a
        // private or loopback address.
        if headers
            .get("access-control-request-private-network")
            .is_some_and(|v| v == "true")
        {
            out.insert(
                "access-control-allow-private-network",
                HeaderValue::from_static("true"),
            );
        }
        out.insert(
            header::VARY,
            HeaderValue::from_static(
                "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
            ),
        );
        response
    }

    /// The CORS headers of a listed origin's answer.
    fn add_cors(&self, origin: HeaderValue, response: &mut Response) {
        let out = response.headers_mut();
        out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        out.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, self.expose.clone());
        out.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

type Request = http::Request<tonic::body::Body>;
type Response = http::Response<tonic::body::Body>;

/// Characters percent-encoded in `grpc-message` (gRPC's rule: outside
/// visible ASCII and space, and `%` itself).
const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// A refusal as the protocol the request speaks: PERMISSION_DENIED as a
/// trailers-only gRPC or gRPC-Web answer (HTTP 200, `grpc-status: 7`), or
/// a Connect error (HTTP 403, `{"code":"permission_denied",…}`: the
/// status google.rpc.Code's table gives the code) for Connect, a preflight
/// and anything else. No CORS headers: a browser page on a refused origin
/// reads nothing.
pub fn refused(headers: &HeaderMap, refusal: &Refusal) -> Response {
    let message = refusal.to_string();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|ct| ct.as_bytes())
        .unwrap_or_default();
    let mut response = if content_type.starts_with(b"application/grpc") {
        let mut response = http::Response::new(tonic::body::Body::empty());
        let kind = if content_type.starts_with(b"application/grpc-web-text") {
            "application/grpc-web-text+proto"
        } else if content_type.starts_with(b"application/grpc-web") {
            "application/grpc-web+proto"
        } else {
            "application/grpc"
        };
        let out = response.headers_mut();
        out.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
        out.insert("grpc-status", HeaderValue::from_static("7"));
        let encoded = percent_encoding::utf8_percent_encode(&message, GRPC_MESSAGE).to_string();
        if let Ok(value) = HeaderValue::from_str(&encoded) {
            out.insert("grpc-message", value);
        }
        response
    } else {
        let body = serde_json::json!({"code": "permission_denied", "message": message});
        let mut response = http::Response::new(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from(body.to_string()),
        )));
        *response.status_mut() = StatusCode::FORBIDDEN;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    };
    if headers.contains_key(header::ORIGIN) {
        response
            .headers_mut()
            .insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// The gRPC port's Host/Origin rule and CORS, in front of Connect and
/// gRPC-Web (which rewrite the request: this sees it as the client sent
/// it).
#[derive(Clone, Debug)]
pub struct OriginLayer {
    rule: Arc<PortRule>,
}

impl OriginLayer {
    pub fn new(rule: PortRule) -> Self {
        OriginLayer {
            rule: Arc::new(rule),
        }
    }
}

impl<S> tower::Layer<S> for OriginLayer {
    type Service = OriginGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OriginGuard {
            inner,
            rule: self.rule.clone(),
        }
    }
}

/// See [`OriginLayer`].
#[derive(Clone, Debug)]
pub struct OriginGuard<S> {
    inner: S,
    rule: Arc<PortRule>,
}

impl<S> tower::Service<Request> for OriginGuard<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = GuardFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.rule.verdict(&request) {
            Verdict::Pass(origin) => GuardFuture::Pass {
                inner: self.inner.call(request),
                cors: origin.map(|origin| (origin, self.rule.clone())),
            },
            Verdict::Preflight(origin) => GuardFuture::Answer {
                answer: Some(self.rule.preflight(origin, request.headers())),
            },
            Verdict::Refuse(refusal) => {
                tracing::debug!(%refusal, uri = %request.uri(), "refused by the origin rule");
                let answer = refused(request.headers(), &refusal);
                GuardFuture::Refusing {
                    answer: Box::pin(async move {
                        drain(request.into_body()).await;
                        answer
                    }),
                }
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// [`OriginGuard`]'s answer: the inner service's (with CORS headers
    /// for a listed origin), or its own.
    #[project = GuardProj]
    pub enum GuardFuture<F> {
        Pass {
            #[pin]
            inner: F,
            cors: Option<(HeaderValue, Arc<PortRule>)>,
        },
        Answer {
            answer: Option<Response>,
        },
        Refusing {
            answer: std::pin::Pin<Box<dyn Future<Output = Response> + Send>>,
        },
    }
}

/// Most of a refused request's body read before the answer, and for how
/// long: an answer sent before the body's end resets the HTTP/2 stream,
/// which some clients (curl) report as a framing error instead of the
/// refusal. A larger or slower body is left unread.
const DRAIN_BYTES: usize = 64 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(1);

async fn drain(body: tonic::body::Body) {
    use http_body_util::BodyExt;
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut seen = 0;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |data| data.len());
            if seen > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}

impl<F, E> Future for GuardFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GuardProj::Pass { inner, cors } => {
                let mut response = std::task::ready!(inner.poll(cx))?;
                if let Some((origin, rule)) = cors.take() {
                    rule.add_cors(origin, &mut response);
                }
                Poll::Ready(Ok(response))
            }
            GuardProj::Answer { answer } => Poll::Ready(Ok(answer
                .take()
                .expect("GuardFuture polled after it answered"))),
            GuardProj::Refusing { answer } => answer.as_mut().poll(cx).map(Ok),
        }
    }
}
