//! What tumbler tells operators: Prometheus metrics on its HTTP port, and
//! a span per RPC exported over OTLP to a collector (here a tiny one the
//! test runs itself).
//!
//! A test binary of its own, not folded into an area: it counts exact RPC
//! totals and per-kind series in the process-wide metrics registry, which
//! other tests in the same process would move.

pub mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::http::{sample, scrape};
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

/// Scrapes until `check` holds (up to 10 s); returns that page.
async fn scrape_until(addr: SocketAddr, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = scrape(addr).await;
        if check(&page) {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw {what}:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_rpcs_outcomes_waiters_and_redis_health() {
    let redis = start_redis();
    let mut args = service_args();
    args.reap_interval_ms = 100;
    let server = (TestServer::new().redis(&redis.url()).args(args).http())
        .start()
        .await;
    let http_addr = server.http();
    let mut client = server.client().await;

    assert_eq!(
        common::http::get(http_addr, "/healthz").await,
        (200, "ok\n".into())
    );
    assert_eq!(common::http::get(http_addr, "/nope").await.0, 404);

    let kinded = |holder: &str| proto::AcquireRequest {
        kind: "obs".into(),
        ..acquire("metrics-lock", holder)
    };
    client.acquire(kinded("a")).await.unwrap();
    client.acquire(kinded("a")).await.unwrap(); // already held
    client.acquire(kinded("b")).await.unwrap(); // busy
    let timed_out = client
        .acquire(proto::AcquireRequest {
            wait_ms: 100,
            ..kinded("b")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(timed_out.reason(), proto::NotAcquiredReason::Timeout);
    let invalid = client
        .acquire(proto::AcquireRequest {
            limit: Some(0),
            ..kinded("c")
        })
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);

    // One waiter in the server shows in the gauge while it waits.
    let mut waiting_client = client.clone();
    let waiter = tokio::spawn(async move {
        waiting_client
            .acquire(proto::AcquireRequest {
                wait_ms: 10_000,
                ..kinded("d")
            })
            .await
    });
    scrape_until(http_addr, "tumbler_waiters 1", |page| {
        sample(page, "tumbler_waiters", &[]) == Some(1.0)
    })
    .await;
    client.release(release("metrics-lock", "a")).await.unwrap();
    waiter.await.unwrap().unwrap();
    client.release(release("metrics-lock", "a")).await.unwrap(); // not held

    let page = scrape_until(http_addr, "a reaper round", |page| {
        sample(page, "tumbler_reaper_runs_total", &[]) >= Some(1.0)
    })
    .await;
    // The page is valid Prometheus text exposition, read by a real parser.
    let parsed = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned())))
        .expect("the /metrics page parses as Prometheus text");
    let families: std::collections::BTreeSet<&str> =
        parsed.samples.iter().map(|s| s.metric.as_str()).collect();
    for family in [
        "tumbler_rpc_requests_total",
        "tumbler_acquire_outcomes_total",
        "tumbler_waiters",
        "tumbler_redis_up",
        "tumbler_reaper_runs_total",
    ] {
        assert!(families.contains(family), "{family} missing: {families:?}");
    }
    assert!(
        parsed.docs.contains_key("tumbler_hold_seconds"),
        "{:?}",
        parsed.docs.keys()
    );
    // One grant released ("a" once; the second release found it gone).
    assert_eq!(
        sample(&page, "tumbler_hold_seconds_count", &[("kind", "obs")]),
        Some(1.0),
        "{page}"
    );
    let rpc = |method, code| {
        sample(
            &page,
            "tumbler_rpc_requests_total",
            &[("method", method), ("code", code)],
        )
    };
    assert_eq!(rpc("Acquire", "OK"), Some(5.0), "{page}");
    assert_eq!(rpc("Acquire", "INVALID_ARGUMENT"), Some(1.0), "{page}");
    assert_eq!(rpc("Release", "OK"), Some(2.0), "{page}");
    let outcome = |outcome| {
        sample(
            &page,
            "tumbler_acquire_outcomes_total",
            &[("kind", "obs"), ("outcome", outcome)],
        )
    };
    assert_eq!(outcome("acquired"), Some(2.0), "{page}");
    assert_eq!(outcome("already_held"), Some(1.0), "{page}");
    assert_eq!(outcome("busy"), Some(1.0), "{page}");
    assert_eq!(outcome("timeout"), Some(1.0), "{page}");
    // Histograms: both waiting acquires, every Acquire answered.
    assert_eq!(
        sample(
            &page,
            "tumbler_acquire_wait_seconds_count",
            &[("kind", "obs")]
        ),
        Some(2.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "tumbler_rpc_duration_seconds_count",
            &[("method", "Acquire")]
        ),
        Some(6.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "tumbler_rpc_duration_seconds_bucket",
            &[("method", "Acquire"), ("le", "+Inf")]
        ),
        Some(6.0),
        "{page}"
    );
    assert_eq!(sample(&page, "tumbler_waiters", &[]), Some(0.0), "{page}");
    assert_eq!(sample(&page, "tumbler_redis_up", &[]), Some(1.0), "{page}");
    assert!(
        page.contains("# TYPE tumbler_rpc_duration_seconds histogram"),
        "{page}"
    );
    assert!(
        page.contains("# HELP tumbler_acquire_outcomes_total"),
        "{page}"
    );

    // Redis goes away: errors are counted and the health gauge drops.
    drop(redis);
    let failed = client.acquire(kinded("e")).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    let page = scrape_until(http_addr, "tumbler_redis_up 0", |page| {
        sample(page, "tumbler_redis_up", &[]) == Some(0.0)
    })
    .await;
    assert!(
        sample(
            &page,
            "tumbler_redis_errors_total",
            &[("kind", "unavailable")]
        ) >= Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "tumbler_rpc_requests_total",
            &[("method", "Acquire"), ("code", "UNAVAILABLE")]
        ),
        Some(1.0),
        "{page}"
    );

    // The HTTP port closes with the server.
    server.shutdown().await.unwrap();
    assert!(TcpStream::connect(http_addr).await.is_err());
}

