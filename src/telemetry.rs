//! Logging: tracing to stderr, human-readable or JSON.

use tracing_subscriber::EnvFilter;

use crate::config::{LogArgs, LogFormat};

pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match args.log_format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("logging: {e}"))
}
