//! Multi-locks from the command line: `tumbler acquire a b c` prints each
//! lock's grant under its name, an overlapping set is refused whole (exit
//! 75) and nothing of it is taken, `extend` and `release` act on the set
//! (a second release exits 79), and `-o json` answers the grants in the
//! request's order, each with its name and own fencing token.

use crate::cli::{int64, json, tumbler};
use crate::common::TestServer;

#[tokio::test]
async fn acquire_extend_and_release_a_set_of_locks() {
    let server = TestServer::new().start().await;
    // The set's holder (and, but for `release`, its lease).
    let with = |args: &[&'static str]| -> Vec<&'static str> {
        let lease: &[&str] = match args[0] {
            "release" => &[],
            _ => &["--ttl-ms", "60000"],
        };
        (args.iter().chain(&["--holder", "transfer"]).chain(lease))
            .copied()
            .collect()
    };

    let run = tumbler(&server, &with(&["acquire", "m-a", "m-b", "m-c"])).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("ACQUIRED"), "{}", run.stdout);
    let mut at = 0;
    for name in ["m-a:", "m-b:", "m-c:"] {
        let found = run.stdout[at..].find(&format!("\n{name}\n"));
        at += found.unwrap_or_else(|| panic!("{name} in order: {}", run.stdout)) + 1;
    }
    assert_eq!(run.stdout.matches("transfer").count(), 3, "{}", run.stdout);

    // b is held: the set {b, d} is refused whole, d stays free.
    let run = tumbler(&server, &["acquire", "m-b", "m-d", "--holder", "other"]).await;
    assert_eq!(run.code, 75, "not acquired: {}{}", run.stdout, run.stderr);
    let held = json(&tumbler(&server, &["inspect", "m-b", "-o", "json"]).await);
    assert_eq!(held["holders"][0]["grant"]["holder"], "transfer", "{held}");
    let free = json(&tumbler(&server, &["inspect", "m-d", "-o", "json"]).await);
    assert!(
        free["holders"].as_array().is_none_or(|h| h.is_empty()),
        "nothing of a refused set is taken: {free}"
    );

    let run = tumbler(&server, &with(&["extend", "m-a", "m-b", "m-c"])).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let run = tumbler(
        &server,
        &with(&["extend", "m-a", "m-b", "m-c", "-o", "json"]),
    )
    .await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(json(&run)["status"], "EXTEND_STATUS_EXTENDED");

    let run = tumbler(&server, &with(&["release", "m-a", "m-b", "m-c"])).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let run = tumbler(&server, &with(&["release", "m-a", "m-b", "m-c"])).await;
    assert_eq!(
        run.code, 79,
        "not held any more: {}{}",
        run.stdout, run.stderr
    );
    let run = tumbler(&server, &with(&["extend", "m-a", "m-b", "m-c"])).await;
    assert_eq!(
        run.code, 79,
        "not held any more: {}{}",
        run.stdout, run.stderr
    );

    // The JSON: every grant, in the order asked, named, each its own token.
    let run = tumbler(&server, &with(&["acquire", "m-c", "m-a", "-o", "json"])).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let reply = json(&run);
    assert_eq!(reply["status"], "ACQUIRE_STATUS_ACQUIRED");
    let grants = reply["grants"].as_array().expect("grants");
    let named: Vec<&str> = grants.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(named, ["m-c", "m-a"], "{reply}");
    for grant in grants {
        assert_eq!(grant["holder"], "transfer");
        assert!(int64(&grant["fencingToken"]) > 0, "{grant}");
    }
    assert_eq!(reply["grant"], grants[0], "`grant` is the first of them");
}
