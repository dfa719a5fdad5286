//! What one lock operation costs Redis, counted by Redis itself
//! (`INFO commandstats` after `CONFIG RESETSTAT`): script calls, the
//! commands run inside them, and Redis' own time in them, per operation.
//! Command counts are exact whatever the machine is doing; Redis' time is
//! what Redis measures around each call, which a busy shared machine
//! inflates (compare runs made side by side).
//!
//! Baseline in the same run, on the same Redis: the plainest Redis lock
//! there is — `SET key value NX PX ttl`, and a compare-and-delete script to
//! release — which has no queue, no fencing token, no semaphore, no index
//! and no metrics. The ratio is what tumbler's guarantees cost Redis.
//!
//! A second measurement counts Redis' CPU instructions per pair with
//! callgrind (valgrind): Redis runs under it, counting only while the pairs
//! run. Instruction counts are exact and repeatable whatever else the
//! shared machine does, so this ratio is the one to compare across runs.
//! Skipped (with a note) where valgrind is not installed.
//!
//! A third counts instructions per pair with group commit's batch
//! function (`lua/batch.lua`, called as `crates/tumbler-engine/src/group.rs`
//! calls it): N acquires in one call, then their N releases in one, for
//! each N in SCRIPT_COST_BATCHES (default `1,4,16,64`), beside the plain
//! lock at its best, its N `SET NX PX` pipelined, then its N `EVALSHA`.
//! The calls are made here with the engine's own typed twins (the same
//! keys and arguments the server sends), on a Redis with the library
//! loaded, so each batch is exactly N operations (SCRIPT_COST_BATCH_PAIRS
//! per N, default 1024). `SCRIPT_COST_ONLY=batches` runs this one alone.
//!
//! `cargo bench --bench script_cost` (SCRIPT_COST_PAIRS=N, default 5000;
//! SCRIPT_COST_CALLGRIND_PAIRS=N, default 1000). Under `cargo test` it
//! runs a few pairs as a smoke test (the SCRIPT_COST_* counts given still
//! apply: Redis' instructions do not depend on how this side was built).
//! `SCRIPT_COST_COMPARE=label=path,…` measures other `tumbler` binaries
//! (earlier versions) in the same run, each on a Redis of its own;
//! `bench/run.sh` builds one from a git revision given as
//! `COMPARE_WITH=<rev>`.

pub mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::ServeProcess;
use redis::Value;
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};
use tumbler_engine::keys::Layout;
use tumbler_engine::scripts::Scripts;
use tumbler_engine::{self as engine, LockId, ops};

/// Commands the measurement itself, the health check and the pub/sub
/// connection send: not part of any lock operation.
const NOT_LOCK_WORK: &[&str] = &[
    "info",
    "config|resetstat",
    "ping",
    "subscribe",
    "client|setname",
    "hello",
    "select",
];

/// Redis' counters since the last reset.
#[derive(Debug, Default)]
struct Counted {
    /// Calls the client sent: scripts, and the baseline's SET.
    top_level_calls: u64,
    /// Commands run by scripts (Redis counts them under their own names).
    inner_commands: u64,
    /// Redis' time in the top-level calls (scripts include their commands).
    usec: u64,
}

/// What Redis counted since the reset; `top_level` names the commands the
/// client sent itself (the rest ran inside scripts).
async fn counted(conn: &mut redis::aio::MultiplexedConnection, top_level: &[&str]) -> Counted {
    let mut counted = Counted::default();
    for stat in common::command_stats(conn).await {
        match stat.name.as_str() {
            name if top_level.contains(&name) => {
                counted.top_level_calls += stat.calls;
                counted.usec += stat.usec;
            }
            name if NOT_LOCK_WORK.contains(&name) => {}
            _ => counted.inner_commands += stat.calls,
        }
    }
    counted
}

