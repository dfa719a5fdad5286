//! The client subcommands (`tumbler acquire|release|extend|inspect|queue|
//! list|reap|clear|metrics`):
//! the real binary against a real server, its tables, its JSON and its
//! exit codes (0 done, 1 not acquired / not held, 2 error).

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `tumbler <args> --addr <server>` to completion.
async fn tumbler(server: &TestServer, args: &[&str]) -> Run {
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

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", run.stdout))
}

#[tokio::test]
async fn acquire_prints_a_table_and_json_and_inspect_shows_the_holder() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;

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
    let reply = json(&run);
    assert_eq!(reply["status"], "ACQUIRED");
    assert_eq!(reply["holders"], 1);
    let grant = &reply["grant"];
    assert_eq!(grant["holder"], "worker-2");
    assert_eq!(grant["slot"], 1);
    assert!(grant["fencing_token"].as_u64().unwrap() > 0);
    assert_eq!(grant["metadata"]["a"], "1");
    assert_eq!(grant["metadata"]["b"], "x=y");
    let token = grant["fencing_token"].as_u64().unwrap();

    // The same acquire again: the same grant, exit 0.
    let run = tumbler(
        &server,
        &[
            "acquire", "cli-json", "-n", "team-a", "--holder", "worker-2", "--limit", "3", "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0);
    assert_eq!(json(&run)["status"], "ALREADY_HELD");
    assert_eq!(json(&run)["grant"]["fencing_token"], token);

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
    assert_eq!(reply["holders"][0]["grant"]["fencing_token"], token);
    assert!(reply["holders"][0]["remaining_ms"].as_i64().unwrap() > 0);
}

#[tokio::test]
async fn queue_shows_a_waiter_until_release_hands_the_lock_over() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;

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
    assert_eq!(reply["status"], "ACQUIRED");
    assert_eq!(reply["grant"]["holder"], "second");
}

#[tokio::test]
async fn exit_codes_for_refusals_and_errors() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;

    assert_eq!(
        tumbler(&server, &["acquire", "cli-codes", "--holder", "a"])
            .await
            .code,
        0
    );

    // Not acquired: 1, with the reason.
    let run = tumbler(&server, &["acquire", "cli-codes", "--holder", "b"]).await;
    assert_eq!(run.code, 1, "{}", run.stdout);
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
    assert_eq!(run.code, 1);
    assert_eq!(json(&run)["status"], "NOT_ACQUIRED");
    assert_eq!(json(&run)["reason"], "BUSY");

    // Waiting runs out: 1, TIMEOUT.
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
    assert_eq!(run.code, 1);
    assert_eq!(json(&run)["reason"], "TIMEOUT");

    // Extend: 0 for the holder, 1 for anyone else.
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
    assert_eq!(run.code, 1);
    assert_eq!(json(&run)["status"], "NOT_HELD");

    // Release with a wrong token, by someone else, twice: 1.
    let run = tumbler(
        &server,
        &["release", "cli-codes", "--holder", "a", "--token", "7"],
    )
    .await;
    assert_eq!(
        (run.code, run.stdout.trim()),
        (1, "NOT_HELD cli-codes (holder a)")
    );
    assert_eq!(
        tumbler(&server, &["release", "cli-codes", "--holder", "b"])
            .await
            .code,
        1
    );
    let run = tumbler(
        &server,
        &["release", "cli-codes", "--holder", "a", "--json"],
    )
    .await;
    assert_eq!(
        (run.code, json(&run)["status"].clone()),
        (0, "RELEASED".into())
    );
    assert_eq!(
        tumbler(&server, &["release", "cli-codes", "--holder", "a"])
            .await
            .code,
        1
    );

    // Bad input: 2, the gRPC status on stderr, nothing on stdout.
    let run = tumbler(&server, &["acquire", "cli-codes", "--limit", "0"]).await;
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(
        run.stderr.starts_with("error: INVALID_ARGUMENT: limit"),
        "{}",
        run.stderr
    );
    let run = tumbler(&server, &["release", "cli-codes", "--holder", ""]).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("INVALID_ARGUMENT"), "{}", run.stderr);

    // No server: 2, UNAVAILABLE.
    server.shutdown().await.unwrap();
    let output = tokio::process::Command::new(TUMBLER)
        .args(["inspect", "cli-codes", "--addr", "http://127.0.0.1:1"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("error: UNAVAILABLE: cannot connect"),
        "{stderr}"
    );
}

#[tokio::test]
async fn list_reap_metrics_and_clear_print_tables_and_json() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
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
    assert_eq!(run.code, 1, "busy");

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
    assert_eq!(listed["next_page_token"], "");

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
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["acquired"], 2);
    assert_eq!(rows[0]["denied"], 1);

    // reap: counts as a table and as JSON.
    let run = tumbler(&server, &["reap"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("expired holders"), "{}", run.stdout);
    let reaped = json(&tumbler(&server, &["reap", "--json"]).await);
    assert_eq!(reaped["dead_waiters"], 0);

    // clear: refused without --yes, then done.
    let run = tumbler(&server, &["clear"]).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--yes"), "{}", run.stderr);
    let cleared = json(&tumbler(&server, &["clear", "--yes", "--json"]).await);
    assert_eq!(cleared["locks_cleared"], 3);
    let listed = json(&tumbler(&server, &["list", "--json"]).await);
    assert!(listed["locks"].as_array().unwrap().is_empty());
}
