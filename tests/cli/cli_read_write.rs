//! Read/write locks from the command line: `tumbler hold --read` twice
//! holds at once, `tumbler acquire --write` waits for both and then gets
//! a higher token, an upgrade and a plain acquire of the held read/write
//! lock exit 65 with FAILED_PRECONDITION, and `inspect` / `queue` show
//! the lock's, each holder's and each waiter's mode. Weighted permits
//! (`--permits`) are the other way a request takes more than one slot.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

fn tumbler(endpoint: &str, args: &[&str]) -> Command {
    let mut command = Command::new(TUMBLER);
    command
        .args(args)
        .args(["--addr", endpoint])
        .env_remove("TUMBLER_ADDR")
        .env_remove("TUMBLER_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs `tumbler <args>` to completion: exit code, stdout, stderr.
async fn run(endpoint: &str, args: &[&str]) -> (i32, String, String) {
    let output = tumbler(endpoint, args).output().await.unwrap();
    (
        output.status.code().expect("exited, not killed"),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// `tumbler hold <args>` without a command, once its HOLDING line is out:
/// the child and that line.
async fn holding(endpoint: &str, args: &[&str]) -> (Child, String) {
    let mut hold = tumbler(endpoint, &[&["hold"], args].concat())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(hold.stderr.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(10), stderr.read_line(&mut line))
        .await
        .expect("hold printed its status line")
        .unwrap();
    (hold, line)
}

/// The `token=N` of a HOLDING line.
fn token_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix("token="))
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}

async fn stop(mut hold: Child) {
    kill(Pid::from_raw(hold.id().unwrap() as i32), Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), hold.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "hold released and exited 0");
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_read_holds_share_a_write_waits_and_an_upgrade_is_refused() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let mut client = server.client().await;

    let (reader_1, line_1) = holding(&endpoint, &["rw", "--read", "--holder", "r1"]).await;
    let (reader_2, line_2) = holding(&endpoint, &["rw", "--read", "--holder", "r2"]).await;
    for line in [&line_1, &line_2] {
        assert!(line.starts_with("HOLDING rw token="), "{line}");
        assert!(line.trim_end().ends_with(" mode=read"), "{line}");
    }

    let (code, table, _) = run(&endpoint, &["inspect", "rw"]).await;
    assert_eq!(code, 0);
    assert!(table.starts_with("rw: 2 holder(s), "), "{table}");
    assert!(
        table.lines().next().unwrap().ends_with(", read mode"),
        "{table}"
    );
    let (_, stdout, _) = run(&endpoint, &["inspect", "rw", "-o", "json"]).await;
    let inspected = json(&stdout);
    assert_eq!(inspected["mode"], "LOCK_MODE_READ", "{inspected}");
    let holders = inspected["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{inspected}");
    for holder in holders {
        assert_eq!(holder["grant"]["mode"], "LOCK_MODE_READ", "{inspected}");
    }

    // An upgrade is refused, and so is a plain acquire of the read/write lock.
    let (code, _, stderr) = run(&endpoint, &["acquire", "rw", "--write", "--holder", "r1"]).await;
    assert_eq!(code, 65, "{stderr}");
    assert!(
        stderr.starts_with("error: FAILED_PRECONDITION: "),
        "{stderr}"
    );
    let (code, _, stderr) = run(&endpoint, &["acquire", "rw", "--holder", "plain"]).await;
    assert_eq!(code, 65, "{stderr}");
    assert!(
        stderr.starts_with("error: FAILED_PRECONDITION: "),
        "{stderr}"
    );

    // A writer waits for both readers.
    let writer = tumbler(
        &endpoint,
        &[
            "acquire",
            "rw",
            "--write",
            "--holder",
            "w",
            "--wait-ms",
            "20000",
            "-o",
            "json",
        ],
    )
    .spawn()
    .unwrap();
    until_waiters(&mut client, "rw", 1).await;
    let (code, table, _) = run(&endpoint, &["queue", "rw"]).await;
    assert_eq!(code, 0);
    assert!(table.contains("fair write"), "{table}");
    let (_, stdout, _) = run(&endpoint, &["queue", "rw", "--json"]).await;
    assert_eq!(
        json(&stdout)["requests"][0]["mode"],
        "LOCK_MODE_WRITE",
        "{stdout}"
    );

    stop(reader_1).await;
    let waiting = client.inspect(inspect("rw")).await.unwrap().into_inner();
    assert_eq!(
        (waiting.holders.len(), waiting.waiters),
        (1, 1),
        "{waiting:?}"
    );
    stop(reader_2).await;
    let output = tokio::time::timeout(Duration::from_secs(10), writer.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let granted = json(&stdout);
    assert_eq!(granted["status"], "ACQUIRE_STATUS_ACQUIRED", "{granted}");
    assert_eq!(granted["grant"]["mode"], "LOCK_MODE_WRITE", "{granted}");
    let token: u64 = granted["grant"]["fencingToken"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        token > token_of(&line_1).max(token_of(&line_2)),
        "{granted}"
    );

    let (code, table, _) = run(&endpoint, &["inspect", "rw"]).await;
    assert_eq!(code, 0);
    assert!(
        table.lines().next().unwrap().ends_with(", write mode"),
        "{table}"
    );
    let (code, _, _) = run(&endpoint, &["release", "rw", "--holder", "w"]).await;
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_downgrades_with_acquire_read_and_keeps_its_token() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let (code, stdout, _) = run(
        &endpoint,
        &["acquire", "doc", "--write", "--holder", "w", "--json"],
    )
    .await;
    assert_eq!(code, 0, "{stdout}");
    let written = json(&stdout);
    let (code, stdout, _) = run(
        &endpoint,
        &["acquire", "doc", "--read", "--holder", "w", "--json"],
    )
    .await;
    assert_eq!(code, 0, "{stdout}");
    let read = json(&stdout);
    assert_eq!(read["grant"]["mode"], "LOCK_MODE_READ", "{read}");
    assert_eq!(
        read["grant"]["fencingToken"], written["grant"]["fencingToken"],
        "{read}"
    );
    // Readers join the downgraded holder.
    let (code, table, _) = run(&endpoint, &["acquire", "doc", "--read", "--holder", "r"]).await;
    assert_eq!(code, 0, "{table}");
    assert!(table.contains("│ mode "), "{table}");
    let (_, table, _) = run(&endpoint, &["inspect", "doc"]).await;
    assert!(table.starts_with("doc: 2 holder(s), "), "{table}");
}

/// A writer whose `tumbler hold` is SIGKILLed (no release, no signal
/// handling) keeps the lock only until its lease ends: the readers that
/// waited behind it are granted then, with higher tokens.
#[tokio::test]
async fn a_sigkilled_writer_lets_the_waiting_readers_in_at_its_lease_end() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let (hold, line) = holding(
        &endpoint,
        &["doc", "--write", "--holder", "w", "--ttl-ms", "1500"],
    )
    .await;
    assert!(line.contains("mode=write"), "{line}");
    let written = token_of(&line);
    kill(Pid::from_raw(hold.id().unwrap() as i32), Signal::SIGKILL).unwrap();
    let readers: Vec<_> = ["r1", "r2"]
        .into_iter()
        .map(|holder| {
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                run(
                    &endpoint,
                    &[
                        "acquire",
                        "doc",
                        "--read",
                        "--holder",
                        holder,
                        "--wait-ms",
                        "15000",
                        "--json",
                    ],
                )
                .await
            })
        })
        .collect();
    for reader in readers {
        let (code, stdout, stderr) = reader.await.unwrap();
        assert_eq!(code, 0, "{stdout}{stderr}");
        let grant = &json(&stdout)["grant"];
        assert_eq!(grant["mode"], "LOCK_MODE_READ", "{grant}");
        let token: u64 = grant["fencingToken"].as_str().unwrap().parse().unwrap();
        assert!(token > written, "{token} after the writer's {written}");
    }
    let (_, table, _) = run(&endpoint, &["inspect", "doc"]).await;
    assert!(table.starts_with("doc: 2 holder(s), "), "{table}");
    assert!(table.contains("read mode"), "{table}");
    drop(hold);
}