/// The baseline's release: delete the key only if it still holds our value.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// One tumbler pair: try-once acquire, then release, on a fresh name.
async fn tumbler_pair(client: &mut LockServiceClient<tonic::transport::Channel>, i: u64) {
    let name = format!("cost-{i}");
    let reply = client
        .acquire(proto::AcquireRequest {
            name: name.clone(),
            holder: "h".into(),
            ttl_ms: Some(30_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let reply = client
        .release(proto::ReleaseRequest {
            name,
            holder: "h".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), ReleaseStatus::Released);
}

/// One baseline pair: SET NX PX, then compare-and-delete.
async fn baseline_pair(conn: &redis::aio::MultiplexedConnection, release: &redis::Script, i: u64) {
    let key = format!("plain:{i}");
    let set: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("h")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert!(set.is_some());
    let deleted: i64 = release
        .key(&key)
        .arg("h")
        .invoke_async(&mut conn.clone())
        .await
        .unwrap();
    assert_eq!(deleted, 1);
}

/// A tumbler server for the measurement: health checks far apart (their
/// PINGs are not lock work) and no background reaper.
async fn measured_server(binary: &str, redis_url: &str, redis_timeout_ms: &str) -> ServeProcess {
    ServeProcess::start_binary(
        binary,
        redis_url,
        &[
            "--health-interval-ms",
            "60000",
            "--reap-interval-ms",
            "0",
            "--redis-timeout-ms",
            redis_timeout_ms,
        ],
    )
    .await
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The tumbler binaries to measure: this build, then any named in
/// SCRIPT_COST_COMPARE (`label=path,…`).
fn binaries() -> Vec<(String, String)> {
    let mut binaries = vec![(
        "tumbler (this build)".to_owned(),
        env!("CARGO_BIN_EXE_tumbler").to_owned(),
    )];
    for entry in std::env::var("SCRIPT_COST_COMPARE")
        .unwrap_or_default()
        .split(',')
        .filter(|e| !e.is_empty())
    {
        let (label, path) = entry.split_once('=').expect("label=path");
        binaries.push((format!("tumbler {label}"), path.to_owned()));
    }
    binaries
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let sized =
        |name: &str, bench: u64, smoke: u64| env_or(name, if benching { bench } else { smoke });
    let binaries = binaries();
    if std::env::var("SCRIPT_COST_ONLY").as_deref() != Ok("batches") {
        command_stats(&binaries, sized("SCRIPT_COST_PAIRS", 5000, 50)).await;
        instructions(&binaries, sized("SCRIPT_COST_CALLGRIND_PAIRS", 1000, 20)).await;
    }
    let default_sizes = if benching { "1,4,16,64" } else { "4" };
    let sizes: Vec<usize> = std::env::var("SCRIPT_COST_BATCHES")
        .unwrap_or_else(|_| default_sizes.to_owned())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("SCRIPT_COST_BATCHES: sizes like 1,4,16,64")
        })
        .collect();
    batches(&sizes, sized("SCRIPT_COST_BATCH_PAIRS", 1024, 8)).await;
}

/// Script calls, commands inside them and Redis' µs per pair, from
/// `INFO commandstats`: each binary on a Redis of its own, then the
/// baseline.
async fn command_stats(binaries: &[(String, String)], pairs: u64) {
    let mut rows = Vec::new();
    for (label, binary) in binaries {
        let redis = RedisServer::start("redis-server").expect("redis-server");
        let server = measured_server(binary, &redis.url(), "500").await;
        let mut client = LockServiceClient::connect(server.endpoint.clone())
            .await
            .unwrap();
        let mut conn = common::redis_conn(&redis.url()).await;
        for i in 0..100 {
            tumbler_pair(&mut client, 1_000_000_000 + i).await;
        }
        common::reset_command_stats(&mut conn).await;
        for i in 0..pairs {
            tumbler_pair(&mut client, i).await;
        }
        let counted = counted(&mut conn, &["fcall", "evalsha"]).await;
        if std::env::var_os("SCRIPT_COST_VERBOSE").is_some() {
            println!("{label}:");
            for stat in common::command_stats(&mut conn).await {
                println!(
                    "  {}: {:.2} per pair",
                    stat.name,
                    stat.calls as f64 / pairs as f64
                );
            }
        }
        assert!(counted.top_level_calls >= 2 * pairs, "{label}");
        rows.push((label.clone(), counted));
    }

    let redis = RedisServer::start("redis-server").expect("redis-server");
    let conn = common::redis_conn(&redis.url()).await;
    let mut stats_conn = conn.clone();
    let release = redis::Script::new(COMPARE_AND_DELETE);
    for i in 0..100 {
        baseline_pair(&conn, &release, 1_000_000_000 + i).await;
    }
    common::reset_command_stats(&mut stats_conn).await;
    for i in 0..pairs {
        baseline_pair(&conn, &release, i).await;
    }
    let baseline = counted(&mut stats_conn, &["evalsha", "eval", "set"]).await;
    assert!(baseline.top_level_calls >= 2 * pairs);

    let per = |n: u64| n as f64 / pairs as f64;
    println!("Redis work per acquire+release pair, {pairs} pairs, uncontended, one client\n");
    println!(
        "| lock | calls | commands inside scripts | all commands | Redis µs | µs ÷ baseline |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    rows.push((
        "baseline: SET NX PX + compare-and-delete".to_owned(),
        baseline,
    ));
    let baseline_usec = rows.last().map_or(1, |(_, c)| c.usec.max(1));
    for (label, c) in &rows {
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} |",
            per(c.top_level_calls),
            per(c.inner_commands),
            per(c.top_level_calls + c.inner_commands),
            per(c.usec),
            c.usec as f64 / baseline_usec as f64
        );
    }
}

