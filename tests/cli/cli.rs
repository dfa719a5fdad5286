//! The client subcommands (`tumbler acquire|release|extend|inspect|queue|
//! list|reap|clear|metrics|watch|token|completion`): the real binary
//! against a real server, its tables, its JSON and YAML, its exit codes
//! (0 done, 64 usage, 65 input refused, 69 unreachable, 75 not acquired,
//! 77 not allowed, 79 not held), fail-over between endpoints, stdout
//! closed early or full, and `token` entries a server with authentication
//! reads and enforces.
//! `hold` has its own file (`tests/cli/cli_hold.rs`).

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `tumbler <args> --addr <server>` to completion.
pub(crate) async fn tumbler(server: &TestServer, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(TUMBLER)
        .args(args)
        .args(["--addr", &server.endpoint()])
        .env_remove("TUMBLER_ADDR")
        .env_remove("TUMBLER_NAMESPACE")
        .output()
        .await
        .unwrap();
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

pub(crate) fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", run.stdout))
}

/// A 64-bit integer of the proto3 JSON mapping: a string of digits.
pub(crate) fn int64(value: &Value) -> i64 {
    value
        .as_str()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| panic!("not a 64-bit integer string: {value}"))
}

#[tokio::test]
async fn acquire_prints_a_table_and_json_and_inspect_shows_the_holder() {
    let server = TestServer::new().start().await;

    let run = tumbler(
        &server,
        &[
            "acquire",
            "cli-table",
            "--holder",
            "worker-1",
            "--ttl-ms",
            "30000",
            "--kind",
            "report",
            "--meta",
            "team=billing",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.starts_with("ACQUIRED cli-table"),
        "{}",
        run.stdout
    );
    for expected in [
        "worker-1",
        "fencing token",
        "team=billing",
        "report",
        "(in ",
    ] {
        assert!(run.stdout.contains(expected), "{expected}: {}", run.stdout);
    }

    let run = tumbler(
        &server,
        &[
            "acquire",
            "cli-json",
            "--namespace",
            "team-a",
            "--holder",
            "worker-2",
            "--limit",
            "3",
            "--meta",
            "a=1",
            "--meta",
            "b=x=y",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    // The reply in the proto3 JSON mapping, as Connect answers it:
    // lowerCamel names, enums by full name, 64-bit integers as strings.
    let reply = json(&run);
    assert_eq!(reply["status"], "ACQUIRE_STATUS_ACQUIRED");
    assert_eq!(reply["holders"], 1);
    let grant = &reply["grant"];
    assert_eq!(grant["holder"], "worker-2");
    assert_eq!(grant["slot"], 1);
    let token = grant["fencingToken"].as_str().unwrap().to_owned();
    assert!(token.parse::<u64>().unwrap() > 0);
    assert!(int64(&grant["expiresAtMs"]) > int64(&grant["acquiredAtMs"]));
    assert_eq!(grant["metadata"]["a"], "1");
    assert_eq!(grant["metadata"]["b"], "x=y");

    // The same acquire again: the same grant, exit 0.
    let run = tumbler(
        &server,
        &[
            "acquire", "cli-json", "-n", "team-a", "--holder", "worker-2", "--limit", "3", "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0);
    assert_eq!(json(&run)["status"], "ACQUIRE_STATUS_ALREADY_HELD");
    assert_eq!(json(&run)["grant"]["fencingToken"], token);

    let run = tumbler(&server, &["inspect", "cli-table"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.starts_with("cli-table: 1 holder(s), limit 1"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("worker-1"), "{}", run.stdout);

    let run = tumbler(&server, &["inspect", "-n", "team-a", "cli-json", "--json"]).await;
    assert_eq!(run.code, 0);
    let reply = json(&run);
    assert_eq!(reply["namespace"], "team-a");
    assert_eq!(reply["limit"], 3);
    assert_eq!(reply["holders"][0]["grant"]["holder"], "worker-2");
    assert_eq!(reply["holders"][0]["grant"]["fencingToken"], token);
    assert!(int64(&reply["holders"][0]["remainingMs"]) > 0);
}

#[tokio::test]
async fn queue_shows_a_waiter_until_release_hands_the_lock_over() {
    let server = TestServer::new().start().await;

    let run = tumbler(&server, &["acquire", "cli-queue", "--holder", "first"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);

    // A second holder waits in the server (its own process).
    let endpoint = server.endpoint();
    let waiter = tokio::spawn(async move {
        tokio::process::Command::new(TUMBLER)
            .args(["acquire", "cli-queue", "--holder", "second", "--wait-ms"])
            .args(["20000", "--priority", "-3", "--json", "--addr", &endpoint])
            .output()
            .await
            .unwrap()
    });

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let table = loop {
        let run = tumbler(&server, &["queue", "cli-queue"]).await;
        assert_eq!(run.code, 0, "{}", run.stderr);
        if run.stdout.contains("second") {
            break run.stdout;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no waiter: {}",
            run.stdout
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(table.starts_with("cli-queue: 1 waiting"), "{table}");
    assert!(table.contains("-3") && table.contains("fair"), "{table}");

    let run = tumbler(&server, &["queue", "cli-queue", "--json"]).await;
    let reply = json(&run);
    assert_eq!(reply["waiters"], 1);
    assert_eq!(reply["requests"][0]["holder"], "second");
    assert_eq!(reply["requests"][0]["position"], 1);
    assert_eq!(reply["requests"][0]["priority"], -3);

    let run = tumbler(&server, &["release", "cli-queue", "--holder", "first"]).await;
    assert_eq!(
        (run.code, run.stdout.trim()),
        (0, "RELEASED cli-queue (holder first)")
    );

    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted after the release")
        .unwrap();
    assert_eq!(waited.status.code(), Some(0));
    let reply: Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(reply["status"], "ACQUIRE_STATUS_ACQUIRED");
    assert_eq!(reply["grant"]["holder"], "second");
}

#[tokio::test]
async fn exit_codes_for_refusals_and_errors() {
    let server = TestServer::new().start().await;

    assert_eq!(
        tumbler(&server, &["acquire", "cli-codes", "--holder", "a"])
            .await
            .code,
        0
    );

    // Not acquired: 75, with the reason.
    let run = tumbler(&server, &["acquire", "cli-codes", "--holder", "b"]).await;
    assert_eq!(run.code, 75, "{}", run.stdout);
    assert!(
        run.stdout.starts_with("NOT_ACQUIRED cli-codes: BUSY"),
        "{}",
        run.stdout
    );
    let run = tumbler(
        &server,
        &["acquire", "cli-codes", "--holder", "b", "--json"],
    )
    .await;
    assert_eq!(run.code, 75);
    assert_eq!(json(&run)["status"], "ACQUIRE_STATUS_NOT_ACQUIRED");
    assert_eq!(json(&run)["reason"], "NOT_ACQUIRED_REASON_BUSY");

    // Waiting runs out: 75, TIMEOUT.
    let run = tumbler(
        &server,
        &[
            "acquire",
            "cli-codes",
            "--holder",
            "b",
            "--wait-ms",
            "200",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 75);
    assert_eq!(json(&run)["reason"], "NOT_ACQUIRED_REASON_TIMEOUT");

    // Extend: 0 for the holder, 79 for anyone else.
    let run = tumbler(
        &server,
        &["extend", "cli-codes", "--holder", "a", "--ttl-ms", "60000"],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.starts_with("EXTENDED cli-codes"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("1m"), "{}", run.stdout);
    let run = tumbler(&server, &["extend", "cli-codes", "--holder", "b", "--json"]).await;
    assert_eq!(run.code, 79);
    assert_eq!(json(&run)["status"], "EXTEND_STATUS_NOT_HELD");

    // Release with a wrong token, by someone else, twice: 79.
    let run = tumbler(
        &server,
        &["release", "cli-codes", "--holder", "a", "--token", "7"],
    )
    .await;
    assert_eq!(
        (run.code, run.stdout.trim()),
        (79, "NOT_HELD cli-codes (holder a)")
    );
    assert_eq!(
        tumbler(&server, &["release", "cli-codes", "--holder", "b"])
            .await
            .code,
        79
    );
    let run = tumbler(
        &server,
        &["release", "cli-codes", "--holder", "a", "--json"],
    )
    .await;
    assert_eq!(
        (run.code, json(&run)["status"].clone()),
        (0, "RELEASE_STATUS_RELEASED".into())
    );
    assert_eq!(
        tumbler(&server, &["release", "cli-codes", "--holder", "a"])
            .await
            .code,
        79
    );

    // Input the server refuses: 65, the gRPC status on stderr, nothing on
    // stdout.
    let run = tumbler(&server, &["acquire", "cli-codes", "--limit", "0"]).await;
    assert_eq!(run.code, 65);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(
        run.stderr.starts_with("error: INVALID_ARGUMENT: limit"),
        "{}",
        run.stderr
    );
    let run = tumbler(&server, &["release", "cli-codes", "--holder", ""]).await;
    assert_eq!(run.code, 65);
    assert!(run.stderr.contains("INVALID_ARGUMENT"), "{}", run.stderr);

    // Usage errors, found before sending: 64, naming the flag.
    for (args, flag) in [
        (&["acquire", "cli-codes", "--limit", "x"][..], "--limit"),
        (
            &["acquire", "cli-codes", "--addr", "grpc://h:1"][..],
            "--addr",
        ),
        (
            &["inspect", "cli-codes", "-n", "a", "-n", "b"][..],
            "--namespace",
        ),
        (&["list", "-o", "xml"][..], "--output"),
        (&["clear"][..], "--yes"),
        (&["no-such-command"][..], "no-such-command"),
    ] {
        let output = tokio::process::Command::new(TUMBLER)
            .args(args)
            .env_remove("TUMBLER_ADDR")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }

    // No server: 69, UNAVAILABLE.
    server.shutdown().await.unwrap();
    let output = tokio::process::Command::new(TUMBLER)
        .args(["inspect", "cli-codes", "--addr", "http://127.0.0.1:1"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("error: UNAVAILABLE: cannot connect to http://127.0.0.1:1"),
        "{stderr}"
    );
}

#[tokio::test]
async fn list_reap_metrics_and_clear_print_tables_and_json() {
    let server = TestServer::new().start().await;
    for (name, kind) in [
        ("nightly-export", "export"),
        ("nightly-import", "import"),
        ("other", "export"),
    ] {
        let run = tumbler(&server, &["acquire", name, "--holder", "w", "--kind", kind]).await;
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    }
    let run = tumbler(
        &server,
        &["acquire", "other", "--holder", "x", "--kind", "export"],
    )
    .await;
    assert_eq!(run.code, 75, "busy");

    // list: every page by default, a prefix filter, table and JSON.
    let run = tumbler(
        &server,
        &["list", "--prefix", "nightly-", "--page-size", "1"],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.starts_with("2 lock(s)"), "{}", run.stdout);
    assert!(run.stdout.contains("nightly-export") && run.stdout.contains("nightly-import"));
    assert!(!run.stdout.contains("other"));
    let listed = json(&tumbler(&server, &["list", "--json"]).await);
    let mut names: Vec<&str> = listed["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["nightly-export", "nightly-import", "other"]);
    // Every page was fetched: no next page token (an empty string, a
    // default, is left out).
    assert!(listed.get("nextPageToken").is_none(), "{listed}");

    // metrics: the per-kind table of the seed's Locks tab.
    let run = tumbler(&server, &["metrics"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    println!("{}", run.stdout);
    for header in [
        "kind", "acquired", "denied", "released", "expired", "errors",
    ] {
        assert!(run.stdout.contains(header), "{header}: {}", run.stdout);
    }
    let report = json(&tumbler(&server, &["metrics", "--json", "--kind", "export"]).await);
    let rows = report["totals"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["kind"], "export");
    assert_eq!(rows[0]["acquired"], "2");
    assert_eq!(rows[0]["denied"], "1");
    // The totals the table shows: per kind, and every kind together.
    let report = json(&tumbler(&server, &["metrics", "-o", "json"]).await);
    let totals = report["totals"].as_array().unwrap();
    assert_eq!(totals.len(), 2, "{report}");
    assert_eq!(report["overall"]["acquired"], "3", "{report}");
    assert_eq!(report["overall"]["denied"], "1", "{report}");
    let minutes: i64 = report["minutes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| int64(&m["acquired"]))
        .sum();
    assert_eq!(minutes, 3, "{report}");

    // reap: counts as a table and as JSON.
    let run = tumbler(&server, &["reap"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("expired holders"), "{}", run.stdout);
    let reaped = json(&tumbler(&server, &["reap", "--json"]).await);
    assert!(int64(&reaped["locksVisited"]) >= 3, "{reaped}");
    assert!(
        reaped.get("deadWaiters").is_none(),
        "0 is left out: {reaped}"
    );

    // clear: refused without --yes, then done.
    let run = tumbler(&server, &["clear"]).await;
    assert_eq!(run.code, 64);
    assert!(run.stderr.contains("--yes"), "{}", run.stderr);
    let cleared = json(&tumbler(&server, &["clear", "--yes", "--json"]).await);
    assert_eq!(cleared["locksCleared"], "3");
    let listed = json(&tumbler(&server, &["list", "--json"]).await);
    assert!(listed.get("locks").is_none(), "no locks: {listed}");
}

#[tokio::test]
async fn global_output_namespace_and_addresses_with_fail_over() {
    let server = TestServer::new().start().await;
    // A replica whose Redis is unreachable answers UNAVAILABLE.
    let broken = TestServer::new()
        .redis("redis://127.0.0.1:1")
        .args(service_args())
        .spawn()
        .await;
    let bare = server.addr.to_string();

    // -o and -n before the subcommand; host:port without a scheme.
    let output = tokio::process::Command::new(TUMBLER)
        .args(["-o", "yaml", "-n", "team-y", "acquire", "yaml-lock"])
        .args(["--holder", "w", "--addr", &bare])
        .env_remove("TUMBLER_NAMESPACE")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let reply: Value = serde_yaml_ng::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["status"], "ACQUIRE_STATUS_ACQUIRED");
    assert!(reply["grant"]["fencingToken"].is_string(), "{reply}");

    // An endpoint that refuses connections, one that answers UNAVAILABLE,
    // then the good one: the call lands on the good one.
    let addrs = format!("127.0.0.1:1, {},{bare}", broken.endpoint());
    let output = tokio::process::Command::new(TUMBLER)
        .args(["inspect", "yaml-lock", "--namespace", "team-y", "--json"])
        .args(["--addr", &addrs])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["holders"][0]["grant"]["holder"], "w");

    // Every endpoint down: 69, each one named.
    let addrs = format!("127.0.0.1:1,{}", broken.endpoint());
    let output = tokio::process::Command::new(TUMBLER)
        .args(["inspect", "yaml-lock", "--addr", &addrs])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("127.0.0.1:1") && stderr.contains(&broken.endpoint()),
        "{stderr}"
    );

    // TUMBLER_NAMESPACE when no -n.
    let output = tokio::process::Command::new(TUMBLER)
        .args(["inspect", "yaml-lock", "--json", "--addr", &bare])
        .env("TUMBLER_NAMESPACE", "team-y")
        .output()
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["namespace"], "team-y");
    assert_eq!(reply["holders"].as_array().unwrap().len(), 1);
}

/// 1,500 locks: `list` writes far more than a pipe holds.
async fn many_locks(server: &TestServer) {
    let mut client = server.client().await;
    for batch in 0..30 {
        let mut acquiring = tokio::task::JoinSet::new();
        for i in batch * 50..(batch + 1) * 50 {
            let mut client = client.clone();
            acquiring.spawn(async move {
                client
                    .acquire(acquire(&format!("pipe-{i:04}"), "w"))
                    .await
                    .unwrap();
            });
        }
        while let Some(done) = acquiring.join_next().await {
            done.unwrap();
        }
    }
    let listed = client
        .list(proto::ListRequest {
            page_size: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.locks.len(), 1);
}

#[tokio::test]
async fn a_reader_that_closes_early_ends_the_output_quietly() {
    let server = TestServer::new().start().await;
    many_locks(&server).await;
    for format in ["table", "json", "yaml"] {
        let mut child = tokio::process::Command::new(TUMBLER)
            .args(["list", "-o", format, "--addr", &server.endpoint()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line)
            .await
            .unwrap();
        assert!(!line.is_empty());
        drop(stdout); // like `| head -1`
        let output = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{format}: {stderr}");
        assert!(stderr.is_empty(), "{format}: {stderr}");
    }
}

#[tokio::test]
async fn a_full_disk_is_an_error() {
    let server = TestServer::new().start().await;
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let output = tokio::process::Command::new(TUMBLER)
        .args(["list", "--addr", &server.endpoint()])
        .stdout(full)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(74));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("error: cannot write the output:"),
        "{stderr}"
    );
    assert!(!stderr.contains("panic"), "{stderr}");
}

#[tokio::test]
async fn watch_prints_events_until_interrupted() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    for (format, signal, code) in [("json", "INT", 130), ("table", "TERM", 143)] {
        let mut watching = tokio::process::Command::new(TUMBLER)
            .args([
                "watch",
                "watched",
                "-o",
                format,
                "--addr",
                &server.endpoint(),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = tokio::io::BufReader::new(watching.stdout.take().unwrap());
        // The subscription is in place once an event arrives: acquire and
        // release until one does.
        let mut line = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while line.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "no event printed");
            client.acquire(acquire("other", "x")).await.unwrap();
            client.acquire(acquire("watched", "w")).await.unwrap();
            client.release(release("watched", "w")).await.unwrap();
            let _ = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line),
            )
            .await;
        }
        if format == "json" {
            let event: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(event["name"], "watched", "{line}");
            assert_eq!(event["holder"], "w", "{line}");
            assert!(int64(&event["fencingToken"]) > 0, "{line}");
        } else {
            assert!(line.contains(" watched holder=w token="), "{line}");
        }
        assert!(!line.contains("other"), "{line}");
        let pid = nix::unistd::Pid::from_raw(watching.id().unwrap() as i32);
        let signal = if signal == "INT" {
            nix::sys::signal::Signal::SIGINT
        } else {
            nix::sys::signal::Signal::SIGTERM
        };
        nix::sys::signal::kill(pid, signal).unwrap();
        let output = tokio::time::timeout(Duration::from_secs(10), watching.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(output.status.code(), Some(code));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("WATCHING watched on"), "{stderr}");
        assert!(!stderr.contains("panic"), "{stderr}");
    }
}

#[tokio::test]
async fn watch_can_start_with_the_current_holders() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client
        .acquire(proto::AcquireRequest {
            kind: "nightly".into(),
            ..acquire("busy", "w")
        })
        .await
        .unwrap();
    let mut watching = tokio::process::Command::new(TUMBLER)
        .args([
            "watch",
            "busy",
            "--initial-state",
            "-o",
            "json",
            "--addr",
            &server.endpoint(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(watching.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line),
        )
        .await
        .expect("a line within 10 s")
        .unwrap();
        lines.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert_eq!(lines[0]["event"], "held", "{lines:?}");
    assert_eq!(lines[0]["holder"], "w");
    assert_eq!(lines[0]["kind"], "nightly");
    assert_eq!(lines[0]["slot"], 1);
    assert!(int64(&lines[0]["expiresAtMs"]) > int64(&lines[0]["atMs"]));
    assert_eq!(lines[1]["event"], "synced", "{lines:?}");
    let pid = nix::unistd::Pid::from_raw(watching.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let output = tokio::time::timeout(Duration::from_secs(10), watching.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(130));
}

#[tokio::test]
async fn completion_scripts_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let output = tokio::process::Command::new(TUMBLER)
            .args(["completion", shell])
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        for word in [
            "tumbler",
            "hold",
            "watch",
            "namespace",
            "output",
            "grace-ms",
        ] {
            assert!(script.contains(word), "{shell}: {word}");
        }
        if shell == "bash" {
            let check = std::process::Command::new("bash")
                .arg("-n")
                .stdin(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut bash| {
                    std::io::Write::write_all(&mut bash.stdin.take().unwrap(), script.as_bytes())?;
                    bash.wait()
                })
                .unwrap();
            assert!(check.success(), "bash -n rejects the script");
        }
    }
}

/// Every subcommand, with the flags its help must mention.
const SUBCOMMANDS: &[(&str, &[&str])] = &[
    (
        "serve",
        &[
            "--redis-url",
            "--listen",
            "--auth-tokens-file",
            "--redis-username",
            "--redis-password-file",
            "--redis-tls-ca-file",
        ],
    ),
    ("dev", &["--listen", "--redis-server"]),
    ("upgrade-layout", &["--force", "--redis-url", "--shards"]),
    (
        "acquire",
        &[
            "--holder",
            "--limit",
            "--ttl-ms",
            "--wait-ms",
            "--queue-ttl-ms",
            "--priority",
            "--barging",
            "--kind",
            "--meta",
            "--addr",
        ],
    ),
    ("release", &["--holder", "--token", "--addr"]),
    ("extend", &["--holder", "--ttl-ms", "--token"]),
    ("inspect", &["--addr", "--tls-ca-file", "--auth-token"]),
    ("queue", &["--max-entries"]),
    (
        "list",
        &["--prefix", "--waiting", "--page-size", "--page-token"],
    ),
    ("reap", &["--older-than-ms"]),
    ("clear", &["--yes"]),
    ("metrics", &["--minutes", "--kind", "--per-minute"]),
    (
        "hold",
        &[
            "--grace-ms",
            "--ttl-ms",
            "--wait-ms",
            "--conflict-exit-code",
            "-E",
            "--session",
            "--holder",
            "--meta",
        ],
    ),
    (
        "elect",
        &[
            "--listen",
            "--session",
            "--candidate",
            "--ttl-ms",
            "--wait-ms",
            "--grace-ms",
            "-E",
            "[VALUE]",
            "[COMMAND]",
        ],
    ),
    ("watch", &["--prefix", "[NAME]"]),
    ("token", &["--name", "--role", "--existing"]),
    ("health", &["--service", "--addr"]),
    ("completion", &["bash", "zsh", "fish"]),
    ("help", &[]),
];

#[tokio::test]
async fn every_subcommand_has_help_that_names_its_flags() {
    let top = std::process::Command::new(TUMBLER).arg("--help").output();
    let top = top.unwrap();
    assert_eq!(top.status.code(), Some(0));
    let top = String::from_utf8(top.stdout).unwrap();
    // The list above is complete: every subcommand the help lists is in it.
    let listed: Vec<&str> = top
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("  "))
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    let known: Vec<&str> = SUBCOMMANDS.iter().map(|(name, _)| *name).collect();
    assert_eq!(listed, known);
    for flag in ["--output", "--json", "--namespace", "--log-level"] {
        assert!(top.contains(flag), "tumbler --help: {flag}");
    }
    for (name, flags) in SUBCOMMANDS.iter().filter(|(name, _)| *name != "help") {
        let output = std::process::Command::new(TUMBLER)
            .args([name, "--help"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{name} --help");
        let help = String::from_utf8(output.stdout).unwrap();
        assert!(help.contains("Usage: tumbler"), "{name}: {help}");
        for flag in *flags {
            assert!(help.contains(flag), "{name} --help lacks {flag}: {help}");
        }
        let no_client = ["serve", "dev", "upgrade-layout", "token", "completion"];
        if !no_client.contains(name) {
            for global in ["--output", "--namespace", "--addr"] {
                assert!(help.contains(global), "{name} --help lacks {global}");
            }
        }
    }
}

/// Runs `tumbler <args>` (no server address) to completion.
fn offline(args: &[&str]) -> Run {
    let output = std::process::Command::new(TUMBLER)
        .args(args)
        .env_remove("TUMBLER_NAMESPACE")
        .output()
        .unwrap();
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// Runs `tumbler <args> --auth-token <token> --addr <server>`.
async fn authed(server: &TestServer, token: &str, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend(["--auth-token", token]);
    tumbler(server, &all).await
}

/// The token on `tumbler token`'s comment line.
fn made_token(run: &Run) -> String {
    run.stdout
        .lines()
        .find_map(|l| l.trim_start_matches('#').trim().strip_prefix("tmb_"))
        .map(|t| format!("tmb_{t}"))
        .unwrap_or_else(|| panic!("a token line: {}", run.stdout))
}

#[tokio::test]
async fn token_entries_are_read_by_the_server_and_grant_what_they_say() {
    // A name that needs quoting, two namespaces (one a prefix), a client.
    let client = offline(&[
        "token",
        "--name",
        "ci \"nightly\" \\ builds",
        "--namespace",
        "builds",
        "--namespace",
        "b-*",
    ]);
    assert_eq!(client.code, 0, "{}", client.stderr);
    let client_token = made_token(&client);
    // An admin, for a token it was given; `-o json` changes nothing.
    let admin = offline(&[
        "token",
        "--name",
        "ops",
        "--namespace",
        "*",
        "--role",
        "admin",
        "--existing",
        "ops-secret",
        "-o",
        "json",
    ]);
    assert_eq!(admin.code, 0, "{}", admin.stderr);
    assert!(
        admin.stdout.contains("#   ops-secret\n"),
        "{}",
        admin.stdout
    );
    assert!(admin.stdout.contains("[[token]]\n"), "{}", admin.stdout);
    assert!(
        admin.stdout.contains("role = \"admin\"\n"),
        "{}",
        admin.stdout
    );
    // The file keeps digests only.
    assert!(!client.stdout.contains(&format!("\"{client_token}\"")));
    assert!(!admin.stdout.contains("\"ops-secret\""));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, format!("{}{}", client.stdout, admin.stdout)).unwrap();
    let args = tumbler::config::ServiceArgs {
        auth: tumbler::config::AuthArgs {
            auth_tokens_file: Some(path.clone()),
            no_auth: false,
            auth_reload_interval_ms: 100,
        },
        ..service_args()
    };
    let server = TestServer::new().args(args).start().await;
    for namespace in ["builds", "b-nightly"] {
        let held = authed(
            &server,
            &client_token,
            &["acquire", "-n", namespace, "main"],
        )
        .await;
        assert_eq!(held.code, 0, "{namespace}: {}", held.stderr);
    }
    let elsewhere = authed(
        &server,
        &client_token,
        &["inspect", "-n", "deploys", "main"],
    )
    .await;
    assert_eq!(elsewhere.code, 77, "{}", elsewhere.stderr);
    assert!(elsewhere.stderr.contains("PERMISSION_DENIED"));
    let not_admin = authed(&server, &client_token, &["clear", "-n", "builds", "--yes"]).await;
    assert_eq!(not_admin.code, 77, "{}", not_admin.stderr);
    let cleared = authed(&server, "ops-secret", &["clear", "-n", "builds", "--yes"]).await;
    assert_eq!(cleared.code, 0, "{}", cleared.stderr);
    let unknown = authed(&server, "not-a-token", &["inspect", "-n", "builds", "main"]).await;
    assert_eq!(unknown.code, 77, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("UNAUTHENTICATED"));
}

#[test]
fn the_tokens_file_help_names_the_command_that_makes_entries() {
    let help = offline(&["serve", "--help"]);
    assert_eq!(help.code, 0);
    let (_, after) = help
        .stdout
        .split_once("--auth-tokens-file <")
        .expect("serve --help describes --auth-tokens-file");
    let named = after.split('`').nth(1).expect("the help quotes a command");
    assert!(named.starts_with("tumbler token --name"), "{named}");
    // The command it names runs, as named (with a namespace filled in).
    let words: Vec<&str> = named
        .split_whitespace()
        .skip(1)
        .map(|w| match w {
            "NAME" => "ci",
            "NS" => "builds",
            other => other,
        })
        .collect();
    let made = offline(&words);
    assert_eq!(made.code, 0, "{named}: {}", made.stderr);
    assert!(made.stdout.contains("[[token]]"), "{}", made.stdout);
}
