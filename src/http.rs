//! The HTTP port: Prometheus `/metrics`, a liveness `/healthz` and the
//! web dashboard with its JSON endpoints (see [`crate::dashboard`]), served
//! by the same process as gRPC, on a listener the caller bound.
//!
//! `/metrics` and `/healthz` need no token even when auth is on: scrapers
//! and probes carry none, and neither shows lock names or holders. The
//! dashboard checks tokens itself.

use std::future::IntoFuture;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::engine::LockEngine;
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
/// does that when it stops); over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
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
        .merge(crate::dashboard::router(engine, dashboard));
    let mut serving: Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> = match tls {
        Some(tls) => Box::pin(axum::serve(tls.https_listener(listener)?, app).into_future()),
        None => Box::pin(axum::serve(listener, app).into_future()),
    };
    let mut upkeep = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        tokio::select! {
            served = &mut serving => return served,
            _ = upkeep.tick() => metrics.run_upkeep(),
        }
    }
}

async fn metrics_page(State(http): State<Http>) -> impl IntoResponse {
    let body = crate::observe::render(&http.metrics, http.engine.waiters().len());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
