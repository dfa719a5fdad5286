//! ZooKeeper as a peer: Debian's `zookeeper` 3.8 (jars only) started by
//! the benchmark on a free loopback port with its data on tmpfs, and the
//! lock recipe of Curator's `InterProcessMutex` over the `zookeeper-client`
//! crate, one session per client.
//!
//! The recipe: create an EPHEMERAL_SEQUENTIAL child under the lock's node;
//! list the children; the lowest holds the lock; any other sets a watch
//! (getData) on the next lower child, waits for its deletion and lists
//! again. Release deletes the child. Uncontended that is three requests
//! (create, getChildren, delete), of which two are writes.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zookeeper_client as zk;

/// Debian's classpath for the server (`/etc/zookeeper/conf/environment`,
/// which `zkEnv.sh` links to): the jar's manifest names the rest.
const CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar";
const JAR: &str = "/usr/share/java/zookeeper.jar";
const JAVA: &str = "/usr/bin/java";

/// The line a benchmark prints when it skips its ZooKeeper rows.
pub const HOW_TO_GET: &str = "(no ZooKeeper: the ZooKeeper rows were skipped; `apt-get install zookeeper` gives Debian's 3.8 and a JRE)";

/// How long a benchmark warms a fresh ZooKeeper's JIT before measuring it
/// (ZK_WARM_SECONDS overrides): a fresh JVM measured at once runs well
/// below its steady rate for several seconds.
pub fn warm_up_length() -> Duration {
    Duration::from_secs(
        std::env::var("ZK_WARM_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(15),
    )
}

fn options(mode: zk::CreateMode) -> zk::CreateOptions<'static> {
    mode.with_acls(zk::Acls::anyone_all())
}

/// A standalone ZooKeeper of the benchmark's own (`ZooKeeperServerMain`
/// with a generated `zoo.cfg`), killed by its pid when dropped.
pub struct ZkServer {
    child: Child,
    /// `127.0.0.1:<port>`, for the client's connect string.
    pub address: String,
    _dir: tempfile::TempDir,
}

impl ZkServer {
    /// Whether Debian's ZooKeeper and a Java runtime are installed.
    pub fn installed() -> bool {
        Path::new(JAR).exists() && Path::new(JAVA).exists()
    }

    /// Starts it (not waited for: see [`Self::ready`]); None when it is
    /// not installed.
    pub fn start() -> Option<Self> {
        if !Self::installed() {
            return None;
        }
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let port = tumbler::dev::free_port().unwrap();
        let config = dir.path().join("zoo.cfg");
        // Standalone, as Debian's zoo.cfg, on loopback; no admin HTTP
        // server (it would take port 8080), no per-address connection cap.
        std::fs::write(
            &config,
            format!(
                "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new(JAVA)
            .args([
                "-cp",
                CLASSPATH,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(&config)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(ZkServer {
            child,
            address: format!("127.0.0.1:{port}"),
            _dir: dir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (up to 30 s) until a session can be opened and a node read.
    pub async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let connect = zk::Client::connector()
                .with_connection_timeout(Duration::from_secs(1))
                .with_fail_eagerly()
                .connect(&self.address);
            if let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(2), connect).await
                && client.check_stat("/").await.is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("ZooKeeper did not come up at {}", self.address);
    }

    /// A new session (one per client, as the recipe is used).
    pub async fn session(&self) -> zk::Client {
        session(&self.address).await
    }

    /// Runs the recipe for `length`: 16 sessions, first each on a lock of
    /// its own, then all on one lock, so the JIT has compiled both paths
    /// before anything is measured.
    pub async fn warm_up(&self, length: Duration) {
        if length.is_zero() {
            return;
        }
        for (phase, part) in [("own", length * 2 / 3), ("one", length / 3)] {
            let stop_at = Instant::now() + part;
            let mut tasks = tokio::task::JoinSet::new();
            for id in 0..16 {
                let client = self.session().await;
                let dir = match phase {
                    "own" => format!("/warm-{id}"),
                    _ => "/warm-hot".to_owned(),
                };
                tasks.spawn(async move {
                    make_lock_node(&client, &dir).await;
                    while Instant::now() < stop_at {
                        let held = lock(&client, &dir, || {}).await;
                        unlock(&client, &held).await;
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.unwrap();
            }
        }
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new session with the ZooKeeper at `address` (`host:port`).
pub async fn session(address: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(address)
        .await
        .unwrap_or_else(|e| panic!("ZooKeeper session at {address}: {e}"))
}

/// Creates the lock's (persistent) node if it is missing; `dir` is an
/// absolute path one level under the root.
pub async fn make_lock_node(client: &zk::Client, dir: &str) {
    match client
        .create(dir, b"", &options(zk::CreateMode::Persistent))
        .await
    {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => panic!("create {dir}: {e}"),
    }
}

/// Curator's InterProcessMutex acquire on the lock node `dir` (which must
/// exist): returns the path of this session's child once it is the lowest.
/// `waiting` is called each time the client starts waiting on a watch (the
/// watch is set by then).
pub async fn lock(client: &zk::Client, dir: &str, mut waiting: impl FnMut()) -> String {
    let prefix = format!("{dir}/lock-");
    let (_, sequence) = client
        .create(&prefix, b"", &options(zk::CreateMode::EphemeralSequential))
        .await
        .unwrap_or_else(|e| panic!("create {prefix}: {e}"));
    let mine = format!("lock-{sequence}");
    loop {
        let mut children = client
            .list_children(dir)
            .await
            .unwrap_or_else(|e| panic!("getChildren {dir}: {e}"));
        // One prefix, zero-padded sequence numbers: name order is
        // sequence order.
        children.sort_unstable();
        let at = children
            .iter()
            .position(|child| *child == mine)
            .unwrap_or_else(|| panic!("{dir}/{mine} is gone"));
        if at == 0 {
            return format!("{dir}/{mine}");
        }
        let lower = format!("{dir}/{}", children[at - 1]);
        match client.get_and_watch_data(&lower).await {
            // Deleted between the listing and the watch: list again.
            Err(zk::Error::NoNode) => continue,
            Err(e) => panic!("getData {lower}: {e}"),
            Ok((_, _, watcher)) => {
                waiting();
                watcher.changed().await;
            }
        }
    }
}

/// Release: deletes the child [`lock`] returned.
pub async fn unlock(client: &zk::Client, held: &str) {
    client
        .delete(held, None)
        .await
        .unwrap_or_else(|e| panic!("delete {held}: {e}"));
}
