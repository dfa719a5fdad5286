//! `serve`'s flags for reaching Redis as a user, over TLS: credentials and
//! certificates, kept apart from the flags that shape the service.

use std::time::Duration;

use clap::Args;

/// How `serve` authenticates to Redis and checks its certificate. The
/// URL's own `user:password@` still works; these flags override it, so a
/// password can come from a Secret without being part of a URL.
#[derive(Args, Clone, Debug, Default)]
pub struct RedisArgs {
    /// Redis ACL user (AUTH user password).
    #[arg(long, env = "TUMBLER_REDIS_USERNAME", value_name = "USER")]
    pub redis_username: Option<String>,
    /// Redis password (prefer --redis-password-file or the environment
    /// variable: flags show up in process listings).
    #[arg(
        long,
        env = "TUMBLER_REDIS_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub redis_password: Option<String>,
    /// A file holding the Redis password (a trailing newline is dropped);
    /// re-read like the TLS files, so a rotated Secret is used by new
    /// connections.
    #[arg(long, env = "TUMBLER_REDIS_PASSWORD_FILE", value_name = "PATH")]
    pub redis_password_file: Option<std::path::PathBuf>,
    /// TLS to Redis (rediss://…): CA certificates (PEM) that Redis'
    /// certificate must chain to. Default: the system's roots.
    #[arg(long, env = "TUMBLER_REDIS_TLS_CA_FILE", value_name = "PATH")]
    pub redis_tls_ca_file: Option<std::path::PathBuf>,
    /// TLS to Redis: a client certificate chain (PEM) for Redis'
    /// `tls-auth-clients`; needs --redis-tls-key-file.
    #[arg(long, env = "TUMBLER_REDIS_TLS_CERT_FILE", value_name = "PATH")]
    pub redis_tls_cert_file: Option<std::path::PathBuf>,
    /// The private key (PEM) of --redis-tls-cert-file.
    #[arg(long, env = "TUMBLER_REDIS_TLS_KEY_FILE", value_name = "PATH")]
    pub redis_tls_key_file: Option<std::path::PathBuf>,
    /// How often new Redis connections re-read the password file and the
    /// TLS files; 0 reads them once at start.
    #[arg(
        long,
        env = "TUMBLER_REDIS_RELOAD_INTERVAL_MS",
        default_value_t = 10_000
    )]
    pub redis_reload_interval_ms: u64,
}

impl RedisArgs {
    /// The credentials these flags name (files are read by the store).
    pub fn credentials(&self) -> anyhow::Result<tumbler_store::RedisCredentials> {
        Ok(tumbler_store::RedisCredentials {
            username: self.redis_username.clone().filter(|u| !u.is_empty()),
            password: self.redis_password.clone().filter(|p| !p.is_empty()),
            password_file: self.redis_password_file.clone(),
            tls_ca_file: self.redis_tls_ca_file.clone(),
            tls_cert_file: self.redis_tls_cert_file.clone(),
            tls_key_file: self.redis_tls_key_file.clone(),
            reload_interval: (self.redis_reload_interval_ms > 0)
                .then(|| Duration::from_millis(self.redis_reload_interval_ms)),
        })
    }
}
