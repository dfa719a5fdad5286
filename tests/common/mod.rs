//! Test harness: real redis-server children on free loopback ports and
//! real tumbler servers (in this process, or as `tumbler` processes) on
//! free ports, reached over real gRPC connections.

pub mod counting;
pub mod http;
pub mod proxy;
pub mod session;
pub mod topology;
pub mod wait;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;

pub use counting::*;
pub use tumbler::proto;

/// A redis-server child of this test (stopped by pid on drop).
pub fn start_redis() -> RedisServer {
    RedisServer::start("redis-server")
        .expect("redis-server must be installed (scripts/test installs it)")
}

/// Service settings as `tumbler serve` would default them, with a fast
/// health check so outage tests do not wait long.
pub fn service_args() -> ServiceArgs {
    ServiceArgs {
        redis_timeout_ms: 1000,
        max_limit: 1000,
        max_ttl_ms: 3_600_000,
        health_interval_ms: 100,
        shutdown_grace_ms: 5_000,
        max_wait_ms: 600_000,
        reap_interval_ms: 0,
        ..ServiceArgs::default()
    }
}

/// A tumbler server running inside the test process, started by one
/// builder call: `TestServer::new().start().await` brings its own Redis;
/// `.redis(url)` uses one the test holds, `.cluster()` a Redis Cluster of
/// three nodes, `.auth(entries)` a tokens file with those entries,
/// `.shards(n)` or `.args(..)` other settings, `.http()` the HTTP port
/// too, `.config(..)` what no flag sets; `.spawn()` instead of `.start()`
/// does not wait for SERVING.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The HTTP port (`/metrics`, `/healthz`, the dashboard), with `.http()`.
    http: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    /// What the builder started for this server (its Redis, the tokens
    /// file's folder), kept until the server is dropped.
    owned: Owned,
}

/// What a [`TestServer`] keeps alive for itself.
#[derive(Default)]
struct Owned {
    redis: Option<RedisServer>,
    cluster: Option<topology::TestCluster>,
    dir: Option<tempfile::TempDir>,
    redis_url: String,
}

/// How a [`TestServer`] is to be started (see [`TestServer::new`]).
pub struct Builder {
    args: ServiceArgs,
    redis_url: Option<String>,
    cluster: bool,
    tokens: Option<String>,
    http: bool,
    configure: Option<ConfigChange>,
}

/// What [`Builder::config`] does to the config.
type ConfigChange = Box<dyn FnOnce(&mut ServerConfig) + Send>;

impl Builder {
    /// Uses this Redis (one the test started and keeps).
    pub fn redis(mut self, url: &str) -> Self {
        self.redis_url = Some(url.to_owned());
        self
    }

    /// Starts a Redis Cluster of three nodes for the server.
    pub fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// Auth on, with a tokens file of these entries (see [`token_entry`]).
    pub fn auth(mut self, entries: &str) -> Self {
        self.tokens = Some(entries.to_owned());
        self
    }

    /// `shards` shards per namespace.
    pub fn shards(mut self, shards: u32) -> Self {
        self.args.shards = shards;
        self
    }

    /// These settings instead of [`service_args`].
    pub fn args(mut self, args: ServiceArgs) -> Self {
        self.args = args;
        self
    }

    /// The HTTP port on too (`/metrics`, `/healthz`, the dashboard):
    /// [`TestServer::http`].
    pub fn http(mut self) -> Self {
        self.http = true;
        self
    }

    /// Changes the config the settings made, for what no flag sets here
    /// (e.g. `dashboard_admin`).
    pub fn config(mut self, change: impl FnOnce(&mut ServerConfig) + Send + 'static) -> Self {
        self.configure = Some(Box::new(change));
        self
    }

    /// Starts the server and waits until it reports SERVING.
    pub async fn start(self) -> TestServer {
        let server = self.spawn().await;
        server.wait_for_health(ServingStatus::Serving).await;
        server
    }

    /// Starts the server without waiting for it to become healthy.
    pub async fn spawn(mut self) -> TestServer {
        let mut owned = Owned::default();
        owned.redis_url = match (self.redis_url.take(), self.cluster) {
            (Some(url), _) => url,
            (None, true) => {
                // On this thread, blocking it a few seconds: the nodes die
                // with the thread that started them (PR_SET_PDEATHSIG), and
                // a spawn_blocking thread ends after 10 s idle, taking the
                // cluster of a longer test with it.
                let cluster = topology::start_cluster();
                let url = cluster.url();
                owned.cluster = Some(cluster);
                url
            }
            (None, false) => {
                let redis = start_redis();
                let url = redis.url();
                owned.redis = Some(redis);
                url
            }
        };
        if let Some(entries) = &self.tokens {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tokens.toml");
            std::fs::write(&path, entries).unwrap();
            self.args.auth.auth_tokens_file = Some(path);
            self.args.auth.no_auth = false;
            owned.dir = Some(dir);
        }
        let mut config = ServerConfig::new(owned.redis_url.clone(), &self.args).unwrap();
        if let Some(change) = self.configure.take() {
            change(&mut config);
        }
        let http = if self.http {
            Some(TcpListener::bind("127.0.0.1:0").await.unwrap())
        } else {
            None
        };
        let listeners = tumbler::server::Listeners {
            grpc: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            http,
            health: None,
        };
        let mut server = TestServer::spawn_on(config, listeners);
        server.owned = owned;
        server
    }
}

