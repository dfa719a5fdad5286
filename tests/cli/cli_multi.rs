//! Multi-locks from the command line: `tumbler acquire a b c` prints each
//! lock's grant under its name, an overlapping set is refused whole (exit
//! 75) and nothing of it is taken, `extend` and `release` act on the set
//! (a second release exits 79), and `-o json` answers the grants in the
//! request's order, each with its name and own fencing token. `--tokens`
//! pins a set's release and extend to each lock's token (decision 0079).

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

/// `release --tokens` of an old set after its holder took the set again
/// exits 79 and leaves the newer set held; the newer set's own tokens
/// extend and release it (0); a count other than the names' and a 0 are
/// usage errors (64), sent nowhere.
#[tokio::test]
async fn a_sets_release_and_extend_pinned_to_its_tokens() {
    let server = TestServer::new().start().await;
    let take = || async {
        let run = tumbler(
            &server,
            &["acquire", "p-a", "p-b", "--holder", "h", "-o", "json"],
        )
        .await;
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let reply = json(&run);
        let tokens: Vec<String> = (reply["grants"].as_array().expect("grants").iter())
            .map(|g| int64(&g["fencingToken"]).to_string())
            .collect();
        tokens.join(",")
    };
    let pinned = |verb: &'static str, tokens: String| {
        let server = &server;
        async move {
            let args = [verb, "p-a", "p-b", "--holder", "h", "--tokens", &tokens];
            tumbler(server, &args).await
        }
    };
    let old = take().await;
    assert_eq!(pinned("release", old.clone()).await.code, 0);
    let new = take().await;
    assert_ne!(old, new);

    let run = pinned("release", old.clone()).await;
    assert_eq!(run.code, 79, "a late release: {}{}", run.stdout, run.stderr);
    let run = pinned("extend", old.clone()).await;
    assert_eq!(run.code, 79, "a stale extend: {}{}", run.stdout, run.stderr);
    for name in ["p-a", "p-b"] {
        let held = json(&tumbler(&server, &["inspect", name, "-o", "json"]).await);
        assert_eq!(held["holders"][0]["grant"]["holder"], "h", "{held}");
    }
    let (first, _) = new.split_once(',').unwrap();
    for bad in [
        first.to_owned(),
        format!("{first},0"),
        format!("{new},{first}"),
    ] {
        for verb in ["release", "extend"] {
            let run = pinned(verb, bad.clone()).await;
            assert_eq!(
                run.code, 64,
                "{verb} --tokens {bad}: {}{}",
                run.stdout, run.stderr
            );
            assert!(run.stderr.contains("--tokens"), "{}", run.stderr);
        }
    }
    let run = pinned("extend", new.clone()).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let run = pinned("release", new).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let free = json(&tumbler(&server, &["inspect", "p-a", "-o", "json"]).await);
    assert!(
        free["holders"].as_array().is_none_or(|h| h.is_empty()),
        "{free}"
    );
}

/// What a set's tokens promise (docs/cli.md, "Multi-locks"; issue 54):
/// `acquire` prints each lock's own grant and token (the token Inspect
/// shows for that lock, in the table and in the JSON), and per lock the
/// tokens rise: the set taken again gets, lock by lock, a greater token.
/// Tokens are not ids across locks: two locks of a set may show the same
/// number (each shard's counter starts from the Redis clock), which is
/// why nothing here asks them to differ.
#[tokio::test]
async fn a_sets_tokens_are_each_locks_own_and_rise_per_lock() {
    let server = TestServer::new().start().await;
    let names = ["t-a", "t-b", "t-c"];
    let mut before: Vec<i64> = Vec::new();
    for round in 0..3 {
        let mut args = vec!["acquire"];
        args.extend(names);
        args.extend(["--holder", "setter", "--ttl-ms", "60000"]);
        let json_args: Vec<&str> = args.iter().copied().chain(["-o", "json"]).collect();
        let run = tumbler(&server, if round == 1 { &args } else { &json_args }).await;
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let mut tokens = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let held = json(&tumbler(&server, &["inspect", name, "-o", "json"]).await);
            let token = int64(&held["holders"][0]["grant"]["fencingToken"]);
            if round == 1 {
                // The table: under each name, that lock's own token.
                let section = run.stdout.split(&format!("\n{name}:\n")).nth(1);
                let section = section.unwrap_or_else(|| panic!("{name}: {}", run.stdout));
                let section = section.split("\nt-").next().unwrap();
                assert!(
                    section.contains(&token.to_string()),
                    "{name}'s table shows its token {token}: {}",
                    run.stdout
                );
            } else {
                let grant = &json(&run)["grants"][i];
                assert_eq!(grant["name"], *name, "{grant}");
                assert_eq!(int64(&grant["fencingToken"]), token, "{name}: {grant}");
            }
            if let Some(old) = before.get(i) {
                assert!(token > *old, "{name}: {token} after {old}");
            }
            tokens.push(token);
        }
        let mut args = vec!["release"];
        args.extend(names);
        args.extend(["--holder", "setter"]);
        let run = tumbler(&server, &args).await;
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        before = tokens;
    }
}
