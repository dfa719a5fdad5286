//! Batch (decision 0087): independent Acquire, Release and Extend calls in
//! one request, each answered as its own call would be, in order. What
//! breaks the batch's own rules is refused whole before any item runs.
//! Each test runs the real server against a real Redis.

use crate::common;

use common::*;
use proto::batch_item::Call;
use proto::batch_result::Result as Answer;
use proto::{AcquireStatus, ExtendStatus, NotAcquiredReason, ReleaseStatus};
use tonic::Code;

fn acquiring(req: proto::AcquireRequest) -> proto::BatchItem {
    proto::BatchItem {
        call: Some(Call::Acquire(req)),
    }
}

fn releasing(req: proto::ReleaseRequest) -> proto::BatchItem {
    proto::BatchItem {
        call: Some(Call::Release(req)),
    }
}

fn extending(name: &str, holder: &str) -> proto::BatchItem {
    proto::BatchItem {
        call: Some(Call::Extend(proto::ExtendRequest {
            name: name.into(),
            holder: holder.into(),
            ttl_ms: Some(60_000),
            ..Default::default()
        })),
    }
}

fn batch(items: Vec<proto::BatchItem>) -> proto::BatchRequest {
    proto::BatchRequest { items }
}

fn acquired(result: &proto::BatchResult) -> &proto::AcquireResponse {
    match &result.result {
        Some(Answer::Acquire(reply)) => reply,
        other => panic!("an Acquire's answer, not {other:?}"),
    }
}

fn error(result: &proto::BatchResult) -> &proto::BatchError {
    match &result.result {
        Some(Answer::Error(e)) => e,
        other => panic!("an error, not {other:?}"),
    }
}

async fn holders(client: &mut Client, name: &str) -> Vec<String> {
    let state = client.inspect(inspect(name)).await.unwrap().into_inner();
    state
        .holders
        .into_iter()
        .filter_map(|g| g.grant.map(|g| g.holder))
        .collect()
}

