//! Connections and topology: where connections come from (one server, a
//! Redis Cluster, a master found through Sentinel), the credentials and
//! TLS files they present, and the bb8 manager that makes, checks and
//! replaces them. Nothing here knows a command beyond the ones a
//! connection needs for itself (ROLE, SENTINEL GET-MASTER-ADDR-BY-NAME).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, RedisError, Value};

use super::ConnectCheck;
use super::credentials::Credentials;
use super::target::RedisTarget;

/// One pooled connection: to one server, or to a whole cluster.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Where connections come from, and what they present.
pub(super) struct Backend {
    pub(super) target: Target,
    pub(super) credentials: Credentials,
    /// Why the last new connection failed (None after one succeeds): bb8
    /// only says that a checkout timed out, and an operator needs the
    /// reason (refused, wrong password, certificate not trusted).
    pub(super) last_connect_error: std::sync::Mutex<Option<ConnectFailure>>,
    /// The deployment's key prefix: an ACL refusal names the pattern to
    /// grant (`~<prefix>:*`).
    pub(super) key_prefix: String,
    /// Where connections go, as a reason names it (no credentials).
    pub(super) describe: String,
}

/// Why the last new connection failed, phrased for the operator
/// (`error::connect_reason`).
#[derive(Clone, Debug)]
pub(super) struct ConnectFailure {
    pub(super) reason: String,
    /// Redis' ACL refused the user (not an outage: a grant is missing).
    pub(super) denied: bool,
}

/// The servers to connect to. Clients are made per connection (see
/// [`Backend::client`]), so that each new connection uses the credentials
/// and TLS files as they are now.
pub(super) enum Target {
    Single(ConnectionInfo),
    Cluster {
        /// The seed nodes (also for the pub/sub subscription).
        seeds: Vec<ConnectionInfo>,
        /// The seed the next subscription tries first.
        next_seed: AtomicUsize,
        timeout: Duration,
    },
    Sentinel {
        master: String,
        /// The sentinels, asked in order "where is the master now".
        sentinels: Vec<ConnectionInfo>,
        /// Credentials, db and TLS mode for the master (its address is a
        /// placeholder).
        settings: ConnectionInfo,
        /// The master's address as the sentinels last named it; pooled
        /// connections to any other address count as broken, so a
        /// failover moves every connection as soon as a health check sees
        /// it (rather than when the old master is demoted, which Sentinel
        /// does only seconds later).
        current: std::sync::RwLock<Option<NodeAddr>>,
    },
}

/// A Redis server's address, as the sentinels name it.
pub(super) type NodeAddr = (String, u16);

/// Fails (READONLY, so the connection is replaced) unless the server
/// says it is a master.
pub(super) async fn is_master(conn: &mut MultiplexedConnection) -> Result<(), RedisError> {
    let role: Vec<Value> = redis::cmd("ROLE").query_async(conn).await?;
    match role.first() {
        Some(Value::BulkString(role)) if role == b"master" => Ok(()),
        _ => Err(RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "the server is not (or no longer) the master",
        ))),
    }
}

impl Backend {
    pub(super) fn new(
        target: &RedisTarget,
        credentials: Credentials,
        timeout: Duration,
        key_prefix: &str,
    ) -> Result<Self, RedisError> {
        let info = |url: &str| url.into_connection_info();
        let target_name = target.describe();
        let target = match target {
            RedisTarget::Single { url } => Target::Single(info(url)?),
            RedisTarget::Cluster { seeds } => Target::Cluster {
                seeds: seeds.iter().map(|s| info(s)).collect::<Result<_, _>>()?,
                next_seed: AtomicUsize::new(0),
                timeout,
            },
            RedisTarget::Sentinel {
                sentinels,
                master,
                redis,
            } => Target::Sentinel {
                settings: info(redis)?,
                master: master.clone(),
                sentinels: sentinels
                    .iter()
                    .map(|s| info(s))
                    .collect::<Result<_, _>>()?,
                current: std::sync::RwLock::new(None),
            },
        };
        let describe = match &target {
            Target::Single(info) => format!("redis at {}", info.addr()),
            _ => target_name,
        };
        Ok(Backend {
            target,
            credentials,
            last_connect_error: std::sync::Mutex::new(None),
            key_prefix: key_prefix.to_owned(),
            describe,
        })
    }

