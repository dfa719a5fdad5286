//! Multi-locks (decision 0076) and deadlock-checked waits (decision 0077)
//! under attack, real server, real Redis: another tenant's set is refused
//! and takes nothing; a token revoked during a deadlock-checked wait ends
//! it and leaves no wait-for edge; huge and malformed sets are
//! INVALID_ARGUMENT naming the field over gRPC and Connect JSON, never a
//! panic, and hold nothing.

use std::time::Duration;

use serde_json::json;
use tonic::Code;

use super::auth::{ADMIN, Client, TEAM_A, bearer, entry, holders, replace_tokens_file, setup_with};
use super::connect::call;
use crate::common::wait::wait_until_async;
use crate::common::*;

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// A set of `names` in `namespace` for `holder`.
fn set(namespace: &str, of: &[&str], holder: &str, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: namespace.into(),
        names: names(of),
        holder: holder.into(),
        ttl_ms: Some(30_000),
        wait_ms,
        ..Default::default()
    }
}

/// The tokens file of these tests: team-a's client token, the admin's.
fn tokens() -> String {
    [
        entry("team-a", TEAM_A, "client", r#"["team-a"]"#, ""),
        entry("ops", ADMIN, "admin", r#"["*"]"#, ""),
    ]
    .concat()
}

/// Every lock, queue and registry key of the Redis behind `server`.
async fn lock_keys(server: &TestServer) -> Vec<String> {
    let mut conn = redis_conn(server.redis_url()).await;
    let mut keys = scan_keys(&mut conn, "tumbler:*:l:*").await;
    keys.extend(scan_keys(&mut conn, "tumbler:*:q:*").await);
    keys
}

/// A set in another tenant's namespace is PERMISSION_DENIED and takes
/// nothing; releasing or extending another tenant's set by its names is
/// PERMISSION_DENIED and leaves it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_set_is_permission_denied_and_changes_nothing() {
    let s = setup_with(&tokens()).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    let mut team_a = bearer(&s.server, TEAM_A).await;
    let of = ["ledger-1", "ledger-2", "ledger-3"];

    for wait_ms in [0, 2_000] {
        let refused = team_a
            .acquire(set("team-b", &of, "intruder", wait_ms))
            .await
            .expect_err("another tenant's set is refused");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    for name in of {
        assert_eq!(holders(&mut admin, "team-b", name).await, 0, "{name}");
    }
    assert!(lock_keys(&s.server).await.is_empty());

    // team-b's own set, held by "owner".
    let taken = admin
        .acquire(set("team-b", &of, "owner", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(taken.status(), proto::AcquireStatus::Acquired, "{taken:?}");
    let released = team_a
        .release(proto::ReleaseRequest {
            namespace: "team-b".into(),
            names: names(&of),
            holder: "owner".into(),
            ..Default::default()
        })
        .await
        .expect_err("another tenant's set is not released");
    assert_eq!(released.code(), Code::PermissionDenied, "{released:?}");
    let extended = team_a
        .extend(proto::ExtendRequest {
            namespace: "team-b".into(),
            names: names(&of),
            holder: "owner".into(),
            ttl_ms: Some(1),
            ..Default::default()
        })
        .await
        .expect_err("another tenant's set is not extended");
    assert_eq!(extended.code(), Code::PermissionDenied, "{extended:?}");
    // Its grants stand, unchanged (not shortened to 1 ms).
    for (name, grant) in of.iter().zip(&taken.grants) {
        let seen = admin
            .inspect(proto::InspectRequest {
                namespace: "team-b".into(),
                name: name.to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        let held = seen.holders[0].grant.as_ref().unwrap();
        assert_eq!(
            (held.holder.as_str(), held.fencing_token, held.expires_at_ms),
            ("owner", grant.fencing_token, grant.expires_at_ms),
            "{name}"
        );
    }
    // Mixed namespaces cannot be smuggled into one set: the namespace is
    // the request's, and a name is a name (a "team-b/x" name is a lock of
    // team-a called that).
    let smuggled = team_a
        .acquire(set("team-a", &["team-b/ledger-1", "ledger-1"], "a", 0))
        .await;
    if let Ok(reply) = smuggled {
        assert_eq!(reply.get_ref().status(), proto::AcquireStatus::Acquired);
        let still = admin
            .inspect(proto::InspectRequest {
                namespace: "team-b".into(),
                name: "ledger-1".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(still.holders[0].grant.as_ref().unwrap().holder, "owner");
    }
}

/// The wait-for edges of `namespace` (decision 0077's registry).
async fn edges(server: &TestServer, namespace: &str) -> Vec<String> {
    let mut conn = redis_conn(server.redis_url()).await;
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("tumbler:{{{namespace}:waits}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Field "" is the registry's byte count, no edge (decision 0081).
    fields.into_iter().filter(|f| !f.is_empty()).collect()
}

/// A named holder that holds another lock and waits (a single lock, and a
/// set) records a wait-for edge; revoking its token ends both waits
/// (UNAUTHENTICATED, as revocation does for single waits), and leaves no
/// edge, no queue entry and nothing held behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_deadlock_checked_waits_and_leaves_no_edge() {
    let s = setup_with(&tokens()).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    let team_a = bearer(&s.server, TEAM_A).await;
    let ns = "team-a";
    let take = |client: &Client, req: proto::AcquireRequest| {
        let mut client = client.clone();
        async move { client.acquire(req).await }
    };
    let single = |name: &str, holder: &str, wait_ms| proto::AcquireRequest {
        namespace: ns.into(),
        name: name.into(),
        holder: holder.into(),
        ttl_ms: Some(30_000),
        wait_ms,
        ..Default::default()
    };
    for (name, holder) in [("busy", "admin"), ("own-w", "w"), ("own-m", "m")] {
        let reply = take(&admin, single(name, holder, 0)).await.unwrap();
        assert_eq!(reply.get_ref().status(), proto::AcquireStatus::Acquired);
    }
    // "w" (holding own-w) waits for busy; "m" (holding own-m) waits for
    // the set {free, busy}. Both waits are long enough to be checked.
    let w = tokio::spawn(take(&team_a, single("busy", "w", 20_000)));
    let m = tokio::spawn(take(&team_a, set(ns, &["free", "busy"], "m", 20_000)));
    wait_until_async(
        "both waits are recorded as wait-for edges",
        Duration::from_secs(10),
        || async {
            let mut seen = edges(&s.server, ns).await;
            seen.sort();
            seen == ["m", "w"]
        },
    )
    .await;

    replace_tokens_file(&s.path, &entry("ops", ADMIN, "admin", r#"["*"]"#, ""));
    let started = std::time::Instant::now();
    let mut codes = Vec::new();
    for (who, wait) in [("w", w), ("m", m)] {
        let status = tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("{who}'s wait ends within 10 s"))
            .unwrap()
            .expect_err("a revoked token's wait ends with an error");
        codes.push(status.code());
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // Both end as revocation ends any wait: UNAUTHENTICATED.
    assert_eq!(codes, [Code::Unauthenticated; 2], "{codes:?}");
    wait_until_async(
        "no wait-for edge is left",
        Duration::from_secs(5),
        || async { edges(&s.server, ns).await.is_empty() },
    )
    .await;
    let mut conn = redis_conn(s.server.redis_url()).await;
    assert!(
        scan_keys(&mut conn, "tumbler:*:q:*").await.is_empty(),
        "no queue entry left"
    );
    assert_eq!(
        holders(&mut admin, ns, "free").await,
        0,
        "nothing of the set held"
    );
    // Busy freed: nobody gets it on the revoked waiters' behalf.
    admin
        .release(proto::ReleaseRequest {
            namespace: ns.into(),
            name: "busy".into(),
            holder: "admin".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_until_async("busy is free", Duration::from_secs(5), || {
        let mut admin = admin.clone();
        async move { holders(&mut admin, ns, "busy").await == 0 }
    })
    .await;
    let kept = admin
        .inspect(proto::InspectRequest {
            namespace: ns.into(),
            name: "busy".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((kept.holders.len(), kept.waiters), (0, 0), "{kept:?}");
}

/// A set's wait whose token is revoked ends as a single wait's does
/// (UNAUTHENTICATED; PERMISSION_DENIED for a namespace taken away), not
/// CANCELLED, "the caller stopped waiting" (it did, until
/// `acquire_many_rpc` looked at why it stopped the wait before mapping
/// the engine's `Stopped`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_waiting_set_ends_unauthenticated_as_a_single_wait_does() {
    let s = setup_with(&tokens()).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    let mut team_a = bearer(&s.server, TEAM_A).await;
    let busy = admin
        .acquire(proto::AcquireRequest {
            namespace: "team-a".into(),
            ..acquire("busy", "admin")
        })
        .await
        .unwrap();
    assert_eq!(busy.get_ref().status(), proto::AcquireStatus::Acquired);
    let wait = tokio::spawn(async move {
        team_a
            .acquire(set("team-a", &["free", "busy"], "", 20_000))
            .await
    });
    wait_until_async("the set waits", Duration::from_secs(10), || {
        let mut admin = admin.clone();
        async move {
            let seen = admin
                .inspect(proto::InspectRequest {
                    namespace: "team-a".into(),
                    name: "busy".into(),
                })
                .await
                .unwrap()
                .into_inner();
            seen.waiters > 0
        }
    })
    .await;
    replace_tokens_file(&s.path, &entry("ops", ADMIN, "admin", r#"["*"]"#, ""));
    let status = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the wait ends within 10 s")
        .unwrap()
        .expect_err("a revoked token's wait ends with an error");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

/// 17 names, 10,000 names, a 1 MB name, an empty name inside the list,
/// `names` and `name` both set: each INVALID_ARGUMENT naming its field,
/// over gRPC and over Connect JSON, with the request size cap raised so
/// validation (not the cap) answers; with the default 64 KiB cap the large
/// ones are RESOURCE_EXHAUSTED. Nothing is held afterwards, and the server
/// still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_and_malformed_sets_are_invalid_argument_naming_the_field() {
    let server = TestServer::new()
        .args(tumbler::config::ServiceArgs {
            max_request_bytes: 4 << 20,
            ..service_args()
        })
        .start()
        .await;
    let mut client = server.client().await;
    let many = |n: usize| (0..n).map(|i| format!("n{i}")).collect::<Vec<_>>();
    let huge = "x".repeat(1 << 20);
    // (what, names, name, the field the message must name)
    let cases: Vec<(&str, Vec<String>, &str, &str)> = vec![
        ("17 names", many(17), "", "names"),
        ("10,000 names", many(10_000), "", "names"),
        (
            "a 1 MB name",
            vec!["a".into(), huge.clone()],
            "",
            "names[1]",
        ),
        (
            "an empty name",
            vec!["a".into(), String::new(), "b".into()],
            "",
            "names[1]",
        ),
        ("names and name", many(2), "single", "name"),
        (
            "a repeated name",
            vec!["a".into(), "a".into()],
            "",
            "names[1]",
        ),
    ];
    for (what, of, name, field) in &cases {
        let status = client
            .acquire(proto::AcquireRequest {
                name: name.to_string(),
                names: of.clone(),
                holder: "h".into(),
                wait_ms: 1_000,
                ..Default::default()
            })
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let names_field = |message: &str| {
            assert!(
                message.starts_with(&format!("{field}: ")),
                "{what}: {}",
                &message[..message.len().min(200)]
            )
        };
        names_field(status.message());
        let body = json!({"names": of, "name": name, "holder": "h", "waitMs": 1000});
        let answer = call(&server, "Acquire", body, &[]).await;
        names_field(&answer.error(400, "invalid_argument"));
        // Release and Extend of such a set: the same.
        for (method, body) in [
            ("Release", json!({"names": of, "name": name, "holder": "h"})),
            (
                "Extend",
                json!({"names": of, "name": name, "holder": "h", "ttlMs": "1000"}),
            ),
        ] {
            names_field(
                &call(&server, method, body, &[])
                    .await
                    .error(400, "invalid_argument"),
            );
        }
    }
    assert!(
        lock_keys(&server).await.is_empty(),
        "nothing held or queued"
    );
    let ok = client
        .acquire(proto::AcquireRequest {
            names: names(&["a", "b"]),
            holder: "h".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.status(), proto::AcquireStatus::Acquired, "still serving");

    // The default cap: the large ones are refused before they are read.
    let capped = TestServer::new().start().await;
    let mut client = capped.client().await;
    for (what, of) in [
        ("10,000 names", many(10_000)),
        ("a 1 MB name", vec!["a".into(), huge]),
    ] {
        let status = client
            .acquire(proto::AcquireRequest {
                names: of.clone(),
                holder: "h".into(),
                ..Default::default()
            })
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::ResourceExhausted, "{what}: {status:?}");
        let answer = call(&capped, "Acquire", json!({"names": of, "holder": "h"}), &[]).await;
        answer.error(429, "resource_exhausted");
    }
    assert!(
        lock_keys(&capped).await.is_empty(),
        "nothing held or queued"
    );
}

/// A set that names a lock its holder holds already: the set is answered
/// ACQUIRED, and every lock of it must then stand for the set's lease, as
/// on a Redis Cluster (where every part is extended to the full ttl), not
/// lapse with what remained of the old grant while the others stand (a
/// partial set visible to others, invariant 15; the chaos run saw it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_that_names_a_lock_already_held_holds_it_for_the_sets_lease() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let old = client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(1_000),
            ..acquire("p", "h")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(old.status(), proto::AcquireStatus::Acquired);
    let reply = client
        .acquire(set("", &["p", "q"], "h", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(
            reply.status(),
            proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld
        ),
        "{reply:?}"
    );
    let expiries: Vec<i64> = reply.grants.iter().map(|g| g.expires_at_ms).collect();
    let old_expiry = old.grant.unwrap().expires_at_ms;
    assert!(
        expiries.iter().all(|&e| e >= old_expiry + 20_000),
        "every lock of the set stands for its 30 s lease: {expiries:?} (the old grant ended at {old_expiry})"
    );
}

/// A set's `fencing_tokens` (decision 0079) out of rule: a length other
/// than the names', a 0 token, tokens with `name` instead of `names`.
/// Each is INVALID_ARGUMENT naming `fencing_tokens`, for Release and
/// Extend, over gRPC and over Connect JSON; the set held meanwhile is
/// unchanged afterwards (same tokens, same expiries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sets_fencing_tokens_out_of_rule_are_invalid_argument_and_change_nothing() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let taken = (client.acquire(set("", &["ta", "tb"], "h", 0)).await)
        .unwrap()
        .into_inner();
    assert_eq!(taken.status(), proto::AcquireStatus::Acquired, "{taken:?}");
    let before = grants_of(&mut client, &["ta", "tb"]).await;
    assert_eq!(before.len(), 2);
    let t: Vec<u64> = taken.grants.iter().map(|g| g.fencing_token).collect();
    // (what, name, names, tokens)
    let cases: Vec<(&str, &str, Vec<String>, Vec<u64>)> = vec![
        ("one token short", "", names(&["ta", "tb"]), vec![t[0]]),
        (
            "a token too many",
            "",
            names(&["ta", "tb"]),
            vec![t[0], t[1], t[1]],
        ),
        ("a 0 token", "", names(&["ta", "tb"]), vec![t[0], 0]),
        ("tokens with name", "ta", Vec::new(), vec![t[0]]),
    ];
    for (what, name, of, tokens) in &cases {
        let named =
            |message: &str| assert!(message.starts_with("fencing_tokens: "), "{what}: {message}");
        let release = proto::ReleaseRequest {
            name: name.to_string(),
            names: of.clone(),
            holder: "h".into(),
            fencing_tokens: tokens.clone(),
            ..Default::default()
        };
        let status = client.release(release).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        named(status.message());
        let extend = proto::ExtendRequest {
            name: name.to_string(),
            names: of.clone(),
            holder: "h".into(),
            ttl_ms: Some(60_000),
            fencing_tokens: tokens.clone(),
            ..Default::default()
        };
        let status = client.extend(extend).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        named(status.message());
        let as_strings: Vec<String> = tokens.iter().map(u64::to_string).collect();
        for (method, body) in [
            (
                "Release",
                json!({"name": name, "names": of, "holder": "h", "fencingTokens": as_strings}),
            ),
            (
                "Extend",
                json!({"name": name, "names": of, "holder": "h", "ttlMs": "60000", "fencingTokens": as_strings}),
            ),
        ] {
            let answer = call(&server, method, body, &[]).await;
            named(&answer.error(400, "invalid_argument"));
        }
    }
    assert_eq!(
        grants_of(&mut client, &["ta", "tb"]).await,
        before,
        "the set is unchanged"
    );
}

/// The grants of `of` now (Inspect), lock by lock.
async fn grants_of(
    client: &mut proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    of: &[&str],
) -> Vec<proto::Grant> {
    let mut grants = Vec::new();
    for name in of {
        let holders = (client.inspect(inspect(name)).await.unwrap().into_inner()).holders;
        grants.extend(holders.into_iter().map(|h| h.grant.unwrap()));
    }
    grants
}
