//! Multi-locks (decision 0076, invariant 15): one Acquire names several
//! locks and gets all of them or none; a waiting set holds nothing while
//! it waits, so callers asking overlapping sets in any order never
//! deadlock; Release and Extend act on the set; bad input names its field.
//! A set's Release and Extend pinned to its tokens: `multi_tokens.rs`.

use crate::{common, read_write};

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, ExtendStatus, NotAcquiredReason, ReleaseStatus};
use read_write::{ask, granted, inspected, let_go};
use tonic::Code;
use tonic::transport::Channel;

/// A multi-lock acquire of `names` for `holder`.
pub(crate) fn set(names: &[&str], holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        ..acquire("", holder)
    }
}

/// The same request, waiting up to `ms` in the server.
fn waiting(request: proto::AcquireRequest, ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait_ms: ms,
        ..request
    }
}

pub(crate) fn release_set(names: &[&str], holder: &str) -> proto::ReleaseRequest {
    proto::ReleaseRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        ..release("", holder)
    }
}

pub(crate) fn extend_set(names: &[&str], holder: &str, ttl_ms: u64) -> proto::ExtendRequest {
    proto::ExtendRequest {
        names: names.iter().map(|n| n.to_string()).collect(),
        holder: holder.into(),
        ttl_ms: Some(ttl_ms),
        ..Default::default()
    }
}

/// Who holds `name` now (Inspect), in grant order.
pub(crate) async fn holders_of(client: &mut LockServiceClient<Channel>, name: &str) -> Vec<String> {
    (inspected(client, name).await.holders.into_iter())
        .map(|h| h.grant.unwrap().holder)
        .collect()
}

/// How many of `names` `holder` holds now.
async fn held_by(client: &mut LockServiceClient<Channel>, names: &[&str], holder: &str) -> usize {
    let mut held = 0;
    for name in names {
        if holders_of(client, name).await.iter().any(|h| h == holder) {
            held += 1;
        }
    }
    held
}

