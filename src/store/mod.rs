//! Redis connections for the lock engine: a small bb8 pool of multiplexed
//! connections, a bounded command timeout, and one error type that says
//! whether Redis was unreachable (the caller answers UNAVAILABLE) or
//! answered with something unexpected.
//!
//! Why a pool of *multiplexed* connections that is only touched to clone a
//! handle: one multiplexed connection pipelines any number of concurrent
//! requests, so holding a checkout for a whole request would only add
//! queueing. The pool still earns its place: it spreads load over a few
//! sockets and replaces a connection that broke (Redis restarted), without
//! a PING on every checkout — a connection is marked broken by the request
//! that saw it fail, and the next checkout drops it and connects anew.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Script};

/// What went wrong talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis is unreachable, timed out, or cannot serve writes right now
    /// (loading, read-only replica, cluster down). Nothing was granted.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// Redis answered, but not as the scripts promise (a bug, not an outage).
    #[error("redis reply not understood: {0}")]
    Protocol(String),
}

impl StoreError {
    fn from_redis(err: RedisError) -> Self {
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
                )
            )
            || err
                .code()
                .is_some_and(|code| matches!(code, "OOM" | "BUSY" | "MISCONF"));
        if transient {
            StoreError::Unavailable(err.to_string())
        } else {
            StoreError::Protocol(err.to_string())
        }
    }
}

/// Converts a reply; Redis errors inside it (e.g. from a script) are
/// classified like any other Redis error.
fn convert<T: redis::FromRedisValue>(reply: redis::Value) -> Result<T, StoreError> {
    if let redis::Value::ServerError(err) = reply {
        return Err(StoreError::from_redis(err.into()));
    }
    redis::from_redis_value(reply).map_err(|e| StoreError::Protocol(e.to_string()))
}

/// Settings for the Redis connections.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `redis://host:port/db` (or `rediss://`, `redis+unix://`).
    pub url: String,
    /// How many multiplexed connections the pool keeps.
    pub connections: u32,
    /// Upper bound for one command, connecting included.
    pub command_timeout: Duration,
}

/// A pooled multiplexed connection plus the flag a failed request sets.
pub struct TrackedConnection {
    connection: MultiplexedConnection,
    broken: Arc<AtomicBool>,
}

/// bb8 manager for [`TrackedConnection`]s. bb8-redis's own manager is not
/// used because it cannot set the response timeout and PINGs on every
/// checkout; this one checks a flag instead.
struct Manager {
    client: Client,
    config: AsyncConnectionConfig,
}

impl bb8::ManageConnection for Manager {
    type Connection = TrackedConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<TrackedConnection, RedisError> {
        let connection = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(TrackedConnection {
            connection,
            broken: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn is_valid(&self, conn: &mut TrackedConnection) -> Result<(), RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "connection marked broken by a failed request",
            )))
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut TrackedConnection) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

/// The engine's handle on Redis. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: bb8::Pool<Manager>,
    /// For the one pub/sub connection a replica keeps (outside the pool:
    /// a subscribed connection cannot run commands).
    client: Client,
    command_timeout: Duration,
}

impl Store {
    /// Builds the pool without connecting: the service starts even while
    /// Redis is down and reports itself NOT_SERVING until Redis answers.
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let client = Client::open(config.url.as_str())
            .map_err(|e| StoreError::Protocol(format!("bad redis url: {e}")))?;
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.command_timeout))
            .set_response_timeout(Some(config.command_timeout));
        let pool = bb8::Pool::builder()
            .max_size(config.connections.max(1))
            .min_idle(Some(1))
            .test_on_check_out(true)
            .connection_timeout(config.command_timeout)
            .retry_connection(false)
            .build_unchecked(Manager {
                client: client.clone(),
                config: connection_config,
            });
        Ok(Store {
            pool,
            client,
            command_timeout: config.command_timeout,
        })
    }

    /// A handle on one pooled connection; the checkout ends right here.
    async fn connection(&self) -> Result<(MultiplexedConnection, Arc<AtomicBool>), StoreError> {
        let pooled = self
            .pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("no redis connection: {e}")))?;
        Ok((pooled.connection.clone(), pooled.broken.clone()))
    }

    /// Runs a future on a connection with the command timeout; marks the
    /// connection broken when Redis could not be reached through it.
    async fn with_connection<T, F, Fut>(&self, run: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let (connection, broken) = self.connection().await?;
        match tokio::time::timeout(self.command_timeout, run(connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
                {
                    broken.store(true, Ordering::Relaxed);
                }
                Err(StoreError::from_redis(err))
            }
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not answer within {:?}",
                self.command_timeout
            ))),
        }
    }

    /// Runs a Lua script (EVALSHA, loading it on NOSCRIPT) and converts
    /// its reply. A reply of the wrong shape is a protocol error, never an
    /// outage: the conversion happens after Redis answered.
    pub async fn run_script<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let reply: redis::Value = self
            .with_connection(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        convert(reply)
    }

    /// Runs one plain command.
    pub async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        let reply: redis::Value = self
            .with_connection(|mut conn| async move { cmd.query_async(&mut conn).await })
            .await?;
        convert(reply)
    }

    /// Runs a pipeline of plain commands.
    pub async fn pipeline<T: redis::FromRedisValue>(
        &self,
        pipe: redis::Pipeline,
    ) -> Result<T, StoreError> {
        let reply: redis::Value = self
            .with_connection(|mut conn| async move { pipe.query_async(&mut conn).await })
            .await?;
        convert(reply)
    }

    /// Subscribes to `channels` on a connection of its own. The sink can
    /// change the subscriptions; the stream ends when the connection is lost.
    pub async fn subscribe(
        &self,
        channels: &[&str],
    ) -> Result<(redis::aio::PubSubSink, redis::aio::PubSubStream), StoreError> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            for channel in channels {
                pubsub.subscribe(*channel).await?;
            }
            Ok::<_, RedisError>(pubsub.split())
        };
        match tokio::time::timeout(self.command_timeout, subscribe).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(err)) => Err(StoreError::from_redis(err)),
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not accept a subscription within {:?}",
                self.command_timeout
            ))),
        }
    }

    /// True when Redis answers a PING within the command timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let pong: String = self.command(redis::cmd("PING")).await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::Protocol(format!("PING answered {pong:?}")))
        }
    }
}
