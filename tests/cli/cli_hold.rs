//! `tumbler hold`: real processes (the binary, `sh`, `sleep`) against a
//! real server. The lock is released only after every process of the
//! command's group is gone (grandchildren included), signals reach the
//! whole group, a lost lock stops it, stdout is the command's alone, and
//! the exit codes are the documented ones.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

/// `tumbler hold <args> --addr <endpoint>`, stdout and stderr piped.
fn hold(endpoint: &str, args: &[&str]) -> Child {
    Command::new(TUMBLER)
        .arg("hold")
        .args(["--addr", endpoint])
        .args(args)
        .env_remove("TUMBLER_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The first stdout line (the command prints its grandchild's pid).
async fn first_line(child: &mut Child) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("the command printed a line")
    .unwrap();
    line
}

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

async fn holders(client: &mut LockServiceClient, name: &str) -> Vec<proto::Grant> {
    client
        .inspect(inspect(name))
        .await
        .unwrap()
        .into_inner()
        .holders
        .into_iter()
        .filter_map(|h| h.grant)
        .collect()
}

type LockServiceClient = proto::lock_service_client::LockServiceClient<tonic::transport::Channel>;

/// Polls until `hold` exits, checking every few ms that the lock is never
/// free while `grandchild` still runs; returns hold's exit code and
/// whether the lock was seen held with the grandchild alive.
async fn exit_keeping_exclusion(
    hold: &mut Child,
    client: &mut LockServiceClient,
    name: &str,
    grandchild: i32,
) -> (i32, bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held_while_alive = false;
    loop {
        // Held first, then alive: a grandchild seen alive after the lock
        // was seen free is a breach; the other order races its reaping.
        let held = !holders(client, name).await.is_empty();
        let running = alive(grandchild);
        assert!(
            held || !running,
            "the lock is free while the command's grandchild {grandchild} still runs"
        );
        held_while_alive |= held && running;
        if let Some(status) = hold.try_wait().unwrap() {
            return (status.code().expect("hold exited"), held_while_alive);
        }
        assert!(Instant::now() < deadline, "hold did not exit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .await
        .unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reaches_the_whole_group_and_the_lock_outlives_it() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // sh and its background sleep both ignore SIGTERM: only the SIGKILL
    // after the grace period ends them.
    let mut holding = hold(
        &server.endpoint(),
        &[
            "deploy",
            "--grace-ms",
            "1500",
            "--",
            "sh",
            "-c",
            "trap '' TERM; sleep 30 & echo $!; wait",
        ],
    );
    let grandchild: i32 = first_line(&mut holding).await.trim().parse().unwrap();
    assert!(alive(grandchild));
    assert_eq!(holders(&mut client, "deploy").await.len(), 1);

    let sent = Instant::now();
    kill(Pid::from_raw(holding.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let (code, held_while_alive) =
        exit_keeping_exclusion(&mut holding, &mut client, "deploy", grandchild).await;
    assert!(held_while_alive);
    // The group ignored SIGTERM: it died by SIGKILL after the grace period.
    assert!(
        sent.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(code, 128 + 9, "the command's own status: killed by SIGKILL");
    assert!(!alive(grandchild));
    assert!(holders(&mut client, "deploy").await.is_empty());
    let stderr = stderr_of(&mut holding).await;
    assert!(stderr.starts_with("HOLDING deploy token="), "{stderr}");
    assert!(!stderr.contains("panic"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_keeps_the_lock_after_the_command_exits() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // sh exits at once; the sleep it left behind is still in the group.
    let mut holding = hold(
        &server.endpoint(),
        &[
            "report",
            "--",
            "sh",
            "-c",
            "sleep 1 >/dev/null & echo $!; exit 4",
        ],
    );
    let grandchild: i32 = first_line(&mut holding).await.trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive(grandchild));
    assert_eq!(holders(&mut client, "report").await.len(), 1);
    let (code, held_while_alive) =
        exit_keeping_exclusion(&mut holding, &mut client, "report", grandchild).await;
    assert!(held_while_alive);
    assert_eq!(code, 4, "the command's exit code");
    assert!(holders(&mut client, "report").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_to_the_server_stops_the_group_and_exits_79() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut holding = hold(
        &server.endpoint(),
        &[
            "nightly",
            "--ttl-ms",
            "600",
            "--grace-ms",
            "1000",
            "--",
            "sh",
            "-c",
            "sleep 30 & echo $!; wait",
        ],
    );
    let grandchild: i32 = first_line(&mut holding).await.trim().parse().unwrap();
    // Renewed past its 600 ms lease.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let grant = holders(&mut client, "nightly").await.pop().expect("held");
    // An admin clears the namespace: the next renewal says NOT_HELD.
    client
        .clear(proto::ClearRequest {
            namespace: String::new(),
        })
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), holding.wait())
        .await
        .expect("hold stops its command")
        .unwrap();
    assert_eq!(status.code(), Some(79));
    assert!(!alive(grandchild), "the grandchild was stopped too");
    let stderr = stderr_of(&mut holding).await;
    assert!(
        stderr.contains(&format!("holder={}", grant.holder)),
        "{stderr}"
    );
    assert!(stderr.contains("LOST nightly: not held"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_stops_the_group_before_the_lease_can_end() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    // A second replica on the same Redis, to watch the lock.
    let observer = TestServer::new().redis(&redis.url()).start().await;
    let mut client = observer.client().await;
    let mut holding = hold(
        &server.endpoint(),
        &[
            "fragile",
            "--ttl-ms",
            "2000",
            "--grace-ms",
            "500",
            "--",
            "sh",
            "-c",
            "trap '' TERM; sleep 30 & echo $!; wait",
        ],
    );
    let grandchild: i32 = first_line(&mut holding).await.trim().parse().unwrap();
    server.shutdown().await.unwrap();
    let (code, held_while_alive) =
        exit_keeping_exclusion(&mut holding, &mut client, "fragile", grandchild).await;
    assert!(held_while_alive);
    assert_eq!(code, 79);
    assert!(!alive(grandchild));
    let stderr = stderr_of(&mut holding).await;
    assert!(stderr.contains("cannot renew fragile"), "{stderr}");
    assert!(stderr.contains("LOST fragile"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_is_the_commands_and_exit_codes_are_distinct() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let run = |args: &[&str]| {
        let child = hold(&endpoint, args);
        async move { child.wait_with_output().await.unwrap() }
    };

    // The command's bytes, exactly; its exit code; the grant in its
    // environment; the status line on stderr.
    let output = run(&[
        "job",
        "--",
        "sh",
        "-c",
        "printf 'a\\000b\\n%s' \"$TUMBLER_FENCING_TOKEN/$TUMBLER_SLOT\"; exit 3",
    ])
    .await;
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8(output.stderr).unwrap();
    let token = stderr
        .strip_prefix("HOLDING job token=")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(output.stdout, format!("a\0b\n{token}/1").into_bytes());

    // Killed by a signal: 128 + its number.
    let output = run(&["job", "--", "sh", "-c", "kill -KILL $$"]).await;
    assert_eq!(output.status.code(), Some(137));

    // Busy: 75 (or -E's code), and the command does not run.
    let mut client = server.client().await;
    client.acquire(acquire("taken", "someone")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let output = run(&["taken", "--", "sh", "-c", &touch]).await;
    assert_eq!(output.status.code(), Some(75));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.starts_with("NOT_ACQUIRED taken: BUSY"), "{stderr}");
    let output = run(&[
        "taken",
        "-E",
        "9",
        "--wait-ms",
        "200",
        "--",
        "sh",
        "-c",
        &touch,
    ])
    .await;
    assert_eq!(output.status.code(), Some(9));
    assert!(String::from_utf8_lossy(&output.stderr).contains("TIMEOUT"));
    assert!(!marker.exists());

    // Not found: 127; not executable: 126; the lock is given back.
    let output = run(&["job", "--", "no-such-command-here"]).await;
    assert_eq!(output.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&output.stderr).contains("command not found"));
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let output = run(&["job", "--", plain.to_str().unwrap()]).await;
    assert_eq!(output.status.code(), Some(126));
    assert!(holders(&mut client, "job").await.is_empty());

    // Usage: 64; no server: 69.
    let output = run(&["--grace-ms", "soon"]).await;
    assert_eq!(output.status.code(), Some(64));
    let output = hold("127.0.0.1:1", &["job", "--", "true"])
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&output.stderr).contains("UNAVAILABLE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_command_the_lock_is_held_until_a_signal() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // stdin is closed (/dev/null): that no longer ends the hold.
    let mut holding = hold(&server.endpoint(), &["maintenance", "--ttl-ms", "900"]);
    let mut stderr = BufReader::new(holding.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("HOLDING maintenance"), "{line}");
    // Well past the lease: renewed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(holding.try_wait().unwrap().is_none());
    assert_eq!(holders(&mut client, "maintenance").await.len(), 1);

    kill(Pid::from_raw(holding.id().unwrap() as i32), Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), holding.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(holders(&mut client, "maintenance").await.is_empty());
}

/// Flags of the replicas restarted below: a short drain, as in a rollout.
const REPLICA_FLAGS: &[&str] = &["--shutdown-drain-ms", "300", "--shutdown-grace-ms", "2000"];

/// Polls Inspect on `client` until `hold` exits, checking that `name` is
/// held all along by exactly `expected` (holder, fencing token); returns
/// hold's exit code.
async fn exit_holding_throughout(
    hold: &mut Child,
    client: &mut LockServiceClient,
    name: &str,
    expected: &(String, u64),
) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = hold.try_wait().unwrap() {
            return status.code().expect("hold exited");
        }
        let seen: Vec<(String, u64)> = holders(client, name)
            .await
            .into_iter()
            .map(|g| (g.holder, g.fencing_token))
            .collect();
        // Once the command is done, hold releases: an empty list is then
        // fine, any other holder never.
        if seen.is_empty() {
            if let Some(status) = hold.try_wait().unwrap() {
                return status.code().expect("hold exited");
            }
            // hold releases, then exits: it has a second for that (the
            // commands run for seconds, so a lock freed while one still
            // runs is caught all the same).
            let freed = Instant::now();
            let status = loop {
                if let Some(status) = hold.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    freed.elapsed() < Duration::from_secs(1),
                    "{name} was free while the command ran"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            return status.code().expect("hold exited");
        }
        assert_eq!(seen, std::slice::from_ref(expected), "{name} changed hands");
        assert!(Instant::now() < deadline, "hold did not exit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_hold_resumes_on_the_next_replica_when_its_replica_drains() {
    let stderr = hold_rides_out_a_drain(&["--session"], false).await;
    assert!(stderr.contains("resumed the session"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_hold_resumes_on_the_next_replica_when_its_replica_crashes() {
    let stderr = hold_rides_out_a_drain(&["--session"], true).await;
    assert!(stderr.contains("resumed the session"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_hold_renews_on_the_next_replica_when_its_replica_drains() {
    hold_rides_out_a_drain(&[], false).await;
}

/// `hold <mode> --ttl-ms 3000` over two replicas, running a 4 s command;
/// the replica it is on drains (or, with `crash`, is SIGKILLed)
/// meanwhile. The lock stays with the same holder and token throughout,
/// and hold exits with the command's code. Returns hold's stderr.
async fn hold_rides_out_a_drain(mode: &[&str], crash: bool) -> String {
    let redis = start_redis();
    let first = TumblerProcess::start(&redis.url(), REPLICA_FLAGS).await;
    let mut first = first;
    let second = TumblerProcess::start(&redis.url(), REPLICA_FLAGS).await;
    let mut observer = second.client().await;
    let addrs = format!("{},{}", first.endpoint, second.endpoint);
    // The lease (3 s) is shorter than the command (4 s): the hold lives
    // only if it is renewed on the second replica.
    let mut holding = hold(
        &addrs,
        &[
            &["migrate", "--ttl-ms", "3000"],
            mode,
            &[
                "--",
                "sh",
                "-c",
                "echo \"$TUMBLER_HOLDER $TUMBLER_FENCING_TOKEN\"; sleep 4; exit 7",
            ],
        ]
        .concat(),
    );
    let line = first_line(&mut holding).await;
    let (holder, token) = line.trim().split_once(' ').unwrap();
    let expected = (holder.to_owned(), token.parse::<u64>().unwrap());
    let seen = holders(&mut observer, "migrate").await;
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].holder.clone(), seen[0].fencing_token), expected);

    // The replica serving the lock drains (or crashes) while the command
    // runs.
    let code = if crash {
        first.kill();
        exit_holding_throughout(&mut holding, &mut observer, "migrate", &expected).await
    } else {
        first.terminate();
        let watching = exit_holding_throughout(&mut holding, &mut observer, "migrate", &expected);
        let (code, exited) = tokio::join!(watching, first.exit_status());
        assert!(exited.success(), "{exited:?}");
        code
    };
    assert_eq!(code, 7, "hold exits with the command's code");
    let stderr = stderr_of(&mut holding).await;
    assert!(!stderr.contains("LOST"), "{stderr}");
    // Released once the command was done.
    assert!(holders(&mut observer, "migrate").await.is_empty());
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_hold_keeps_its_place_when_its_replica_restarts() {
    waiting_hold_keeps_its_place(&["--session"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lease_hold_keeps_its_place_when_its_replica_restarts() {
    waiting_hold_keeps_its_place(&["--ttl-ms", "3000"]).await;
}

/// `hold <mode> --wait-ms …` queued on a replica that restarts (its only
/// address), a later waiter queued on another replica: once the gate
/// leaves, the hold is granted first.
async fn waiting_hold_keeps_its_place(mode: &[&str]) {
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let replica = TumblerProcess::spawn_at(&redis.url(), port, REPLICA_FLAGS);
    wait_for_health(
        &replica.endpoint,
        tonic_health::pb::health_check_response::ServingStatus::Serving,
    )
    .await;
    let other = TumblerProcess::start(&redis.url(), REPLICA_FLAGS).await;
    let mut admin = other.client().await;
    admin
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(60_000),
            ..acquire("line", "gate")
        })
        .await
        .unwrap();
    // The hold waits on the replica about to restart (its only address),
    // then a later waiter queues behind it on the other replica.
    let mut waiting = hold(
        &replica.endpoint,
        &[
            &["line", "--wait-ms", "30000"],
            mode,
            &["--", "sh", "-c", "echo $TUMBLER_FENCING_TOKEN"],
        ]
        .concat(),
    );
    until_waiters(&mut admin, "line", 1).await;
    let mut later = admin.clone();
    let later_wait = tokio::spawn(async move {
        later
            .acquire(proto::AcquireRequest {
                wait_ms: 30_000,
                ..acquire("line", "later")
            })
            .await
            .unwrap()
            .into_inner()
    });
    until_waiters(&mut admin, "line", 2).await;

    // Restart the replica the hold waits on: SIGTERM, then again on its
    // port.
    replica.terminate();
    assert!(replica.exit_status().await.success());
    let back = TumblerProcess::spawn_at(&redis.url(), port, REPLICA_FLAGS);
    wait_for_health(
        &back.endpoint,
        tonic_health::pb::health_check_response::ServingStatus::Serving,
    )
    .await;
    until_waiters(&mut admin, "line", 2).await;

    // The gate leaves: the hold, first in line, gets the lock before the
    // later waiter.
    admin
        .release(proto::ReleaseRequest {
            namespace: String::new(),
            name: "line".into(),
            holder: "gate".into(),
            fencing_token: None,
            names: Vec::new(),
            fencing_tokens: Vec::new(),
        })
        .await
        .unwrap();
    let line = first_line(&mut waiting).await;
    let Ok(token) = line.trim().parse::<u64>() else {
        panic!("hold printed {line:?}: {}", stderr_of(&mut waiting).await);
    };
    let status = tokio::time::timeout(Duration::from_secs(10), waiting.wait())
        .await
        .expect("hold exited")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let later_reply = tokio::time::timeout(Duration::from_secs(10), later_wait)
        .await
        .expect("the later waiter was granted")
        .unwrap();
    let later_grant = later_reply.grant.expect("granted after the hold");
    assert_eq!(later_grant.holder, "later");
    assert!(
        later_grant.fencing_token > token,
        "the later waiter ({}) was granted before the hold ({token})",
        later_grant.fencing_token
    );
    let stderr = stderr_of(&mut waiting).await;
    assert!(!stderr.contains("LOST"), "{stderr}");
}
