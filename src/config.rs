//! Command-line flags (each also a `TUMBLER_*` environment variable) and
//! the one [`ServerConfig`] the server is built from.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::service::validate::Limits;
use crate::tls::TlsArgs;
use tumbler_engine::WaitLimits;
use tumbler_engine::group::GroupCommit;
use tumbler_store::StoreConfig;

mod observability_args;
mod redis_args;
pub use observability_args::{HttpListen, ObservabilityArgs};
pub use redis_args::RedisArgs;

/// Connections one port holds at once when `--max-connections` is not set.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;

/// Settings shared by `tumbler serve` and `tumbler dev`.
#[derive(Args, Clone, Debug)]
pub struct ServiceArgs {
    /// Multiplexed Redis connections in the pool. One batches best: the
    /// calls of concurrent RPCs share its writes and Redis' reads (with 4,
    /// tumbler spent 7-12 % and Redis 11-12 % more CPU per lock, BENCHMARKS.md
    /// "Lean server path"); more only spread the client-side decoding of
    /// large replies.
    #[arg(long, env = "TUMBLER_REDIS_CONNECTIONS", default_value_t = 1)]
    pub redis_connections: u32,
    /// Group commit off: every lock operation is its own Redis call. On
    /// (the default), the operations for one shard that are ready while a
    /// call for it is in flight go out together in the next call
    /// (docs/operating.md "Group commit").
    #[arg(
        long,
        env = "TUMBLER_NO_GROUP_COMMIT",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_group_commit: bool,
    /// Group commit: most operations in one Redis call.
    #[arg(long, env = "TUMBLER_GROUP_COMMIT_MAX_OPS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub group_commit_max_ops: u32,
    /// Group commit: most bytes of keys and arguments in one Redis call.
    #[arg(long, env = "TUMBLER_GROUP_COMMIT_MAX_BYTES", default_value_t = 262_144, value_parser = clap::value_parser!(u32).range(1024..))]
    pub group_commit_max_bytes: u32,
    /// Group commit on one Redis server or through Sentinel: batch each
    /// shard on its own, as on a Redis Cluster (by default a namespace's
    /// shards share a call there, since slots do not constrain keys).
    #[arg(
        long,
        env = "TUMBLER_GROUP_COMMIT_PER_SHARD",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub group_commit_per_shard: bool,
    /// Group commit: calls one shard (one namespace on one server) may
    /// have in flight at once; an operation that finds fewer goes at once.
    #[arg(long, env = "TUMBLER_GROUP_COMMIT_IN_FLIGHT", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub group_commit_in_flight: u32,
    /// Hand-over (on by default): a permit freed while someone waits is
    /// granted to the head of the queue in the call that freed it, and its
    /// grant rides the wake-up (two Redis calls per contended grant
    /// instead of three). A lease longer than the waiter's liveness
    /// deadline is provisional up to it, and the waiter's replica takes it
    /// up before answering, so a waiter whose replica died keeps the lock
    /// no longer than its request TTL (docs/operating.md "Hand-over").
    #[arg(
        long,
        env = "TUMBLER_HAND_OVER",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub hand_over: bool,
    /// Turns the hand-over off (the A/B switch): a freed permit wakes the
    /// head of the queue, whose replica calls again. Wins over
    /// `--hand-over`.
    #[arg(long)]
    pub no_hand_over: bool,
    /// Upper bound for one Redis command, connecting included; past it the
    /// RPC answers UNAVAILABLE.
    #[arg(long, env = "TUMBLER_REDIS_TIMEOUT_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub redis_timeout_ms: u64,
    /// Durability: replicas that must acknowledge a grant (Acquire,
    /// session acquire, Extend) before it is answered, checked with Redis
    /// `WAIT` on the connection that wrote it; fewer acknowledgements
    /// within --min-replicas-timeout-ms answer UNAVAILABLE. 0 (the
    /// default) answers as soon as the primary has the grant.
    #[arg(long, env = "TUMBLER_MIN_REPLICAS_ACKED", default_value_t = 0)]
    pub min_replicas_acked: u32,
    /// How long a grant waits for --min-replicas-acked acknowledgements;
    /// must be below --redis-timeout-ms.
    #[arg(long, env = "TUMBLER_MIN_REPLICAS_TIMEOUT_MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub min_replicas_timeout_ms: u64,
    /// First part of every Redis key (no braces, no whitespace).
    #[arg(long, env = "TUMBLER_KEY_PREFIX", default_value = "tumbler", value_parser = parse_key_prefix)]
    pub key_prefix: String,
    /// Shards per namespace. Fixed for the life of a deployment's data: the
    /// server refuses to start against data written with another count.
    #[arg(long, env = "TUMBLER_SHARDS", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub shards: u32,
    /// Largest `limit` (holders per lock) a request may ask for.
    #[arg(long, env = "TUMBLER_MAX_LIMIT", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_limit: u32,
    /// Lease given when an Acquire names no ttl_ms.
    #[arg(long, env = "TUMBLER_DEFAULT_TTL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub default_ttl_ms: u64,
    /// Longest lease a request may ask for (default: one day).
    #[arg(long, env = "TUMBLER_MAX_TTL_MS", default_value_t = 86_400_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_ttl_ms: u64,
    /// Longest wait_ms a request may ask for (default: one hour).
    #[arg(long, env = "TUMBLER_MAX_WAIT_MS", default_value_t = 3_600_000)]
    pub max_wait_ms: u64,
    /// Waiting-request TTL (queue_ttl_ms) when a request gives none: how
    /// long a waiter whose server died can hold up the queue.
    #[arg(long, env = "TUMBLER_DEFAULT_QUEUE_TTL_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub default_queue_ttl_ms: u64,
    /// Waiting requests one lock's queue may hold, over all replicas;
    /// beyond it Acquire answers RESOURCE_EXHAUSTED.
    #[arg(long, env = "TUMBLER_MAX_WAITERS_PER_LOCK", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters_per_lock: u32,
    /// Waiting RPCs one replica may hold open; beyond it Acquire answers
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "TUMBLER_MAX_WAITERS", default_value_t = 100_000)]
    pub max_waiters: usize,
    /// Lock-delay: when a session dies (its client crashed or was cut
    /// off, rather than closing it), keep its grants held this long before
    /// they expire, so a partitioned old holder cannot overlap with the
    /// next one. 0 (the default) releases them at once.
    #[arg(long, env = "TUMBLER_SESSION_LOCK_DELAY_MS", default_value_t = 0)]
    pub session_lock_delay_ms: u64,
    /// How often the background reaper runs (on one replica at a time);
    /// 0 turns it off.
    #[arg(long, env = "TUMBLER_REAP_INTERVAL_MS", default_value_t = 10_000)]
    pub reap_interval_ms: u64,
    /// Delete tumbler's Redis function libraries that no running replica
    /// has named for this long (older builds' code); 0 keeps them all.
    #[arg(long, env = "TUMBLER_LIBRARY_GRACE_MS", default_value_t = 3_600_000)]
    pub library_grace_ms: u64,
    /// How often the health check pings Redis.
    #[arg(long, env = "TUMBLER_HEALTH_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub health_interval_ms: u64,
    /// After SIGTERM, how long in-flight RPCs may take before the server
    /// closes the remaining connections and exits.
    #[arg(long, env = "TUMBLER_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,
    /// Largest request message the server reads, in bytes (a lock request
    /// at its limits is under 10 KiB); larger ones are refused.
    #[arg(long, env = "TUMBLER_MAX_REQUEST_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1024..))]
    pub max_request_bytes: u32,
    /// Concurrent RPCs (HTTP/2 streams) one client connection may have
    /// open; a client that wants more waits for one to finish.
    #[arg(long, env = "TUMBLER_MAX_CONCURRENT_STREAMS", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_streams: u32,
    /// Waiting RPCs one namespace may hold open on one replica; beyond it
    /// Acquire answers RESOURCE_EXHAUSTED, so one team cannot use up the
    /// replica's `--max-waiters`.
    #[arg(long, env = "TUMBLER_MAX_WAITERS_PER_NAMESPACE", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters_per_namespace: u32,
    /// Locks (held or waited for) one namespace may have; 0 (the default)
    /// means no limit. Enforced atomically per shard, as this number
    /// divided by --shards (rounded up), so a namespace may be refused a
    /// little before it reaches the total.
    #[arg(long, env = "TUMBLER_MAX_LOCKS_PER_NAMESPACE", default_value_t = 0)]
    pub max_locks_per_namespace: u64,
    /// Session streams one replica may hold open.
    #[arg(long, env = "TUMBLER_MAX_SESSIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: u32,
    /// Watch streams one replica may hold open.
    #[arg(long, env = "TUMBLER_MAX_WATCHERS", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_watchers: u32,
    /// Session streams one token may hold open on one replica (a token's
    /// `max_sessions` in the tokens file overrides it); beyond it Session
    /// answers RESOURCE_EXHAUSTED, leaving --max-sessions to the others.
    #[arg(long, env = "TUMBLER_MAX_SESSIONS_PER_TOKEN", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions_per_token: u32,
    /// Watch streams one token may hold open on one replica (a token's
    /// `max_watchers` overrides it).
    #[arg(long, env = "TUMBLER_MAX_WATCHERS_PER_TOKEN", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_watchers_per_token: u32,
    /// Watch streams on one namespace one replica may hold open.
    #[arg(long, env = "TUMBLER_MAX_WATCHERS_PER_NAMESPACE", default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_watchers_per_namespace: u32,
    /// Waiting acquires (RPCs and session commands) one token may have on
    /// one replica, over all its namespaces (a token's `max_waiters`
    /// overrides it).
    #[arg(long, env = "TUMBLER_MAX_WAITERS_PER_TOKEN", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters_per_token: u32,
    /// Connections one port (gRPC, HTTP, health) holds at once. At the cap
    /// the connection idle the longest is closed for a new one; only when
    /// every connection has a request in flight is a new one refused.
    /// Lowered at start to fit the process's open-files limit (a warning
    /// when this flag was set, a note in the log when the default is).
    /// [default: 10000]
    #[arg(long, env = "TUMBLER_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
    /// Connections one client address holds on one port; more are
    /// refused (closed at once).
    #[arg(long, env = "TUMBLER_MAX_CONNECTIONS_PER_IP", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_ip: u32,
    /// A connection with no request in flight this long is closed (clients
    /// reconnect when they next call). Waits, Sessions and Watches are
    /// requests in flight: they are never cut.
    #[arg(long, env = "TUMBLER_IDLE_TIMEOUT_MS", default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub idle_timeout_ms: u64,
    /// Time a new connection has to send its first request's headers
    /// (on the HTTP port: every request's headers); slow or silent
    /// clients (slowloris, preface-only sockets) are closed after it.
    #[arg(long, env = "TUMBLER_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub header_read_timeout_ms: u64,
    /// Time a request has, once its headers are in, to send its body (on
    /// the HTTP port: all of it, else 408 and the connection closed) or
    /// its first message (gRPC: else DEADLINE_EXCEEDED and the stream
    /// reset). Until then it is not work: a connection whose requests all
    /// wait for their message may be closed when its port needs room.
    #[arg(long, env = "TUMBLER_BODY_READ_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub body_read_timeout_ms: u64,
    /// HTTP/2 keep-alive pings on gRPC connections, sent when a connection
    /// has been quiet this long...
    #[arg(long, env = "TUMBLER_HTTP2_KEEPALIVE_INTERVAL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub http2_keepalive_interval_ms: u64,
    /// ...and closed when a ping is unanswered this long (a vanished
    /// client's waits and sessions end instead of hanging on).
    #[arg(long, env = "TUMBLER_HTTP2_KEEPALIVE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub http2_keepalive_timeout_ms: u64,
    /// Host names the HTTP-speaking ports answer (the dashboard, and
    /// Connect and gRPC-Web on the gRPC port; requests whose Host is
    /// another name are refused, against DNS rebinding), besides loopback
    /// names and addresses, which they always answer. The check is on
    /// whenever names are given, and always without --auth-tokens-file
    /// (`tumbler dev`, --no-auth), where nothing else guards them. Native
    /// gRPC (HTTP/2, no browser Origin) is not checked.
    #[arg(
        long,
        visible_alias = "allowed-hosts",
        env = "TUMBLER_DASHBOARD_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub dashboard_allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, repeatable or comma-separated)
    /// whose browser pages may call the gRPC port through Connect or
    /// gRPC-Web: CORS for them (preflight, readable answers). Default none:
    /// a request with any other browser Origin is refused
    /// (PERMISSION_DENIED), whatever the auth mode.
    #[arg(long, env = "TUMBLER_CORS_ALLOW_ORIGIN", value_delimiter = ',', value_parser = crate::origin::parse_origin)]
    pub cors_allow_origin: Vec<String>,
    /// File holding the secret (at least 32 bytes, e.g. `openssl rand
    /// -base64 48`) that signs the dashboard's login cookies; replicas
    /// given the same file accept each other's logins. Without it each
    /// process signs with a random key of its own, so logins last until
    /// it restarts and hold only on the replica that made them. Empty:
    /// no file.
    #[arg(long, env = "TUMBLER_DASHBOARD_COOKIE_KEY_FILE", value_parser = parse_optional_path)]
    pub dashboard_cookie_key_file: Option<std::path::PathBuf>,
    /// Namespaces whose latest lock events are kept for the dashboard's
    /// Changelog page: names, `prefix*` patterns or `*`, comma-separated
    /// (default none: no lock call writes anything for it).
    #[arg(long, env = "TUMBLER_CHANGELOG_NAMESPACES", value_delimiter = ',', value_parser = parse_changelog_namespace)]
    pub changelog_namespaces: Vec<String>,
    /// Events each shard of a namespace's changelog keeps (the newest), in size x 256 bytes at most.
    #[arg(long, env = "TUMBLER_CHANGELOG_SIZE", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub changelog_size: u32,
    /// How long a changelog is kept after its last event.
    #[arg(long, env = "TUMBLER_CHANGELOG_RETENTION_MS", default_value_t = 86_400_000, value_parser = clap::value_parser!(u64).range(1000..))]
    pub changelog_retention_ms: u64,
    /// Changelog pages one caller (token; with auth off, address) may read per second; then 429.
    #[arg(long, env = "TUMBLER_CHANGELOG_READS_PER_SECOND", default_value_t = tumbler_engine::changelog::DEFAULT_READS_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub changelog_reads_per_second: u32,
    /// Failed authentications (dashboard logins with an unknown token,
    /// session resumes with a wrong secret) one client address (IPv6: its
    /// /64) may make per --auth-failure-window-ms; past that its attempts
    /// are refused (429, RESOURCE_EXHAUSTED) until the window, counted
    /// from its first failure, ends. 0 turns the throttle off.
    #[arg(long, env = "TUMBLER_AUTH_FAILURES_PER_ADDRESS", default_value_t = crate::auth::ThrottleSettings::DEFAULT_MAX_FAILURES)]
    pub auth_failures_per_address: u32,
    /// The window of --auth-failures-per-address.
    #[arg(long, env = "TUMBLER_AUTH_FAILURE_WINDOW_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub auth_failure_window_ms: u64,
    #[command(flatten)]
    pub auth: AuthArgs,
}

