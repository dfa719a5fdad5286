//! The `tumbler` command: `serve` runs the service against a Redis you
//! name; `dev` runs it against a private redis-server it starts itself.

use std::io::Write;

use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

use tumbler::config::{DevArgs, LogArgs, ServeArgs, ServerConfig};
use tumbler::dev::RedisServer;
use tumbler::{server, telemetry};

#[derive(Parser)]
#[command(name = "tumbler", version, about = "A gRPC lock service on Redis")]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(&cli.log)?;
    match cli.command {
        Command::Serve(args) => {
            let config = args.server_config()?;
            let listener = bind(args.listen).await?;
            server::serve(config, listener, shutdown_signal()).await
        }
        Command::Dev(args) => {
            let redis = RedisServer::start(&args.redis_server)?;
            let config = ServerConfig::new(redis.url(), &args.service)?;
            let listener = bind(args.listen).await?;
            let addr = listener.local_addr()?;
            // Errors ignored: a closed stdout must not stop the service.
            let _ = writeln!(
                std::io::stdout(),
                "tumbler dev: gRPC on {addr}, private Redis at {url}\n\
                 \x20 try: grpcurl -plaintext -d '{{\"name\":\"demo\",\"ttl_ms\":30000}}' {addr} tumbler.v1.LockService/Acquire\n\
                 \x20 stop with Ctrl-C; the private Redis stops with it",
                url = redis.url()
            );
            let outcome = server::serve(config, listener, shutdown_signal()).await;
            drop(redis);
            outcome
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

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C received"),
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
    }
}
