//! The HTTP port: Prometheus `/metrics`, a liveness `/healthz` and the
//! web dashboard with its JSON endpoints (see [`crate::dashboard`]), served
//! by the same process as gRPC, on a listener the caller bound.
//!
//! `/metrics` and `/healthz` need no token even when auth is on: scrapers
//! and probes carry none, and neither shows lock names or holders. The
//! dashboard checks tokens itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusHandle;
use tower::ServiceExt;
use tracing::Instrument;

use crate::limits::{ConnState, GatedListener, WatchedBody};
use crate::tls::TlsSettings;
use tumbler_engine::EngineFace;

/// The HTTP port's requests (dashboard, JSON endpoints; not `/metrics`
/// or `/healthz`) as server spans when export is on, children of the
/// caller's trace when the request carries one.
pub async fn http_span(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = request.uri().path();
    if !crate::observe::rpc_spans() || path == "/metrics" || path == "/healthz" {
        return next.run(request).await;
    }
    let span = tracing::info_span!(
        "http",
        otel.name = format!("{} {}", request.method(), path),
        otel.kind = "server",
        http.request.method = %request.method(),
        url.path = %path,
        http.response.status_code = tracing::field::Empty,
    );
    crate::observe::join_callers_trace(&span, request.headers());
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// How often histograms are folded in when nobody scrapes, so their
/// samples do not pile up between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Http {
    metrics: PrometheusHandle,
    engine: Arc<dyn EngineFace>,
}

/// Serves the HTTP port until the task running it is aborted (the server
/// does that when it stops); over TLS when `tls` is given. Connections
/// pass `listener`'s gate (caps, idle timeout) and have the header-read
/// timeout for every request.
pub async fn serve(
    listener: GatedListener,
    metrics: PrometheusHandle,
    engine: Arc<dyn EngineFace>,
    dashboard: crate::dashboard::Options,
    tls: Option<TlsSettings>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Http {
            metrics: metrics.clone(),
            engine: engine.clone(),
        })
        .merge(crate::dashboard::router(engine, dashboard))
        .layer(axum::middleware::from_fn(http_span));
    let limits = listener.gate().limits();
    let timeouts = (limits.header_read_timeout, limits.body_read_timeout);
    let mut listener = match tls {
        Some(tls) => Listener::Tls(tls.https_listener(listener)?),
        None => Listener::Plain(listener),
    };
    let mut upkeep = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        tokio::select! {
            (io, conn) = listener.accept() => {
                let app = app.clone();
                tokio::spawn(serve_connection(io, conn, app, timeouts));
            }
            _ = upkeep.tick() => metrics.run_upkeep(),
        }
    }
}

enum Listener {
    Plain(GatedListener),
    Tls(crate::tls::HttpsListener),
}

type Io = Box<dyn Connection>;

trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Connection for T {}

impl Listener {
    async fn accept(&mut self) -> (Io, Arc<ConnState>) {
        match self {
            Listener::Plain(listener) => {
                let (io, _) = listener.accept().await;
                let conn = io.state().clone();
                (Box::new(io), conn)
            }
            Listener::Tls(listener) => {
                let io = listener.accept().await;
                let conn = io.get_ref().0.state().clone();
                (Box::new(io), conn)
            }
        }
    }
}

/// HTTP/1.1 on one connection: each request is in flight (not idle) until
/// its response is ready; request headers must arrive within the first of
/// `timeouts`, a request's body within the second once its headers are in
/// (else 408, and the connection is closed). The connection's state goes
/// into each request's extensions, for the dashboard to mark it trusted
/// and to know the client's address.
async fn serve_connection(
    io: Io,
    conn: Arc<ConnState>,
    app: Router,
    (header_read_timeout, body_read_timeout): (Duration, Duration),
) {
    let service =
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let in_flight = conn.begin();
            let timed_out = Arc::new(AtomicBool::new(false));
            let mut request = request.map(|body| {
                if http_body::Body::is_end_stream(&body) {
                    return axum::body::Body::new(body);
                }
                let body = body.map_err(BoxError::from);
                axum::body::Body::new(WatchedBody::whole(
                    body,
                    conn.awaiting_body(),
                    body_read_timeout,
                    timed_out.clone(),
                ))
            });
            request.extensions_mut().insert(conn.clone());
            let answer = app.clone().oneshot(request);
            async move {
                let response = answer.await;
                drop(in_flight);
                if timed_out.load(Ordering::Acquire) {
                    return Ok(body_timed_out(body_read_timeout));
                }
                response
            }
        });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "HTTP connection ended");
    }
}

/// The answer to a request whose body did not arrive in time (whatever
/// its handler made of the truncated body): 408, and the connection
/// closes after it.
fn body_timed_out(after: Duration) -> axum::response::Response {
    let text = format!(
        "request body not received within --body-read-timeout-ms ({} ms)\n",
        after.as_millis()
    );
    (
        http::StatusCode::REQUEST_TIMEOUT,
        [
            (header::CONNECTION, "close"),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        text,
    )
        .into_response()
}

async fn metrics_page(State(http): State<Http>) -> impl IntoResponse {
    let body = crate::observe::render(
        &http.metrics,
        http.engine.health().waiting(),
        http.engine.session_calls().renewed_grants(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
