//! Redis connections for the lock engine: a small bb8 pool of multiplexed
//! connections, a bounded command timeout, and one error type that says
//! whether Redis was unreachable (the caller answers UNAVAILABLE) or
//! answered with something unexpected.
//!
//! Three deployments behind one API ([`RedisTarget`]): one server, a Redis
//! Cluster (each pooled connection is a cluster connection that routes by
//! key and follows MOVED/ASK), and a master found through Sentinel (every
//! new connection asks the sentinels where the master is now, so replacing
//! a broken connection is how the service follows a failover).
//!
//! Why a pool of *multiplexed* connections that is only touched to clone a
//! handle: one multiplexed connection pipelines any number of concurrent
//! requests, so holding a checkout for a whole request would only add
//! queueing. The pool still earns its place: it spreads load over a few
//! sockets and replaces a connection that broke (Redis restarted, a master
//! was demoted), without a PING on every checkout — a connection is marked
//! broken by the request that saw it fail, and the next checkout drops it
//! and connects anew.

mod credentials;
mod target;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, RedisError, Value};

pub use credentials::RedisCredentials;
pub use target::RedisTarget;

/// A function of a Redis function library, as `run_script` calls it: its
/// name, and the library's code for `FUNCTION LOAD` when Redis lacks it.
/// (What the functions do is the engine's business.)
#[derive(Clone, Debug)]
pub struct Function {
    pub function: String,
    pub library: Arc<str>,
}

use credentials::Credentials;

/// Where a deployment-wide `SCAN` goes on (see [`Store::scan`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanCursor {
    /// 0 on a single server; on a cluster, a primary in address order.
    pub node: u32,
    /// That node's SCAN cursor (0: from its start).
    pub position: u64,
}

/// A check run on each new connection (see [`Store::on_connect`]).
pub type ConnectCheck = Arc<
    dyn Fn(MultiplexedConnection) -> futures::future::BoxFuture<'static, Result<(), RedisError>>
        + Send
        + Sync,
>;

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

/// `FCALL` of one operation of tumbler's library. A Redis (on a cluster:
/// the node owning the keys) that lacks the library gets it first
/// (`FUNCTION LOAD REPLACE`: replicas racing to load it load the same
/// code), then the call is sent again.
async fn fcall(
    conn: &mut Conn,
    script: &Function,
    keys: &[&str],
    args: &[&str],
) -> Result<Value, RedisError> {
    let mut call = redis::cmd("FCALL");
    call.arg(&script.function)
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    match call.query_async::<Value>(&mut *conn).await {
        Err(err) if err.to_string().contains("Function not found") => {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg("REPLACE").arg(&*script.library);
            match &mut *conn {
                Conn::Single(single) => {
                    let _: Value = load.query_async(single).await?;
                }
                Conn::Cluster(cluster) => {
                    let key = keys.first().copied().unwrap_or_default();
                    let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                    let routing =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    cluster.route_command(load, routing).await?;
                }
            }
            call.query_async(conn).await
        }
        other => other,
    }
}

/// Settings for the Redis connections.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// A `--redis-url`: `redis://host:port/db` (or `rediss://`,
    /// `redis+unix://`), `redis+cluster://h:p,h:p,…` or
    /// `redis+sentinel://h:p,h:p,…/<master>[/db]` (see [`RedisTarget`]).
    pub url: String,
    /// How many multiplexed connections the pool keeps.
    pub connections: u32,
    /// Upper bound for one command, connecting included.
    pub command_timeout: Duration,
    /// Replicas that must acknowledge a grant before it is answered
    /// (`WAIT`); 0 answers as soon as the primary has it.
    pub min_replicas_acked: u32,
    /// How long `WAIT` waits for those acknowledgements.
    pub min_replicas_timeout: Duration,
    /// ACL user, password and TLS files (the `--redis-*` flags).
    pub credentials: RedisCredentials,
}

