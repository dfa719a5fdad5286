//! The Redis user that docs/operating.md's "Redis requirements" section
//! creates: made from that exact `ACL SETUSER` line (read out of the
//! document, so the two cannot drift), it runs every lock operation, with no
//! refusal in Redis' ACL LOG. A user missing a grant (`+@scripting`, key
//! access, a password) makes the server NOT_SERVING, and `tumbler
//! health`, the log and every RPC's UNAVAILABLE name what to grant.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::wait::wait_until_async;
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
        .args([
            "watch",
            "acl-lock",
            "--initial-state",
            "--addr",
            addr,
            "--output",
            "json",
        ])
        .env_remove("TUMBLER_ADDR")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut events = BufReader::new(watch.stdout.take().unwrap());
    // `synced` ends the initial state: the watcher is registered by then.
    let mut synced = String::new();
    events.read_line(&mut synced).unwrap();
    assert!(synced.contains("synced"), "watch began with {synced:?}");

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

/// A `tumbler serve` process of this test with the test user and a short
/// health interval, its log kept (killed by its pid when dropped).
struct Logged {
    child: std::process::Child,
    endpoint: String,
    log: tempfile::NamedTempFile,
}

impl Logged {
    fn spawn(redis: &tumbler::dev::RedisServer) -> Logged {
        let port = tumbler::dev::free_port().unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(TUMBLER)
            .args(["serve", "--no-auth", "--http-listen", "off"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--redis-url", &redis.url(), "--health-interval-ms", "100"])
            .args(USER_FLAGS)
            .env_remove("TUMBLER_LOG_FORMAT")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        Logged {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A user made from the documented line with `change` appended: the
/// server is NOT_SERVING and says `reason` (what to grant) in `tumbler
/// health`'s output, in its log and in every lock RPC's UNAVAILABLE;
/// nothing is granted. Then the documented line applied again at runtime
/// (`ACL SETUSER`) turns it SERVING within a few health ticks.
async fn refused_until_granted(change: &str, reason: &str) {
    let redis = start_redis();
    let line = documented_acl_line();
    create_user(&redis, &format!("{line} {change}")).await;
    let server = Logged::spawn(&redis);
    let endpoint = server.endpoint.clone();
    let ten_s = std::time::Duration::from_secs(10);
    wait_until_async("tumbler health names the missing grant", ten_s, || {
        let endpoint = endpoint.clone();
        async move {
            let (code, out) = run(&endpoint, &["health"]);
            code == 69 && out.starts_with("NOT_SERVING: ") && out.contains(reason)
        }
    })
    .await;
    let (_, json) = run(&endpoint, &["health", "-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["status"], "NOT_SERVING");
    assert!(json["reason"].as_str().unwrap().contains(reason), "{json}");
    assert!(
        server
            .log()
            .lines()
            .any(|l| l.contains("NOT_SERVING") && l.contains(reason)),
        "the log says why: {}",
        server.log()
    );

    let mut client =
        tumbler::proto::lock_service_client::LockServiceClient::connect(endpoint.clone())
            .await
            .unwrap();
    let err = client
        .acquire(acquire("acl-lock", "w1"))
        .await
        .expect_err("no grant without the permission");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains(reason), "{err:?}");
    let (code, out) = run(&endpoint, &["acquire", "acl-lock"]);
    assert_eq!(code, 69, "{out}");
    assert!(out.contains(reason), "{out}");

    // The grant arrives while the server runs.
    create_user(&redis, &line).await;
    wait_for_health(&endpoint, ServingStatus::Serving).await;
    let (code, out) = run(&endpoint, &["health"]);
    assert_eq!((code, out.trim()), (0, "SERVING"));
    let (code, out) = run(&endpoint, &["acquire", "acl-lock", "--holder", "w1"]);
    assert_eq!(code, 0, "{out}");
}

/// Without `+@scripting` Redis answers FCALL with NOPERM: the readiness
/// check, which calls a read-only function of tumbler's library as the
/// lock path does, finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_scripting_health_and_rpcs_name_the_grant() {
    refused_until_granted(
        "-@scripting",
        "the redis user may not run FCALL_RO: grant +@scripting",
    )
    .await;
}

/// A user whose keys are another application's: refused at the first
/// command on tumbler's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_key_access_health_and_rpcs_name_the_grant() {
    refused_until_granted(
        "resetkeys ~other:*",
        "the redis user may not access tumbler's keys: grant ~tumbler:*",
    )
    .await;
}

/// Read-only access to tumbler's keys (`%R~`) is not enough: locks write
/// (and Redis' ACL counts FCALL's keys as written, whatever the function).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_key_access_is_not_serving() {
    let redis = start_redis();
    let line = documented_acl_line();
    create_user(&redis, &format!("{line} resetkeys %R~tumbler:*")).await;
    let server = Logged::spawn(&redis);
    let endpoint = server.endpoint.clone();
    wait_until_async(
        "tumbler health names the key grant",
        std::time::Duration::from_secs(10),
        || {
            let endpoint = endpoint.clone();
            async move {
                let (code, out) = run(&endpoint, &["health"]);
                code == 69 && out.contains("grant ~tumbler:*")
            }
        },
    )
    .await;
}

/// Connections Redis refuses for a password: every RPC says so (NOAUTH
/// without one, WRONGPASS with a wrong one), as the log and health do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_password_is_the_reason_rpcs_give() {
    let redis = start_redis();
    create_user(&redis, &documented_acl_line()).await;
    let mut admin = redis_conn(&redis.url()).await;
    let _: String = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("off")
        .query_async(&mut admin)
        .await
        .unwrap();
    for (flags, reason) in [
        (&[][..], "NOAUTH"),
        (
            &["--redis-username", "tumbler", "--redis-password", "wrong"][..],
            "WRONGPASS",
        ),
    ] {
        let server = TumblerProcess::spawn(&redis.url(), flags);
        wait_until_async(
            "an RPC names the refusal",
            std::time::Duration::from_secs(10),
            || {
                let endpoint = server.endpoint.clone();
                async move {
                    let Ok(mut client) =
                        tumbler::proto::lock_service_client::LockServiceClient::connect(endpoint)
                            .await
                    else {
                        return false;
                    };
                    match client.acquire(acquire("pw-lock", "w1")).await {
                        Err(err) => {
                            assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
                            err.message().contains(reason) && err.message().contains("password")
                        }
                        Ok(reply) => panic!("granted without a password: {reply:?}"),
                    }
                }
            },
        )
        .await;
        wait_until_async(
            "tumbler health names the refusal",
            std::time::Duration::from_secs(10),
            || {
                let endpoint = server.endpoint.clone();
                async move {
                    let (code, out) = run(&endpoint, &["health"]);
                    code == 69 && out.contains(reason)
                }
            },
        )
        .await;
    }
}
