//! Client subcommands for people and shell scripts: `tumbler acquire`,
//! `release`, `extend`, `inspect`, `queue`, `list`, `reap`, `clear` and
//! `metrics` against a running server.
//!
//! Output is a table by default and the reply as JSON with `--json` (field
//! names as in the proto, enum values without their type prefix, integers
//! as numbers). Exit codes: 0 success (acquired, already held, released,
//! extended, inspected), 1 the lock was not acquired or is not held, 2 an
//! error (the gRPC status is printed on stderr).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use comfy_table::{Table, presets};
use serde_json::{Value, json};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::proto::{self, lock_service_client::LockServiceClient};

/// Exit code: the request did what it asked.
const SUCCESS: u8 = 0;
/// Exit code: answered, but not acquired / not held.
const REFUSED: u8 = 1;
/// Exit code: no answer (bad input, server or Redis trouble, no connection).
const ERROR: u8 = 2;

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Take a permit of a lock (exit 1 when not acquired).
    Acquire(AcquireArgs),
    /// Give a grant back (exit 1 when not held).
    Release(ReleaseArgs),
    /// Renew a grant's lease (exit 1 when not held: the lock was lost).
    Extend(ExtendArgs),
    /// Show a lock's holders.
    Inspect(InspectArgs),
    /// Show a lock's waiting requests in grant order.
    Queue(QueueArgs),
    /// List a namespace's locks (all pages, or one with --page-token).
    List(ListArgs),
    /// Clean up a namespace now: expired leases, dead waiters, stale entries.
    Reap(ReapArgs),
    /// Admin: release every lock and drop every queue of a namespace.
    Clear(ClearArgs),
    /// Per-kind counters (acquired, denied, released, …) over a time range.
    Metrics(MetricsArgs),
    /// Hold a lock through a session for as long as this process lives, or
    /// while a command runs: `tumbler hold NAME -- CMD ARGS…` (the lock is
    /// released when the command ends, or when this process dies).
    Hold(HoldArgs),
    /// Make a bearer token: prints the token (give it to the client) and
    /// its entry for the --auth-tokens-file (which keeps only a digest).
    Token(TokenArgs),
}

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The token's name in logs.
    #[arg(long)]
    pub name: String,
    /// `client` (locks in its namespaces) or `admin` (also clear, reap
    /// with a cutoff).
    #[arg(long, default_value = "client", value_parser = ["client", "admin"])]
    pub role: String,
    /// A namespace it may act in (repeat for more; `prefix*` and `*` work).
    #[arg(long = "namespace", required = true)]
    pub namespaces: Vec<String>,
    /// Hash this token instead of making a new one.
    #[arg(long)]
    pub existing: Option<String>,
}

#[derive(Args, Debug)]
pub struct HoldArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// Holders allowed at once (default 1: a mutex).
    #[arg(long)]
    pub limit: Option<u32>,
    /// The session TTL: how long the lock outlives this process if it dies
    /// without a word (default: the server's lease).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// How long to wait for the lock; 0 tries once.
    #[arg(long, default_value_t = 0)]
    pub wait_ms: u64,
    /// A short label for metrics.
    #[arg(long, default_value = "")]
    pub kind: String,
    /// The command to run while holding the lock (gets TUMBLER_FENCING_TOKEN
    /// and TUMBLER_SLOT in its environment).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Which namespace.
#[derive(Args, Debug)]
pub struct NamespaceArg {
    /// The namespace (empty: `default`).
    #[arg(long, short = 'n', env = "TUMBLER_NAMESPACE", default_value = "")]
    pub namespace: String,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub namespace: NamespaceArg,
    /// Only names that start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Only locks with waiting requests.
    #[arg(long)]
    pub waiting: bool,
    /// Locks per page (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub page_size: u32,
    /// Fetch only this page (from a previous reply); default: every page.
    #[arg(long)]
    pub page_token: Option<String>,
}

#[derive(Args, Debug)]
pub struct ReapArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub namespace: NamespaceArg,
    /// Also drop grants and waiting requests older than this (ms).
    #[arg(long)]
    pub older_than_ms: Option<u64>,
}

