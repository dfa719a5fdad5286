//! The store's one error type: whether Redis was unreachable (the caller
//! answers UNAVAILABLE) or answered with something unexpected (a bug, not
//! an outage), and how a redis-rs error or reply is sorted into the two.

use redis::{RedisError, Value};

/// What went wrong talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis is unreachable, timed out, or cannot serve writes right now
    /// (loading, read-only replica, cluster down, failover under way, too
    /// few replicas acknowledged a grant). Nothing was granted — or, for a
    /// grant that replicas did not acknowledge, nothing the caller may
    /// count on.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// Redis refused the configured user a command, a key or a channel
    /// tumbler needs (ACL `NOPERM`): nothing ran. The text names what is
    /// missing and what to grant; the caller answers UNAVAILABLE, since
    /// the fix is the operator's, not the client's.
    #[error("{0}")]
    Denied(String),
    /// Redis answered, but not as the scripts promise (a bug, not an outage).
    #[error("redis reply not understood: {0}")]
    Protocol(String),
    /// The Redis settings cannot be used (a `--redis-url` the redis crate
    /// refuses, a credentials or TLS file that cannot be read, TLS files
    /// without a TLS URL): found before any connection, names the flag.
    #[error("redis settings: {0}")]
    Config(String),
}

/// Error codes that mean "not now" rather than "wrong".
fn transient_code(code: &str) -> bool {
    matches!(
        code,
        "OOM"
            | "BUSY"
            | "MISCONF"
            | "NOREPLICAS"
            | "LOADING"
            | "READONLY"
            | "MASTERDOWN"
            | "TRYAGAIN"
            | "CLUSTERDOWN"
            | "MOVED"
            | "ASK"
    )
}

/// What an operator reads about a refusal of Redis' ACL, `None` when
/// `err` is none: the command, key or channel refused, and what to grant
/// (`prefix` is the deployment's key prefix, for the pattern to grant).
/// Redis says `NOPERM … to run the 'fcall' command` or `… to access one
/// of the keys used as arguments` for the call itself, and `ERR The user
/// executing the script can't run this command` for a command inside a
/// function.
pub(crate) fn denial(err: &RedisError, prefix: Option<&str>) -> Option<String> {
    let text = err.to_string();
    let pattern = |sigil: &str| match prefix {
        Some(prefix) => format!("{sigil}{prefix}:*"),
        None => format!("{sigil}<key prefix>:*"),
    };
    if text.contains("can't run this command or subcommand") {
        return Some(
            "the redis user may not run a command inside tumbler's functions: grant the commands docs/operating.md lists under \"Redis requirements\" (Redis' ACL LOG names the one refused)".into(),
        );
    }
    let noperm = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        || err.code() == Some("NOPERM")
        || text.contains("NOPERM")
        || text.contains("NoPerm");
    if !noperm {
        return None;
    }
    if let Some(command) = text
        .split("to run the '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
    {
        let command = command.to_ascii_lowercase();
        let name = command.replace('|', " ").to_ascii_uppercase();
        let grant = match command.split('|').next().unwrap_or_default() {
            "fcall" | "fcall_ro" | "function" => {
                "+@scripting (or +fcall +fcall_ro +function|load +function|list)".to_owned()
            }
            _ => format!("+{command}"),
        };
        return Some(format!("the redis user may not run {name}: grant {grant}"));
    }
    if text.contains("channel") {
        return Some(format!(
            "the redis user may not use tumbler's Pub/Sub channels: grant {}",
            pattern("&")
        ));
    }
    if text.contains("key") {
        return Some(format!(
            "the redis user may not access tumbler's keys: grant {}",
            pattern("~")
        ));
    }
    Some(format!(
        "the redis user is refused by redis' ACL ({text}): see docs/operating.md \"Redis requirements\""
    ))
}

/// What an operator reads when Redis refuses the credentials (a missing
/// or wrong password), `None` for any other error.
pub(crate) fn auth_refusal(err: &RedisError) -> Option<&'static str> {
    let text = err.to_string();
    if text.contains("WRONGPASS")
        || text.contains("invalid username-password")
        || err.kind() == redis::ErrorKind::AuthenticationFailed
    {
        Some(
            "redis refused the username or password (WRONGPASS): check --redis-username and --redis-password[-file]",
        )
    } else if text.contains("NOAUTH") || text.contains("Authentication required") {
        Some(
            "redis requires a password (NOAUTH): set --redis-password-file (and --redis-username for an ACL user)",
        )
    } else {
        None
    }
}

/// Why a new connection to Redis failed, phrased for the operator: the
/// cause (refused, name not resolved, certificate not trusted, password
/// missing or wrong, an ACL refusal) and what to check, then Redis' or
/// the OS's own words. The same text is logged, reported by health and
/// sent with every UNAVAILABLE until a connection succeeds.
pub(crate) fn connect_reason(err: &RedisError, target: &str, prefix: Option<&str>) -> String {
    if let Some(denied) = denial(err, prefix) {
        return denied;
    }
    let text = err.to_string();
    let lower = text.to_ascii_lowercase();
    let io_kind = std::error::Error::source(err)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    let cause = if let Some(refused) = auth_refusal(err) {
        refused.to_owned()
    } else if lower.contains("certificate")
        || lower.contains("unknownissuer")
        || (lower.contains("tls") && lower.contains("handshake"))
    {
        format!(
            "the TLS connection to {target} failed: redis' certificate is not trusted or does not match; check --redis-tls-ca-file (the CA that signed redis' certificate) and the host name in --redis-url"
        )
    } else if io_kind == Some(std::io::ErrorKind::ConnectionRefused)
        || lower.contains("connection refused")
    {
        format!("{target} refused the connection: is redis running and listening there?")
    } else if lower.contains("lookup address")
        || lower.contains("name or service not known")
        || lower.contains("name resolution")
        || lower.contains("nodename nor servname")
        || lower.contains("no address")
    {
        format!("cannot resolve the host of {target} (DNS): check the host name in --redis-url")
    } else if err.is_timeout() || lower.contains("timed out") {
        format!(
            "{target} did not answer in time: check the address, firewalls, and --redis-timeout-ms"
        )
    } else {
        format!("cannot connect to {target}")
    };
    format!("{cause} ({text})")
}

