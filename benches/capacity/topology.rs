//! The Redis side of the capacity benchmark: a Redis Cluster of three
//! masters, each with one replica (six redis-server processes), or one
//! plain redis-server; every one a child of this process on free loopback
//! ports, stopped by its pid when dropped (`tumbler::dev::RedisServer`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tumbler::dev::RedisServer;

/// One redis-server of the topology and what it is.
pub struct Node {
    pub server: RedisServer,
    /// "master" or "replica" (as the node reported it once the cluster
    /// formed).
    pub role: String,
    /// `m1`…, `r1`… (a replica numbered as its master).
    pub label: String,
}

impl Node {
    pub fn pid(&self) -> u32 {
        self.server.pid().expect("a running redis-server")
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }
}

pub struct Topology {
    pub nodes: Vec<Node>,
    pub url: String,
}

/// Runs one command on the node at `port`, synchronously.
pub fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(5))?;
    cmd.query(&mut conn)
}

/// One plain redis-server.
pub fn single() -> Result<Topology, String> {
    let server = RedisServer::start("redis-server").map_err(|e| format!("{e:#}"))?;
    let url = server.url();
    Ok(Topology {
        nodes: vec![Node {
            server,
            role: "master".into(),
            label: "single".into(),
        }],
        url,
    })
}

/// A cluster-enabled redis-server. It binds its cluster bus port (port +
/// 10000) itself and exits when it cannot, so a start that succeeded has
/// both; a few tries, as the bus port is not probed first.
fn cluster_node() -> Result<RedisServer, String> {
    let mut last = String::new();
    for _ in 0..10 {
        match RedisServer::start_with_args(
            "redis-server",
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
                // A replica's first sync at once, not after the default
                // 5 s wait for more replicas.
                "--repl-diskless-sync-delay",
                "0",
            ],
        ) {
            Ok(server) => return Ok(server),
            Err(e) => last = format!("{e:#}"),
        }
    }
    Err(last)
}

/// Three masters and three replicas joined with `redis-cli --cluster
/// create … --cluster-replicas 1`; waits until every node reports the
/// cluster OK and every replica is in sync. An error says why a cluster
/// cannot be had here (the caller skips).
pub fn cluster() -> Result<Topology, String> {
    let servers = (0..6)
        .map(|_| cluster_node())
        .collect::<Result<Vec<_>, _>>()?;
    let mut create = Command::new("redis-cli");
    create.args(["--cluster", "create"]);
    for server in &servers {
        create.arg(format!("127.0.0.1:{}", server.port()));
    }
    let output = create
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = servers.iter().all(|s| {
            let info: String =
                query(s.port(), redis::cmd("CLUSTER").arg("INFO")).unwrap_or_default();
            let replication: String =
                query(s.port(), redis::cmd("INFO").arg("replication")).unwrap_or_default();
            info.contains("cluster_state:ok")
                && info.contains("cluster_known_nodes:6")
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
        });
        if ready {
            break;
        }
        if Instant::now() > deadline {
            return Err("the cluster did not become ok within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Roles and labels: masters m1..m3 by port, each replica named after
    // its master.
    let mut nodes: Vec<(RedisServer, String, u16)> = Vec::new();
    for server in servers {
        let replication: String = query(server.port(), redis::cmd("INFO").arg("replication"))
            .map_err(|e| e.to_string())?;
        let master_port = replication
            .lines()
            .find_map(|l| l.strip_prefix("master_port:"))
            .and_then(|p| p.trim().parse().ok());
        let (role, of) = match master_port {
            Some(port) => ("replica".to_owned(), port),
            None => ("master".to_owned(), server.port()),
        };
        nodes.push((server, role, of));
    }
    let mut master_ports: Vec<u16> = nodes
        .iter()
        .filter(|(_, role, _)| role == "master")
        .map(|(s, _, _)| s.port())
        .collect();
    master_ports.sort();
    let mut labelled: Vec<Node> = nodes
        .into_iter()
        .map(|(server, role, of)| {
            let n = master_ports
                .iter()
                .position(|&p| p == of)
                .map_or(0, |i| i + 1);
            let label = format!("{}{n}", if role == "master" { "m" } else { "r" });
            Node {
                server,
                role,
                label,
            }
        })
        .collect();
    labelled.sort_by(|a, b| a.label.cmp(&b.label));
    let url = format!(
        "redis+cluster://{}",
        labelled
            .iter()
            .filter(|n| n.role == "master")
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok(Topology {
        nodes: labelled,
        url,
    })
}
