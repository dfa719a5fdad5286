//! Flags for metrics, traces and the dashboard's admin actions, on the
//! HTTP port, for `tumbler serve` and `tumbler dev`.

use std::net::SocketAddr;

use clap::Args;

/// Metrics and traces, for `tumbler serve` and `tumbler dev`.
#[derive(Args, Clone, Debug, Default)]
pub struct ObservabilityArgs {
    /// Address of the HTTP port: Prometheus `/metrics` and `/healthz`;
    /// `off` disables it. Default: 0.0.0.0:9090 for `serve`, 127.0.0.1:9090
    /// for `dev`; when the default port is taken the service runs without
    /// it (logged as an error; `dev` takes a free port instead), while an
    /// address given here must be free.
    #[arg(long, env = "TUMBLER_HTTP_LISTEN", value_parser = parse_http_listen)]
    pub http_listen: Option<HttpListen>,
    /// OpenTelemetry collector to export a span per RPC to, over OTLP/gRPC
    /// (e.g. `http://otel-collector:4317`), or OTLP/HTTP with
    /// `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf` (e.g.
    /// `http://otel-collector:4318`). Empty: no tracing export.
    #[arg(long, env = "TUMBLER_OTLP_ENDPOINT", default_value = "")]
    pub otlp_endpoint: String,
    /// Turns on the dashboard's admin actions (force release of a holder,
    /// clear a namespace) on the HTTP port. Off by default. With
    /// --auth-tokens-file they also need an admin token for the namespace;
    /// with --no-auth anyone who reaches the HTTP port may use them.
    #[arg(
        long,
        env = "TUMBLER_DASHBOARD_ADMIN",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub dashboard_admin: bool,
}

/// Where the HTTP port listens, when asked for explicitly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpListen {
    Off,
    At(SocketAddr),
}

fn parse_http_listen(value: &str) -> Result<HttpListen, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(HttpListen::Off);
    }
    value
        .parse()
        .map(HttpListen::At)
        .map_err(|e| format!("{e}: expected an address like 0.0.0.0:9090, or `off`"))
}
