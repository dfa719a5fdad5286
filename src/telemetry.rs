//! Logging (tracing to stderr, human-readable or JSON) and, when an OTLP
//! endpoint is given, OpenTelemetry export of a span per RPC.
//!
//! Without an endpoint nothing of OpenTelemetry is set up: no exporter, no
//! extra tracing layer, no per-RPC server span.
//!
//! The endpoint is `--otlp-endpoint`, or else the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (either alone turns export on; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off). The transport is
//! `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`:
//! `grpc` (the default, port 4317) or `http/protobuf` (port 4318, `POST
//! /v1/traces`, appended to an endpoint without a path). The SDK reads the rest of the
//! `OTEL_*` variables itself: `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` (tumbler names itself `tumbler` only when
//! neither names the service), `OTEL_TRACES_SAMPLER[_ARG]`,
//! `OTEL_EXPORTER_OTLP_*_HEADERS`/`_TIMEOUT`, `OTEL_BSP_*`. Callers'
//! W3C `traceparent`/`tracestate`/`baggage` are honoured (see
//! `observe::RpcLayer`).
//!
//! JSON logs are one flat object per line: the event's fields, the fields
//! of the spans it happened in (innermost wins), `span` (the innermost
//! span's name) and, with export on, `trace_id` and `span_id`.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
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

/// Where spans go: `--otlp-endpoint`, else the standard variables.
enum Export {
    Off,
    /// An endpoint given on the command line.
    To(String),
    /// The exporter reads `OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT` itself.
    FromEnvironment,
}

fn export(otlp_endpoint: &str, env: impl Fn(&str) -> Option<String>) -> Export {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        return Export::Off;
    }
    if !otlp_endpoint.is_empty() {
        return Export::To(otlp_endpoint.to_owned());
    }
    if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
    {
        return Export::FromEnvironment;
    }
    Export::Off
}

/// True unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names the
/// service: then the operator's name stands.
fn names_itself(env: impl Fn(&str) -> Option<String>) -> bool {
    let named = env("OTEL_SERVICE_NAME").is_some_and(|v| !v.trim().is_empty())
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
            attributes
                .split(',')
                .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
        });
    !named
}

/// How spans travel to the collector: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`,
/// else `OTEL_EXPORTER_OTLP_PROTOCOL`, else gRPC (what tumbler always did,
/// a collector's port 4317).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// OTLP/gRPC (`grpc`).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`), a collector's
    /// port 4318, `POST /v1/traces`.
    HttpProtobuf,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

fn protocol(env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Protocol> {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        let Some(value) = env(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        return match value.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            other => Err(anyhow::anyhow!(
                "{name}={other:?}: tumbler exports spans over `grpc` (a collector's port 4317) or `http/protobuf` (port 4318); http/json is not supported"
            )),
        };
    }
    Ok(Protocol::Grpc)
}

/// The traces URL for `--otlp-endpoint` over OTLP/HTTP: like
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, a URL without a path is the collector's
/// base and gets `/v1/traces`; a URL with a path is used as it is.
fn http_traces_url(endpoint: &str) -> anyhow::Result<String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint:?}: {e}"))?;
    anyhow::ensure!(
        matches!(uri.scheme_str(), Some("http" | "https")),
        "--otlp-endpoint {endpoint:?}: expected an http:// or https:// URL"
    );
    Ok(match uri.path() {
        "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_owned(),
    })
}