#[test]
fn read_and_write_cannot_be_asked_together() {
    let output = std::process::Command::new(TUMBLER)
        .args(["acquire", "x", "--read", "--write"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "a usage error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--write"), "{stderr}");
}

/// `--permits k` takes k of the limit at once, with one slot per permit;
/// a request that does not fit is BUSY, one more than the limit is refused
/// naming the field, and `inspect` counts the permits in use.
#[tokio::test]
async fn permits_take_several_slots_and_inspect_counts_them() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let ask = |holder: &'static str, permits: &'static str| {
        let endpoint = endpoint.clone();
        async move {
            let args = [
                "acquire",
                "pool",
                "--limit",
                "5",
                "--permits",
                permits,
                "--holder",
                holder,
                "--json",
            ];
            run(&endpoint, &args).await
        }
    };
    let (code, stdout, _) = ask("big", "3").await;
    assert_eq!(code, 0, "{stdout}");
    let grant = &json(&stdout)["grant"];
    assert_eq!(grant["permits"], 3, "{grant}");
    assert_eq!(grant["slots"], serde_json::json!([1, 2, 3]), "{grant}");
    let (code, stdout, _) = ask("other", "3").await;
    assert_eq!(code, 75, "3 more of 5 do not fit: {stdout}");
    let (code, stdout, _) = ask("small", "2").await;
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(json(&stdout)["grant"]["slots"], serde_json::json!([4, 5]));
    let (code, _, stderr) = ask("huge", "6").await;
    assert_eq!(code, 65, "{stderr}");
    assert!(stderr.contains("permits:"), "{stderr}");
    let (_, table, _) = run(&endpoint, &["inspect", "pool"]).await;
    assert!(
        table.starts_with("pool: 2 holder(s) holding 5 permits, limit 5, "),
        "{table}"
    );
    assert!(table.contains("1,2,3"), "{table}");
}