impl TestServer {
    /// A builder with [`service_args`] and a Redis of the server's own.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> Builder {
        Builder {
            args: service_args(),
            redis_url: None,
            cluster: false,
            tokens: None,
            http: false,
            configure: None,
        }
    }

    /// The HTTP port (started with `.http()`).
    pub fn http(&self) -> SocketAddr {
        self.http.expect("started with .http()")
    }

    /// The Redis the server uses (its own, or the one it was given).
    pub fn redis_url(&self) -> &str {
        &self.owned.redis_url
    }

    /// The Redis Cluster the builder started for it (`.cluster()`).
    pub fn cluster(&self) -> &topology::TestCluster {
        self.owned
            .cluster
            .as_ref()
            .expect("started with .cluster()")
    }

    /// Starts a server from a whole config (e.g. with TLS) on `listeners`,
    /// without waiting for it to become healthy.
    pub fn spawn_on(config: ServerConfig, listeners: tumbler::server::Listeners) -> Self {
        let addr = listeners.grpc.local_addr().unwrap();
        let http = listeners.http.as_ref().map(|l| l.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tumbler::server::serve_on(config, listeners, async {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            http,
            stop: Some(stop),
            task: Some(task),
            owned: Owned::default(),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::connect(self.endpoint()).await.unwrap()
    }

    pub async fn health(&self, service: &str) -> Result<ServingStatus, tonic::Status> {
        health_status(&self.endpoint(), service).await
    }

    /// Waits (up to 15 s) until the server-wide health status is `wanted`.
    pub async fn wait_for_health(&self, wanted: ServingStatus) {
        wait_for_health(&self.endpoint(), wanted).await
    }

    /// Stops the server gracefully and returns how `serve` ended.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap()
    }

    /// Starts a graceful shutdown (a drain) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits for `serve` to end on its own (e.g. a refused layout).
    pub async fn finished(mut self) -> anyhow::Result<()> {
        tokio::time::timeout(Duration::from_secs(15), self.task.take().unwrap())
            .await
            .expect("server should stop by itself")
            .unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub async fn health_status(endpoint: &str, service: &str) -> Result<ServingStatus, tonic::Status> {
    let channel = Channel::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?;
    Ok(reply.into_inner().status())
}

pub async fn wait_for_health(endpoint: &str, wanted: ServingStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let seen = health_status(endpoint, "").await;
        if seen.as_ref().ok() == Some(&wanted) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never became {wanted:?}; last seen {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain Redis connection for looking at (or damaging) what tumbler wrote.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Every key matching `pattern`, found with SCAN (as an operator would).
/// The holders with a grant stored in a lock's hash (its `h:<holder>`
/// fields, key layout v3), in slot order.
pub async fn grants_in(
    conn: &mut redis::aio::MultiplexedConnection,
    lock_key: &str,
) -> Vec<String> {
    let fields: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(lock_key)
        .query_async(conn)
        .await
        .unwrap();
    let mut grants: Vec<(u32, String)> = (fields.iter())
        .filter_map(|(field, record)| {
            let grant = tumbler_engine::parse_grant(field.strip_prefix("h:")?, record).ok()?;
            Some((grant.slot, grant.holder))
        })
        .collect();
    grants.sort();
    grants.into_iter().map(|(_, holder)| holder).collect()
}

/// The header of a lock's hash (layout v3): limit, holders, earliest
/// expiry, top slot, arrivals, key expiry (stored empty when it is the
/// earliest expiry plus two minutes; given here in full).
pub async fn lock_header(conn: &mut redis::aio::MultiplexedConnection, lock_key: &str) -> Vec<i64> {
    let header: String = redis::cmd("HGET")
        .arg(lock_key)
        .arg("_")
        .query_async(conn)
        .await
        .unwrap();
    let mut fields: Vec<i64> = (header.split('|'))
        .map(|n| if n.is_empty() { -1 } else { n.parse().unwrap() })
        .collect();
    if fields[5] == -1 {
        fields[5] = fields[2] + 120_000;
    }
    fields
}

/// Deletes lock `name` (of any namespace; the name must be one lock's)
/// behind its holders' backs, as Redis losing it would: a session's grants
/// can no longer be released by a plain Release (decision 0082).
pub async fn lose_lock(redis_url: &str, name: &str) {
    let mut conn = redis_conn(redis_url).await;
    let keys = scan_keys(&mut conn, &format!("tumbler:*:l:{name}")).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let _: () = redis::cmd("DEL")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
}

pub async fn scan_keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            keys.sort();
            return keys;
        }
        cursor = next;
    }
}

/// Sends `authorization: Bearer <token>` with every request.
#[derive(Clone)]
pub struct BearerToken(pub String);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let value = format!("Bearer {}", self.0).parse().unwrap();
        req.metadata_mut().insert("authorization", value);
        Ok(req)
    }
}