/// The OTLP/HTTP client: hyper, plain http or https with the system's CA
/// roots, bounded by `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` /
/// `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds, 10 s by default).
fn http_client(
    env: impl Fn(&str) -> Option<String>,
) -> opentelemetry_http::hyper::HyperClient<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
> {
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto::ring};
    let timeout = [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| env(name).and_then(|v| v.trim().parse::<u64>().ok()))
    .map_or(Duration::from_secs(10), Duration::from_millis);
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match builder.with_provider_and_native_roots(ring::default_provider()) {
        Ok(builder) => builder,
        Err(err) => {
            // No system roots (an image without CA certificates): plain
            // http still works, https is refused at export.
            tracing::warn!(error = %err, "no system CA certificates: OTLP over https cannot verify the collector");
            let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    let connector = builder.https_or_http().enable_http1().build();
    opentelemetry_http::hyper::HyperClient::new(connector, timeout, None)
}

/// The span exporter for either protocol.
#[derive(Debug)]
enum Exporter {
    Grpc(Box<opentelemetry_otlp::SpanExporter>),
    Http(OnRuntime),
}

impl SpanExporter for Exporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match self {
            Exporter::Grpc(exporter) => exporter.export(batch).await,
            Exporter::Http(exporter) => exporter.export(batch).await,
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        match self {
            Exporter::Grpc(exporter) => exporter.set_resource(resource),
            Exporter::Http(exporter) => exporter.set_resource(resource),
        }
    }
}

/// Runs each export of the OTLP/HTTP exporter on tumbler's Tokio runtime:
/// the batch processor exports from a thread of its own, where hyper's
/// client would find no reactor.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        self.runtime
            .spawn(async move { inner.export(batch).await })
            .await
            .unwrap_or_else(|e| Err(OTelSdkError::InternalFailure(e.to_string())))
    }

    fn set_resource(&mut self, resource: &Resource) {
        // The provider sets the resource while it is built, before any
        // export shares the exporter.
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.set_resource(resource),
            None => tracing::warn!("span exporter in use: its resource stays as it was"),
        }
    }
}

/// Sets up logging, and span export when an endpoint is configured.
/// Must run inside the Tokio runtime (the OTLP client lives on it).
pub fn init(args: &LogArgs, otlp_endpoint: &str) -> anyhow::Result<Telemetry> {
    let env = |name: &str| std::env::var(name).ok();
    let filter = EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", args.log_level))?;
    let export = export(otlp_endpoint, env);
    let exporting = !matches!(export, Export::Off);
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match args.log_format {
        LogFormat::Pretty => logs
            // Colours only for a person at a terminal, not for a file or a
            // log collector.
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => logs
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson { exporting })
            .with_filter(filter)
            .boxed(),
    };

    let provider = match &export {
        Export::Off => None,
        Export::To(_) | Export::FromEnvironment => {
            let exporter = match protocol(env)? {
                Protocol::Grpc => {
                    let builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                    let builder = match &export {
                        Export::To(endpoint) => builder.with_endpoint(endpoint),
                        _ => builder,
                    };
                    Exporter::Grpc(Box::new(
                        builder
                            .build()
                            .map_err(|e| anyhow::anyhow!("OTLP endpoint: {e}"))?,
                    ))
                }
                Protocol::HttpProtobuf => {
                    let builder = opentelemetry_otlp::SpanExporter::builder()
                        .with_http()
                        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                        .with_http_client(http_client(env));
                    let builder = match &export {
                        Export::To(endpoint) => builder.with_endpoint(http_traces_url(endpoint)?),
                        _ => builder,
                    };
                    let exporter = builder
                        .build()
                        .map_err(|e| anyhow::anyhow!("OTLP endpoint: {e}"))?;
                    Exporter::Http(OnRuntime {
                        inner: Arc::new(exporter),
                        runtime: tokio::runtime::Handle::current(),
                    })
                }
            };
            let resource = if names_itself(env) {
                Resource::builder().with_service_name("tumbler").build()
            } else {
                Resource::builder().build()
            };
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
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
        // W3C trace context and baggage, as every OpenTelemetry SDK sends.
        opentelemetry::global::set_text_map_propagator(
            opentelemetry::propagation::TextMapCompositePropagator::new(vec![
                Box::new(opentelemetry_sdk::propagation::TraceContextPropagator::new()),
                Box::new(opentelemetry_sdk::propagation::BaggagePropagator::new()),
            ]),
        );
        crate::observe::enable_rpc_spans();
        let protocol = protocol(env)?.name();
        match &export {
            Export::To(endpoint) => {
                tracing::info!(
                    endpoint = endpoint.as_str(),
                    protocol,
                    "exporting spans over OTLP"
                )
            }
            _ => tracing::info!(
                protocol,
                "exporting spans over OTLP (endpoint from OTEL_EXPORTER_OTLP_*)"
            ),
        }
    }
    Ok(Telemetry { provider })
}