type Client = tumbler::proto::lock_service_client::LockServiceClient<tonic::transport::Channel>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_item_is_answered_as_its_own_call_in_order() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("held", "other")).await.unwrap();
    client.acquire(acquire("mine", "me")).await.unwrap();

    let reply = client
        .batch(batch(vec![
            acquiring(acquire("job-1", "jid-1")),
            acquiring(acquire("held", "jid-2")),
            acquiring(acquire("job-3", "jid-3")),
            extending("mine", "me"),
            releasing(release("mine", "me")),
            releasing(release("held", "not-its-holder")),
            acquiring(acquire("job-1", "jid-1")),
        ]))
        .await
        .unwrap()
        .into_inner();
    let r = &reply.results;
    assert_eq!(r.len(), 7, "{reply:?}");
    let first = acquired(&r[0]);
    assert_eq!(first.status(), AcquireStatus::Acquired, "{first:?}");
    let busy = acquired(&r[1]);
    assert_eq!(
        (busy.status(), busy.reason()),
        (AcquireStatus::NotAcquired, NotAcquiredReason::Busy),
        "{busy:?}"
    );
    assert_eq!(acquired(&r[2]).status(), AcquireStatus::Acquired);
    match &r[3].result {
        Some(Answer::Extend(e)) => assert_eq!(e.status(), ExtendStatus::Extended, "{e:?}"),
        other => panic!("an Extend's answer, not {other:?}"),
    }
    match &r[4].result {
        Some(Answer::Release(e)) => assert_eq!(e.status(), ReleaseStatus::Released, "{e:?}"),
        other => panic!("a Release's answer, not {other:?}"),
    }
    match &r[5].result {
        Some(Answer::Release(e)) => assert_eq!(e.status(), ReleaseStatus::NotHeld, "{e:?}"),
        other => panic!("a Release's answer, not {other:?}"),
    }
    // The same holder's Acquire again in one batch: idempotent, one grant.
    let again = acquired(&r[6]);
    assert_eq!(
        again.grant.as_ref().unwrap().fencing_token,
        first.grant.as_ref().unwrap().fencing_token,
        "{reply:?}"
    );

    // What the batch did is what Redis holds.
    assert_eq!(holders(&mut client, "job-1").await, ["jid-1"]);
    assert_eq!(holders(&mut client, "job-3").await, ["jid-3"]);
    assert_eq!(holders(&mut client, "held").await, ["other"]);
    assert!(holders(&mut client, "mine").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_item_fails_alone_naming_its_field() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let reply = client
        .batch(batch(vec![
            acquiring(acquire("fine", "a")),
            acquiring(proto::AcquireRequest {
                ttl_ms: Some(0),
                ..acquire("bad-ttl", "b")
            }),
            acquiring(acquire("", "c")),
            acquiring(acquire("also-fine", "d")),
        ]))
        .await
        .unwrap()
        .into_inner();
    let r = &reply.results;
    assert_eq!(acquired(&r[0]).status(), AcquireStatus::Acquired);
    let ttl = error(&r[1]);
    assert_eq!(ttl.code, Code::InvalidArgument as i32, "{ttl:?}");
    assert!(ttl.message.starts_with("ttl_ms"), "{ttl:?}");
    let name = error(&r[2]);
    assert_eq!(name.code, Code::InvalidArgument as i32, "{name:?}");
    assert!(name.message.starts_with("name"), "{name:?}");
    assert_eq!(acquired(&r[3]).status(), AcquireStatus::Acquired);
    assert!(holders(&mut client, "bad-ttl").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_breaks_its_own_rules_is_refused_whole() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let refused = |items: Vec<proto::BatchItem>, says: &'static str| {
        let mut client = client.clone();
        async move {
            let status = client.batch(batch(items)).await.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().starts_with("items"), "{status:?}");
            assert!(status.message().contains(says), "{status:?}");
        }
    };
    refused(vec![], "must not be empty").await;
    let many = (0..257)
        .map(|i| acquiring(acquire(&format!("n-{i}"), "h")))
        .collect();
    refused(many, "at most 256").await;
    refused(
        vec![
            acquiring(acquire("first", "h")),
            proto::BatchItem { call: None },
        ],
        "items[1] names no call",
    )
    .await;
    refused(
        vec![
            acquiring(acquire("first", "h")),
            acquiring(proto::AcquireRequest {
                wait_ms: 500,
                ..acquire("waits", "h")
            }),
        ],
        "items[1].acquire.wait_ms",
    )
    .await;
    // Nothing of a refused batch ran.
    assert!(holders(&mut client, "first").await.is_empty());
    assert!(holders(&mut client, "n-0").await.is_empty());
    // 256 is allowed, and every one is granted.
    let reply = client
        .batch(batch(
            (0..256)
                .map(|i| acquiring(acquire(&format!("n-{i}"), "h")))
                .collect(),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        (reply.results.iter()).all(|r| acquired(r).status() == AcquireStatus::Acquired),
        "{reply:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_one_namespace_reaches_redis_in_a_few_calls() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    client.acquire(acquire("warm-up", "h")).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reply = client
        .batch(batch(
            (0..64)
                .map(|i| acquiring(acquire(&format!("bulk-{i}"), &format!("jid-{i}"))))
                .collect(),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        (reply.results.iter()).all(|r| acquired(r).status() == AcquireStatus::Acquired),
        "{reply:?}"
    );
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let fcalls: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    println!("64 acquires in one batch: {fcalls} function calls");
    // Group commit: the first goes alone while the rest gather behind it
    // (one call in flight per namespace and shard), so 64 acquires take a
    // handful of calls, not 64.
    assert!(
        (1..=16).contains(&fcalls),
        "64 acquires in one batch took {fcalls} function calls:\n{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_every_item_is_unavailable_and_nothing_is_granted_later() {
    let mut redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    client.acquire(acquire("before", "h")).await.unwrap();
    redis.stop();
    let reply = client
        .batch(batch(vec![
            acquiring(acquire("a", "h")),
            acquiring(acquire("b", "h")),
            releasing(release("before", "h")),
        ]))
        .await
        .unwrap()
        .into_inner();
    for result in &reply.results {
        let e = error(result);
        assert_eq!(e.code, Code::Unavailable as i32, "{reply:?}");
    }
    // Redis back: none of the refused acquires landed afterwards.
    redis.restart().unwrap();
    let mut answered = None;
    for _ in 0..100 {
        if let Ok(state) = client.inspect(inspect("a")).await {
            answered = Some(state.into_inner());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        answered
            .expect("the server answers again")
            .holders
            .is_empty()
    );
    assert!(holders(&mut client, "b").await.is_empty());
}
