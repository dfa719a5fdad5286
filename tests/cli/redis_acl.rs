//! The Redis user that docs/operating.md's "Redis requirements" section
//! creates: made from that exact `ACL SETUSER` line (read out of the
//! document, so the two cannot drift), it runs every lock operation, with no
//! refusal in Redis' ACL LOG; and without `+@scripting` the lock RPCs fail.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;
use tonic_health::pb::health_check_response::ServingStatus;

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");
const PASSWORD: &str = "acl-test-s3cret";

/// The `ACL SETUSER tumbler …` line of docs/operating.md (the chart's README
/// must carry the same line).
fn documented_acl_line() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |path: &str| std::fs::read_to_string(format!("{root}/{path}")).unwrap();
    let lines: Vec<String> = read("docs/operating.md")
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER tumbler "))
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 1, "one ACL SETUSER line in docs/operating.md");
    assert!(
        read("helm/README.md").lines().any(|l| l == lines[0]),
        "helm/README.md carries docs/operating.md's ACL line"
    );
    lines[0].clone()
}

/// Creates the user on `redis` (as the default user) from `line`, with the
/// test's password in place of CHANGE-ME.
async fn create_user(redis: &tumbler::dev::RedisServer, line: &str) {
    let line = line.replace(">CHANGE-ME", &format!(">{PASSWORD}"));
    let mut words = line.split_whitespace();
    let mut cmd = redis::cmd(words.next().unwrap());
    for word in words {
        cmd.arg(word);
    }
    let mut conn = redis_conn(&redis.url()).await;
    let reply: String = cmd.query_async(&mut conn).await.unwrap();
    assert_eq!(reply, "OK");
}

fn run(endpoint: &str, args: &[&str]) -> (i32, String) {
    // --addr right after the subcommand: `hold` passes what follows `--` on.
    let out = Command::new(TUMBLER)
        .arg(args[0])
        .args(["--addr", endpoint])
        .args(&args[1..])
        .env_remove("TUMBLER_ADDR")
        .env_remove("TUMBLER_NAMESPACE")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

const USER_FLAGS: [&str; 4] = ["--redis-username", "tumbler", "--redis-password", PASSWORD];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_user_runs_every_lock_operation() {
    let redis = start_redis();
    create_user(&redis, &documented_acl_line()).await;
    let server = TumblerProcess::start(&redis.url(), &USER_FLAGS).await;
    let addr = server.endpoint.as_str();

    // Watch first, so the acquire below is an event it sees.
    let mut watch = Command::new(TUMBLER)
        .args(["watch", "acl-lock", "--addr", addr, "--output", "json"])
        .env_remove("TUMBLER_ADDR")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut events = BufReader::new(watch.stdout.take().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(500));

    let (code, out) = run(
        addr,
        &["acquire", "acl-lock", "--holder", "w1", "--ttl-ms", "30000"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ACQUIRED acl-lock"), "{out}");
    let mut event = String::new();
    events.read_line(&mut event).unwrap();
    assert!(event.contains("acl-lock"), "watch saw {event:?}");
    watch.kill().unwrap();
    watch.wait().unwrap();

    let (code, out) = run(addr, &["list"]);
    assert!(code == 0 && out.contains("acl-lock"), "{out}");
    let (code, out) = run(addr, &["inspect", "acl-lock"]);
    assert!(code == 0 && out.contains("w1"), "{out}");
    let (code, out) = run(addr, &["release", "acl-lock", "--holder", "w1"]);
    assert!(code == 0 && out.starts_with("RELEASED"), "{out}");
    let (code, out) = run(addr, &["hold", "acl-session", "--session", "--", "true"]);
    assert_eq!(code, 0, "hold --session: {out}");
    let (code, out) = run(addr, &["hold", "acl-lease", "--", "true"]);
    assert_eq!(code, 0, "hold: {out}");
    let (code, out) = run(addr, &["reap"]);
    assert_eq!(code, 0, "reap: {out}");
    let (code, out) = run(addr, &["metrics"]);
    assert_eq!(code, 0, "metrics: {out}");

    // Redis refused nothing, and the user sees tumbler's library.
    let mut admin = redis_conn(&redis.url()).await;
    let denied: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(denied.is_empty(), "ACL LOG: {denied:?}");
    let user = redis::Client::open(format!(
        "redis://tumbler:{PASSWORD}@127.0.0.1:{}",
        redis.port()
    ))
    .unwrap();
    let mut user = user.get_multiplexed_async_connection().await.unwrap();
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("tumbler_*")
        .query_async(&mut user)
        .await
        .unwrap();
    assert_eq!(libraries.len(), 1, "the check docs/operating.md gives");
}

/// Without `+@scripting`, what happens today (documented in "Redis
/// requirements"): the lock RPCs fail, and Redis' ACL LOG names `fcall`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_scripting_the_lock_rpcs_fail() {
    let redis = start_redis();
    create_user(&redis, &format!("{} -@scripting", documented_acl_line())).await;
    let server = TumblerProcess::spawn(&redis.url(), &USER_FLAGS);
    // Health as it answers today: SERVING (it checks reachability, not the
    // lock path); a readiness check that proves the lock path may answer
    // NOT_SERVING instead. Either way, no lock is granted.
    let health = loop {
        match health_status(&server.endpoint, "").await {
            Ok(status) => break status,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    };
    assert!(
        matches!(health, ServingStatus::Serving | ServingStatus::NotServing),
        "{health:?}"
    );
    let mut client = server.client().await;
    let err = client
        .acquire(acquire("acl-lock", "w1"))
        .await
        .expect_err("no grant without FCALL");
    assert!(
        matches!(err.code(), tonic::Code::Internal | tonic::Code::Unavailable),
        "{err:?}"
    );
    let (code, out) = run(&server.endpoint, &["acquire", "acl-lock"]);
    assert!(code == 70 || code == 69, "exit {code}: {out}");
    let mut admin = redis_conn(&redis.url()).await;
    let log: Vec<Vec<redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .arg(1)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(format!("{log:?}").contains("fcall"), "ACL LOG: {log:?}");
}