/// Who may call the service.
#[derive(Args, Clone, Debug, Default)]
pub struct AuthArgs {
    /// TOML file of bearer tokens (their SHA-256 digests, roles and
    /// namespaces); re-read when it changes. `tumbler token --name NAME
    /// --namespace NS` makes entries.
    #[arg(long, env = "TUMBLER_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<std::path::PathBuf>,
    /// Serve without authentication: every caller may do everything,
    /// in every namespace. `serve` refuses to start without either this
    /// or --auth-tokens-file.
    #[arg(
        long,
        env = "TUMBLER_NO_AUTH",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new(),
        conflicts_with = "auth_tokens_file"
    )]
    pub no_auth: bool,
    /// How often the tokens file is checked for changes.
    #[arg(long, env = "TUMBLER_AUTH_RELOAD_INTERVAL_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub auth_reload_interval_ms: u64,
}

impl Default for ServiceArgs {
    /// The flags' own defaults (and any `TUMBLER_*` variables set), as
    /// `tumbler serve` would see them with no flags.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            service: ServiceArgs,
        }
        <Defaults as clap::Parser>::parse_from(["tumbler"]).service
    }
}

/// Logging flags, for every subcommand.
#[derive(Args, Clone, Debug)]
pub struct LogArgs {
    /// `pretty` for people, `json` for log pipelines.
    #[arg(
        long,
        env = "TUMBLER_LOG_FORMAT",
        default_value = "pretty",
        global = true
    )]
    pub log_format: LogFormat,
    /// A tracing filter, e.g. `info` or `tumbler=debug,info`.
    #[arg(long, env = "TUMBLER_LOG", default_value = "info", global = true)]
    pub log_level: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// A path that may be given empty (as the Helm chart's ConfigMap does for