/// A collector that hands every exported span to the test.
struct Collector {
    spans: mpsc::UnboundedSender<(Vec<KeyValue>, Span)>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    let _ = self.spans.send((resource.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        any_value::Value::StringValue(text) => text.clone(),
        any_value::Value::IntValue(number) => number.to_string(),
        any_value::Value::BoolValue(flag) => flag.to_string(),
        other => format!("{other:?}"),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_exports_a_span_over_otlp() {
    let (spans_tx, mut spans) = mpsc::unbounded_channel();
    let collector = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = collector.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector { spans: spans_tx }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(collector)),
    );

    // The OpenTelemetry provider is process-wide: a server of its own.
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let mut serve = tokio::process::Command::new(TUMBLER)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis-url", &redis.url(), "--health-interval-ms", "100"])
        .args([
            "--shutdown-drain-ms",
            "0",
            "--http-listen",
            "off",
            "--no-auth",
        ])
        .args(["--otlp-endpoint", &format!("http://{collector_addr}")])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    wait_for_health(&endpoint, ServingStatus::Serving).await;
    let mut client = proto::lock_service_client::LockServiceClient::connect(endpoint)
        .await
        .unwrap();
    client
        .acquire(proto::AcquireRequest {
            kind: "traced".into(),
            ..acquire("otel-lock", "otel-holder")
        })
        .await
        .unwrap();
    let bad = client.release(release("otel-lock", "")).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);

    let mut handler = None;
    let mut server_span = None;
    let mut invalid = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while handler.is_none() || server_span.is_none() || invalid.is_none() {
        let (resource, span) = tokio::time::timeout_at(deadline, spans.recv())
            .await
            .expect("the spans reach the collector")
            .unwrap();
        assert_eq!(
            attribute(&resource, "service.name").as_deref(),
            Some("tumbler")
        );
        match span.name.as_str() {
            "Acquire" => handler = Some(span),
            "tumbler.v1.LockService/Acquire" => server_span = Some(span),
            "tumbler.v1.LockService/Release" => invalid = Some(span),
            _ => {}
        }
    }

    // The handler's span: the lock, the holder, the kind and the outcome.
    let handler = handler.unwrap();
    let attrs = &handler.attributes;
    assert_eq!(attribute(attrs, "lock_name").as_deref(), Some("otel-lock"));
    assert_eq!(attribute(attrs, "namespace").as_deref(), Some("default"));
    assert_eq!(attribute(attrs, "holder").as_deref(), Some("otel-holder"));
    assert_eq!(attribute(attrs, "tumbler.kind").as_deref(), Some("traced"));
    assert_eq!(
        attribute(attrs, "tumbler.status").as_deref(),
        Some("acquired")
    );
    assert!(attribute(attrs, "tumbler.wait_ms").is_some());