#[derive(Args, Debug)]
pub struct ClearArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub namespace: NamespaceArg,
    /// Required: clearing releases locks that others hold.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Args, Debug)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub namespace: NamespaceArg,
    /// How far back, in minutes (default: the last hour; at most 1440).
    #[arg(long, default_value_t = 60)]
    pub minutes: i64,
    /// Only this kind.
    #[arg(long, default_value = "")]
    pub kind: String,
    /// One row per minute and kind instead of totals per kind.
    #[arg(long)]
    pub per_minute: bool,
}

/// Where to send the request and how to print the reply.
#[derive(Args, Debug)]
pub struct Target {
    /// The tumbler server's gRPC address (`https://…` for TLS).
    #[arg(long, env = "TUMBLER_ADDR", default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// With https: trust the CA(s) in this PEM file instead of the
    /// system's roots.
    #[arg(long, env = "TUMBLER_TLS_CA_FILE", value_name = "PATH")]
    pub tls_ca_file: Option<PathBuf>,
    /// With https: present this client certificate (PEM), for servers that
    /// require mutual TLS; needs --tls-key-file.
    #[arg(long, env = "TUMBLER_TLS_CLIENT_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, env = "TUMBLER_TLS_CLIENT_KEY_FILE", value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// With https: the name the server's certificate must carry (also sent
    /// as SNI); default: the host in --addr.
    #[arg(long, env = "TUMBLER_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Print the reply as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Bearer token, for a server with authentication on (prefer the
    /// environment variable: arguments show in process lists).
    #[arg(long, env = "TUMBLER_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
}

/// Which lock.
#[derive(Args, Debug)]
pub struct LockName {
    /// The lock's namespace (empty: `default`).
    #[arg(long, short = 'n', env = "TUMBLER_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// The lock's name.
    pub name: String,
}

#[derive(Args, Debug)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// Who takes the permit (empty: the server makes an id and prints it).
    #[arg(long, default_value = "")]
    pub holder: String,
    /// Holders allowed at once (default 1: a mutex).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Lease length (default: the server's).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// How long to wait for a permit in the server; 0 tries once.
    #[arg(long, default_value_t = 0)]
    pub wait_ms: u64,
    /// How long a waiting request outlives its server (default: the server's).
    #[arg(long)]
    pub queue_ttl_ms: Option<u64>,
    /// Higher goes first in the queue (-1000..=1000).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Take any free permit at once, whoever waits (not fair).
    #[arg(long)]
    pub barging: bool,
    /// A short label for metrics ([a-z0-9_.-]).
    #[arg(long, default_value = "")]
    pub kind: String,
    /// Metadata stored with the grant, as key=value; repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub metadata: Vec<(String, String)>,
}

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// The holder whose grant to give back.
    #[arg(long)]
    pub holder: String,
    /// Only if the grant carries this fencing token.
    #[arg(long)]
    pub token: Option<u64>,
}

#[derive(Args, Debug)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// The holder whose lease to renew.
    #[arg(long)]
    pub holder: String,
    /// The new remaining lease (default: the grant's own ttl).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// Only if the grant carries this fencing token.
    #[arg(long)]
    pub token: Option<u64>,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
}

#[derive(Args, Debug)]
pub struct QueueArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// How many requests to show from the head (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub max_entries: u32,
}

fn parse_meta(value: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{value:?}: expected KEY=VALUE"))
}

/// Runs one client subcommand and returns its exit code.
pub async fn run(command: ClientCommand) -> ExitCode {
    let code = match execute(command).await {
        Ok(code) => code,
        Err(status) => {
            eprintln!(
                "error: {}: {}",
                crate::observe::code_name(status.code()),
                with_causes(status.message(), std::error::Error::source(&status))
            );
            ERROR
        }
    };
    ExitCode::from(code)
}

/// `message`, followed by the causes below it that it does not already
/// end with (a transport error's own text is generic: "transport error").
fn with_causes(message: &str, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = message.to_owned();
    while let Some(inner) = source {
        let cause = inner.to_string();
        if !text.ends_with(&cause) {
            text = format!("{text}: {cause}");
        }
        source = inner.source();
    }
    text
}

