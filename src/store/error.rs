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

impl StoreError {
    pub(crate) fn from_redis(err: RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
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
