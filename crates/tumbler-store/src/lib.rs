//! Redis for the lock engine: commands and function calls with a bounded
//! timeout over a bb8 pool of multiplexed connections. The files of this
//! module, by concern:
//!
//! - here: [`Store`], the command API the engine uses (`FCALL` of a
//!   [`Function`], plain commands, pipelines), the command timeout, and
//!   which failures mark a connection broken;
//! - `connection`: where connections come from (one server, a Redis
//!   Cluster routing by key and following MOVED/ASK, a master found
//!   through Sentinel, asked anew by every new connection so that
//!   replacing a broken connection follows a failover), and the pool's
//!   manager;
//! - `nodes`: what is asked of the whole deployment (pub/sub, a `SCAN`
//!   over every primary, the health check);
//! - `error`: [`StoreError`], unavailable or not understood;
//! - `target`, `credentials`: the `--redis-url` forms and the ACL/TLS
//!   files, reloaded while running.
//!
//! Why a pool of *multiplexed* connections that is only touched to clone a
//! handle: one multiplexed connection pipelines any number of concurrent
//! requests, so holding a checkout for a whole request would only add
//! queueing, and the default is one connection, which batches the calls of
//! concurrent RPCs into the fewest writes (`--redis-connections`, measured
//! in BENCHMARKS.md "Lean server path"). The pool still earns its place: it
//! replaces a connection that broke (Redis restarted, a master was
//! demoted) without a PING on every checkout — a connection is marked
//! broken by the request that saw it fail, and the next checkout drops it
//! and connects anew. bb8-redis's own manager is not used: it PINGs on
//! every checkout, cannot set the response timeout and knows neither
//! clusters nor sentinels.

mod connection;
mod credentials;
mod error;
mod nodes;
mod target;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, RedisError, Value};

pub use credentials::RedisCredentials;
pub use error::{StoreError, convert};
pub use target::RedisTarget;

use connection::{Backend, Conn, Manager, Target};

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
    fcall_as("FCALL", conn, script, keys, args).await
}

/// [`fcall`] sent as `command`: `FCALL`, or `FCALL_RO` for a function
/// flagged `no-writes` (which Redis' ACL checks as a read of its keys).
async fn fcall_as(
    command: &str,
    conn: &mut Conn,
    script: &Function,
    keys: &[&str],
    args: &[&str],
) -> Result<Value, RedisError> {
    let mut call = redis::cmd(command);
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
                    cluster.route_command(load, by_key(key)).await?;
                }
            }
            call.query_async(conn).await
        }
        other => other,
    }
}

/// Where a cluster sends a command about `key`: the primary that owns its
/// slot.
fn by_key(key: &str) -> RoutingInfo {
    let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route))
}

/// Settings for the Redis connections.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The `--redis-url`, parsed once where the flag is read:
    /// `redis://host:port/db` (or `rediss://`, `redis+unix://`),
    /// `redis+cluster://h:p,h:p,…` or `redis+sentinel://h:p,h:p,…/<master>[/db]`
    /// (see [`RedisTarget::parse`]).
    pub target: RedisTarget,
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
    /// The prefix of every key and channel (`--key-prefix`): a refusal of
    /// Redis' ACL names the pattern to grant (`~<prefix>:*`).
    pub key_prefix: String,
}

/// How many grants may wait for their replicas at once (each on a
/// connection of its own); more wait for a connection, within the command
/// timeout.
const WAITING_GRANTS: u32 = 16;