/// A lock service client that sends the caller's bearer token, if any.
type Client = LockServiceClient<InterceptedService<Channel, BearerToken>>;

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
struct BearerToken(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

async fn connect(target: &Target) -> Result<Client, tonic::Status> {
    let token = match &target.auth_token {
        Some(token) => Some(format!("Bearer {}", token.trim()).parse().map_err(|_| {
            tonic::Status::invalid_argument("--auth-token: not a printable ASCII token")
        })?),
        None => None,
    };
    let mut endpoint = Endpoint::from_shared(target.addr.clone())
        .map_err(|e| tonic::Status::invalid_argument(format!("--addr {:?}: {e}", target.addr)))?
        .connect_timeout(Duration::from_secs(5));
    if endpoint.uri().scheme_str() == Some("https") {
        endpoint = endpoint
            .tls_config(client_tls(target)?)
            .map_err(|e| tonic::Status::invalid_argument(format!("TLS settings: {e}")))?;
    } else if target.tls_ca_file.is_some()
        || target.tls_cert_file.is_some()
        || target.tls_key_file.is_some()
        || target.tls_server_name.is_some()
    {
        return Err(tonic::Status::invalid_argument(
            "the --tls-* flags need an https:// --addr",
        ));
    }
    let channel = endpoint.connect().await.map_err(|e| {
        let cause = with_causes(&e.to_string(), std::error::Error::source(&e));
        tonic::Status::unavailable(format!("cannot connect to {}: {cause}", target.addr))
    })?;
    Ok(LockServiceClient::with_interceptor(
        channel,
        BearerToken(token),
    ))
}

/// The client side of TLS, from the `--tls-*` flags.
fn client_tls(target: &Target) -> Result<ClientTlsConfig, tonic::Status> {
    fn read(path: &Path, flag: &str) -> Result<Vec<u8>, tonic::Status> {
        std::fs::read(path).map_err(|e| {
            tonic::Status::invalid_argument(format!("cannot read {flag} {}: {e}", path.display()))
        })
    }
    let mut tls = ClientTlsConfig::new();
    tls = match &target.tls_ca_file {
        Some(path) => tls.ca_certificate(Certificate::from_pem(read(path, "--tls-ca-file")?)),
        None => tls.with_native_roots(),
    };
    match (&target.tls_cert_file, &target.tls_key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read(cert, "--tls-cert-file")?,
                read(key, "--tls-key-file")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(tonic::Status::invalid_argument(
                "--tls-cert-file and --tls-key-file go together",
            ));
        }
    }
    if let Some(name) = &target.tls_server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(tls)
}

