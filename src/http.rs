//! The HTTP port: Prometheus `/metrics`, a liveness `/healthz` and the
//! web dashboard with its JSON endpoints (see [`crate::dashboard`]), served
//! by the same process as gRPC, on a listener the caller bound.
//!
//! `/metrics` and `/healthz` need no token even when auth is on: scrapers
//! and probes carry none, and neither shows lock names or holders. The
//! dashboard checks tokens itself.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tower::ServiceExt;

use crate::engine::LockEngine;
use crate::limits::{ConnState, GatedListener};
use crate::tls::TlsSettings;

/// How often histograms are folded in when nobody scrapes, so their
/// samples do not pile up between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct Http {
    metrics: PrometheusHandle,
    engine: Arc<LockEngine>,
}

/// Serves the HTTP port until the task running it is aborted (the server
/// does that when it stops); over TLS when `tls` is given. Connections
/// pass `listener`'s gate (caps, idle timeout) and have the header-read
/// timeout for every request.
pub async fn serve(
    listener: GatedListener,
    metrics: PrometheusHandle,
    engine: Arc<LockEngine>,
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
        .layer(axum::middleware::from_fn(crate::observe::http_span));
    let header_read_timeout = listener.gate().limits().header_read_timeout;
    let mut listener = match tls {
        Some(tls) => Listener::Tls(tls.https_listener(listener)?),
        None => Listener::Plain(listener),
    };
    let mut upkeep = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        tokio::select! {
            (io, conn) = listener.accept() => {
                let app = app.clone();
                tokio::spawn(serve_connection(io, conn, app, header_read_timeout));
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
/// its response is ready; request headers must arrive within
/// `header_read_timeout`.
async fn serve_connection(
    io: Io,
    conn: Arc<ConnState>,
    app: Router,
    header_read_timeout: Duration,
) {
    let service =
        hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
            // The client's address, for rates kept per address.
            (request.extensions_mut()).insert(axum::extract::ConnectInfo(conn.peer()));
            let in_flight = conn.begin();
            let answer = app.clone().oneshot(request.map(axum::body::Body::new));
            async move {
                let response = answer.await;
                drop(in_flight);
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

async fn metrics_page(State(http): State<Http>) -> impl IntoResponse {
    let body = crate::observe::render(
        &http.metrics,
        http.engine.waiters().len(),
        http.engine.sessions().len(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
