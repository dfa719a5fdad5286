//! What the service tells operators about itself: Prometheus metrics, the
//! per-RPC OpenTelemetry span, and debug-level lifecycle logs of locks.
//!
//! Everything is recorded through the `metrics` facade, which does nothing
//! until [`install_recorder`] has run (the server does that when it has an
//! HTTP port), and through `tracing`. The handlers in `api` call one
//! function of this module per outcome; [`RpcLayer`] times and counts every
//! RPC of the lock service, whatever its handler does.
//!
//! Metric names follow the Prometheus conventions: `tumbler_` prefix, base
//! units (seconds), `_total` on counters. Label values are bounded: RPC
//! methods are the service's own (anything else is `unknown`), gRPC codes
//! are the 17 of gRPC, and lock kinds are capped at [`MAX_KINDS`] per
//! process (the rest are counted as `other`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use metrics::{
    Counter, Histogram, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tonic::Code;
use tracing::Instrument;

mod rpc;

pub use rpc::*;

/// The gRPC path prefix of the lock service's methods.
const SERVICE_PATH: &str = "/tumbler.v1.LockService/";

/// The lock service's own method names, read once from its descriptor
/// (so a new RPC is covered without a list to keep in step).
fn service_methods() -> &'static [String] {
    static METHODS: OnceLock<Vec<String>> = OnceLock::new();
    METHODS.get_or_init(|| {
        use prost::Message;
        let Ok(set) = prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET)
        else {
            return Vec::new();
        };
        set.file
            .iter()
            .filter(|file| file.package() == "tumbler.v1")
            .flat_map(|file| &file.service)
            .filter(|service| service.name() == "LockService")
            .flat_map(|service| &service.method)
            .map(|method| method.name().to_owned())
            .collect()
    })
}

/// The `method` label of a request path: the method's name when the path
/// is one of the lock service's own methods, `unknown` for any other path
/// under the lock service (refused before routing with auth on, or
/// UNIMPLEMENTED), None for other services (health, reflection), which
/// are not counted. Label values therefore never come from the caller.
#[cfg(test)]
fn method_label(path: &str) -> Option<&'static str> {
    method_index(path).map(method_name)
}

/// The position of a request path's method in [`service_methods`], or
/// its length for `unknown` (see [`method_label`]).
fn method_index(path: &str) -> Option<usize> {
    let method = path.strip_prefix(SERVICE_PATH)?;
    let methods = service_methods();
    Some(
        methods
            .iter()
            .position(|known| known == method)
            .unwrap_or(methods.len()),
    )
}

/// The `method` label of a [`method_index`].
fn method_name(index: usize) -> &'static str {
    service_methods()
        .get(index)
        .map_or("unknown", String::as_str)
}

/// The handles of one method's RPC metrics, each registered with the
/// recorder at its first use and kept (rather than looked up by its
/// label strings at every RPC). Same series, same labels, created at the
/// same moment as before: a series appears when it is first counted.
struct MethodMetrics {
    duration: OnceLock<Histogram>,
    /// By gRPC code (`Code as usize`, 0..=16).
    requests: [OnceLock<Counter>; 17],
}

fn method_metrics(index: usize) -> &'static MethodMetrics {
    static ALL: OnceLock<Box<[MethodMetrics]>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        (0..=service_methods().len())
            .map(|_| MethodMetrics {
                duration: OnceLock::new(),
                requests: Default::default(),
            })
            .collect()
    });
    &all[index.min(all.len() - 1)]
}

/// Counts one answered RPC of method `index` with `code`, taking `elapsed`.
fn rpc_answered(index: usize, code: Code, elapsed: Duration) {
    if !recording() {
        return;
    }
    let method = method_name(index);
    let handles = method_metrics(index);
    handles
        .duration
        .get_or_init(|| histogram!("tumbler_rpc_duration_seconds", "method" => method))
        .record(elapsed.as_secs_f64());
    handles.requests[(code as usize).min(16)]
        .get_or_init(|| {
            counter!("tumbler_rpc_requests_total", "method" => method, "code" => code_name(code))
        })
        .increment(1);
}

/// Distinct `kind` label values one process reports before counting the
/// rest as `other`: kinds come from clients, and every value is a series.
pub const MAX_KINDS: usize = 100;

/// Histogram buckets (seconds) for RPC and wait times: 0.5 ms to 5 min.
const TIME_BUCKETS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];

/// Set once OpenTelemetry export is on: only then does [`RpcLayer`] open a
/// server span per RPC, so tracing costs nothing extra when it is off.
static TRACING: AtomicBool = AtomicBool::new(false);