/// One pooled connection: to one server, or to a whole cluster.
#[derive(Clone)]
enum Conn {
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
struct Backend {
    target: Target,
    credentials: Credentials,
    /// Why the last new connection failed (None after one succeeds): bb8
    /// only says that a checkout timed out, and an operator needs the
    /// reason (refused, wrong password, certificate not trusted).
    last_connect_error: std::sync::Mutex<Option<String>>,
}

/// The servers to connect to. Clients are made per connection (see
/// [`Backend::client`]), so that each new connection uses the credentials
/// and TLS files as they are now.
enum Target {
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
type NodeAddr = (String, u16);

/// Fails (READONLY, so the connection is replaced) unless the server
/// says it is a master.
async fn is_master(conn: &mut MultiplexedConnection) -> Result<(), RedisError> {
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
    fn new(
        target: &RedisTarget,
        credentials: Credentials,
        timeout: Duration,
    ) -> Result<Self, RedisError> {
        let info = |url: &str| url.into_connection_info();
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
        Ok(Backend {
            target,
            credentials,
            last_connect_error: std::sync::Mutex::new(None),
        })
    }

    /// A client for `info` with the credentials in force now: the ACL
    /// user and password (unless `sentinel`: those belong to Redis, not to
    /// the sentinels) and, for a TLS address, the CA and client
    /// certificate.
    fn client(&self, info: &ConnectionInfo, sentinel: bool) -> Result<Client, RedisError> {
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
    fn cluster_client(
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
    fn superseded(&self, conn: &TrackedConnection) -> bool {
        match &self.target {
            Target::Sentinel { current, .. } => {
                let current = current.read().unwrap();
                current.is_some() && conn.addr.is_some() && *current != conn.addr
            }
            _ => false,
        }
    }

    /// Asks the sentinels, one after another, where the master is now.
    async fn ask_sentinels(
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
    async fn sentinel_master(
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
pub struct TrackedConnection {
    connection: Conn,
    broken: Arc<AtomicBool>,
    /// The server it leads to (Sentinel: to notice a new master).
    addr: Option<NodeAddr>,
}

/// bb8 manager for [`TrackedConnection`]s. bb8-redis's own manager is not
/// used because it cannot set the response timeout, PINGs on every
/// checkout and knows neither clusters nor sentinels; this one checks a
/// flag instead.
struct Manager {
    backend: Arc<Backend>,
    config: AsyncConnectionConfig,
    timeout: Duration,
    /// The check every new connection passes first (see [`Store::on_connect`]).
    hooks: Arc<std::sync::OnceLock<ConnectCheck>>,
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
            .unwrap_or_else(|e| e.into_inner()) = made.as_ref().err().map(|e| e.to_string());
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

/// The engine's handle on Redis. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: bb8::Pool<Manager>,
    /// Also for the one pub/sub connection a replica keeps (outside the
    /// pool: a subscribed connection cannot run commands).
    backend: Arc<Backend>,
    backend_hooks: Arc<std::sync::OnceLock<ConnectCheck>>,
    command_timeout: Duration,
    min_replicas_acked: u32,
    min_replicas_timeout: Duration,
}

impl Store {
    /// Builds the pool without connecting: the service starts even while
    /// Redis is down and reports itself NOT_SERVING until Redis answers.
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let (target, credentials) = Self::prepare(config)?;
        let backend = Arc::new(
            Backend::new(&target, credentials, config.command_timeout)
                .map_err(|e| StoreError::Protocol(format!("bad --redis-url: {e}")))?,
        );
        tracing::debug!(redis = %target.describe(), "redis target");
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.command_timeout))
            .set_response_timeout(Some(config.command_timeout));
        let hooks: Arc<std::sync::OnceLock<ConnectCheck>> = Arc::default();
        let pool = bb8::Pool::builder()
            .max_size(config.connections.max(1))
            .min_idle(Some(1))
            .test_on_check_out(true)
            .connection_timeout(config.command_timeout)
            .retry_connection(false)
            .build_unchecked(Manager {
                backend: backend.clone(),
                config: connection_config,
                timeout: config.command_timeout,
                hooks: hooks.clone(),
            });
        Ok(Store {
            pool,
            backend,
            backend_hooks: hooks,
            command_timeout: config.command_timeout,
            min_replicas_acked: config.min_replicas_acked,
            min_replicas_timeout: config.min_replicas_timeout,
        })
    }

    /// Checks the URL and loads the credentials and TLS files without
    /// connecting: the error names the flag at fault, so `serve` can
    /// refuse to start on it.
    pub fn check(config: &StoreConfig) -> Result<(), StoreError> {
        Self::prepare(config).map(drop)
    }

    fn prepare(config: &StoreConfig) -> Result<(RedisTarget, Credentials), StoreError> {
        let target = RedisTarget::parse(&config.url)
            .map_err(|e| StoreError::Protocol(format!("bad --redis-url: {e}")))?;
        if config.credentials.has_tls_files() && !target.is_tls() {
            return Err(StoreError::Protocol(
                "--redis-tls-ca-file, --redis-tls-cert-file and --redis-tls-key-file need TLS to Redis: a rediss://, rediss+cluster:// or rediss+sentinel:// URL".into(),
            ));
        }
        let credentials =
            Credentials::load(config.credentials.clone()).map_err(StoreError::Protocol)?;
        Ok((target, credentials))
    }

    /// True when this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.backend.target, Target::Cluster { .. })
    }

    /// A handle on one pooled connection; the checkout ends right here.
    async fn connection(&self) -> Result<(Conn, Arc<AtomicBool>), StoreError> {
        let pooled = self.pool.get().await.map_err(|e| {
            let reason = self
                .backend
                .last_connect_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            match reason {
                Some(reason) => StoreError::Unavailable(format!("no redis connection: {reason}")),
                None => StoreError::Unavailable(format!("no redis connection: {e}")),
            }
        })?;
        Ok((pooled.connection.clone(), pooled.broken.clone()))
    }

    /// Runs a future on a connection with the command timeout; marks the
    /// connection broken when Redis could not be reached through it, or
    /// when it leads to a server that is no longer the master (READONLY:
    /// the next connection asks the sentinels again).
    async fn with_connection<T, F, Fut>(&self, run: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let (connection, broken) = self.connection().await?;
        match tokio::time::timeout(self.command_timeout, run(connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.is_io_error()
                    || err.is_connection_dropped()
                    || err.is_unrecoverable_error()
                    || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
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

    /// Runs one operation of tumbler's function library (`FCALL`) and
    /// converts its reply. A reply of the wrong shape is a protocol error,
    /// never an outage: the conversion happens after Redis answered.
    pub async fn run_script<T: redis::FromRedisValue>(
        &self,
        script: &Function,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        let reply: Value = self
            .with_connection(|mut conn| async move { fcall(&mut conn, script, keys, args).await })
            .await?;
        convert(reply)
    }

    /// [`Self::run_script`] for a script that may grant: when `granted`
    /// says the reply is a grant and `--min-replicas-acked` is set, sends
    /// `WAIT n timeout` on the same connection (in a cluster: the same
    /// node connection, the one owning the keys' slot) before answering,
    /// and answers UNAVAILABLE when fewer replicas acknowledged. WAIT
    /// counts the writes sent on its own connection, so it covers this
    /// script (and whatever else shared the connection).
    pub async fn run_granting_script<T: redis::FromRedisValue>(
        &self,
        script: &Function,
        keys: &[&str],
        args: &[&str],
        granted: impl FnOnce(&Value) -> bool + Send,
    ) -> Result<T, StoreError> {
        let wanted = self.min_replicas_acked;
        if wanted == 0 {
            return self.run_script(script, keys, args).await;
        }
        let timeout_ms = self.min_replicas_timeout.as_millis() as u64;
        let slot_key = keys.first().map(|k| (*k).to_owned()).unwrap_or_default();
        let (reply, acked): (Value, Option<i64>) = self
            .with_connection(|mut conn| async move {
                let reply: Value = fcall(&mut conn, script, keys, args).await?;
                if !granted(&reply) {
                    return Ok((reply, None));
                }
                let mut wait = redis::cmd("WAIT");
                wait.arg(wanted).arg(timeout_ms);
                let acked: i64 = match &mut conn {
                    Conn::Single(conn) => wait.query_async(conn).await?,
                    Conn::Cluster(conn) => {
                        let route = Route::with_key(slot_key.as_bytes(), SlotAddr::Master);
                        let routing =
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                        redis::from_redis_value(conn.route_command(wait, routing).await?)?
                    }
                };
                Ok((reply, Some(acked)))
            })
            .await?;
        if let Some(acked) = acked
            && acked < i64::from(wanted)
        {
            return Err(StoreError::Unavailable(format!(
                "the grant was acknowledged by {acked} of the {wanted} replicas required (--min-replicas-acked) within {timeout_ms} ms; it may exist on the primary: retrying with the same holder returns it (ALREADY_HELD) once enough replicas have it"
            )));
        }
        convert(reply)
    }

    /// Runs one plain command (routed by its key on a cluster).
    pub async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        let reply: Value = self
            .with_connection(|mut conn| async move { cmd.query_async(&mut conn).await })
            .await?;
        convert(reply)
    }

    /// Runs a pipeline of plain commands. On a cluster all its keys must
    /// share one slot (it goes to the node of its first key).
    pub async fn pipeline<T: redis::FromRedisValue>(
        &self,
        pipe: redis::Pipeline,
    ) -> Result<T, StoreError> {
        let reply: Value = self
            .with_connection(|mut conn| async move { pipe.query_async(&mut conn).await })
            .await?;
        convert(reply)
    }

    /// Subscribes to `channels` on a connection of its own. The sink can
    /// change the subscriptions; the stream ends when the connection is lost.
    ///
    /// On a cluster the subscription lives on one node: classic PUBLISH is
    /// forwarded to every node of the cluster, so any node hears every
    /// message. Each call starts from the seed after the one used last, so
    /// a subscription that was lost moves to another node.
    pub async fn subscribe(
        &self,
        channels: &[&str],
    ) -> Result<(redis::aio::PubSubSink, redis::aio::PubSubStream), StoreError> {
        let on = |client: Client| async move {
            let mut pubsub = client.get_async_pubsub().await?;
            for channel in channels {
                pubsub.subscribe(*channel).await?;
            }
            Ok::<_, RedisError>(pubsub.split())
        };
        let timeout = self.command_timeout;
        let within = |what: &'static str| {
            StoreError::Unavailable(format!("redis did not accept {what} within {timeout:?}"))
        };
        let backend = &*self.backend;
        match &backend.target {
            Target::Single(info) => {
                let client = backend
                    .client(info, false)
                    .map_err(StoreError::from_redis)?;
                match tokio::time::timeout(timeout, on(client)).await {
                    Ok(found) => found.map_err(StoreError::from_redis),
                    Err(_) => Err(within("a subscription")),
                }
            }
            Target::Sentinel {
                master,
                sentinels,
                settings,
                ..
            } => {
                let subscribe = async {
                    let (client, _) = backend
                        .sentinel_master(sentinels, master, settings, timeout)
                        .await?;
                    on(client).await
                };
                match tokio::time::timeout(timeout, subscribe).await {
                    Ok(found) => found.map_err(StoreError::from_redis),
                    Err(_) => Err(within("a subscription")),
                }
            }
            Target::Cluster {
                seeds, next_seed, ..
            } => {
                let first = next_seed.load(Ordering::Relaxed);
                let mut last_error = StoreError::Unavailable("no cluster seed node".into());
                for i in 0..seeds.len() {
                    let index = (first + i) % seeds.len();
                    let client = match backend.client(&seeds[index], false) {
                        Ok(client) => client,
                        Err(err) => {
                            last_error = StoreError::from_redis(err);
                            continue;
                        }
                    };
                    match tokio::time::timeout(timeout, on(client)).await {
                        Ok(Ok(subscribed)) => {
                            next_seed.store((index + 1) % seeds.len(), Ordering::Relaxed);
                            tracing::debug!(seed = index, "subscribed on a cluster node");
                            return Ok(subscribed);
                        }
                        Ok(Err(err)) => last_error = StoreError::from_redis(err),
                        Err(_) => last_error = within("a subscription"),
                    }
                }
                Err(last_error)
            }
        }
    }

    /// The cluster's primaries that own slots, by address, in a stable
    /// order (`CLUSTER SLOTS`).
    async fn primaries(conn: &mut ClusterConnection) -> Result<Vec<NodeAddr>, RedisError> {
        let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        let mut primaries = std::collections::BTreeSet::new();
        for range in ranges {
            // [first slot, last slot, [host, port, id, …], replicas…]
            if let Value::Array(range) = range
                && let Some(Value::Array(primary)) = range.get(2)
                && let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1))
                && let Ok(host) = redis::from_redis_value::<String>(host.clone())
                && !host.is_empty()
            {
                primaries.insert((host, *port as u16));
            }
        }
        Ok(primaries.into_iter().collect())
    }

    /// Every primary that owns slots answers PING, asked by address (the
    /// cluster connection's own PING to all primaries quietly skips nodes
    /// it lost), and the cluster calls itself OK (`CLUSTER INFO`).
    async fn ping_cluster(&self) -> Result<(), StoreError> {
        use redis::{ErrorKind, ServerErrorKind};
        self.with_connection(|conn| async move {
            let Conn::Cluster(mut conn) = conn else {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "not a cluster connection",
                )));
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                return Err(RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ClusterDown),
                    "the cluster reports cluster_state:fail",
                )));
            }
            for (host, port) in Self::primaries(&mut conn).await? {
                let routing =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                conn.route_command(redis::cmd("PING"), routing).await?;
            }
            Ok(())
        })
        .await
    }

    /// One `SCAN` step over the whole deployment: `cursor` names a node
    /// (0 on a single server; on a cluster the index of a primary in
    /// address order) and that node's SCAN cursor. Returns the keys found
    /// and where the next step goes on (None: every node is done). Keys
    /// that exist for the whole walk are found at least once.
    pub async fn scan(
        &self,
        cursor: ScanCursor,
        pattern: &str,
        count: u32,
    ) -> Result<(Vec<String>, Option<ScanCursor>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor.position)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let (next, keys, nodes): (u64, Vec<String>, u32) = self
            .with_connection(|conn| async move {
                match conn {
                    Conn::Single(mut conn) => {
                        let (next, keys): (u64, Vec<String>) = scan.query_async(&mut conn).await?;
                        Ok((next, keys, 1))
                    }
                    Conn::Cluster(mut conn) => {
                        let primaries = Self::primaries(&mut conn).await?;
                        let Some((host, port)) = primaries.get(cursor.node as usize).cloned()
                        else {
                            return Ok((0, Vec::new(), primaries.len() as u32));
                        };
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host,
                            port,
                        });
                        let (next, keys): (u64, Vec<String>) =
                            redis::from_redis_value(conn.route_command(scan, routing).await?)?;
                        Ok((next, keys, primaries.len() as u32))
                    }
                }
            })
            .await?;
        let following = if next != 0 {
            Some(ScanCursor {
                node: cursor.node,
                position: next,
            })
        } else if cursor.node + 1 < nodes {
            Some(ScanCursor {
                node: cursor.node + 1,
                position: 0,
            })
        } else {
            None
        };
        Ok((keys, following))
    }

    /// Upper bound of one command, connecting included.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Runs `check` on every new connection to one server (or the master
    /// Sentinel names) before it is used, so that a replica that
    /// reconnects (Redis restarted, failed over) learns anything it must
    /// know about the new server first. A failed check fails the
    /// connection: requests answer UNAVAILABLE until a check passes.
    pub fn on_connect(&self, check: ConnectCheck) {
        let _ = self.backend_hooks.set(check);
    }

    /// True when Redis can serve writes: one server or every cluster
    /// primary answers PING; a sentinel-found server still says it is the
    /// master (after a failover the old connections may lead to a replica).
    pub async fn ping(&self) -> Result<(), StoreError> {
        if let Target::Sentinel {
            master,
            sentinels,
            current,
            ..
        } = &self.backend.target
        {
            // Where the sentinels say the master is now: connections that
            // lead elsewhere are replaced at their next checkout. Sentinels
            // that cannot be asked do not stop the service (the master may
            // be fine); they only delay noticing a failover.
            match self
                .backend
                .ask_sentinels(sentinels, master, self.command_timeout)
                .await
            {
                Ok(addr) => {
                    let mut current = current.write().unwrap();
                    if current.as_ref() != Some(&addr) {
                        if current.is_some() {
                            tracing::warn!(master = %master, host = %addr.0, port = addr.1, "the sentinels name a new master; reconnecting");
                        }
                        *current = Some(addr);
                    }
                }
                Err(err) => tracing::warn!(error = %err, "no sentinel answered"),
            }
            return self
                .with_connection(|conn| async move {
                    match conn {
                        Conn::Single(mut conn) => is_master(&mut conn).await,
                        Conn::Cluster(_) => Ok(()),
                    }
                })
                .await;
        }
        if self.is_cluster() {
            return self.ping_cluster().await;
        }
        let pong: String = self.command(redis::cmd("PING")).await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::Protocol(format!("PING answered {pong:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(err: RedisError) -> &'static str {
        match StoreError::from_redis(err) {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Protocol(_) => "protocol",
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
