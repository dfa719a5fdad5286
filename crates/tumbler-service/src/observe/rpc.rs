//! The per-RPC layer of the lock service ([`RpcLayer`]): its span (when
//! spans are exported), the caller's deadline, the RPC metrics, and the
//! status rewrites that keep gRPC's conventions (an oversized request is
//! RESOURCE_EXHAUSTED, a malformed one INVALID_ARGUMENT).

use super::*;

/// tonic answers a request message over `--max-request-bytes` with
/// OUT_OF_RANGE; gRPC's convention (and what clients retry on) is
/// RESOURCE_EXHAUSTED, so the status is rewritten (its message stays),
/// in the headers of a trailers-only answer or in the trailers.
pub(super) fn oversized_request_is_resource_exhausted(headers: &mut http::HeaderMap) {
    // grpc-message is percent-encoded (tonic encodes spaces).
    rewrite_status(
        headers,
        Code::OutOfRange,
        &[
            b"Error,%20decoded%20message%20length%20too%20large",
            b"Error, decoded message length too large",
        ],
        Code::ResourceExhausted,
    );
    malformed_request_is_invalid_argument(headers);
}

/// tonic answers a request message that does not decode as protobuf with
/// INTERNAL; the caller sent it, so it is INVALID_ARGUMENT (the message,
/// which names the field where decoding failed, stays).
pub(super) fn malformed_request_is_invalid_argument(headers: &mut http::HeaderMap) {
    rewrite_status(
        headers,
        Code::Internal,
        &[
            b"failed%20to%20decode%20Protobuf%20message",
            b"failed to decode Protobuf message",
        ],
        Code::InvalidArgument,
    );
}

/// Sets `grpc-status` to `to` where it is `from` with a `grpc-message`
/// starting with one of `messages`.
fn rewrite_status(headers: &mut http::HeaderMap, from: Code, messages: &[&[u8]], to: Code) {
    let matches = headers
        .get("grpc-status")
        .is_some_and(|code| Code::from_bytes(code.as_bytes()) == from)
        && headers.get("grpc-message").is_some_and(|m| {
            messages
                .iter()
                .any(|prefix| m.as_bytes().starts_with(prefix))
        });
    if matches {
        headers.insert("grpc-status", http::HeaderValue::from(to as i32));
    }
}

pin_project_lite::pin_project! {
    /// A response body whose trailers get
    /// [`oversized_request_is_resource_exhausted`].
    pub struct StatusRewrite<B> {
        #[pin]
        inner: B,
    }
}

impl<B: http_body::Body> http_body::Body for StatusRewrite<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = std::task::ready!(self.project().inner.poll_frame(cx));
        Poll::Ready(frame.map(|frame| {
            frame.map(|mut frame| {
                if let Some(trailers) = frame.trailers_mut() {
                    oversized_request_is_resource_exhausted(trailers);
                }
                frame
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Reads W3C `traceparent`/`tracestate`/`baggage` from a request's headers
/// (gRPC metadata are HTTP/2 headers).
pub(super) struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Makes `span` a child of the caller's span when the request carries a
/// trace context, so tumbler's spans join the caller's trace; the caller's
/// baggage travels with it.
pub fn join_callers_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&Headers(headers))
    });
    if opentelemetry::trace::TraceContextExt::has_active_span(&parent) {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let _ = span.set_parent(parent);
    }
}

/// A tower layer over the gRPC server: for every lock service RPC it counts
/// `tumbler_rpc_requests_total{method,code}`, times
/// `tumbler_rpc_duration_seconds{method}` and, when OpenTelemetry export is
/// on, opens the RPC's server span (the handler's span is its child).
/// Health checks and reflection pass through untouched.
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcLayer;

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService { inner }
    }
}

/// See [`RpcLayer`].
#[derive(Clone, Debug)]
pub struct RpcService<S> {
    inner: S,
}

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// When the RPC layer gives up on a handler and answers DEADLINE_EXCEEDED
/// itself, `left` before the caller's deadline: early enough for the
/// answer to arrive before the caller's own timer (which would report
/// CANCELLED, with the RPC uncounted here), later than a waiting Acquire's
/// own answer (the engine keeps max(5%, 20 ms) for that).
pub(super) fn give_up_after(left: Duration) -> Duration {
    left.saturating_sub((left / 40).max(Duration::from_millis(10)))
}

/// The caller's gRPC deadline, read once from `grpc-timeout` by the RPC
/// layer and handed to the handlers in the request's extensions, with
/// the instant this layer answers DEADLINE_EXCEEDED itself (after which
/// nothing may be granted to the caller).
#[derive(Clone, Copy, Debug)]
pub struct CallerDeadline {
    pub at: Instant,
    pub answered_at: Instant,
}

impl CallerDeadline {
    /// The time left before it.
    pub fn left(self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// The caller's deadline from a `grpc-timeout` value (`<digits><unit>`,
/// unit one of H M S m u n); `None` when absent or malformed.
pub(super) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

impl<S, B, R> tower::Service<http::Request<B>> for RpcService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default,
{
    type Response = http::Response<StatusRewrite<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let Some(index) = method_index(request.uri().path()) else {
            let answer = self.inner.call(request);
            return Box::pin(async move {
                let response = answer.await?;
                Ok(response.map(|body| StatusRewrite { inner: body }))
            });
        };
        let spans = rpc_spans();
        let span = if spans {
            let method = method_name(index);
            tracing::info_span!(
                "grpc",
                otel.name = format!("tumbler.v1.LockService/{method}"),
                otel.kind = "server",
                otel.status_code = tracing::field::Empty,
                rpc.system = "grpc",
                rpc.service = "tumbler.v1.LockService",
                rpc.method = %method,
                rpc.grpc.status_code = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        if spans {
            join_callers_trace(&span, request.headers());
        }
        let started = Instant::now();
        let left = (request.headers().get("grpc-timeout"))
            .and_then(|value| parse_grpc_timeout(value.to_str().ok()?));
        if let Some(left) = left {
            request.extensions_mut().insert(CallerDeadline {
                at: started + left,
                answered_at: started + give_up_after(left),
            });
        }
        let deadline = left.map(|left| started + give_up_after(left));
        let answer = span.in_scope(|| self.inner.call(request));
        Box::pin(
            async move {
                // Past the deadline the handler is dropped (a waiter leaves
                // its queue in the background) and the caller is told so.
                let mut result = match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline.into(), answer)
                        .await
                        .unwrap_or_else(|_| {
                            Ok(tonic::Status::deadline_exceeded(
                                "the deadline passed before tumbler could answer",
                            )
                            .into_http())
                        }),
                    None => answer.await,
                };
                if let Ok(response) = &mut result {
                    oversized_request_is_resource_exhausted(response.headers_mut());
                }
                // A handler's error is a trailers-only response: its status
                // is in the headers. A success carries OK in the trailers.
                let code = match &result {
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .map_or(Code::Ok, |value| Code::from_bytes(value.as_bytes())),
                    Err(_) => Code::Internal,
                };
                if spans {
                    let span = tracing::Span::current();
                    span.record("rpc.grpc.status_code", code as i32);
                    if matches!(
                        code,
                        Code::Unknown
                            | Code::DeadlineExceeded
                            | Code::Unimplemented
                            | Code::Internal
                            | Code::Unavailable
                            | Code::DataLoss
                    ) {
                        span.record("otel.status_code", "ERROR");
                    }
                }
                rpc_answered(index, code, started.elapsed());
                result.map(|response| response.map(|body| StatusRewrite { inner: body }))
            }
            .instrument(span),
        )
    }
}