/// "none"); the reader treats an empty path as absent.
fn parse_optional_path(value: &str) -> Result<std::path::PathBuf, String> {
    Ok(value.into())
}

/// A `--changelog-namespaces` entry: a namespace, `prefix*` or `*` (an
/// empty one, as an empty TUMBLER_CHANGELOG_NAMESPACES gives, names none).
fn parse_changelog_namespace(value: &str) -> Result<String, String> {
    let value = value.trim();
    let name = value.strip_suffix('*').unwrap_or(value);
    if name.contains('*') {
        return Err(format!(
            "{value:?}: a namespace, a `prefix*` pattern or `*`"
        ));
    }
    if !name.is_empty() {
        crate::service::validate::namespace(name).map_err(|e| e.to_string())?;
    }
    Ok(value.to_owned())
}

fn parse_key_prefix(value: &str) -> Result<String, String> {
    if value.is_empty()
        || value.len() > 64
        || value
            .chars()
            .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err("must be 1..=64 characters without braces or whitespace".into());
    }
    Ok(value.to_owned())
}

/// Everything the server needs, resolved from flags.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub store: StoreConfig,
    pub key_prefix: String,
    pub shards: u32,
    pub limits: Limits,
    pub wait_limits: WaitLimits,
    /// None: no background reaper on this replica.
    pub reap_interval: Option<Duration>,
    /// `--library-grace-ms`; None keeps every library.
    pub library_grace: Option<Duration>,
    pub health_interval: Duration,
    /// After SIGTERM: how long to keep serving while reporting NOT_SERVING.
    pub shutdown_drain: Duration,
    pub shutdown_grace: Duration,
    /// Whether the dashboard on the HTTP port offers admin actions.
    pub dashboard_admin: bool,
    /// The Host rule of the dashboard and of the gRPC port's HTTP
    /// requests: loopback names and these; off (any Host) with auth on and
    /// no names given.
    pub allowed_hosts: crate::origin::HostRule,
    /// Origins whose browser pages may call the gRPC port (CORS); no
    /// other Origin is answered there.
    pub cors_allow_origins: Vec<String>,
    /// The key that signs the dashboard's login cookies.
    pub dashboard_cookie_key: crate::dashboard::CookieKey,
    /// Bearer tokens file; None: authentication is off.
    pub auth_tokens_file: Option<std::path::PathBuf>,
    pub auth_reload_interval: Duration,
    /// Failed-authentication throttling per client address.
    pub auth_throttle: crate::auth::ThrottleSettings,
    /// Which namespaces keep a changelog.
    pub changelog: tumbler_engine::changelog::ChangelogSettings,
    pub transport: TransportLimits,
    /// TLS for the gRPC port (and the HTTP port if it says so); None: plaintext.
    pub tls: Option<crate::tls::TlsSettings>,
}