async fn execute(command: ClientCommand) -> Result<u8, tonic::Status> {
    match command {
        ClientCommand::Acquire(args) => {
            let request = proto::AcquireRequest {
                namespace: args.lock.namespace,
                name: args.lock.name,
                holder: args.holder,
                limit: args.limit,
                ttl_ms: args.ttl_ms,
                kind: args.kind,
                metadata: args.metadata.into_iter().collect(),
                wait_ms: args.wait_ms,
                queue_ttl_ms: args.queue_ttl_ms,
                priority: args.priority,
                fair: args.barging.then_some(false),
            };
            let lock = display_name(&request.namespace, &request.name);
            let reply = connect(&args.target)
                .await?
                .acquire(request)
                .await?
                .into_inner();
            let code = match reply.status() {
                proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld => SUCCESS,
                _ => REFUSED,
            };
            if args.target.json {
                print_json(&acquire_json(&reply));
            } else {
                print_acquire(&lock, &reply);
            }
            Ok(code)
        }
        ClientCommand::Release(args) => {
            let request = proto::ReleaseRequest {
                namespace: args.lock.namespace,
                name: args.lock.name,
                holder: args.holder,
                fencing_token: args.token,
            };
            let lock = display_name(&request.namespace, &request.name);
            let holder = request.holder.clone();
            let reply = connect(&args.target)
                .await?
                .release(request)
                .await?
                .into_inner();
            let status = enum_name(reply.status().as_str_name(), "RELEASE_STATUS_");
            if args.target.json {
                print_json(&json!({ "status": status }));
            } else {
                println!("{status} {lock} (holder {holder})");
            }
            Ok(match reply.status() {
                proto::ReleaseStatus::Released => SUCCESS,
                _ => REFUSED,
            })
        }
        ClientCommand::Extend(args) => {
            let request = proto::ExtendRequest {
                namespace: args.lock.namespace,
                name: args.lock.name,
                holder: args.holder,
                ttl_ms: args.ttl_ms,
                fencing_token: args.token,
            };
            let lock = display_name(&request.namespace, &request.name);
            let holder = request.holder.clone();
            let reply = connect(&args.target)
                .await?
                .extend(request)
                .await?
                .into_inner();
            let status = enum_name(reply.status().as_str_name(), "EXTEND_STATUS_");
            if args.target.json {
                print_json(&json!({
                    "status": status,
                    "grant": reply.grant.as_ref().map(grant_json),
                }));
            } else {
                println!("{status} {lock} (holder {holder})");
                if let Some(grant) = &reply.grant {
                    println!("{}", grant_table(grant, now_ms()));
                }
            }
            Ok(match reply.status() {
                proto::ExtendStatus::Extended => SUCCESS,
                _ => REFUSED,
            })
        }
        ClientCommand::Inspect(args) => {
            let reply = connect(&args.target)
                .await?
                .inspect(proto::InspectRequest {
                    namespace: args.lock.namespace,
                    name: args.lock.name,
                })
                .await?
                .into_inner();
            if args.target.json {
                print_json(&inspect_json(&reply));
            } else {
                print_inspect(&reply);
            }
            Ok(SUCCESS)
        }
        ClientCommand::Queue(args) => {
            let reply = connect(&args.target)
                .await?
                .queue(proto::QueueRequest {
                    namespace: args.lock.namespace,
                    name: args.lock.name,
                    max_entries: args.max_entries,
                })
                .await?
                .into_inner();
            if args.target.json {
                print_json(&queue_json(&reply));
            } else {
                print_queue(&reply);
            }
            Ok(SUCCESS)
        }
        ClientCommand::List(args) => {
            let mut client = connect(&args.target).await?;
            let single_page = args.page_token.is_some();
            let mut token = args.page_token.unwrap_or_default();
            let mut locks = Vec::new();
            let next = loop {
                let page = client
                    .list(proto::ListRequest {
                        namespace: args.namespace.namespace.clone(),
                        prefix: args.prefix.clone(),
                        page_size: args.page_size,
                        page_token: token,
                        only_waiting: args.waiting,
                    })
                    .await?
                    .into_inner();
                locks.extend(page.locks);
                if single_page || page.next_page_token.is_empty() {
                    break page.next_page_token;
                }
                token = page.next_page_token;
            };
            if args.target.json {
                print_json(&json!({
                    "locks": locks.iter().map(|l| json!({
                        "name": l.name,
                        "holders": l.holders,
                        "limit": l.limit,
                        "waiters": l.waiters,
                        "next_expiry_at_ms": l.next_expiry_at_ms,
                    })).collect::<Vec<_>>(),
                    "next_page_token": next,
                }));
            } else {
                print_list(&locks, &next);
            }
            Ok(SUCCESS)
        }
        ClientCommand::Reap(args) => {
            let reply = connect(&args.target)
                .await?
                .reap(proto::ReapRequest {
                    namespace: args.namespace.namespace,
                    older_than_ms: args.older_than_ms,
                })
                .await?
                .into_inner();
            let counts = [
                ("expired_holders", reply.expired_holders),
                ("dead_waiters", reply.dead_waiters),
                ("stale_index_entries", reply.stale_index_entries),
                ("old_grants", reply.old_grants),
                ("old_waiters", reply.old_waiters),
                ("locks_visited", reply.locks_visited),
            ];
            print_counts(args.target.json, &counts);
            Ok(SUCCESS)
        }
        ClientCommand::Clear(args) => {
            if !args.yes {
                return Err(tonic::Status::failed_precondition(
                    "clear releases every lock of the namespace, held by others too: add --yes",
                ));
            }
            let reply = connect(&args.target)
                .await?
                .clear(proto::ClearRequest {
                    namespace: args.namespace.namespace,
                })
                .await?
                .into_inner();
            let counts = [
                ("locks_cleared", reply.locks_cleared),
                ("grants_released", reply.grants_released),
                ("requests_dropped", reply.requests_dropped),
            ];
            print_counts(args.target.json, &counts);
            Ok(SUCCESS)
        }
        ClientCommand::Hold(args) => hold(args).await,
        ClientCommand::Token(args) => {
            let token = match args.existing {
                Some(token) => token,
                None => {
                    crate::auth::new_token().map_err(|e| tonic::Status::internal(e.to_string()))?
                }
            };
            let namespaces = args
                .namespaces
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            println!("# token (give this to the client; it is not stored anywhere):");
            println!("#   {token}");
            println!("[[token]]");
            println!("name = {:?}", args.name);
            println!("sha256 = \"{}\"", crate::auth::token_digest(&token));
            println!("role = \"{}\"", args.role);
            println!("namespaces = [{namespaces}]");
            Ok(SUCCESS)
        }
        ClientCommand::Metrics(args) => {
            let to_ms = now_ms();
            let reply = connect(&args.target)
                .await?
                .metrics(proto::MetricsRequest {
                    namespace: args.namespace.namespace,
                    from_ms: to_ms - args.minutes.max(1) * 60_000,
                    to_ms,
                    kind: args.kind,
                })
                .await?
                .into_inner();
            let mut rows = if args.per_minute {
                reply.minutes.clone()
            } else {
                reply.totals.clone()
            };
            // Every kind together, under the per-kind rows.
            if !args.per_minute
                && rows.len() > 1
                && let Some(overall) = &reply.overall
            {
                rows.push(overall.clone());
            }
            let rows = &rows;
            if args.target.json {
                print_json(&json!({
                    "from_ms": reply.from_ms,
                    "to_ms": reply.to_ms,
                    "rows": rows.iter().map(metrics_row_json).collect::<Vec<_>>(),
                }));
            } else {
                print_metrics(rows, args.per_minute, reply.from_ms, reply.to_ms);
            }
            Ok(SUCCESS)
        }
    }
}