/// One flat JSON object per event (see the module's documentation).
struct FlatJson {
    /// Whether spans carry OpenTelemetry ids to log.
    exporting: bool,
}

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        use serde_json::{Map, Value};
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), timestamp.into());
        let meta = event.metadata();
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                innermost = Some(span.name());
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    for (key, value) in fields {
                        if !key.starts_with("otel.") {
                            line.insert(key, value);
                        }
                    }
                }
            }
            if let Some(name) = innermost {
                line.insert("span".into(), name.into());
            }
        }
        event.record(&mut FieldsInto(&mut line));
        if self.exporting
            && let Some(span) = ctx.lookup_current()
        {
            let id = span.id();
            drop(span);
            let cx = tracing::dispatcher::get_default(|dispatch| {
                tracing_opentelemetry::get_otel_context(&id, dispatch)
            });
            if let Some(cx) = cx {
                let span = cx.span();
                let span_context = span.span_context();
                if span_context.is_valid() {
                    line.insert(
                        "trace_id".into(),
                        span_context.trace_id().to_string().into(),
                    );
                    line.insert("span_id".into(), span_context.span_id().to_string().into());
                }
            }
        }
        let text = serde_json::to_string(&line).map_err(|_| std::fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Puts an event's fields into a JSON object: numbers and booleans as
/// such, everything else as text.
struct FieldsInto<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for FieldsInto<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(
        &mut self,
        field: &tracing::field::Field,
        value: &(dyn std::error::Error + 'static),
    ) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_standard_endpoint_alone_turns_export_on() {
        assert!(matches!(export("", env(&[])), Export::Off));
        assert!(matches!(
            export("", env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")])),
            Export::FromEnvironment
        ));
        assert!(matches!(
            export(
                "",
                env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")])
            ),
            Export::FromEnvironment
        ));
        assert!(matches!(export("http://x:4317", env(&[])), Export::To(_)));
        assert!(matches!(
            export("http://x:4317", env(&[("OTEL_SDK_DISABLED", "true")])),
            Export::Off
        ));
        assert!(matches!(
            export(
                "",
                env(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_TRACES_EXPORTER", "none")
                ])
            ),
            Export::Off
        ));
    }

    #[test]
    fn an_operators_service_name_stands() {
        assert!(names_itself(env(&[])));
        assert!(!names_itself(env(&[("OTEL_SERVICE_NAME", "locks")])));
        assert!(!names_itself(env(&[(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=prod, service.name=locks"
        )])));
        assert!(names_itself(env(&[(
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.namespace=infra"
        )])));
    }

    #[test]
    fn the_traces_protocol_wins_over_the_general_one() {
        assert_eq!(protocol(env(&[])).unwrap(), Protocol::Grpc);
        assert_eq!(
            protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])).unwrap(),
            Protocol::HttpProtobuf
        );
        assert_eq!(
            protocol(env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
            ]))
            .unwrap(),
            Protocol::Grpc
        );
        assert_eq!(
            protocol(env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", " http/protobuf ")
            ]))
            .unwrap(),
            Protocol::HttpProtobuf
        );
        let err = protocol(env(&[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") && err.contains("http/protobuf"),
            "{err}"
        );
    }

    #[test]
    fn an_http_endpoint_without_a_path_gets_the_traces_path() {
        assert_eq!(
            http_traces_url("http://collector:4318").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("https://collector:4318/").unwrap(),
            "https://collector:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://gateway/otlp/v1/traces").unwrap(),
            "http://gateway/otlp/v1/traces"
        );
        assert!(http_traces_url("collector:4318").is_err());
    }
}