/// Per-connection and per-replica bounds on what clients can make the
/// server hold in memory.
#[derive(Clone, Debug)]
pub struct TransportLimits {
    pub max_request_bytes: usize,
    pub max_concurrent_streams: u32,
    pub max_sessions: usize,
    pub max_watchers: usize,
    /// Per-tenant quotas (per token unless the tokens file says otherwise).
    pub max_sessions_per_token: usize,
    pub max_watchers_per_token: usize,
    pub max_watchers_per_namespace: usize,
    pub max_waiters_per_token: usize,
    /// Connection caps and timeouts of every port.
    pub connections: crate::limits::ConnLimits,
}

impl ServerConfig {
    pub fn new(redis_url: String, args: &ServiceArgs) -> anyhow::Result<Self> {
        anyhow::ensure!(
            args.default_ttl_ms <= args.max_ttl_ms,
            "--default-ttl-ms ({}) must not exceed --max-ttl-ms ({})",
            args.default_ttl_ms,
            args.max_ttl_ms
        );
        anyhow::ensure!(
            args.min_replicas_acked == 0 || args.min_replicas_timeout_ms < args.redis_timeout_ms,
            "--min-replicas-timeout-ms ({}) must be below --redis-timeout-ms ({}): the WAIT for replicas is part of the grant's Redis call",
            args.min_replicas_timeout_ms,
            args.redis_timeout_ms
        );
        let target = tumbler_store::RedisTarget::parse(&redis_url)
            .map_err(|e| anyhow::anyhow!("--redis-url: {e}"))?;
        Ok(ServerConfig {
            store: StoreConfig {
                target,
                connections: args.redis_connections,
                command_timeout: Duration::from_millis(args.redis_timeout_ms),
                min_replicas_acked: args.min_replicas_acked,
                min_replicas_timeout: Duration::from_millis(args.min_replicas_timeout_ms),
                credentials: Default::default(),
                key_prefix: args.key_prefix.clone(),
            },
            key_prefix: args.key_prefix.clone(),
            shards: args.shards,
            limits: Limits {
                max_limit: args.max_limit,
                default_ttl_ms: args.default_ttl_ms,
                max_ttl_ms: args.max_ttl_ms,
                max_wait_ms: args.max_wait_ms,
                default_queue_ttl_ms: args.default_queue_ttl_ms,
            },
            wait_limits: WaitLimits {
                max_waiters_per_lock: args.max_waiters_per_lock,
                max_waiters_per_replica: args.max_waiters,
                max_waiters_per_namespace: args.max_waiters_per_namespace as usize,
                max_locks_per_shard: args
                    .max_locks_per_namespace
                    .div_ceil(u64::from(args.shards)),
                session_lock_delay_ms: (args.session_lock_delay_ms > 0)
                    .then_some(args.session_lock_delay_ms),
                group_commit: GroupCommit {
                    enabled: !args.no_group_commit,
                    max_ops: args.group_commit_max_ops as usize,
                    max_bytes: args.group_commit_max_bytes as usize,
                    across_shards: !args.group_commit_per_shard,
                    in_flight: args.group_commit_in_flight as usize,
                },
                hand_over: args.hand_over && !args.no_hand_over,
            },
            reap_interval: (args.reap_interval_ms > 0)
                .then(|| Duration::from_millis(args.reap_interval_ms)),
            library_grace: (args.library_grace_ms > 0)
                .then(|| Duration::from_millis(args.library_grace_ms)),
            health_interval: Duration::from_millis(args.health_interval_ms),
            shutdown_drain: Duration::ZERO,
            shutdown_grace: Duration::from_millis(args.shutdown_grace_ms),
            dashboard_admin: false,
            allowed_hosts: if args.auth.auth_tokens_file.is_none()
                || !args.dashboard_allowed_hosts.is_empty()
            {
                crate::origin::HostRule::loopback_and(&args.dashboard_allowed_hosts)
            } else {
                crate::origin::HostRule::off()
            },
            cors_allow_origins: (args.cors_allow_origin.iter())
                .filter(|o| !o.is_empty())
                .cloned()
                .collect(),
            dashboard_cookie_key: crate::dashboard::CookieKey::load(
                args.dashboard_cookie_key_file.as_deref(),
            )?,
            auth_tokens_file: args.auth.auth_tokens_file.clone(),
            auth_reload_interval: Duration::from_millis(args.auth.auth_reload_interval_ms),
            auth_throttle: crate::auth::ThrottleSettings {
                max_failures: args.auth_failures_per_address,
                window: Duration::from_millis(args.auth_failure_window_ms),
                ..Default::default()
            },
            changelog: tumbler_engine::changelog::ChangelogSettings {
                namespaces: (args.changelog_namespaces.iter())
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .collect(),
                size: args.changelog_size,
                retention_ms: args.changelog_retention_ms,
                reads_per_second: std::num::NonZeroU32::new(args.changelog_reads_per_second)
                    .unwrap_or(std::num::NonZeroU32::MIN),
            },
            transport: TransportLimits {
                max_request_bytes: args.max_request_bytes as usize,
                max_concurrent_streams: args.max_concurrent_streams,
                max_sessions: args.max_sessions as usize,
                max_watchers: args.max_watchers as usize,
                max_sessions_per_token: args.max_sessions_per_token as usize,
                max_watchers_per_token: args.max_watchers_per_token as usize,
                max_watchers_per_namespace: args.max_watchers_per_namespace as usize,
                max_waiters_per_token: args.max_waiters_per_token as usize,
                connections: crate::limits::ConnLimits {
                    max_connections: args.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS)
                        as usize,
                    max_connections_chosen: args.max_connections.is_some(),
                    max_connections_per_ip: args.max_connections_per_ip as usize,
                    idle_timeout: Duration::from_millis(args.idle_timeout_ms),
                    header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
                    body_read_timeout: Duration::from_millis(args.body_read_timeout_ms),
                    keepalive_interval: Duration::from_millis(args.http2_keepalive_interval_ms),
                    keepalive_timeout: Duration::from_millis(args.http2_keepalive_timeout_ms),
                },
            },
            tls: None,
        })
    }
}