    // The server span around it: gRPC semantics, and the handler is its child.
    let server_span = server_span.unwrap();
    let attrs = &server_span.attributes;
    assert_eq!(attribute(attrs, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(attribute(attrs, "rpc.method").as_deref(), Some("Acquire"));
    assert_eq!(
        attribute(attrs, "rpc.grpc.status_code").as_deref(),
        Some("0")
    );
    assert_eq!(handler.trace_id, server_span.trace_id);
    assert_eq!(handler.parent_span_id, server_span.span_id);
    let invalid = invalid.unwrap();
    assert_eq!(
        attribute(&invalid.attributes, "rpc.grpc.status_code").as_deref(),
        Some("3")
    );

    // Exporting does not hold up the exit.
    kill(Pid::from_raw(serve.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), serve.wait())
        .await
        .expect("tumbler serve exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_trace_is_joined_and_every_json_log_line_is_flat() {
    let (spans_tx, mut spans) = mpsc::unbounded_channel();
    let collector = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = collector.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector { spans: spans_tx }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(collector)),
    );

    // Configured the OpenTelemetry way only: the endpoint alone turns
    // export on, and the operator's service name and attributes stand.
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut serve = tokio::process::Command::new(TUMBLER)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis-url", &redis.url(), "--health-interval-ms", "100"])
        .args([
            "--shutdown-drain-ms",
            "0",
            "--http-listen",
            "off",
            "--no-auth",
        ])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        )
        .env("OTEL_SERVICE_NAME", "locks-prod")
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("TUMBLER_LOG_FORMAT", "json")
        .env("TUMBLER_LOG", "tumbler=debug,info")
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    wait_for_health(&endpoint, ServingStatus::Serving).await;
    let mut client = proto::lock_service_client::LockServiceClient::connect(endpoint)
        .await
        .unwrap();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut request = tonic::Request::new(acquire("traced-lock", "traced-holder"));
    let metadata = request.metadata_mut();
    metadata.insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    metadata.insert("tracestate", "vendor=opaque".parse().unwrap());
    metadata.insert("baggage", "tenant=blue".parse().unwrap());
    client.acquire(request).await.unwrap();
    client.reap(proto::ReapRequest::default()).await.unwrap();

    // The server span continues the caller's trace, under the caller's span.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (resource, server_span) = loop {
        let (resource, span) = tokio::time::timeout_at(deadline, spans.recv())
            .await
            .expect("the spans reach the collector")
            .unwrap();
        if span.name == "tumbler.v1.LockService/Acquire" {
            break (resource, span);
        }
    };
    assert_eq!(hex(&server_span.trace_id), trace_id);
    assert_eq!(hex(&server_span.parent_span_id), parent_id);
    assert_eq!(
        attribute(&resource, "service.name").as_deref(),
        Some("locks-prod")
    );
    assert_eq!(
        attribute(&resource, "deployment.environment").as_deref(),
        Some("test")
    );

    kill(Pid::from_raw(serve.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(15), serve.wait())
        .await
        .expect("tumbler serve exits after SIGTERM")
        .unwrap();

    // Every line is one JSON object, without colour codes or Rust debug text.
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        !text.contains('\u{1b}'),
        "no ANSI colours in a file: {text}"
    );
    let lines: Vec<serde_json::Map<String, serde_json::Value>> = text
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(serde_json::Value::Object(fields)) => fields,
            other => panic!("not a JSON object: {line} ({other:?})"),
        })
        .collect();
    // Inside the Acquire: the lock's fields, flat, and the caller's trace.
    let acquired = lines
        .iter()
        .find(|l| l.get("lock_name").and_then(|v| v.as_str()) == Some("traced-lock"))
        .unwrap_or_else(|| panic!("a log line about the lock: {text}"));
    assert_eq!(acquired["trace_id"], trace_id, "{acquired:?}");
    assert_eq!(acquired["span_id"].as_str().unwrap().len(), 16);
    assert_eq!(acquired["namespace"], "default");
    assert_eq!(acquired["holder"], "traced-holder");
    assert!(!acquired.contains_key("name"), "{acquired:?}");
    // The same key never appears twice on a line (a parser keeps one).
    for line in text.lines() {
        for key in ["\"lock_name\":", "\"namespace\":", "\"message\":"] {
            assert!(line.matches(key).count() <= 1, "{key} twice: {line}");
        }
    }
    let reaped = lines
        .iter()
        .find(|l| l.get("message").and_then(|v| v.as_str()) == Some("reaped on request"))
        .unwrap_or_else(|| panic!("the reap is logged: {text}"));
    assert!(reaped["locks_visited"].is_u64(), "{reaped:?}");
    assert!(
        !text.contains("ReapCounts"),
        "no Rust debug text in logs: {text}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What an OTLP/HTTP collector received: the request's path and
/// content type, and the decoded spans with their resource.
struct HttpExport {
    path: String,
    content_type: String,
    spans: Vec<(Vec<KeyValue>, Span)>,
}

/// A collector speaking OTLP/HTTP with protobuf bodies on a loopback port
/// (an axum server decoding `ExportTraceServiceRequest`); each request
/// reaches the test through the returned channel.
async fn http_collector() -> (SocketAddr, mpsc::UnboundedReceiver<HttpExport>) {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode, Uri, header};
    use prost::Message;

    let (tx, rx) = mpsc::unbounded_channel();
    let receive = move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let tx = tx.clone();
        async move {
            let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                return (StatusCode::BAD_REQUEST, Vec::new());
            };
            let mut spans = Vec::new();
            for resource_spans in request.resource_spans {
                let resource = resource_spans
                    .resource
                    .map(|r| r.attributes)
                    .unwrap_or_default();
                for scope_spans in resource_spans.scope_spans {
                    for span in scope_spans.spans {
                        spans.push((resource.clone(), span));
                    }
                }
            }
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let _ = tx.send(HttpExport {
                path: uri.path().to_owned(),
                content_type,
                spans,
            });
            (
                StatusCode::OK,
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
    };
    let app = axum::Router::new().fallback(axum::routing::post(receive));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, rx)
}