/// The engine's handle on Redis. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: bb8::Pool<Manager>,
    /// With `--min-replicas-acked`: connections for a grant and its `WAIT`,
    /// each held for both (see [`Self::run_granting_script`]), so that a
    /// `WAIT`, which blocks its connection until replicas acknowledge,
    /// never stalls the calls multiplexed on the shared one.
    waits: Option<bb8::Pool<Manager>>,
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
            Backend::new(
                &target,
                credentials,
                config.command_timeout,
                &config.key_prefix,
            )
            .map_err(|e| StoreError::Config(format!("--redis-url: {e}")))?,
        );
        tracing::debug!(redis = %target.describe(), "redis target");
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.command_timeout))
            .set_response_timeout(Some(config.command_timeout));
        let hooks: Arc<std::sync::OnceLock<ConnectCheck>> = Arc::default();
        let manager = Manager {
            backend: backend.clone(),
            config: connection_config,
            timeout: config.command_timeout,
            hooks: hooks.clone(),
        };
        let pool = |size: u32, idle: u32| {
            bb8::Pool::builder()
                .max_size(size)
                .min_idle(Some(idle))
                .test_on_check_out(true)
                .connection_timeout(config.command_timeout)
                .retry_connection(false)
                .build_unchecked(manager.clone())
        };
        Ok(Store {
            pool: pool(config.connections.max(1), 1),
            waits: (config.min_replicas_acked > 0).then(|| pool(WAITING_GRANTS, 0)),
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
        let target = config.target.clone();
        if config.credentials.has_tls_files() && !target.is_tls() {
            return Err(StoreError::Config(
                "--redis-tls-ca-file, --redis-tls-cert-file and --redis-tls-key-file need TLS to Redis: a rediss://, rediss+cluster:// or rediss+sentinel:// URL".into(),
            ));
        }
        let credentials =
            Credentials::load(config.credentials.clone()).map_err(StoreError::Config)?;
        Ok((target, credentials))
    }

    /// True when this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.backend.target, Target::Cluster { .. })
    }

    /// A handle on one pooled connection; the checkout ends right here.
    async fn connection(&self) -> Result<(Conn, Arc<AtomicBool>), StoreError> {
        let pooled = self.checkout(&self.pool).await?;
        Ok((pooled.connection.clone(), pooled.broken.clone()))
    }

    /// A connection of `pool`, held until the handle is dropped.
    async fn checkout<'a>(
        &self,
        pool: &'a bb8::Pool<Manager>,
    ) -> Result<bb8::PooledConnection<'a, Manager>, StoreError> {
        pool.get().await.map_err(|e| {
            let reason = self
                .backend
                .last_connect_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            match reason {
                Some(failed) if failed.denied => StoreError::Denied(failed.reason),
                Some(failed) => {
                    StoreError::Unavailable(format!("no redis connection: {}", failed.reason))
                }
                None => StoreError::Unavailable(format!("no redis connection: {e}")),
            }
        })
    }

    /// Why the last new connection failed (None once one succeeds, or
    /// before any was tried), as [`Self::checkout`] reports it: what a
    /// caller is told while no connection can be made.
    pub fn last_connect_error(&self) -> Option<StoreError> {
        let failed = self
            .backend
            .last_connect_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(if failed.denied {
            StoreError::Denied(failed.reason)
        } else {
            StoreError::Unavailable(format!("no redis connection: {}", failed.reason))
        })
    }

    /// Runs a future on a connection with the command timeout; marks the
    /// connection broken when Redis could not be reached through it, or
    /// when it leads to a server that is no longer the master (READONLY:
    /// the next connection asks the sentinels again), or when Redis refuses
    /// its credentials (NOAUTH, WRONGPASS: the next one presents the
    /// credentials in force, and says why when it fails).
    async fn with_connection<T, F, Fut>(&self, run: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let (connection, broken) = self.connection().await?;
        self.run_on(connection, &broken, run).await
    }

    /// [`Self::with_connection`] on a connection of the `--min-replicas-acked`
    /// pool, held by this call alone until it ends.
    async fn with_own_connection<T, F, Fut>(
        &self,
        pool: &bb8::Pool<Manager>,
        run: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let held = self.checkout(pool).await?;
        self.run_on(held.connection.clone(), &held.broken, run)
            .await
    }

    async fn run_on<T, F, Fut>(
        &self,
        connection: Conn,
        broken: &AtomicBool,
        run: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        match tokio::time::timeout(self.command_timeout, run(connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.is_io_error()
                    || err.is_connection_dropped()
                    || err.is_unrecoverable_error()
                    || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                    || error::auth_refusal(&err).is_some()
                {
                    broken.store(true, Ordering::Relaxed);
                }
                Err(self.fail(err))
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
        self.run_as("FCALL", script, keys, args).await
    }

    /// [`Self::run_script`] sent as `FCALL_RO`: only for a function flagged
    /// `no-writes`. (The readiness check uses it to prove that the user
    /// may read tumbler's keys through its functions.)
    pub async fn run_read_only<T: redis::FromRedisValue>(
        &self,
        script: &Function,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        self.run_as("FCALL_RO", script, keys, args).await
    }

    /// A function call sent as `command` (`FCALL` or `FCALL_RO`), its
    /// reply converted.
    async fn run_as<T: redis::FromRedisValue>(
        &self,
        command: &'static str,
        script: &Function,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        let reply: Value = self
            .with_connection(|mut conn| async move {
                fcall_as(command, &mut conn, script, keys, args).await
            })
            .await?;
        convert(reply)
    }

    /// [`Self::run_script`] for a script that may grant: when `granted`
    /// says the reply is a grant and `--min-replicas-acked` is set, sends
    /// `WAIT n timeout` on the same connection (in a cluster: the same
    /// node connection, the one owning the keys' slot) before answering,
    /// and answers UNAVAILABLE when fewer replicas acknowledged. The
    /// call and its `WAIT` hold a connection of their own (`WAIT` blocks
    /// it), never the shared one. WAIT
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
        let Some(waits) = self.waits.as_ref().filter(|_| wanted > 0) else {
            return self.run_script(script, keys, args).await;
        };
        let timeout_ms = self.min_replicas_timeout.as_millis() as u64;
        let slot_key = keys.first().map(|k| (*k).to_owned()).unwrap_or_default();
        let (reply, acked): (Value, Option<i64>) = self
            .with_own_connection(waits, |mut conn| async move {
                let reply: Value = fcall(&mut conn, script, keys, args).await?;
                if !granted(&reply) {
                    return Ok((reply, None));
                }
                let mut wait = redis::cmd("WAIT");
                wait.arg(wanted).arg(timeout_ms);
                let acked: i64 = match &mut conn {
                    Conn::Single(conn) => wait.query_async(conn).await?,
                    Conn::Cluster(conn) => {
                        redis::from_redis_value(conn.route_command(wait, by_key(&slot_key)).await?)?
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

    /// A redis-rs error as a [`StoreError`], an ACL refusal naming this
    /// deployment's key pattern.
    fn fail(&self, err: RedisError) -> StoreError {
        StoreError::classify(err, Some(&self.backend.key_prefix))
    }

    /// True when a grant waits for replica acknowledgements
    /// (`--min-replicas-acked`): see [`Self::run_granting_script`].
    pub fn waits_for_replicas(&self) -> bool {
        self.waits.is_some() && self.min_replicas_acked > 0
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
}
