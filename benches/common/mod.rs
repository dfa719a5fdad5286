//! Shared by the benchmarks: a `tumbler serve` process of its own (so its
//! RSS is the replica's alone) or a server in the bench's own process,
//! waiting until it serves, reading its RSS;
//! and Redis' own command counters (`INFO commandstats`); acquire +
//! release pairs from many clients, with their rate and Redis' work per
//! pair (`pairs.rs`); the peers etcd (`etcd.rs`) and ZooKeeper
//! (`zookeeper.rs`), each a server of the benchmark's own.

pub mod etcd;
pub mod pairs;
pub mod zookeeper;

use std::time::Duration;

use tonic::transport::Channel;
use tumbler::proto::{self, lock_service_client::LockServiceClient};

/// A `tumbler serve` child on a free port (no auth, no HTTP port), killed
/// by its pid when dropped.
pub struct ServeProcess {
    child: std::process::Child,
    pub endpoint: String,
}

impl ServeProcess {
    /// Starts it against `redis_url` with `flags` added and waits until it
    /// answers.
    pub async fn start(redis_url: &str, flags: &[&str]) -> ServeProcess {
        Self::start_binary(env!("CARGO_BIN_EXE_tumbler"), redis_url, flags).await
    }

    /// [`Self::start`] with another `tumbler` binary (an earlier version,
    /// to compare in the same run).
    pub async fn start_binary(binary: &str, redis_url: &str, flags: &[&str]) -> ServeProcess {
        let mut args = vec![
            "--no-auth",
            "--redis-url",
            redis_url,
            "--http-listen",
            "off",
        ];
        args.extend_from_slice(flags);
        Self::start_with_args(binary, &args).await
    }

    /// `tumbler serve --listen <free port>` with exactly `args` after it
    /// (nothing assumed: auth, Redis, HTTP port all given by the caller).
    pub async fn start_with_args(binary: &str, args: &[&str]) -> ServeProcess {
        let port = tumbler::dev::free_port().unwrap();
        let child = std::process::Command::new(binary)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let process = ServeProcess {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        wait_until_serving(&process.endpoint).await;
        process
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size, from /proc.
    pub fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (up to 20 s) until a server at `endpoint` answers an Inspect.
pub async fn wait_until_serving(endpoint: &str) {
    for _ in 0..400 {
        if let Ok(channel) = Channel::from_shared(endpoint.to_owned())
            .unwrap()
            .connect()
            .await
        {
            let probe = LockServiceClient::new(channel)
                .inspect(proto::InspectRequest {
                    name: "probe".into(),
                    ..Default::default()
                })
                .await;
            // Refused for want of a token is an answer too (auth on).
            match probe {
                Ok(_) => return,
                Err(status) if status.code() == tonic::Code::Unauthenticated => return,
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{endpoint} never served");
}

/// A multiplexed connection to the benchmark's own Redis.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// One line of `INFO commandstats`.
#[derive(Debug)]
pub struct CommandStat {
    pub name: String,
    pub calls: u64,
    pub usec: u64,
}

/// Zeroes Redis' command counters (`CONFIG RESETSTAT`).
pub async fn reset_command_stats(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// Every command Redis counted since the last reset, scripts' inner
/// commands included (under their own names).
pub async fn command_stats(conn: &mut redis::aio::MultiplexedConnection) -> Vec<CommandStat> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(name, stats)| {
            let field = |key: &str| -> u64 {
                (stats.split(','))
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            CommandStat {
                name: name.to_owned(),
                calls: field("calls="),
                usec: field("usec="),
            }
        })
        .collect()
}

/// Starts `tumbler::server::serve` inside the bench's process on a free
/// loopback port and returns its endpoint (not waited for: see
/// [`wait_until_serving`]).
pub async fn serve_in_process(config: tumbler::config::ServerConfig) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(tumbler::server::serve(
        config,
        listener,
        std::future::pending(),
    ));
    endpoint
}

/// Waits until `name` has exactly one waiter (the bench's own).
pub async fn wait_queued(client: &mut LockServiceClient<Channel>, name: &str) {
    loop {
        let queue = client
            .queue(proto::QueueRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if queue.waiters == 1 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// The quantile `q` of a histogram of microseconds.
pub fn micros(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64
}