/// Starts `tumbler serve` with `configure` applied, makes one Acquire, and
/// returns the first export that carries its server span.
async fn acquire_and_receive_over_http(
    configure: impl FnOnce(&mut tokio::process::Command),
    exports: &mut mpsc::UnboundedReceiver<HttpExport>,
) -> (HttpExport, Vec<KeyValue>) {
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let mut command = tokio::process::Command::new(TUMBLER);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis-url", &redis.url(), "--health-interval-ms", "100"])
        .args([
            "--shutdown-drain-ms",
            "0",
            "--http-listen",
            "off",
            "--no-auth",
        ])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    configure(&mut command);
    let mut serve = command.spawn().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    wait_for_health(&endpoint, ServingStatus::Serving).await;
    let mut client = proto::lock_service_client::LockServiceClient::connect(endpoint)
        .await
        .unwrap();
    client
        .acquire(acquire("http-otel-lock", "http-otel-holder"))
        .await
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let found = loop {
        let export = tokio::time::timeout_at(deadline, exports.recv())
            .await
            .expect("the spans reach the OTLP/HTTP collector")
            .unwrap();
        let acquire = export
            .spans
            .iter()
            .find(|(_, span)| span.name == "tumbler.v1.LockService/Acquire")
            .map(|(resource, _)| resource.clone());
        if let Some(resource) = acquire {
            break (export, resource);
        }
    };

    // Exporting over HTTP does not hold up the exit either.
    kill(Pid::from_raw(serve.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), serve.wait())
        .await
        .expect("tumbler serve exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_http_collector_with_the_traces_protocol() {
    let (collector, mut exports) = http_collector().await;
    // The traces-specific variable wins over the general one, and
    // --otlp-endpoint without a path gets /v1/traces.
    let (export, resource) = acquire_and_receive_over_http(
        |command| {
            command
                .args(["--otlp-endpoint", &format!("http://{collector}")])
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
                .env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf");
        },
        &mut exports,
    )
    .await;
    assert_eq!(export.path, "/v1/traces");
    assert_eq!(export.content_type, "application/x-protobuf");
    assert_eq!(
        attribute(&resource, "service.name").as_deref(),
        Some("tumbler")
    );
    let handler = export
        .spans
        .iter()
        .map(|(_, span)| span)
        .find(|span| span.name == "Acquire")
        .expect("the handler's span travels in the same batch");
    assert_eq!(
        attribute(&handler.attributes, "lock_name").as_deref(),
        Some("http-otel-lock")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_http_collector_configured_by_the_standard_variables() {
    let (collector, mut exports) = http_collector().await;
    let (export, resource) = acquire_and_receive_over_http(
        |command| {
            command
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"))
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
                .env("OTEL_SERVICE_NAME", "locks-http");
        },
        &mut exports,
    )
    .await;
    assert_eq!(export.path, "/v1/traces");
    assert_eq!(
        attribute(&resource, "service.name").as_deref(),
        Some("locks-http")
    );
}

#[tokio::test]
async fn an_unsupported_otlp_protocol_stops_the_start_with_the_variable_named() {
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let out = tokio::process::Command::new(TUMBLER)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--redis-url",
            &redis.url(),
            "--http-listen",
            "off",
            "--no-auth",
        ])
        .args(["--otlp-endpoint", "http://127.0.0.1:4318"])
        .env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(15), out)
        .await
        .expect("tumbler serve exits at once")
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") && stderr.contains("http/protobuf"),
        "{stderr}"
    );
}