/// `tumbler hold`: a session that takes one lock and keeps it alive until
/// the command ends (or, without a command, until stdin closes or a signal
/// arrives). A lost grant is reported on stderr and stops the command.
async fn hold(args: HoldArgs) -> Result<u8, tonic::Status> {
    use proto::session_request::Command;
    use proto::session_response::Event;
    let mut client = connect(&args.target).await?;
    let (commands, outbox) = tokio::sync::mpsc::channel(16);
    let send = |command| proto::SessionRequest {
        command: Some(command),
    };
    let _ = commands
        .send(send(Command::Open(proto::SessionOpen {
            ttl_ms: args.ttl_ms,
        })))
        .await;
    let _ = commands
        .send(send(Command::Acquire(proto::SessionAcquire {
            request_id: 1,
            acquire: Some(proto::AcquireRequest {
                namespace: args.lock.namespace.clone(),
                name: args.lock.name.clone(),
                limit: args.limit,
                wait_ms: args.wait_ms,
                kind: args.kind.clone(),
                ..Default::default()
            }),
        })))
        .await;
    let mut events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await?
        .into_inner();
    let lock = display_name(&args.lock.namespace, &args.lock.name);
    let mut keep_alive_every = Duration::from_secs(1);
    let grant = loop {
        match events.message().await? {
            Some(proto::SessionResponse {
                event: Some(Event::Opened(opened)),
            }) => keep_alive_every = Duration::from_millis((opened.ttl_ms / 3).max(10)),
            Some(proto::SessionResponse {
                event: Some(Event::Acquired(acquired)),
            }) => {
                let reply = acquired.response.unwrap_or_default();
                match reply.grant {
                    Some(grant) => break grant,
                    None => {
                        print_acquire(&lock, &reply);
                        return Ok(REFUSED);
                    }
                }
            }
            Some(proto::SessionResponse {
                event: Some(Event::Error(error)),
            }) => {
                return Err(tonic::Status::new(error.code.into(), error.message));
            }
            Some(_) => {}
            None => return Err(tonic::Status::unavailable("the session ended")),
        }
    };
    println!(
        "HOLDING {lock} token={} slot={} (session {})",
        grant.fencing_token, grant.slot, grant.holder
    );
    let mut child = match args.command.split_first() {
        Some((program, rest)) => Some(
            tokio::process::Command::new(program)
                .args(rest)
                .env("TUMBLER_FENCING_TOKEN", grant.fencing_token.to_string())
                .env("TUMBLER_SLOT", grant.slot.to_string())
                .spawn()
                .map_err(|e| tonic::Status::invalid_argument(format!("{program}: {e}")))?,
        ),
        None => None,
    };
    let mut stdin_closed = Box::pin(async {
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
    });
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| tonic::Status::internal(e.to_string()))?;
    let mut ticker = tokio::time::interval(keep_alive_every);
    let code = loop {
        tokio::select! {
            _ = ticker.tick() => {
                let _ = commands.send(send(Command::KeepAlive(proto::SessionKeepAlive {}))).await;
            }
            event = events.message() => match event {
                Ok(Some(proto::SessionResponse { event: Some(Event::Lost(lost)) })) => {
                    eprintln!("LOST {lock}: {}", lost.reason);
                    if let Some(child) = child.as_mut() {
                        let _ = child.start_kill();
                    }
                    break REFUSED;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    eprintln!("LOST {lock}: the session ended");
                    if let Some(child) = child.as_mut() {
                        let _ = child.start_kill();
                    }
                    break ERROR;
                }
            },
            status = async { child.as_mut().unwrap().wait().await }, if child.is_some() => {
                let status = status.map_err(|e| tonic::Status::internal(e.to_string()))?;
                break status.code().map_or(ERROR, |c| c.clamp(0, 255) as u8);
            }
            () = &mut stdin_closed, if child.is_none() => break SUCCESS,
            _ = terminate.recv() => break SUCCESS,
            _ = tokio::signal::ctrl_c() => break SUCCESS,
        }
    };
    // Closing the session releases the lock.
    drop(commands);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(Some(_)) = events.message().await {}
    })
    .await;
    Ok(code)
}