/// An Acquire refused as INVALID_ARGUMENT whose message names `field`.
async fn refused(
    client: &mut LockServiceClient<Channel>,
    request: proto::AcquireRequest,
    field: &str,
) {
    let err = client.acquire(request).await.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with(&format!("{field}: ")),
        "{field}: {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_granted_whole_with_a_token_each_and_released_together() {
    let server = TestServer::new().shards(4).start().await;
    let mut client = server.client().await;
    let names = ["acct-1", "acct-2", "acct-3"];
    let reply = ask(&mut client, set(&names, "transfer")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let named: Vec<&str> = reply.grants.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(named, names, "one grant per name, in the request's order");
    assert_eq!(reply.grant.as_ref(), reply.grants.first());
    for grant in &reply.grants {
        assert_eq!(holders_of(&mut client, &grant.name).await, ["transfer"]);
        assert_eq!(grant.ttl_ms, 30_000);
    }
    // Asked again: the same grants.
    let again = ask(&mut client, set(&names, "transfer")).await;
    assert_eq!(again.status(), AcquireStatus::AlreadyHeld, "{again:?}");
    assert_eq!(again.grants, reply.grants);

    let released = client
        .release(release_set(&names, "transfer"))
        .await
        .unwrap();
    assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
    assert_eq!(held_by(&mut client, &names, "transfer").await, 0);
    let again = client
        .release(release_set(&names, "transfer"))
        .await
        .unwrap();
    assert_eq!(again.into_inner().status(), ReleaseStatus::NotHeld);
    // Nothing is left behind in Redis.
    let mut redis = redis_conn(server.redis_url()).await;
    assert!(scan_keys(&mut redis, "tumbler:*:l:*").await.is_empty());
    // Each lock's token comes from its shard's counter: taken again, every
    // lock's token is above its last one.
    let next = ask(&mut client, set(&names, "transfer")).await;
    for (old, new) in reply.grants.iter().zip(&next.grants) {
        assert!(new.fencing_token > old.fencing_token, "{old:?} {new:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_refuses_the_whole_set_and_takes_nothing() {
    let server = TestServer::new().shards(4).start().await;
    let mut client = server.client().await;
    granted(&mut client, acquire("b", "other")).await;
    let reply = ask(&mut client, set(&["a", "b", "c"], "me")).await;
    assert_eq!(reply.status(), AcquireStatus::NotAcquired, "{reply:?}");
    assert_eq!(reply.reason(), NotAcquiredReason::Busy);
    assert_eq!(reply.holders, 1, "the busy lock's holders");
    assert!(reply.next_expiry_at_ms > 0);
    assert!(reply.grants.is_empty());
    assert_eq!(held_by(&mut client, &["a", "b", "c"], "me").await, 0);
    let mut redis = redis_conn(server.redis_url()).await;
    let keys = scan_keys(&mut redis, "tumbler:*").await;
    assert!(
        !keys
            .iter()
            .any(|k| k.ends_with(":l:a") || k.ends_with(":l:c") || k.contains(":q:")),
        "a refused set leaves no key: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_holds_nothing_and_is_granted_when_the_busy_lock_is_released() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, acquire("b", "other")).await;
    let mut waiter = client.clone();
    let task = tokio::spawn(async move {
        waiter
            .acquire(waiting(set(&["a", "b", "c"], "me"), 10_000))
            .await
    });
    // Its wake-up place in b's queue: it waits, holding neither a nor c.
    until_waiters(&mut client, "b", 1).await;
    assert_eq!(held_by(&mut client, &["a", "b", "c"], "me").await, 0);
    // A single caller takes a meanwhile (the set does not block it).
    granted(&mut client, acquire("a", "single")).await;
    let_go(&mut client, "a", "single").await;
    let_go(&mut client, "b", "other").await;
    let reply = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    assert_eq!(held_by(&mut client, &["a", "b", "c"], "me").await, 3);
    assert_eq!(
        inspected(&mut client, "b").await.waiters,
        0,
        "its place left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_is_granted_when_the_busy_lease_ends() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let short = proto::AcquireRequest {
        ttl_ms: Some(300),
        ..acquire("y", "lapsing")
    };
    granted(&mut client, short).await;
    let reply = ask(&mut client, waiting(set(&["x", "y"], "me"), 10_000)).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_and_cancel_leave_nothing_held_or_queued() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, acquire("b", "other")).await;
    // Timed out.
    let reply = ask(&mut client, waiting(set(&["a", "b", "c"], "me"), 300)).await;
    assert_eq!(reply.reason(), NotAcquiredReason::Timeout, "{reply:?}");
    until_waiters(&mut client, "b", 0).await;
    assert_eq!(held_by(&mut client, &["a", "b", "c"], "me").await, 0);
    // Cancelled: the RPC goes away while it waits.
    let mut waiter = client.clone();
    let task = tokio::spawn(async move {
        waiter
            .acquire(waiting(set(&["a", "b", "c"], "me"), 10_000))
            .await
    });
    until_waiters(&mut client, "b", 1).await;
    task.abort();
    until_waiters(&mut client, "b", 0).await;
    let_go(&mut client, "b", "other").await;
    // Nothing is granted to the caller that went away.
    assert_eq!(held_by(&mut client, &["a", "b", "c"], "me").await, 0);
    let mut redis = redis_conn(server.redis_url()).await;
    assert!(scan_keys(&mut redis, "tumbler:*:l:*").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_order_callers_never_deadlock() {
    let server = TestServer::new().shards(4).start().await;
    let client = server.client().await;
    let rounds = 25;
    let mut tasks = Vec::new();
    for (holder, names) in [("ab", ["a", "b"]), ("ba", ["b", "a"])] {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let reply = ask(&mut client, waiting(set(&names, holder), 10_000)).await;
                assert_eq!(
                    reply.status(),
                    AcquireStatus::Acquired,
                    "{holder}: {reply:?}"
                );
                let released = client.release(release_set(&names, holder)).await.unwrap();
                assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("both callers make progress")
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_in_random_orders_are_all_or_nothing() {
    let server = TestServer::new().shards(4).start().await;
    let client = server.client().await;
    let all = ["n0", "n1", "n2", "n3", "n4"];
    let mut tasks = Vec::new();
    for caller in 0..6u64 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let holder = format!("caller-{caller}");
            let mut seed = caller * 0x9E37_79B9 + 1;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut grants = 0;
            for _ in 0..15 {
                // 2 or 3 distinct names, in a random order.
                let mut names: Vec<&str> = all.to_vec();
                for i in (1..names.len()).rev() {
                    names.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                names.truncate(2 + (next() % 2) as usize);
                let wait = if next() % 3 == 0 { 0 } else { 2_000 };
                let reply = ask(&mut client, waiting(set(&names, &holder), wait)).await;
                // As Inspect sees it right after: the whole set or none.
                let held = held_by(&mut client, &names, &holder).await;
                if reply.status() == AcquireStatus::Acquired {
                    grants += 1;
                    assert_eq!(held, names.len(), "{holder} {names:?}");
                    for name in &names {
                        assert_eq!(holders_of(&mut client, name).await, [holder.as_str()]);
                    }
                    let released = client.release(release_set(&names, &holder)).await.unwrap();
                    assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
                } else {
                    assert_eq!(
                        held, 0,
                        "{holder} refused {names:?} yet holds part: {reply:?}"
                    );
                }
            }
            grants
        }));
    }
    let mut granted_sets = 0;
    for task in tasks {
        granted_sets += tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("no caller stuck")
            .unwrap();
    }
    assert!(granted_sets > 0);
    for name in all {
        let state = inspected(&mut client.clone(), name).await;
        assert_eq!(
            (state.holders.len(), state.waiters),
            (0, 0),
            "{name}: {state:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_renews_the_set_and_a_broken_set_is_let_go() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let names = ["e1", "e2", "e3"];
    let reply = ask(&mut client, set(&names, "me")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let extended = client
        .extend(extend_set(&names, "me", 60_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), ExtendStatus::Extended);
    let earliest = extended.grant.unwrap().expires_at_ms;
    for name in names {
        let state = inspected(&mut client, name).await;
        let grant = state.holders[0].grant.clone().unwrap();
        assert!(grant.expires_at_ms >= earliest, "{grant:?}");
        assert!(grant.expires_at_ms > reply.grant.as_ref().unwrap().expires_at_ms);
    }
    // One lock of the set let go on its own: the set is broken; Extend
    // answers NOT_HELD and lets the rest go too.
    let_go(&mut client, "e2", "me").await;
    let extended = client
        .extend(extend_set(&names, "me", 60_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), ExtendStatus::NotHeld);
    assert_eq!(held_by(&mut client, &names, "me").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_a_partly_held_set_releases_the_rest_and_answers_not_held() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let names = ["r1", "r2"];
    assert_eq!(
        ask(&mut client, set(&names, "me")).await.status(),
        AcquireStatus::Acquired
    );
    let_go(&mut client, "r1", "me").await;
    let released = client.release(release_set(&names, "me")).await.unwrap();
    assert_eq!(released.into_inner().status(), ReleaseStatus::NotHeld);
    assert_eq!(held_by(&mut client, &names, "me").await, 0);
}

/// Function calls (`FCALL`, `FCALL_RO`) Redis ran since `before`.
fn function_calls(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
) -> u64 {
    ["fcall", "fcall_ro"]
        .iter()
        .map(|name| {
            after.get(*name).copied().unwrap_or(0) - before.get(*name).copied().unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_on_one_server_is_one_call_to_take_extend_and_release() {
    let (_redis, _server, mut client, mut conn) = counting_server().await;
    // The namespace's registry entry is written once, at its first call.
    let warm = ["w1", "w2"];
    ask(&mut client, set(&warm, "h")).await;
    client.release(release_set(&warm, "h")).await.unwrap();
    let names = ["c1", "c2", "c3"];
    let before = command_calls(&mut conn).await;
    assert_eq!(
        ask(&mut client, set(&names, "h")).await.status(),
        AcquireStatus::Acquired
    );
    let taken = command_calls(&mut conn).await;
    let extended = client
        .extend(extend_set(&names, "h", 60_000))
        .await
        .unwrap();
    assert_eq!(extended.into_inner().status(), ExtendStatus::Extended);
    let renewed = command_calls(&mut conn).await;
    let released = client.release(release_set(&names, "h")).await.unwrap();
    assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
    let after = command_calls(&mut conn).await;
    assert_eq!(
        [
            function_calls(&before, &taken),
            function_calls(&taken, &renewed),
            function_calls(&renewed, &after),
        ],
        [1, 1, 1],
        "acquire, extend, release of a set of three"
    );
    assert_eq!(held_by(&mut client, &names, "h").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rule_of_a_multi_lock_names_its_field() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let both = proto::AcquireRequest {
        name: "a".into(),
        ..set(&["b", "c"], "me")
    };
    refused(&mut client, both, "name").await;
    refused(&mut client, set(&["only"], "me"), "names").await;
    let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    refused(&mut client, set(&many, "me"), "names").await;
    refused(&mut client, set(&["a", "b", "a"], "me"), "names[2]").await;
    refused(&mut client, set(&["a", "b", ""], "me"), "names[2]").await;
    refused(&mut client, set(&["a", "b\u{1}"], "me"), "names[1]").await;
    let read = proto::AcquireRequest {
        mode: proto::LockMode::Read as i32,
        ..set(&["a", "b"], "me")
    };
    refused(&mut client, read, "mode").await;
    let weighted = proto::AcquireRequest {
        limit: Some(3),
        permits: Some(2),
        ..set(&["a", "b"], "me")
    };
    refused(&mut client, weighted, "permits").await;
    let pinned = proto::ReleaseRequest {
        fencing_token: Some(7),
        ..release_set(&["a", "b"], "me")
    };
    let err = client.release(pinned).await.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("fencing_token: "), "{err:?}");
    let err = client
        .extend(extend_set(&["a", "a"], "me", 1_000))
        .await
        .expect_err("refused");
    assert!(err.message().starts_with("names[1]: "), "{err:?}");
    // Nothing of any refused request reached Redis.
    let mut redis = redis_conn(server.redis_url()).await;
    assert!(scan_keys(&mut redis, "tumbler:*:l:*").await.is_empty());
}