/// A redis-server running under callgrind, instrumented (counting) only
/// while told.
struct CallgrindRedis {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl CallgrindRedis {
    /// None (with a note) where valgrind is not installed.
    fn start() -> Option<CallgrindRedis> {
        let installed = |tool: &str| {
            Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !installed("valgrind") || !installed("callgrind_control") {
            println!("\n(valgrind is not installed: Redis instructions per pair not measured)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = tumbler::dev::free_port().unwrap();
        let child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--instr-atstart=no")
            .arg(format!(
                "--callgrind-out-file={}",
                dir.path().join("redis.cg").display()
            ))
            .args(["redis-server", "--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            // Redis' timer housekeeping (serverCron: memory statistics,
            // expiry sampling) runs `hz` times a second whatever the
            // pairs do, so its share grows with the run's wall time (a
            // busy machine, a slower build): once a second keeps it out
            // of the comparison.
            .args(["--hz", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let redis = CallgrindRedis { child, port, dir };
        for _ in 0..600 {
            if tumbler::dev::ping(port) {
                return Some(redis);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server under callgrind never answered");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn control(&self, args: &[&str]) {
        let status = Command::new("callgrind_control")
            .args(args)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "callgrind_control {args:?}");
    }

    /// Instructions Redis ran while `work` ran (collection on only then).
    async fn count<F: std::future::Future<Output = ()>>(&self, work: F) -> u64 {
        self.control(&["--zero"]);
        self.control(&["--instr=on"]);
        work.await;
        self.control(&["--instr=off"]);
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        self.control(&["--dump"]);
        let total = total_instructions(self.dir.path());
        keep_dump(self.dir.path());
        total
    }
}

impl Drop for CallgrindRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The instructions in the dump in `dir`: its `totals:` line (`summary:`
/// stays 0 when instrumentation was switched on and off during the run).
fn total_instructions(dir: &Path) -> u64 {
    for _ in 0..100 {
        let dumps: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
            .collect();
        let total = dumps.iter().find_map(|text| {
            text.lines()
                .find_map(|line| (line.strip_prefix("totals:")).and_then(|n| n.trim().parse().ok()))
        });
        if let Some(total) = total {
            return total;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no callgrind dump in {}", dir.display());
}

/// With `SCRIPT_COST_KEEP=<dir>`, each measurement's callgrind dump is
/// copied there (`callgrind_annotate --inclusive=yes <file>` shows where
/// Redis' instructions went: the profile behind the notebook's tables, docs/benchmarks/notebook.md).
fn keep_dump(dir: &Path) {
    let Ok(keep) = std::env::var("SCRIPT_COST_KEEP") else {
        return;
    };
    std::fs::create_dir_all(&keep).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let n = std::fs::read_dir(&keep).unwrap().count();
        std::fs::copy(&path, Path::new(&keep).join(format!("{n}.cg"))).unwrap();
    }
}

/// Redis' CPU instructions per pair, counted by callgrind: each binary
/// on a Redis of its own, then the baseline.
async fn instructions(binaries: &[(String, String)], pairs: u64) {
    let mut rows = Vec::new();
    for (label, binary) in binaries {
        let Some(redis) = CallgrindRedis::start() else {
            return;
        };
        // Redis runs many times slower under valgrind: a long command timeout.
        let server = measured_server(binary, &redis.url(), "20000").await;
        let mut client = LockServiceClient::connect(server.endpoint.clone())
            .await
            .unwrap();
        for i in 0..20 {
            tumbler_pair(&mut client, 1_000_000_000 + i).await;
        }
        let counted = redis
            .count(async {
                for i in 0..pairs {
                    tumbler_pair(&mut client, i).await;
                }
            })
            .await;
        assert!(counted > 0, "{label}");
        rows.push((label.clone(), counted));
    }
    let Some(redis) = CallgrindRedis::start() else {
        return;
    };
    let conn = common::redis_conn(&redis.url()).await;
    let release = redis::Script::new(COMPARE_AND_DELETE);
    for i in 0..20 {
        baseline_pair(&conn, &release, 1_000_000_000 + i).await;
    }
    let baseline = redis
        .count(async {
            for i in 0..pairs {
                baseline_pair(&conn, &release, i).await;
            }
        })
        .await;
    assert!(baseline > 0);
    let per = |n: u64| n as f64 / pairs as f64;
    println!("\nRedis CPU instructions per acquire+release pair (callgrind), {pairs} pairs\n");
    println!("| lock | instructions per pair | ÷ baseline |");
    println!("| --- | ---: | ---: |");
    for (label, counted) in &rows {
        println!(
            "| {label} | {:.0} | {:.2} |",
            per(*counted),
            *counted as f64 / baseline as f64
        );
    }
    println!(
        "| baseline: SET NX PX + compare-and-delete | {:.0} | 1.00 |",
        per(baseline)
    );
}

/// One operation of a call: its function, keys and arguments.
struct Op {
    name: &'static str,
    keys: Vec<String>,
    args: Vec<String>,
}

/// Builds acquire and release calls as the server does (its defaults:
/// key prefix `tumbler`, 32 shards, the default namespace and kind, no
/// events) with the engine's typed twins.
struct Calls {
    scripts: Scripts,
    layout: Layout,
    /// Redis ms far enough ahead that no batch runs past it.
    answer_by: i64,
}

impl Calls {
    fn acquire(&self, name: &str) -> Op {
        let req = engine::AcquireRequest::new(
            LockId::parse("default", name).unwrap(),
            engine::Holder::stored("h"),
            engine::Ttl::stored(30_000),
        );
        let call = ops::acquire::Call {
            req: &req,
            metadata: "",
            answer_by: self.answer_by,
            watched: ops::Emit::default(),
            max_locks: 0,
            wait: None,
        };
        self.op("acquire", name, call.args())
    }

    fn release(&self, name: &str) -> Op {
        let call = ops::release::Call {
            holder: "h",
            ..Default::default()
        };
        self.op("release", name, call.args())
    }

    fn op(&self, name: &'static str, lock: &str, args: Vec<String>) -> Op {
        let keys = self.layout.lock_keys("default", lock);
        let keys = keys
            .declared(false)
            .into_iter()
            .map(str::to_owned)
            .collect();
        Op { name, keys, args }
    }

    /// One `FCALL` for `ops`: the operation's own function (`own`, one
    /// operation: what group commit sends when nothing else waits), else
    /// `lua/batch.lua`'s, with every operation's keys, then per operation
    /// its name, key count, argument count and arguments.
    fn fcall(&self, ops: &[Op], own: bool) -> redis::Cmd {
        let mut cmd = redis::cmd("FCALL");
        if let ([op], true) = (ops, own) {
            let function = match op.name {
                "acquire" => &self.scripts.acquire,
                _ => &self.scripts.release,
            };
            cmd.arg(&function.function).arg(op.keys.len());
            cmd.arg(&op.keys).arg(&op.args);
            return cmd;
        }
        let keys: usize = ops.iter().map(|op| op.keys.len()).sum();
        cmd.arg(&self.scripts.batch.function).arg(keys);
        for op in ops {
            cmd.arg(&op.keys);
        }
        for op in ops {
            cmd.arg(op.name).arg(op.keys.len()).arg(op.args.len());
            cmd.arg(&op.args);
        }
        cmd
    }

    /// One call of N acquires, then one of their N releases; panics
    /// unless every operation did what it does alone.
    async fn round(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        names: &[String],
        own: bool,
    ) {
        let replies = |value: Value| match value {
            Value::Array(replies) if !own => replies,
            one => vec![one],
        };
        let acquires: Vec<Op> = names.iter().map(|n| self.acquire(n)).collect();
        let reply: Value = self.fcall(&acquires, own).query_async(conn).await.unwrap();
        for reply in replies(reply) {
            let answer = ops::acquire::parse(reply).unwrap();
            assert!(
                matches!(answer.outcome, ops::acquire::Outcome::Granted { .. }),
                "{answer:?}"
            );
        }
        let releases: Vec<Op> = names.iter().map(|n| self.release(n)).collect();
        let reply: Value = self.fcall(&releases, own).query_async(conn).await.unwrap();
        for reply in replies(reply) {
            let answer = ops::release::parse(reply).unwrap();
            assert!(
                matches!(answer.outcome, ops::release::Outcome::Released(_)),
                "{answer:?}"
            );
        }
    }
}

/// The plain lock at its best: N `SET NX PX` in one pipeline, then the N
/// compare-and-deletes (`EVALSHA` of `sha`) in another.
async fn plain_round(conn: &mut redis::aio::MultiplexedConnection, sha: &str, names: &[String]) {
    let mut sets = redis::pipe();
    for name in names {
        sets.cmd("SET")
            .arg(name)
            .arg("h")
            .arg("NX")
            .arg("PX")
            .arg(30_000);
    }
    let set: Vec<Option<String>> = sets.query_async(conn).await.unwrap();
    assert!(set.iter().all(Option::is_some));
    let mut deletes = redis::pipe();
    for name in names {
        deletes.cmd("EVALSHA").arg(sha).arg(1).arg(name).arg("h");
    }
    let deleted: Vec<i64> = deletes.query_async(conn).await.unwrap();
    assert!(deleted.iter().all(|&d| d == 1));
}

/// Redis' instructions per pair with N operations per call, for each N
/// in `sizes`: tumbler's batch function (and, for N = 1, the operation's
/// own function) against the plain lock pipelined N deep.
async fn batches(sizes: &[usize], pairs: u64) {
    let Some(redis) = CallgrindRedis::start() else {
        return;
    };
    let mut conn = common::redis_conn(&redis.url()).await;
    // Redis runs many times slower under valgrind, and a batch of 64 is
    // one call: no response timeout short of that.
    conn.set_response_timeout(Duration::from_secs(600));
    let scripts = Scripts::compile();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&*scripts.batch.library)
        .query_async(&mut conn)
        .await
        .unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(COMPARE_AND_DELETE)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (seconds, _): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let calls = Calls {
        scripts,
        layout: Layout::new("tumbler", 32),
        // Redis runs many times slower under valgrind: an hour ahead.
        answer_by: (seconds + 3_600) * 1_000,
    };
    let mut next = 0u64;
    let mut names = |n: usize, prefix: &str| -> Vec<String> {
        next += n as u64;
        (next - n as u64..next)
            .map(|i| format!("{prefix}{i:07}"))
            .collect()
    };
    // Warm-up: every shard's fencing counter exists, the library and the
    // script are loaded and called.
    for own in [true, false] {
        for name in names(64, "cost-") {
            calls.round(&mut conn, &[name], own).await;
        }
    }
    plain_round(&mut conn, &sha, &names(64, "plain:")).await;

    let mut rows = Vec::new();
    for &n in sizes {
        let rounds: Vec<Vec<String>> = (0..(pairs as usize / n).max(1))
            .map(|_| names(n, "plain:"))
            .collect();
        let measured = (rounds.len() * n) as f64;
        let plain = redis
            .count(async {
                for round in &rounds {
                    plain_round(&mut conn.clone(), &sha, round).await;
                }
            })
            .await as f64
            / measured;
        for own in [true, false].into_iter().filter(|&own| !own || n == 1) {
            let rounds: Vec<Vec<String>> = (0..rounds.len()).map(|_| names(n, "cost-")).collect();
            let tumbler = redis
                .count(async {
                    for round in &rounds {
                        calls.round(&mut conn.clone(), round, own).await;
                    }
                })
                .await as f64
                / measured;
            let label = match own {
                true => format!("{n}, each operation's own function"),
                false => format!("{n}, `lua/batch.lua`"),
            };
            rows.push((label, tumbler, plain));
        }
    }
    println!(
        "\nRedis CPU instructions per acquire+release pair with N operations per call (callgrind), about {pairs} pairs per N\n"
    );
    println!(
        "| N per call | tumbler per pair | plain lock per pair (N pipelined) | ÷ plain lock |"
    );
    println!("| --- | ---: | ---: | ---: |");
    for (label, tumbler, plain) in rows {
        println!(
            "| {label} | {tumbler:.0} | {plain:.0} | {:.2} |",
            tumbler / plain
        );
    }
}