/// The counters of a metrics row, in table order.
fn counter_columns(row: &proto::MetricsRow) -> [(&'static str, u64); 8] {
    [
        ("acquired", row.acquired),
        ("denied", row.denied),
        ("timed_out", row.timed_out),
        ("released", row.released),
        ("extended", row.extended),
        ("expired", row.expired),
        ("reaped", row.reaped),
        ("errors", row.errors),
    ]
}

fn metrics_row_json(row: &proto::MetricsRow) -> Value {
    let mut value = json!({ "minute_ms": row.minute_ms, "kind": row.kind });
    for (name, count) in counter_columns(row) {
        value[name] = count.into();
    }
    value
}

fn print_counts(json: bool, counts: &[(&str, u64)]) {
    if json {
        let value: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(name, count)| ((*name).to_owned(), (*count).into()))
            .collect();
        print_json(&Value::Object(value));
    } else {
        let mut table = new_table();
        table.set_header(["", "count"]);
        for (name, count) in counts {
            table.add_row([name.replace('_', " "), count.to_string()]);
        }
        println!("{table}");
    }
}

fn print_list(locks: &[proto::LockSummary], next: &str) {
    let now = now_ms();
    let mut table = new_table();
    table.set_header(["name", "holders", "limit", "waiters", "next expiry"]);
    for lock in locks {
        let expiry = if lock.next_expiry_at_ms > 0 {
            when(lock.next_expiry_at_ms, now)
        } else {
            "-".to_owned()
        };
        table.add_row([
            lock.name.clone(),
            lock.holders.to_string(),
            lock.limit.to_string(),
            lock.waiters.to_string(),
            expiry,
        ]);
    }
    println!("{} lock(s)", locks.len());
    if !locks.is_empty() {
        println!("{table}");
    }
    if !next.is_empty() {
        println!("next page: --page-token {next}");
    }
}