impl StoreError {
    pub(crate) fn from_redis(err: RedisError) -> Self {
        Self::classify(err, None)
    }

    /// [`Self::from_redis`] knowing the deployment's key prefix (for the
    /// key pattern an ACL refusal asks to grant).
    pub(crate) fn classify(err: RedisError, prefix: Option<&str>) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        if let Some(denied) = denial(&err, prefix) {
            return StoreError::Denied(denied);
        }
        if let Some(refused) = auth_refusal(&err) {
            // On a connection that was open before the password changed
            // (or was made without one): an outage until it is fixed.
            return StoreError::Unavailable(format!("{refused} ({err})"));
        }
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_cluster_error()
            || err.is_unrecoverable_error()
            || matches!(
                err.kind(),
                ErrorKind::Server(
                    ServerErrorKind::ReadOnly
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                ) | ErrorKind::ClusterConnectionNotFound
                    | ErrorKind::MasterNameNotFoundBySentinel
                    | ErrorKind::NoValidReplicasFoundBySentinel
            )
            || err.code().is_some_and(transient_code)
            // A pipeline's error carries every failed command's error.
            || err
                .clone()
                .into_server_errors()
                .is_some_and(|errors| errors.iter().any(|(_, e)| transient_code(e.code())));
        if transient {
            StoreError::Unavailable(err.to_string())
        } else {
            StoreError::Protocol(err.to_string())
        }
    }
}

/// Converts a reply; Redis errors inside it (e.g. from a script) are
/// classified like any other Redis error. Public so that the fuzz targets
/// (`fuzz/`) and property tests reach it.
pub fn convert<T: redis::FromRedisValue>(reply: Value) -> Result<T, StoreError> {
    if let Value::ServerError(err) = reply {
        return Err(StoreError::from_redis(err.into()));
    }
    redis::from_redis_value(reply).map_err(|e| StoreError::Protocol(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(err: RedisError) -> &'static str {
        match StoreError::from_redis(err) {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Protocol(_) => "protocol",
            StoreError::Config(_) => "config",
            StoreError::Denied(_) => "denied",
        }
    }

    fn server(code: &str, detail: &str) -> RedisError {
        // Parse a RESP error line as Redis would send it.
        let reply = format!("-{code} {detail}\r\n");
        match redis::parse_redis_value(reply.as_bytes()).unwrap() {
            Value::ServerError(err) => err.into(),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn cluster_and_failover_errors_are_unavailable() {
        for (code, detail) in [
            ("CLUSTERDOWN", "The cluster is down"),
            ("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            ("MOVED", "3999 127.0.0.1:6381"),
            ("ASK", "3999 127.0.0.1:6381"),
            ("READONLY", "You can't write against a read only replica."),
            ("MASTERDOWN", "Link with MASTER is down"),
            ("LOADING", "Redis is loading the dataset in memory"),
            ("NOREPLICAS", "Not enough good replicas to write."),
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
        ] {
            assert_eq!(classify(server(code, detail)), "unavailable", "{code}");
        }
        assert_eq!(
            classify(RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "Master with given name not found in sentinel",
            ))),
            "unavailable"
        );
        assert_eq!(
            classify(RedisError::from((
                redis::ErrorKind::ClusterConnectionNotFound,
                "no connection",
            ))),
            "unavailable"
        );
    }

    #[test]
    fn acl_refusals_are_denied_and_name_what_to_grant() {
        let reason = |err| match StoreError::classify(err, Some("tumbler")) {
            StoreError::Denied(reason) => reason,
            other => panic!("not denied: {other:?}"),
        };
        let fcall = reason(server(
            "NOPERM",
            "this user has no permissions to run the 'fcall' command",
        ));
        assert!(
            fcall.contains("may not run FCALL") && fcall.contains("+@scripting"),
            "{fcall}"
        );
        let keys = reason(server(
            "NOPERM",
            "this user has no permissions to access one of the keys used as arguments",
        ));
        assert!(keys.contains("grant ~tumbler:*"), "{keys}");
        let inner = reason(server(
            "ERR",
            "The user executing the script can't run this command or subcommand script: x, on @user_function:2.",
        ));
        assert!(inner.contains("inside tumbler's functions"), "{inner}");
    }

    #[test]
    fn refused_credentials_are_unavailable_and_say_which_flag() {
        for (code, detail, says) in [
            (
                "NOAUTH",
                "Authentication required.",
                "--redis-password-file",
            ),
            (
                "WRONGPASS",
                "invalid username-password pair or user is disabled.",
                "--redis-username",
            ),
        ] {
            match StoreError::from_redis(server(code, detail)) {
                StoreError::Unavailable(reason) => {
                    assert!(reason.contains(code) && reason.contains(says), "{reason}")
                }
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_replies_are_protocol_errors() {
        assert_eq!(classify(server("ERR", "user script error")), "protocol");
        assert_eq!(
            classify(server(
                "CROSSSLOT",
                "Keys in request don't hash to the same slot"
            )),
            "protocol"
        );
    }
}