/// Tells this module that spans are exported (see `telemetry`).
pub fn enable_rpc_spans() {
    TRACING.store(true, Ordering::Relaxed);
}

pub fn rpc_spans() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// Whether spans are exported (the handlers then open theirs; see
/// `api`).
pub fn spans_exported() -> bool {
    rpc_spans()
}

/// The process-wide Prometheus recorder's handle, once installed.
static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Whether tumbler's recorder is installed. Until it is, every metric is
/// a no-op (the `metrics` facade has no recorder), so the kept handles
/// below are only taken once it is: a handle taken before would stay a
/// no-op for good.
pub fn recording() -> bool {
    RECORDER.get().is_some_and(Result::is_ok)
}

/// Installs the process-wide Prometheus recorder (once; later calls return
/// the same handle) and describes every metric; `tumbler_build_info`
/// carries the server's `version` and the `commit` it was built from
/// (the server package's `build.rs`).
pub fn install_recorder(
    version: &'static str,
    commit: &'static str,
) -> anyhow::Result<PrometheusHandle> {
    // One initialisation per process; concurrent callers (several servers
    // in one test process) wait for it instead of racing it.
    RECORDER
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &TIME_BUCKETS)
                .map_err(|e| e.to_string())?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder)
                .map_err(|_| "another metrics recorder is installed in this process".to_owned())?;
            describe();
            gauge!(
                "tumbler_build_info",
                "version" => version,
                "commit" => commit
            )
            .set(1.0);
            // Zero rather than absent before the first stream.
            for what in ["session", "watch"] {
                gauge!("tumbler_open_streams", "stream" => what).increment(0.0);
            }
            Ok(handle)
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

fn describe() {
    describe_counter!(
        "tumbler_rpc_requests_total",
        "Lock service RPCs answered, by method and gRPC status code."
    );
    describe_histogram!(
        "tumbler_rpc_duration_seconds",
        metrics::Unit::Seconds,
        "Time to answer a lock service RPC (waiting included), by method."
    );
    describe_counter!(
        "tumbler_acquire_outcomes_total",
        "Acquire results by lock kind: acquired, already_held, busy, timeout, deadlock (a wait refused: it would have closed a wait-for cycle)."
    );
    describe_histogram!(
        "tumbler_acquire_wait_seconds",
        metrics::Unit::Seconds,
        "Time a waiting Acquire (wait_ms > 0) spent in the server until granted or timed out."
    );
    describe_gauge!(
        "tumbler_waiters",
        "Acquire RPCs waiting for a permit on this replica."
    );
    describe_counter!(
        "tumbler_redis_errors_total",
        "Failed Redis calls answering RPCs: unavailable (outage, timeout) or protocol (unexpected reply)."
    );
    describe_histogram!(
        "tumbler_hold_seconds",
        metrics::Unit::Seconds,
        "How long released grants were held (Redis clock), by lock kind."
    );
    describe_counter!(
        "tumbler_reaper_runs_total",
        "Background reaper rounds run by this replica (while it holds the reaper lease)."
    );
    describe_counter!(
        "tumbler_reaper_lock_unavailable_total",
        "Reaper rounds in which this replica could not take the reaper lock for longer than a reaper's lease, while no reaper with such a lease held it."
    );
    // Served from the start at 0, so an alert on its increase has a base.
    counter!("tumbler_reaper_lock_unavailable_total").increment(0);
    describe_counter!(
        "tumbler_reaped_total",
        "What the background reaper removed: expired_holders, dead_waiters, stale_index_entries."
    );
    describe_counter!(
        "tumbler_group_commit_calls_total",
        "Redis calls of the lock hot path, by how many operations each carried (group commit): 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+."
    );
    describe_gauge!(
        "tumbler_build_info",
        "Always 1; the labels say which tumbler this is (version, and the commit it was built from)."
    );
    describe_gauge!(
        "tumbler_open_streams",
        "Session and Watch streams open on this replica, by stream (session, watch)."
    );
    describe_gauge!(
        "tumbler_session_grants",
        "Locks held through sessions on this replica (grants it renews and releases when their session ends)."
    );
    process_collector().describe();
    describe_gauge!(
        "tumbler_redis_up",
        "1 while the health check reaches Redis (and the key layout is verified), else 0."
    );
}

/// Renders the current metrics in the Prometheus text format, after
/// setting the gauges that are read rather than counted.
/// `waiters`: waiting RPCs on this replica; `session_grants`: grants its
/// sessions hold.
pub fn render(handle: &PrometheusHandle, waiters: usize, session_grants: usize) -> String {
    gauge!("tumbler_waiters").set(waiters as f64);
    gauge!("tumbler_session_grants").set(session_grants as f64);
    process_collector().collect();
    handle.render()
}