/// The per-kind table of the seed's web "Locks" tab.
fn print_metrics(rows: &[proto::MetricsRow], per_minute: bool, from_ms: i64, to_ms: i64) {
    println!("{} → {}", rfc3339(from_ms), rfc3339(to_ms));
    let mut table = new_table();
    let mut header = vec![if per_minute { "minute" } else { "kind" }];
    if per_minute {
        header.push("kind");
    }
    header.extend([
        "acquired",
        "denied",
        "timed out",
        "released",
        "extended",
        "expired",
        "reaped",
        "errors",
    ]);
    table.set_header(header);
    for row in rows {
        let mut cells = Vec::new();
        if per_minute {
            cells.push(rfc3339(row.minute_ms));
        }
        cells.push(row.kind.clone());
        cells.extend(
            counter_columns(row)
                .iter()
                .map(|(_, count)| count.to_string()),
        );
        table.add_row(cells);
    }
    if rows.is_empty() {
        println!("no lock activity in this range");
    } else {
        println!("{table}");
    }
}

// ---- JSON: the one place where replies are mapped to serde_json. ----

fn print_json(value: &Value) {
    println!("{value:#}");
}

/// `ACQUIRE_STATUS_ACQUIRED` → `ACQUIRED`.
fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix).unwrap_or(full).to_owned()
}

fn grant_json(grant: &proto::Grant) -> Value {
    json!({
        "holder": grant.holder,
        "fencing_token": grant.fencing_token,
        "slot": grant.slot,
        "acquired_at_ms": grant.acquired_at_ms,
        "expires_at_ms": grant.expires_at_ms,
        "ttl_ms": grant.ttl_ms,
        "kind": grant.kind,
        "metadata": grant.metadata,
    })
}

fn acquire_json(reply: &proto::AcquireResponse) -> Value {
    let mut value = json!({
        "status": enum_name(reply.status().as_str_name(), "ACQUIRE_STATUS_"),
        "holders": reply.holders,
    });
    if let Some(grant) = &reply.grant {
        value["grant"] = grant_json(grant);
    }
    if reply.status() == proto::AcquireStatus::NotAcquired {
        value["reason"] = enum_name(reply.reason().as_str_name(), "NOT_ACQUIRED_REASON_").into();
        value["next_expiry_at_ms"] = reply.next_expiry_at_ms.into();
        if reply.queue_position > 0 {
            value["queue_position"] = reply.queue_position.into();
        }
    }
    value
}

fn inspect_json(reply: &proto::InspectResponse) -> Value {
    json!({
        "namespace": reply.namespace,
        "name": reply.name,
        "limit": reply.limit,
        "waiters": reply.waiters,
        "now_ms": reply.now_ms,
        "holders": reply.holders.iter().map(|holder| json!({
            "grant": holder.grant.as_ref().map(grant_json),
            "remaining_ms": holder.remaining_ms,
        })).collect::<Vec<_>>(),
    })
}

fn queue_json(reply: &proto::QueueResponse) -> Value {
    json!({
        "namespace": reply.namespace,
        "name": reply.name,
        "waiters": reply.waiters,
        "now_ms": reply.now_ms,
        "requests": reply.requests.iter().map(|r| json!({
            "holder": r.holder,
            "position": r.position,
            "priority": r.priority,
            "enqueued_at_ms": r.enqueued_at_ms,
            "expires_at_ms": r.expires_at_ms,
            "wait_deadline_ms": r.wait_deadline_ms,
            "fair": r.fair,
            "kind": r.kind,
        })).collect::<Vec<_>>(),
    })
}

// ---- Tables and times for people. ----