    /// A client for `info` with the credentials in force now: the ACL
    /// user and password (unless `sentinel`: those belong to Redis, not to
    /// the sentinels) and, for a TLS address, the CA and client
    /// certificate.
    pub(super) fn client(
        &self,
        info: &ConnectionInfo,
        sentinel: bool,
    ) -> Result<Client, RedisError> {
        let current = self.credentials.current();
        let mut info = info.clone();
        if !sentinel {
            let mut settings = info.redis_settings().clone();
            if let Some(username) = &current.username {
                settings = settings.set_username(username);
            }
            if let Some(password) = &current.password {
                settings = settings.set_password(password);
            }
            info = info.set_redis_settings(settings);
        }
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            Client::build_with_tls(info, current.tls)
        } else {
            Client::open(info)
        }
    }

    /// A cluster client over `seeds` with the credentials in force now.
    pub(super) fn cluster_client(
        &self,
        seeds: &[ConnectionInfo],
        timeout: Duration,
    ) -> Result<ClusterClient, RedisError> {
        let current = self.credentials.current();
        let mut builder = ClusterClient::builder(seeds.iter().cloned())
            .connection_timeout(timeout)
            .response_timeout(timeout);
        if let Some(username) = &current.username {
            builder = builder.username(username);
        }
        if let Some(password) = &current.password {
            builder = builder.password(password);
        }
        if seeds
            .iter()
            .any(|s| matches!(s.addr(), redis::ConnectionAddr::TcpTls { .. }))
        {
            builder = builder.certs(current.tls);
        }
        builder.build()
    }

    /// True when `conn` leads to a server other than the master the
    /// sentinels named last.
    pub(super) fn superseded(&self, conn: &TrackedConnection) -> bool {
        match &self.target {
            Target::Sentinel { current, .. } => {
                let current = current.read().unwrap();
                current.is_some() && conn.addr.is_some() && *current != conn.addr
            }
            _ => false,
        }
    }

    /// Asks the sentinels, one after another, where the master is now.
    pub(super) async fn ask_sentinels(
        &self,
        sentinels: &[ConnectionInfo],
        master: &str,
        timeout: Duration,
    ) -> Result<NodeAddr, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut last = RedisError::from((redis::ErrorKind::EmptySentinelList, "no sentinels"));
        for sentinel in sentinels {
            let ask = async {
                let mut conn = self
                    .client(sentinel, true)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match ask.await {
                Ok(Some(addr)) => return Ok(addr),
                Ok(None) => {
                    last = RedisError::from((
                        redis::ErrorKind::MasterNameNotFoundBySentinel,
                        "a sentinel does not know the master",
                    ))
                }
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    /// A client for the master the sentinels name now, and its address.
    /// The same question as the health check's (see [`Store::ping`]), so
    /// the two cannot disagree during a switch.
    pub(super) async fn sentinel_master(
        &self,
        sentinels: &[ConnectionInfo],
        master: &str,
        settings: &ConnectionInfo,
        timeout: Duration,
    ) -> Result<(Client, NodeAddr), RedisError> {
        let (host, port) = self.ask_sentinels(sentinels, master, timeout).await?;
        let addr = match settings.addr() {
            redis::ConnectionAddr::TcpTls { insecure, .. } => redis::ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => redis::ConnectionAddr::Tcp(host.clone(), port),
        };
        let info = settings.clone().set_addr(addr);
        Ok((self.client(&info, false)?, (host, port)))
    }
}

/// A pooled connection plus the flag a failed request sets.
pub(super) struct TrackedConnection {
    pub(super) connection: Conn,
    pub(super) broken: Arc<AtomicBool>,
    /// The server it leads to (Sentinel: to notice a new master).
    pub(super) addr: Option<NodeAddr>,
}

/// bb8 manager for [`TrackedConnection`]s. bb8-redis's own manager is not
/// used because it cannot set the response timeout, PINGs on every
/// checkout and knows neither clusters nor sentinels; this one checks a
/// flag instead.
#[derive(Clone)]
pub(super) struct Manager {
    pub(super) backend: Arc<Backend>,
    pub(super) config: AsyncConnectionConfig,
    pub(super) timeout: Duration,
    /// The check every new connection passes first (see [`Store::on_connect`]).
    pub(super) hooks: Arc<std::sync::OnceLock<ConnectCheck>>,
}

impl bb8::ManageConnection for Manager {
    type Connection = TrackedConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<TrackedConnection, RedisError> {
        let made = self.make().await;
        *self
            .backend
            .last_connect_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = made.as_ref().err().map(|e| {
            let prefix = Some(self.backend.key_prefix.as_str());
            ConnectFailure {
                reason: super::error::connect_reason(e, &self.backend.describe, prefix),
                denied: super::error::denial(e, prefix).is_some(),
            }
        });
        made
    }

    async fn is_valid(&self, conn: &mut TrackedConnection) -> Result<(), RedisError> {
        if conn.broken.load(Ordering::Relaxed) || self.backend.superseded(conn) {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "connection marked broken by a failed request",
            )))
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut TrackedConnection) -> bool {
        conn.broken.load(Ordering::Relaxed) || self.backend.superseded(conn)
    }
}

impl Manager {
    /// A new connection, checked (see [`Store::on_connect`]).
    async fn make(&self) -> Result<TrackedConnection, RedisError> {
        let backend = &*self.backend;
        let (connection, addr) = match &backend.target {
            Target::Single(info) => (
                Conn::Single(
                    backend
                        .client(info, false)?
                        .get_multiplexed_async_connection_with_config(&self.config)
                        .await?,
                ),
                None,
            ),
            Target::Cluster { seeds, timeout, .. } => (
                Conn::Cluster(
                    backend
                        .cluster_client(seeds, *timeout)?
                        .get_async_connection()
                        .await?,
                ),
                None,
            ),
            Target::Sentinel {
                master,
                sentinels,
                settings,
                current,
            } => {
                let (client, addr) = backend
                    .sentinel_master(sentinels, master, settings, self.timeout)
                    .await?;
                let mut connection = client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                // A server the sentinels name must also call itself master.
                is_master(&mut connection).await?;
                *current.write().unwrap() = Some(addr.clone());
                (Conn::Single(connection), Some(addr))
            }
        };
        if let (Some(check), Conn::Single(single)) = (self.hooks.get(), &connection) {
            check(single.clone()).await?;
        }
        Ok(TrackedConnection {
            connection,
            broken: Arc::new(AtomicBool::new(false)),
            addr,
        })
    }
}
