//! Logging (tracing to stderr, human-readable or JSON) and, when an OTLP
//! endpoint is given, OpenTelemetry export of a span per RPC.
//!
//! Without an endpoint nothing of OpenTelemetry is set up: no exporter, no
//! extra tracing layer, no per-RPC server span.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::config::{LogArgs, LogFormat};

/// The longest the exit waits for the last spans to reach the collector.
const EXPORT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`init`] set up; [`Telemetry::shutdown`] flushes it on exit.
#[must_use = "call shutdown() on exit so the last spans are exported"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Sets up logging, and span export when `otlp_endpoint` is not empty.
/// Must run inside the Tokio runtime (the OTLP client lives on it).
pub fn init(args: &LogArgs, otlp_endpoint: &str) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", args.log_level))?;
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match args.log_format {
        LogFormat::Pretty => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
    };

    let provider = if otlp_endpoint.is_empty() {
        None
    } else {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(otlp_endpoint)
            .build()
            .map_err(|e| anyhow::anyhow!("--otlp-endpoint {otlp_endpoint:?}: {e}"))?;
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(Resource::builder().with_service_name("tumbler").build())
                .build(),
        )
    };
    // Only tumbler's own spans are exported (not those of the HTTP/2 stack,
    // which would include the exporter's own requests), whatever the log
    // level says.
    let spans = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("tumbler"))
            .with_filter(Targets::new().with_target("tumbler", Level::INFO))
    });

    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init()
        .map_err(|e| anyhow::anyhow!("logging: {e}"))?;
    if provider.is_some() {
        crate::observe::enable_rpc_spans();
        tracing::info!(endpoint = otlp_endpoint, "exporting spans over OTLP");
    }
    Ok(Telemetry { provider })
}

impl Telemetry {
    /// Exports the spans still buffered. Runs off the async workers (the
    /// provider's shutdown blocks, and on a busy or single-threaded runtime
    /// would wait for itself) and gives up after a few seconds.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(EXPORT_FLUSH_TIMEOUT)
        });
        match tokio::time::timeout(EXPORT_FLUSH_TIMEOUT + Duration::from_secs(1), flushed).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "span export did not finish"),
            Ok(Err(err)) => tracing::warn!(error = %err, "span export did not finish"),
            Err(_) => tracing::warn!("span export still busy at exit; dropping the rest"),
        }
    }
}