fn display_name(namespace: &str, name: &str) -> String {
    if namespace.is_empty() || namespace == "default" {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// A Redis-clock timestamp as RFC 3339 (UTC, milliseconds).
fn rfc3339(at_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(at_ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

/// `in 29s`, `3m 2s ago`: whole seconds from 10 s on, milliseconds below.
fn relative(delta_ms: i64) -> String {
    let size = delta_ms.unsigned_abs();
    let size = if size >= 10_000 {
        size / 1000 * 1000
    } else {
        size
    };
    let text = humantime::format_duration(Duration::from_millis(size));
    if size == 0 {
        "now".to_owned()
    } else if delta_ms > 0 {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A timestamp with its distance from `now_ms`.
fn when(at_ms: i64, now_ms: i64) -> String {
    format!("{} ({})", rfc3339(at_ms), relative(at_ms - now_ms))
}

fn metadata_text(metadata: &std::collections::HashMap<String, String>) -> String {
    let mut pairs: Vec<_> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(", ")
}

fn new_table() -> Table {
    let mut table = Table::new();
    table.load_preset(presets::UTF8_FULL_CONDENSED);
    table
}

fn grant_table(grant: &proto::Grant, now_ms: i64) -> Table {
    let mut table = new_table();
    table.set_header(["field", "value"]);
    table.add_row(["holder".to_owned(), grant.holder.clone()]);
    table.add_row(["fencing token".to_owned(), grant.fencing_token.to_string()]);
    table.add_row(["slot".to_owned(), grant.slot.to_string()]);
    table.add_row(["acquired".to_owned(), when(grant.acquired_at_ms, now_ms)]);
    table.add_row(["expires".to_owned(), when(grant.expires_at_ms, now_ms)]);
    table.add_row([
        "ttl".to_owned(),
        humantime::format_duration(Duration::from_millis(grant.ttl_ms)).to_string(),
    ]);
    table.add_row(["kind".to_owned(), grant.kind.clone()]);
    if !grant.metadata.is_empty() {
        table.add_row(["metadata".to_owned(), metadata_text(&grant.metadata)]);
    }
    table
}

fn print_acquire(lock: &str, reply: &proto::AcquireResponse) {
    let status = enum_name(reply.status().as_str_name(), "ACQUIRE_STATUS_");
    match &reply.grant {
        Some(grant) => {
            println!("{status} {lock} (holders now: {})", reply.holders);
            println!("{}", grant_table(grant, now_ms()));
        }
        None => {
            let reason = enum_name(reply.reason().as_str_name(), "NOT_ACQUIRED_REASON_");
            let mut line = format!("{status} {lock}: {reason}, {} holder(s)", reply.holders);
            if reply.next_expiry_at_ms > 0 {
                line += &format!("; a lease ends {}", when(reply.next_expiry_at_ms, now_ms()));
            }
            if reply.queue_position > 0 {
                line += &format!("; was {} in the queue", reply.queue_position);
            }
            println!("{line}");
        }
    }
}

fn print_inspect(reply: &proto::InspectResponse) {
    let lock = display_name(&reply.namespace, &reply.name);
    println!(
        "{lock}: {} holder(s), limit {}, {} waiting",
        reply.holders.len(),
        reply.limit,
        reply.waiters
    );
    if reply.holders.is_empty() {
        return;
    }
    let mut table = new_table();
    table.set_header([
        "slot", "holder", "token", "acquired", "expires", "kind", "metadata",
    ]);
    for holder in &reply.holders {
        let Some(grant) = &holder.grant else { continue };
        table.add_row([
            grant.slot.to_string(),
            grant.holder.clone(),
            grant.fencing_token.to_string(),
            when(grant.acquired_at_ms, reply.now_ms),
            when(grant.expires_at_ms, reply.now_ms),
            grant.kind.clone(),
            metadata_text(&grant.metadata),
        ]);
    }
    println!("{table}");
}

fn print_queue(reply: &proto::QueueResponse) {
    let lock = display_name(&reply.namespace, &reply.name);
    println!("{lock}: {} waiting", reply.waiters);
    if reply.requests.is_empty() {
        return;
    }
    let mut table = new_table();
    table.set_header([
        "position",
        "holder",
        "priority",
        "mode",
        "enqueued",
        "waits until",
    ]);
    for request in &reply.requests {
        table.add_row([
            request.position.to_string(),
            request.holder.clone(),
            request.priority.to_string(),
            if request.fair { "fair" } else { "barging" }.to_owned(),
            when(request.enqueued_at_ms, reply.now_ms),
            when(request.wait_deadline_ms, reply.now_ms),
        ]);
    }
    println!("{table}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times() {
        assert_eq!(relative(0), "now");
        assert_eq!(relative(1500), "in 1s 500ms");
        assert_eq!(relative(29_998), "in 29s");
        assert_eq!(relative(-61_000), "1m 1s ago");
    }

    #[test]
    fn rfc3339_in_utc_with_millis() {
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn meta_pairs() {
        assert_eq!(parse_meta("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_meta("nope").is_err());
    }
}