/// `tumbler serve` flags.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address of the gRPC port.
    #[arg(long, env = "TUMBLER_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    /// Redis to keep the locks in: `redis://[user:password@]host:port[/db]`,
    /// a Redis Cluster as `redis+cluster://host:port,host:port,…` (seed
    /// nodes), or a Sentinel-managed master as
    /// `redis+sentinel://host:port,host:port,…/<master-name>[/db]`.
    #[arg(
        long,
        env = "TUMBLER_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// After SIGTERM, how long to keep serving while health reports
    /// NOT_SERVING, so load balancers and Kubernetes endpoints stop sending
    /// new work before the port closes.
    #[arg(long, env = "TUMBLER_SHUTDOWN_DRAIN_MS", default_value_t = 5_000)]
    pub shutdown_drain_ms: u64,
    #[command(flatten)]
    pub observability: ObservabilityArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
}

impl ServeArgs {
    /// The config's Redis side only (where, how, the layout), for a
    /// command that talks to Redis and serves nothing: `upgrade-layout`.
    pub fn redis_config(&self) -> anyhow::Result<ServerConfig> {
        let mut config = ServerConfig::new(self.redis_url.clone(), &self.service)?;
        config.store.credentials = self.redis.credentials()?;
        tumbler_store::Store::check(&config.store).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(config)
    }

    pub fn server_config(&self) -> anyhow::Result<ServerConfig> {
        let auth = &self.service.auth;
        anyhow::ensure!(
            auth.auth_tokens_file.is_some() || auth.no_auth,
            "authentication is not configured: give --auth-tokens-file FILE (bearer tokens), or --no-auth to let every caller do everything"
        );
        if auth.no_auth {
            tracing::warn!(
                "AUTHENTICATION IS OFF (--no-auth): any client that reaches this port can acquire, release and clear every lock in every namespace"
            );
        }
        let mut config = self.redis_config()?;
        config.shutdown_drain = Duration::from_millis(self.shutdown_drain_ms);
        config.dashboard_admin = self.observability.dashboard_admin;
        config.tls = self.tls.settings()?;
        Ok(config)
    }
}

/// `tumbler dev` flags.
#[derive(Args, Clone, Debug)]
pub struct DevArgs {
    /// gRPC address [default: 127.0.0.1:50051, or a free port if taken]; one given must be free.
    #[arg(long, env = "TUMBLER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// The redis-server program to start.
    #[arg(long, env = "TUMBLER_REDIS_SERVER", default_value = "redis-server")]
    pub redis_server: String,
    #[command(flatten)]
    pub observability: ObservabilityArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
}
