//! The lock semantics of Acquire, Release, Extend and Inspect, each pinned
//! against a real Redis through the real gRPC server.

use crate::common;

use std::time::Duration;

use common::wait::wait_until_async;
use common::*;
use proto::{AcquireStatus, ExtendStatus, NotAcquiredReason, ReleaseStatus};
use redis::AsyncCommands;
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::ServiceArgs;

async fn setup() -> (tumbler::dev::RedisServer, TestServer) {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    (redis, server)
}

/// An acquire of a semaphore of 2 with its own lease.
fn semaphore(name: &str, holder: &str, ttl_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        limit: Some(2),
        ttl_ms: Some(ttl_ms),
        ..acquire(name, holder)
    }
}

fn grant(reply: &proto::AcquireResponse) -> proto::Grant {
    reply.grant.clone().expect("a grant")
}

#[tokio::test]
async fn the_same_name_in_two_namespaces_is_two_locks() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    for (namespace, holder) in [("team-a", "a1"), ("team-b", "b1"), ("", "d1")] {
        let reply = client
            .acquire(proto::AcquireRequest {
                namespace: namespace.into(),
                ..acquire("report", holder)
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "{namespace}");
    }
    let busy = client
        .acquire(proto::AcquireRequest {
            namespace: "team-a".into(),
            ..acquire("report", "a2")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.status(), AcquireStatus::NotAcquired);
    // An empty namespace is "default".
    let seen = client
        .inspect(proto::InspectRequest {
            namespace: "default".into(),
            name: "report".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen.holders.len(), 1);
    assert_eq!(seen.holders[0].grant.as_ref().unwrap().holder, "d1");
}

#[tokio::test]
async fn a_mutex_admits_one_holder_and_says_when_it_frees() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let first = client
        .acquire(acquire("m", "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.status(), AcquireStatus::Acquired);
    assert_eq!(first.holders, 1);
    let second = client
        .acquire(acquire("m", "h2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.status(), AcquireStatus::NotAcquired);
    assert_eq!(second.reason(), NotAcquiredReason::Busy);
    assert!(second.grant.is_none());
    assert_eq!(second.holders, 1);
    assert_eq!(second.next_expiry_at_ms, grant(&first).expires_at_ms);
}

#[tokio::test]
async fn semaphore_slots_are_the_smallest_free_and_are_reused() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let take = |holder: &str| proto::AcquireRequest {
        limit: Some(3),
        ..acquire("pool", holder)
    };
    for (holder, slot) in [("h1", 1), ("h2", 2), ("h3", 3)] {
        let reply = client.acquire(take(holder)).await.unwrap().into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        assert_eq!(grant(&reply).slot, slot, "{holder}");
    }
    let full = client.acquire(take("h4")).await.unwrap().into_inner();
    assert_eq!(full.status(), AcquireStatus::NotAcquired);
    assert_eq!(full.holders, 3);

    client.release(release("pool", "h2")).await.unwrap();
    let reply = client.acquire(take("h4")).await.unwrap().into_inner();
    assert_eq!(grant(&reply).slot, 2);
    client.release(release("pool", "h1")).await.unwrap();
    let reply = client.acquire(take("h5")).await.unwrap().into_inner();
    assert_eq!(grant(&reply).slot, 1);

    let seen = client.inspect(inspect("pool")).await.unwrap().into_inner();
    assert_eq!(seen.limit, 3);
    let slots: Vec<(String, u32)> = seen
        .holders
        .iter()
        .map(|h| {
            let g = h.grant.as_ref().unwrap();
            (g.holder.clone(), g.slot)
        })
        .collect();
    assert_eq!(
        slots,
        vec![("h5".into(), 1), ("h4".into(), 2), ("h3".into(), 3)]
    );
}

#[tokio::test]
async fn an_expired_holder_stops_counting_and_every_key_carries_a_ttl() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let short = proto::AcquireRequest {
        ttl_ms: Some(300),
        ..acquire("lease", "h1")
    };
    assert_eq!(
        client.acquire(short).await.unwrap().into_inner().status(),
        AcquireStatus::Acquired
    );
    // While held, every key tumbler wrote (but its own deployment records)
    // carries a TTL: the lock's key expires at most two grace periods
    // (2 × 60 s: at least one, so the reaper can count the expiry, and a
    // second so that most extends need no new TTL) after the lease, the
    // fencing counter after 7 idle days.
    for key in scan_keys(&mut conn, "tumbler:*").await {
        if key == "tumbler:meta" {
            continue;
        }
        let ttl: i64 = conn.pttl(&key).await.unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        let lock_or_index = !key.ends_with(":fence")
            && !key.ends_with(":namespaces")
            && !key.ends_with(":libraries")
            && !key.contains(":m:");
        if lock_or_index {
            assert!(ttl <= 300 + 120_000, "{key} outlives its lease: {ttl} ms");
            assert!(
                ttl > 60_000,
                "{key} may vanish before the reaper sees it: {ttl} ms"
            );
        }
    }
    assert_eq!(
        client
            .acquire(acquire("lease", "h2"))
            .await
            .unwrap()
            .into_inner()
            .status(),
        AcquireStatus::NotAcquired
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    let seen = client.inspect(inspect("lease")).await.unwrap().into_inner();
    assert!(seen.holders.is_empty());
    assert_eq!(
        client
            .acquire(acquire("lease", "h2"))
            .await
            .unwrap()
            .into_inner()
            .status(),
        AcquireStatus::Acquired
    );
}

#[tokio::test]
async fn an_expired_holder_is_purged_by_the_next_script() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let semaphore = |holder: &str, ttl: u64| semaphore("purge", holder, ttl);
    client.acquire(semaphore("short", 200)).await.unwrap();
    client.acquire(semaphore("long", 30_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The long lease keeps the keys alive; the short one is still in them.
    let lock_key = scan_keys(&mut conn, "tumbler:*:l:purge").await;
    assert_eq!(
        grants_in(&mut conn, &lock_key[0]).await,
        vec!["short", "long"]
    );
    // It no longer counts: a third holder gets its slot.
    let reply = client
        .acquire(semaphore("third", 30_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    assert_eq!(grant(&reply).slot, 1);
    assert_eq!(reply.holders, 2);
    let mut members = grants_in(&mut conn, &lock_key[0]).await;
    members.sort();
    assert_eq!(members, vec!["long", "third"]);
}

#[tokio::test]
async fn holder_ids_made_by_the_server_are_time_ordered_uuids() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        let reply = client
            .acquire(acquire(name, ""))
            .await
            .unwrap()
            .into_inner();
        ids.push(grant(&reply).holder);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for id in &ids {
        let parsed = uuid::Uuid::parse_str(id).unwrap();
        assert_eq!(parsed.get_version_num(), 7, "{id}");
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    // The made-up id works like any other for release.
    let released = client
        .release(release("a", &ids[0]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), ReleaseStatus::Released);
}

#[tokio::test]
async fn acquiring_again_returns_the_same_grant_not_a_second_permit() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let request = proto::AcquireRequest {
        limit: Some(2),
        ..acquire("idem", "worker-1")
    };
    let first = client.acquire(request.clone()).await.unwrap().into_inner();
    let again = client.acquire(request).await.unwrap().into_inner();
    assert_eq!(first.status(), AcquireStatus::Acquired);
    assert_eq!(again.status(), AcquireStatus::AlreadyHeld);
    assert_eq!(grant(&first), grant(&again));
    assert_eq!(again.holders, 1);
    let seen = client.inspect(inspect("idem")).await.unwrap().into_inner();
    assert_eq!(seen.holders.len(), 1);
}

#[tokio::test]
async fn fencing_tokens_rise_across_release_expiry_key_deletion_and_data_loss() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let mut tokens = Vec::new();
    let mut take = async |holder: &str, ttl: u64| {
        let reply = client
            .acquire(proto::AcquireRequest {
                ttl_ms: Some(ttl),
                ..acquire("fenced", holder)
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "{holder}");
        grant(&reply).fencing_token
    };

    // Release.
    tokens.push(take("h1", 30_000).await);
    server
        .client()
        .await
        .release(release("fenced", "h1"))
        .await
        .unwrap();
    tokens.push(take("h2", 100).await);
    // Expiry.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokens.push(take("h3", 30_000).await);
    // The lock's keys and the shard's counter deleted.
    let keys = scan_keys(&mut conn, "tumbler:{default:*").await;
    assert!(keys.iter().any(|k| k.ends_with(":fence")), "{keys:?}");
    let _: i64 = conn.del(&keys).await.unwrap();
    tokens.push(take("h4", 30_000).await);
    // Redis lost everything (restart without persistence).
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    tokens.push(take("h5", 30_000).await);

    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[tokio::test]
async fn inspect_returns_kind_metadata_and_remaining_lease() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let reply = client
        .acquire(proto::AcquireRequest {
            kind: "export.daily".into(),
            metadata: [
                ("job".to_string(), "42".to_string()),
                ("host".into(), "w-7".into()),
            ]
            .into(),
            ttl_ms: Some(10_000),
            ..acquire("meta", "h1")
        })
        .await
        .unwrap()
        .into_inner();
    let granted = grant(&reply);
    let seen = client.inspect(inspect("meta")).await.unwrap().into_inner();
    assert_eq!(seen.namespace, "default");
    assert_eq!(seen.limit, 1);
    assert_eq!(seen.waiters, 0);
    let holder = &seen.holders[0];
    assert_eq!(holder.grant.as_ref().unwrap(), &granted);
    assert_eq!(granted.kind, "export.daily");
    assert_eq!(granted.metadata["job"], "42");
    assert_eq!(granted.ttl_ms, 10_000);
    assert_eq!(granted.expires_at_ms - granted.acquired_at_ms, 10_000);
    assert!(holder.remaining_ms > 0 && holder.remaining_ms <= 10_000);
    assert_eq!(holder.remaining_ms, granted.expires_at_ms - seen.now_ms);

    // A lock nobody holds.
    let empty = client
        .inspect(inspect("nobody"))
        .await
        .unwrap()
        .into_inner();
    assert!(empty.holders.is_empty());
    assert_eq!(empty.limit, 0);
}

#[tokio::test]
async fn only_the_holder_with_its_token_can_release() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let token = grant(
        &client
            .acquire(acquire("r", "owner"))
            .await
            .unwrap()
            .into_inner(),
    )
    .fencing_token;
    let status = |r: tonic::Response<proto::ReleaseResponse>| r.into_inner().status();

    assert_eq!(
        status(client.release(release("r", "intruder")).await.unwrap()),
        ReleaseStatus::NotHeld
    );
    let wrong_token = proto::ReleaseRequest {
        fencing_token: Some(token + 1),
        ..release("r", "owner")
    };
    assert_eq!(
        status(client.release(wrong_token).await.unwrap()),
        ReleaseStatus::NotHeld
    );
    let seen = client.inspect(inspect("r")).await.unwrap().into_inner();
    assert_eq!(seen.holders.len(), 1, "a refused release changed nothing");

    let right_token = proto::ReleaseRequest {
        fencing_token: Some(token),
        ..release("r", "owner")
    };
    assert_eq!(
        status(client.release(right_token).await.unwrap()),
        ReleaseStatus::Released
    );
    assert_eq!(
        status(client.release(release("r", "owner")).await.unwrap()),
        ReleaseStatus::NotHeld
    );
}

#[tokio::test]
async fn extend_resets_the_lease_only_for_the_live_holder() {
    let (_redis, server) = setup().await;
    let mut client = server.client().await;
    let first = grant(
        &client
            .acquire(proto::AcquireRequest {
                ttl_ms: Some(1_000),
                ..acquire("x", "owner")
            })
            .await
            .unwrap()
            .into_inner(),
    );
    let extend = |holder: &str, ttl: Option<u64>, token: Option<u64>| proto::ExtendRequest {
        name: "x".into(),
        holder: holder.into(),
        ttl_ms: ttl,
        fencing_token: token,
        ..Default::default()
    };

    let refused = client
        .extend(extend("intruder", Some(60_000), None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.status(), ExtendStatus::NotHeld);
    let refused = client
        .extend(extend("owner", Some(60_000), Some(first.fencing_token + 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.status(), ExtendStatus::NotHeld);

    let extended = client
        .extend(extend("owner", Some(60_000), Some(first.fencing_token)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), ExtendStatus::Extended);
    let renewed = extended.grant.unwrap();
    assert_eq!(renewed.fencing_token, first.fencing_token, "same grant");
    assert_eq!(renewed.slot, first.slot);
    assert_eq!(renewed.ttl_ms, 60_000);
    assert!(renewed.expires_at_ms >= first.acquired_at_ms + 60_000);
    let seen = client.inspect(inspect("x")).await.unwrap().into_inner();
    assert!(seen.holders[0].remaining_ms > 50_000);

    // Shortening works too, and no ttl means the grant's own ttl.
    let short = client
        .extend(extend("owner", Some(150), None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(short.grant.unwrap().ttl_ms, 150);
    let again = client
        .extend(extend("owner", None, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.status(), ExtendStatus::Extended);
    assert_eq!(again.grant.unwrap().ttl_ms, 150);

    // Once the lease has passed, the holder learns it lost the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lost = client
        .extend(extend("owner", Some(60_000), None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(lost.status(), ExtendStatus::NotHeld);
    assert!(lost.grant.is_none());
    let seen = client.inspect(inspect("x")).await.unwrap().into_inner();
    assert!(seen.holders.is_empty());
}

#[tokio::test]
async fn no_key_of_the_lock_remains_after_the_last_release() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    for holder in ["h1", "h2", "h3"] {
        client
            .acquire(proto::AcquireRequest {
                limit: Some(3),
                metadata: [("who".to_string(), holder.to_string())].into(),
                ..acquire("tidy", holder)
            })
            .await
            .unwrap();
    }
    let held = scan_keys(&mut conn, "tumbler:*").await;
    let per_lock: Vec<&String> = held.iter().filter(|k| k.contains(":tidy")).collect();
    assert_eq!(per_lock.len(), 1, "one key per held lock: {held:?}");
    for holder in ["h1", "h2", "h3"] {
        client.release(release("tidy", holder)).await.unwrap();
    }
    let left = scan_keys(&mut conn, "tumbler:*").await;
    // What remains belongs to the deployment (layout record, namespace
    // registry, function libraries in use) or the shard (fencing counter,
    // per-minute metrics), never to the lock; each has its own TTL but the
    // layout record.
    let lock_keys: Vec<&String> = left
        .iter()
        .filter(|k| {
            *k != "tumbler:meta"
                && *k != "tumbler:namespaces"
                && *k != "tumbler:libraries"
                && !k.ends_with(":fence")
                && !k.contains(":m:")
        })
        .collect();
    assert!(lock_keys.is_empty(), "left after release: {left:?}");
}

#[tokio::test]
async fn a_server_refuses_data_written_with_another_shard_count() {
    let redis = start_redis();
    let first = TestServer::new().redis(&redis.url()).start().await;
    let mut other = service_args();
    other.shards = 16;
    let second = TestServer::new()
        .redis(&redis.url())
        .args(other)
        .spawn()
        .await;
    let outcome = second.finished().await;
    let message = format!("{:#}", outcome.expect_err("must refuse"));
    assert!(message.contains("shards"), "{message}");
    // The first one is unaffected.
    let mut client = first.client().await;
    let reply = client
        .acquire(acquire("still", "h"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

#[tokio::test]
async fn reflection_lists_the_lock_service() {
    use tokio_stream::StreamExt;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let (_redis, server) = setup().await;
    let channel = tonic::transport::Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reflection reply");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"tumbler.v1.LockService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
}

/// A semaphore's earliest-expiry bound (`e` in the lock hash) goes stale
/// when its earliest holder releases; a lease that lapses later must still
/// stop counting and hand its permit to a waiter, at its own expiry.
#[tokio::test]
async fn a_semaphore_hands_over_at_a_later_expiry_after_its_earliest_holder_released() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let semaphore = |holder: &str, ttl: u64| semaphore("stale", holder, ttl);
    let early = client.acquire(semaphore("early", 300)).await.unwrap();
    assert_eq!(early.into_inner().status(), AcquireStatus::Acquired);
    let lapsing = grant(
        &client
            .acquire(semaphore("lapsing", 1_200))
            .await
            .unwrap()
            .into_inner(),
    );
    // The earliest lease leaves by release; a long one takes its permit.
    client.release(release("stale", "early")).await.unwrap();
    let long = client.acquire(semaphore("long", 30_000)).await.unwrap();
    assert_eq!(long.into_inner().status(), AcquireStatus::Acquired);

    // A waiter queues behind the full semaphore; nobody releases again.
    let mut waiter_client = server.client().await;
    let waiter = tokio::spawn(async move {
        waiter_client
            .acquire(proto::AcquireRequest {
                wait_ms: 10_000,
                ..semaphore("waiter", 30_000)
            })
            .await
    });
    // Past the released lease's end (the stale bound), the busy answer
    // names the lapsing lease's true expiry.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let busy = client
        .acquire(semaphore("prober", 30_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.status(), AcquireStatus::NotAcquired);
    assert_eq!(busy.next_expiry_at_ms, lapsing.expires_at_ms);

    // The waiter gets the lapsed permit, its slot, no sooner than its expiry.
    let granted = waiter.await.unwrap().unwrap().into_inner();
    assert_eq!(granted.status(), AcquireStatus::Acquired);
    let taken = grant(&granted);
    assert_eq!(taken.slot, lapsing.slot);
    assert!(
        taken.acquired_at_ms >= lapsing.expires_at_ms,
        "{taken:?} vs {lapsing:?}"
    );
    assert_eq!(granted.holders, 2);

    // The queue is empty again (its key and the waiters' fields gone, no
    // arrival counter); the next waiter still queues and is served in order.
    let lock_key = scan_keys(&mut conn, "tumbler:*:l:stale").await;
    assert!(scan_keys(&mut conn, "tumbler:*:q:stale").await.is_empty());
    let fields: Vec<String> = conn.hkeys(&lock_key[0]).await.unwrap();
    assert!(!fields.iter().any(|f| f.starts_with("w:")), "{fields:?}");
    assert_eq!(lock_header(&mut conn, &lock_key[0]).await[4], 0, "arrivals");
    let mut next_client = server.client().await;
    let next = tokio::spawn(async move {
        next_client
            .acquire(proto::AcquireRequest {
                wait_ms: 10_000,
                ..semaphore("next", 30_000)
            })
            .await
    });
    wait_until_async(
        "one waiter queued on stale",
        Duration::from_secs(10),
        || {
            let mut client = client.clone();
            async move {
                let seen = client.inspect(inspect("stale")).await.unwrap();
                seen.into_inner().waiters == 1
            }
        },
    )
    .await;
    let refused = client
        .acquire(semaphore("barger", 30_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.status(), AcquireStatus::NotAcquired);
    client.release(release("stale", "long")).await.unwrap();
    let served = next.await.unwrap().unwrap().into_inner();
    assert_eq!(served.status(), AcquireStatus::Acquired);
}

/// Redis can lose tumbler's function library (FUNCTION FLUSH, a restart
/// without persistence, a failover to a node that never had it): the next
/// call loads it again and is answered as if nothing happened.
#[tokio::test]
async fn a_redis_that_lost_the_function_library_gets_it_back_on_the_next_call() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let held = client.acquire(acquire("reload", "h1")).await.unwrap();
    assert_eq!(held.into_inner().status(), AcquireStatus::Acquired);
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(libraries.is_empty());
    let reply = client.release(release("reload", "h1")).await.unwrap();
    assert_eq!(reply.into_inner().status(), ReleaseStatus::Released);
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(libraries.len(), 1, "the library was loaded again");
}

/// A refusal for another limit: FAILED_PRECONDITION naming both limits.
fn assert_limit_refused(status: &tonic::Status, lock_limit: u32, requested: u32) {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let message = status.message();
    assert!(
        message.contains(&format!("limit {lock_limit}"))
            && message.contains(&format!("limit {requested}")),
        "{message}"
    );
}

#[tokio::test]
async fn a_locks_limit_is_fixed_while_anyone_holds_or_waits() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let with_limit = |name: &str, holder: &str, limit: u32| proto::AcquireRequest {
        limit: Some(limit),
        ..acquire(name, holder)
    };

    // A mutex: a second holder asking for limit 2 is refused, not admitted.
    client.acquire(acquire("mutex", "a")).await.unwrap();
    let lock_key = scan_keys(&mut conn, "tumbler:*:l:mutex").await.remove(0);
    let before: Vec<(String, String)> = conn.hgetall(&lock_key).await.unwrap();
    let refused = client
        .acquire(with_limit("mutex", "b", 2))
        .await
        .expect_err("another limit");
    assert_limit_refused(&refused, 1, 2);
    let after: Vec<(String, String)> = conn.hgetall(&lock_key).await.unwrap();
    assert_eq!(before, after, "nothing changed");

    // A semaphore of 3: limit 1 and limit 4 are refused, limit 3 admitted.
    client.acquire(with_limit("pool", "a", 3)).await.unwrap();
    for other in [1, 4] {
        let refused = client
            .acquire(with_limit("pool", "x", other))
            .await
            .expect_err("another limit");
        assert_limit_refused(&refused, 3, other);
    }
    let admitted = client
        .acquire(with_limit("pool", "b", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admitted.status(), AcquireStatus::Acquired);
    assert_eq!(admitted.holders, 2);

    // Waiting: a waiter of another limit is refused at once, and the queue
    // keeps only the one that matches.
    let mut waiting = server.client().await;
    let waiter = tokio::spawn(async move {
        waiting
            .acquire(proto::AcquireRequest {
                wait_ms: 30_000,
                ..acquire("mutex", "w1")
            })
            .await
    });
    until_waiters(&mut client, "mutex", 1).await;
    let refused = client
        .acquire(proto::AcquireRequest {
            wait_ms: 30_000,
            ..with_limit("mutex", "w2", 5)
        })
        .await
        .expect_err("another limit");
    assert_limit_refused(&refused, 1, 5);
    // Nobody holds the lock now, but "w1" waits: the limit stays 1.
    client.release(release("mutex", "a")).await.unwrap();
    let granted = waiter.await.unwrap().unwrap().into_inner();
    assert_eq!(granted.status(), AcquireStatus::Acquired);
    client.release(release("mutex", "w1")).await.unwrap();

    // Once the last holder left and nobody waits, a new limit applies.
    let fresh = client
        .acquire(with_limit("mutex", "c", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fresh.status(), AcquireStatus::Acquired);
}

/// The probe that found one mutex granted to two holders: Redis restarts
/// empty under a running replica, and a replica with another shard count
/// claims it first. The old replica must not serve that Redis again: its
/// new connections meet the other layout's record (refused: UNAVAILABLE)
/// and its health check turns NOT_SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_another_layout_that_claims_an_emptied_redis_stops_the_old_ones() {
    let mut redis = start_redis();
    let old = TestServer::new()
        .redis(&redis.url())
        .args(ServiceArgs {
            health_interval_ms: 2_000,
            ..service_args()
        })
        .start()
        .await;
    let mut old_client = old.client().await;
    let reply = old_client.acquire(acquire("m", "old-1")).await.unwrap();
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);

    // Redis loses everything; a 16-shard replica claims it at once.
    redis.restart().unwrap();
    let mut conn = redis_conn(&redis.url()).await;
    let _: i64 = redis::cmd("HSETNX")
        .arg("tumbler:meta")
        .arg("layout")
        .arg("v4/16 shards")
        .query_async(&mut conn)
        .await
        .unwrap();
    let new = TestServer::new()
        .redis(&redis.url())
        .args(ServiceArgs {
            shards: 16,
            ..service_args()
        })
        .start()
        .await;
    let mut new_client = new.client().await;
    let reply = new_client.acquire(acquire("m", "new-1")).await.unwrap();
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);

    // The old replica grants nothing on it: neither "m" nor any other lock.
    for name in ["m", "a", "b", "c", "d"] {
        let refused = old_client
            .acquire(acquire(name, "old-2"))
            .await
            .expect_err("the old replica must not serve another layout's Redis");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    }
    old.wait_for_health(ServingStatus::NotServing).await;
    let seen = new_client.inspect(inspect("m")).await.unwrap().into_inner();
    assert_eq!(seen.holders.len(), 1);
    for name in ["a", "b", "c", "d"] {
        let seen = new_client
            .inspect(inspect(name))
            .await
            .unwrap()
            .into_inner();
        assert!(seen.holders.is_empty(), "{name}: {seen:?}");
    }
}

/// The other order: the running replica claims the emptied Redis again
/// first (at its next health tick), and a replica with another shard count
/// refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_redis_is_claimed_again_by_the_running_replicas() {
    let mut redis = start_redis();
    let old = TestServer::new().redis(&redis.url()).start().await;
    redis.restart().unwrap();
    // Within a health tick (100 ms in the tests) the record is back.
    let mut conn = redis_conn(&redis.url()).await;
    let mut record = None;
    for _ in 0..100 {
        record = redis::cmd("HGET")
            .arg("tumbler:meta")
            .arg("layout")
            .query_async::<Option<String>>(&mut conn)
            .await
            .unwrap();
        if record.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(record.as_deref(), Some("v4/32 shards"));
    let second = TestServer::new()
        .redis(&redis.url())
        .args(ServiceArgs {
            shards: 16,
            ..service_args()
        })
        .spawn()
        .await;
    let message = format!("{:#}", second.finished().await.expect_err("must refuse"));
    assert!(message.contains("v4/32 shards"), "{message}");
    let mut client = old.client().await;
    let reply = client.acquire(acquire("still", "h")).await.unwrap();
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
}

/// A held lock stays one small, compactly encoded hash whoever holds it:
/// the holder's id (here one the server makes, 36 characters) is the
/// grant's field name, so no stored value passes Redis' 64-byte limit for
/// compact hashes. A queue's records live in the lock's hash (layout v4,
/// decision 0090): one field per waiter, gone when it leaves.
#[tokio::test]
async fn a_held_lock_stays_a_compact_hash_with_long_holders_and_long_queues() {
    let (redis, server) = setup().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let probe = conn.clone();
    let encoding = |key: String| {
        let mut conn = probe.clone();
        async move {
            redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&key)
                .query_async::<String>(&mut conn)
                .await
                .unwrap()
        }
    };

    let made = client
        .acquire(acquire("compact", ""))
        .await
        .unwrap()
        .into_inner();
    let grant = made.grant.unwrap();
    let holder = grant.holder.clone();
    assert_eq!(holder.len(), 36, "{holder:?}");
    let lock_key = scan_keys(&mut conn, "tumbler:*:l:compact").await.remove(0);
    let fields: Vec<String> = conn.hkeys(&lock_key).await.unwrap();
    assert_eq!(fields.len(), 2, "header and one grant: {fields:?}");
    assert!(fields.contains(&format!("h:{holder}")), "{fields:?}");
    assert_eq!(encoding(lock_key.clone()).await, "listpack");
    // What can be derived is left out: the grant's instant (its token's
    // milliseconds) and the keys' expiry (the lease's end plus twice the
    // 60 s grace), so a 36-character holder's lock fits Redis' 128-byte
    // allocation for its listpack.
    let record: String = conn.hget(&lock_key, format!("h:{holder}")).await.unwrap();
    let parts: Vec<&str> = record.split('|').collect();
    assert_eq!(parts[2], grant.fencing_token.to_string(), "{record}");
    assert_eq!(
        parts[3], "",
        "acquired is the token's milliseconds: {record}"
    );
    let parsed = tumbler_engine::parse_grant(&holder, &record).unwrap();
    assert_eq!(parsed.acquired_at_ms as u64, grant.fencing_token / 1000);
    let header = lock_header(&mut conn, &lock_key).await;
    let key_ttl: i64 = conn.pttl(&lock_key).await.unwrap();
    let now_ms = i64::try_from(grant.fencing_token / 1000).unwrap();
    let expected = header[5] - now_ms;
    assert!(
        (expected - 1_000..=expected + 2).contains(&key_ttl),
        "the key expires when its header says: PTTL {key_ttl}, header {header:?}"
    );
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&lock_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(bytes <= 200, "a held mutex's key takes {bytes} bytes");

    // 200 waiters (more than a compact hash may hold entries).
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..200 {
        let mut client = server.client().await;
        waiting.spawn(async move {
            client
                .acquire(proto::AcquireRequest {
                    wait_ms: 30_000,
                    ..acquire("compact", &format!("waiter-{i:03}"))
                })
                .await
        });
    }
    wait_until_async(
        "200 waiters queued on compact",
        Duration::from_secs(30),
        || {
            let mut client = client.clone();
            async move { inspect_waiters(&mut client, "compact").await >= 200 }
        },
    )
    .await;
    let fields: Vec<String> = conn.hkeys(&lock_key).await.unwrap();
    let waiters = fields.iter().filter(|f| f.starts_with("w:")).count();
    assert_eq!((fields.len(), waiters), (202, 200), "{fields:?}");
    waiting.abort_all();
    let left = || async { conn.clone().hlen::<_, usize>(&lock_key).await.unwrap() == 2 };
    wait_until_async("the waiters left", Duration::from_secs(30), left).await;
}

async fn inspect_waiters(
    client: &mut tumbler::proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    name: &str,
) -> u32 {
    client
        .inspect(proto::InspectRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .waiters
}
