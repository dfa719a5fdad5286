//! Redis topologies for the tests: a 3-master Redis Cluster, and a
//! master + replica watched by Sentinel. Every process is a child of the
//! test, on free loopback ports, in its own temp directory; each is stopped
//! by its pid when its handle is dropped (and told by the kernel to stop
//! if the test's thread dies first).

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::wait::wait_until;

/// One redis-server (or sentinel) child.
pub struct RedisNode {
    pub port: u16,
    dir: tempfile::TempDir,
    /// Arguments after the binary (a config file first for sentinels).
    args: Vec<String>,
    child: Option<Child>,
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn free_port_pair() -> u16 {
    loop {
        let port = tumbler::dev::free_port().unwrap();
        if port <= 55_535 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisNode {
    /// A redis-server on a free port with `extra` arguments, keeping
    /// nothing on disk.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(tumbler::dev::free_port().unwrap(), extra)
    }

    fn start_on(port: u16, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tumbler-topology-")
            .tempdir()
            .unwrap();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "redis.log",
            "--dir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(dir.path().display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut node = RedisNode {
            port,
            dir,
            args,
            child: None,
        };
        node.spawn();
        node
    }

    /// A sentinel on a free port watching `master_port` as `name`.
    pub fn start_sentinel(name: &str, master_port: u16) -> Self {
        Self::start_sentinel_with(name, master_port, &[])
    }

    /// [`Self::start_sentinel`] with `extra` arguments (e.g. TLS settings).
    pub fn start_sentinel_with(name: &str, master_port: u16, extra: &[&str]) -> Self {
        let port = tumbler::dev::free_port().unwrap();
        let dir = tempfile::Builder::new()
            .prefix("tumbler-sentinel-")
            .tempdir()
            .unwrap();
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile sentinel.log\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 10000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.path().display()
            ),
        )
        .unwrap();
        let mut node = RedisNode {
            port,
            dir,
            args: [config.display().to_string(), "--sentinel".into()]
                .into_iter()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect(),
            child: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only an async-signal-safe prctl call between fork and exec.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        self.child = Some(
            command
                .spawn()
                .expect("redis-server must be installed (scripts/test.sh installs it)"),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tumbler::dev::ping(self.port) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "redis-server on port {} exited with {status}: {}",
                    self.port,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The node's log files, for failure messages.
    pub fn log(&self) -> String {
        ["redis.log", "sentinel.log"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.path().join(f)).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again on the same port with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs one command synchronously (for set-up and checks).
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        self.try_query(cmd).unwrap()
    }

    /// [`Self::query`], keeping Redis' error.
    pub fn try_query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(5))?;
        cmd.query(&mut conn)
    }

    /// Every key matching `pattern` on this node, by SCAN.
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let mut keys: Vec<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut conn)
            .unwrap()
            .map(|k| k.unwrap())
            .collect();
        keys.sort();
        keys
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            tumbler::dev::stop_child(child);
        }
    }
}

/// A Redis Cluster of three masters (no replicas).
pub struct TestCluster {
    pub nodes: Vec<RedisNode>,
}

impl TestCluster {
    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Keys matching `pattern` per node (SCAN on each).
    pub fn scan_each(&self, pattern: &str) -> Vec<Vec<String>> {
        self.nodes.iter().map(|n| n.scan(pattern)).collect()
    }
}

/// Starts three `--cluster-enabled` redis-servers, joins them with
/// `redis-cli --cluster create` and waits until every node reports the
/// cluster OK.
pub fn start_cluster() -> TestCluster {
    start_cluster_with(&[])
}

/// [`start_cluster`] with `extra` arguments for every node (e.g. AOF).
pub fn start_cluster_with(extra: &[&str]) -> TestCluster {
    let nodes: Vec<RedisNode> = (0..3)
        .map(|_| {
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ];
            args.extend_from_slice(extra);
            RedisNode::start_on(free_port_pair(), &args)
        })
        .collect();
    let mut create = Command::new("redis-cli");
    create.arg("--cluster").arg("create");
    for node in &nodes {
        create.arg(format!("127.0.0.1:{}", node.port));
    }
    let output = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli must be installed (scripts/test.sh installs redis-tools)");
    assert!(
        output.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for node in &nodes {
        wait_until(
            "the cluster is ok on every node",
            Duration::from_secs(20),
            || {
                let info: String = node.query(redis::cmd("CLUSTER").arg("INFO"));
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            },
        );
    }
    TestCluster { nodes }
}

/// A master, one replica of it, and a sentinel watching them.
pub struct SentinelSetup {
    pub name: String,
    pub master: RedisNode,
    pub replica: RedisNode,
    pub sentinel: RedisNode,
    /// A sentinel address where nothing answers, listed first in
    /// [`Self::url`] so the service must fall back to the next one.
    dead_sentinel: u16,
}

impl SentinelSetup {
    /// `redis+sentinel://` naming a dead sentinel and the live one.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/{}",
            self.dead_sentinel, self.sentinel.port, self.name
        )
    }

    /// The port of the master as the sentinel sees it now.
    pub fn master_port(&self) -> u16 {
        let addr: Vec<String> = self.sentinel.query(
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.name),
        );
        addr[1].parse().unwrap()
    }
}

/// Waits until `replica` is in sync with its master.
pub fn wait_for_replication(replica: &RedisNode) {
    wait_until("the replica is in sync", Duration::from_secs(20), || {
        let info: String = replica.query(redis::cmd("INFO").arg("replication"));
        info.contains("master_link_status:up")
    });
}

/// A master with one replica.
pub fn start_replicated() -> (RedisNode, RedisNode) {
    let master = RedisNode::start(&[]);
    let replica = RedisNode::start(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    wait_for_replication(&replica);
    (master, replica)
}

/// Master + replica + a sentinel that knows both and can fail over
/// (1 s down-after, quorum 1).
pub fn start_sentinel_setup() -> SentinelSetup {
    let name = "tumbler-test".to_owned();
    let (master, replica) = start_replicated();
    let sentinel = RedisNode::start_sentinel(&name, master.port);
    wait_until(
        "the sentinel knows the replica",
        Duration::from_secs(20),
        || {
            let replicas: Vec<redis::Value> =
                sentinel.query(redis::cmd("SENTINEL").arg("REPLICAS").arg(&name));
            !replicas.is_empty()
        },
    );
    SentinelSetup {
        name,
        master,
        replica,
        sentinel,
        dead_sentinel: tumbler::dev::free_port().unwrap(),
    }
}

/// A `tumbler serve` process with environment variables of its own (here
/// beside the topologies it is started against; the harness's
/// `TumblerProcess::spawn_at` is this with none).
impl super::TumblerProcess {
    /// [`Self::spawn_at`] with environment variables set for the process
    /// (a debug build's test hooks).
    pub fn spawn_with_env(
        redis_url: &str,
        port: u16,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
            .envs(env.iter().copied())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--redis-url", redis_url])
            .args(super::no_http_unless_configured(flags))
            .args(super::no_auth_unless_configured(flags))
            .args(flags)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        super::TumblerProcess {
            child: Some(child),
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }
}