/// The `process_*` metrics (CPU, memory, open files, threads, start time),
/// read at each scrape.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// A Session or Watch stream opened (`what`: `session` or `watch`) on
/// this replica; [`stream_closed`] when it ends.
pub fn stream_opened(what: &'static str) {
    gauge!("tumbler_open_streams", "stream" => what).increment(1.0);
}

/// See [`stream_opened`].
pub fn stream_closed(what: &'static str) {
    gauge!("tumbler_open_streams", "stream" => what).decrement(1.0);
}

/// The result of one health check of Redis.
pub fn redis_up(up: bool) {
    gauge!("tumbler_redis_up").set(if up { 1.0 } else { 0.0 });
}

/// A Redis failure behind an RPC: `unavailable` or `protocol`.
pub fn redis_error(kind: &'static str) {
    counter!("tumbler_redis_errors_total", "kind" => kind).increment(1);
}

/// The metric handles of one `kind` label value, each registered at its
/// first use and kept.
pub struct KindMetrics {
    label: String,
    /// By outcome: acquired, already_held, busy, timeout.
    outcomes: [OnceLock<Counter>; 5],
    wait: OnceLock<Histogram>,
    hold: OnceLock<Histogram>,
}

impl KindMetrics {
    fn new(label: &str) -> Self {
        KindMetrics {
            label: label.to_owned(),
            outcomes: Default::default(),
            wait: OnceLock::new(),
            hold: OnceLock::new(),
        }
    }

    pub fn outcome(&self, index: usize, outcome: &'static str) -> &Counter {
        self.outcomes[index].get_or_init(|| {
            counter!("tumbler_acquire_outcomes_total", "kind" => self.label.clone(), "outcome" => outcome)
        })
    }

    pub fn wait(&self) -> &Histogram {
        self.wait.get_or_init(
            || histogram!("tumbler_acquire_wait_seconds", "kind" => self.label.clone()),
        )
    }

    pub fn hold(&self) -> &Histogram {
        self.hold
            .get_or_init(|| histogram!("tumbler_hold_seconds", "kind" => self.label.clone()))
    }
}

/// `kind`'s metrics: under its own label for the first [`MAX_KINDS`]
/// distinct kinds this process sees, under `other` after that.
pub fn kind_metrics(kind: &str) -> &'static KindMetrics {
    static SEEN: OnceLock<RwLock<HashMap<String, &'static KindMetrics>>> = OnceLock::new();
    static OTHER: OnceLock<KindMetrics> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(known) = seen
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(kind)
    {
        return known;
    }
    let mut seen = seen
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(known) = seen.get(kind) {
        return known;
    }
    if seen.len() < MAX_KINDS {
        // At most MAX_KINDS of them, for the life of the process.
        let metrics: &'static KindMetrics = Box::leak(Box::new(KindMetrics::new(kind)));
        seen.insert(kind.to_owned(), metrics);
        return metrics;
    }
    OTHER.get_or_init(|| KindMetrics::new("other"))
}

/// `kind` as a label value (see [`kind_metrics`]).
#[cfg(test)]
fn kind_label(kind: &str) -> &'static str {
    &kind_metrics(kind).label
}

/// Sets an attribute on the current span's OpenTelemetry span (a no-op
/// when export is off).
pub fn span_attribute(key: &'static str, value: impl Into<opentelemetry::Value>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if rpc_spans() {
        tracing::Span::current().set_attribute(key, value);
    }
}

/// Fills the lock fields the handler's span declares (Acquire records its
/// own before calling the engine), when the handler opened one.
pub fn record_lock(namespace: &str, lock_name: &str, holder: &str) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("namespace", namespace);
    span.record("lock_name", lock_name);
    span.record("holder", holder);
}

/// The name Prometheus and OpenTelemetry use for a gRPC status code.
pub use crate::proto::metadata::code_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_past_the_cap_are_other() {
        for i in 0..MAX_KINDS {
            kind_label(&format!("k{i}"));
        }
        assert_eq!(kind_label("k0"), "k0");
        assert_eq!(kind_label("one-too-many"), "other");
    }

    #[test]
    fn method_labels_are_the_services_own() {
        assert_eq!(
            method_label("/tumbler.v1.LockService/Acquire"),
            Some("Acquire")
        );
        assert_eq!(method_label("/tumbler.v1.LockService/Watch"), Some("Watch"));
        assert_eq!(
            method_label("/tumbler.v1.LockService/MadeUp123"),
            Some("unknown")
        );
        assert_eq!(method_label("/tumbler.v1.LockService/"), Some("unknown"));
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), None);
    }
}