pub type BearerClient =
    LockServiceClient<tonic::service::interceptor::InterceptedService<Channel, BearerToken>>;

/// A lock service client for a server with auth on, sending `token`.
pub async fn bearer_client(endpoint: &str, token: &str) -> BearerClient {
    let channel = Channel::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    LockServiceClient::with_interceptor(channel, BearerToken(token.to_owned()))
}

/// One `[[token]]` entry of a tokens file for `token` (`extra`: more
/// lines, e.g. `expires_at = "…"`).
pub fn token_entry(name: &str, token: &str, role: &str, namespaces: &str, extra: &str) -> String {
    format!(
        "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nrole = \"{role}\"\nnamespaces = {namespaces}\n{extra}\n",
        tumbler::auth::token_digest(token)
    )
}

/// An acquire request with the common fields filled in.
pub fn acquire(name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        name: name.into(),
        holder: holder.into(),
        ttl_ms: Some(30_000),
        ..Default::default()
    }
}

pub fn release(name: &str, holder: &str) -> proto::ReleaseRequest {
    proto::ReleaseRequest {
        name: name.into(),
        holder: holder.into(),
        ..Default::default()
    }
}

pub fn inspect(name: &str) -> proto::InspectRequest {
    proto::InspectRequest {
        name: name.into(),
        ..Default::default()
    }
}

/// `serve` insists on a choice about authentication: tests that do not
/// configure tokens run without it.
pub fn no_auth_unless_configured(flags: &[&str]) -> Option<&'static str> {
    (!flags
        .iter()
        .any(|f| f.starts_with("--auth-tokens-file") || f.starts_with("--no-auth")))
    .then_some("--no-auth")
}

/// No HTTP port unless the test asks for one.
fn no_http_unless_configured(flags: &[&str]) -> &'static [&'static str] {
    if flags.iter().any(|f| f.starts_with("--http-listen")) {
        &[]
    } else {
        &["--http-listen", "off"]
    }
}

/// A `tumbler serve` process started by this test on a free port; killed
/// (by its pid) when dropped, so a failing test leaves none behind.
pub struct TumblerProcess {
    child: Option<std::process::Child>,
    pub endpoint: String,
}

impl TumblerProcess {
    /// Starts `tumbler serve` against `redis_url` with `flags` added, and
    /// waits until it reports SERVING.
    pub async fn start(redis_url: &str, flags: &[&str]) -> Self {
        let process = Self::spawn(redis_url, flags);
        wait_for_health(&process.endpoint, ServingStatus::Serving).await;
        process
    }

    /// Starts it without waiting for health.
    pub fn spawn(redis_url: &str, flags: &[&str]) -> Self {
        Self::spawn_at(redis_url, tumbler::dev::free_port().unwrap(), flags)
    }

    /// [`Self::spawn`] on a given port (a replica restarted in place).
    pub fn spawn_at(redis_url: &str, port: u16, flags: &[&str]) -> Self {
        Self::spawn_with_env(redis_url, port, flags, &[])
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    pub async fn client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::connect(self.endpoint.clone())
            .await
            .unwrap()
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM; a later [`Self::exit_status`] waits for the exit.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        }
    }

    /// Waits (off the async threads) for the process to exit.
    pub async fn exit_status(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("still running");
        tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap()
    }
}

impl Drop for TumblerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits (up to 10 s) until Inspect counts `n` live waiters on `name`.
pub async fn until_waiters(client: &mut LockServiceClient<Channel>, name: &str, n: u32) {
    until_waiters_in(client, "", name, n).await
}

/// [`until_waiters`] for a lock of `namespace`.
pub async fn until_waiters_in(
    client: &mut LockServiceClient<Channel>,
    namespace: &str,
    name: &str,
    n: u32,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let request = proto::InspectRequest {
        namespace: namespace.into(),
        name: name.into(),
    };
    loop {
        let seen = client.inspect(request.clone()).await.unwrap().into_inner();
        if seen.waiters == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never had {n} waiter(s); last seen {}",
            seen.waiters
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every page of a List, following the page tokens from `request`'s own.
pub async fn list_pages(
    client: &mut LockServiceClient<Channel>,
    request: proto::ListRequest,
) -> Vec<proto::ListResponse> {
    let mut pages = Vec::new();
    let mut token = request.page_token.clone();
    loop {
        let page = client
            .list(proto::ListRequest {
                page_token: token,
                ..request.clone()
            })
            .await
            .unwrap()
            .into_inner();
        token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            return pages;
        }
    }
}
