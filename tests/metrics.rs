//! The Metrics RPC: per-minute counters per kind, recorded by the scripts
//! at the point of each operation, so two replicas' counts meet in Redis.

mod common;

use std::time::Duration;

use common::*;
use proto::{AcquireStatus, NotAcquiredReason};
use tonic_health::pb::health_check_response::ServingStatus;

fn kinded(name: &str, holder: &str, kind: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        kind: kind.into(),
        ..acquire(name, holder)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_counts_sum_per_kind_and_minute() {
    let redis = start_redis();
    let here = TestServer::start(&redis.url()).await;
    let mut a = here.client().await;
    // The second replica is its own process.
    let other = TumblerProcess::start(&redis.url(), &[]).await;
    let mut b = other.client().await;

    // Replica A: 3 email grants, 2 released, 1 extended, 1 denied.
    for i in 0..3 {
        a.acquire(kinded(&format!("mail-{i}"), "a", "email"))
            .await
            .unwrap();
    }
    a.release(release("mail-0", "a")).await.unwrap();
    a.release(release("mail-1", "a")).await.unwrap();
    a.extend(proto::ExtendRequest {
        name: "mail-2".into(),
        holder: "a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let denied = a
        .acquire(kinded("mail-2", "someone", "email"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(denied.reason(), NotAcquiredReason::Busy);

    // Replica B: 2 email grants, 1 report grant, 1 report wait that times out.
    for i in 3..5 {
        b.acquire(kinded(&format!("mail-{i}"), "b", "email"))
            .await
            .unwrap();
    }
    b.acquire(kinded("monthly", "b", "report")).await.unwrap();
    let timed_out = b
        .acquire(proto::AcquireRequest {
            wait_ms: 200,
            ..kinded("monthly", "late", "report")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(timed_out.reason(), NotAcquiredReason::Timeout);

    // An email lease that expires, purged by the next grant on its lock.
    b.acquire(proto::AcquireRequest {
        limit: Some(2),
        ttl_ms: Some(100),
        ..kinded("burst", "short", "email")
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reply = a
        .acquire(proto::AcquireRequest {
            limit: Some(2),
            ..kinded("burst", "next", "email")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);

    // Each replica adds its counts to Redis every second (the one asked
    // first writes its own): wait for the other replica's.
    let mut report = a
        .metrics(proto::MetricsRequest::default())
        .await
        .unwrap()
        .into_inner();
    for _ in 0..40 {
        let acquired = |r: &proto::MetricsResponse| r.overall.as_ref().map_or(0, |o| o.acquired);
        // Seven email grants and one report.
        if acquired(&report) >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = a
            .metrics(proto::MetricsRequest::default())
            .await
            .unwrap()
            .into_inner();
    }
    let total = |kind: &str| {
        report
            .totals
            .iter()
            .find(|row| row.kind == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} totals in {report:?}"))
    };
    let email = total("email");
    assert_eq!(email.acquired, 3 + 2 + 2, "{email:?}");
    assert_eq!(email.released, 2);
    assert_eq!(email.extended, 1);
    assert_eq!(email.denied, 1);
    assert_eq!(email.expired, 1);
    let reports = total("report");
    assert_eq!((reports.acquired, reports.timed_out), (1, 1), "{reports:?}");
    let overall = report.overall.clone().unwrap();
    assert_eq!(overall.kind, "*");
    assert_eq!(overall.acquired, email.acquired + reports.acquired);

    // Minute rows add up to the totals.
    let summed: u64 = report
        .minutes
        .iter()
        .filter(|row| row.kind == "email")
        .map(|row| row.acquired)
        .sum();
    assert_eq!(summed, email.acquired);
    assert!(report.minutes.iter().all(|row| row.minute_ms % 60_000 == 0));

    // A kind filter, and the same answer from the other replica.
    let only = b
        .metrics(proto::MetricsRequest {
            kind: "report".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(only.totals.len(), 1);
    assert_eq!(only.totals[0].acquired, 1);

    // The counters carry a retention TTL.
    let mut conn = redis_conn(&redis.url()).await;
    let keys = scan_keys(&mut conn, "tumbler:{default:*}:m:*").await;
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 24 * 3600 * 1000, "{key}: {ttl}");
    }
    drop(other);
}

#[tokio::test]
async fn redis_errors_are_counted_once_redis_is_back() {
    let mut redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
    let mut client = server.client().await;
    redis.kill();
    for i in 0..3 {
        let err = client
            .acquire(kinded(&format!("x{i}"), "h", "flaky"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
    }
    redis.restart().unwrap();
    server.wait_for_health(ServingStatus::Serving).await;
    let mut errors = 0;
    for _ in 0..100 {
        let report = client
            .metrics(proto::MetricsRequest {
                kind: "flaky".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        errors = report.totals.first().map_or(0, |row| row.errors);
        if errors == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(errors, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_past_the_cap_of_one_shard_minute_are_counted_as_other() {
    // The scripts keep at most this many kind|event fields per shard-minute.
    const CAP: usize = 512;
    const KINDS: usize = CAP + 8;
    let redis = start_redis();
    let server = TestServer::start_with_shards(&redis.url(), 1).await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    // The cap is per minute: a run that crosses a minute boundary is
    // repeated in a fresh namespace.
    for attempt in 0..3 {
        let namespace = format!("cap-{attempt}");
        let minute = |conn: &mut redis::aio::MultiplexedConnection| {
            let mut conn = conn.clone();
            async move {
                let (secs, _): (i64, i64) =
                    redis::cmd("TIME").query_async(&mut conn).await.unwrap();
                secs / 60
            }
        };
        let started = minute(&mut conn).await;
        for i in 0..KINDS {
            let reply = client
                .acquire(proto::AcquireRequest {
                    namespace: namespace.clone(),
                    ..kinded(&format!("lock-{i}"), "h", &format!("k{i}"))
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired);
        }
        if minute(&mut conn).await != started {
            continue;
        }
        let metrics = client
            .metrics(proto::MetricsRequest {
                namespace,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let named = metrics.totals.iter().filter(|r| r.kind != "other").count();
        let other = metrics.totals.iter().find(|r| r.kind == "other");
        assert_eq!(named, CAP);
        assert_eq!(other.map(|r| r.acquired), Some((KINDS - CAP) as u64));
        assert_eq!(metrics.overall.unwrap().acquired, KINDS as u64);
        return;
    }
    panic!("three runs in a row crossed a minute boundary");
}
