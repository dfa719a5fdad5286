//! Acquire's `takes_over` (decision 0083): one holder's live grant passes
//! to another in one call, ahead of waiters, with a new fencing token; the
//! old holder can then neither extend nor release it. Each test runs the
//! real server against a real Redis.

use crate::common;
use crate::election::{campaign, elect};

use std::time::Duration;

use common::session::Session;
use common::*;
use proto::session_request::Command;
use proto::session_response::Event;
use proto::{AcquireStatus, ExtendStatus, ReleaseStatus};

fn taking(name: &str, holder: &str, old: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        takes_over: old.into(),
        ttl_ms: Some(5_000),
        kind: "run".into(),
        metadata: [("stage".to_owned(), "run".to_owned())].into(),
        ..acquire(name, holder)
    }
}

fn granted(reply: &proto::AcquireResponse) -> proto::Grant {
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    reply.grant.clone().expect("a grant")
}

fn refused(status: tonic::Status, code: tonic::Code) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().starts_with("takes_over:"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_passes_at_once_ahead_of_waiters_and_the_old_holder_loses_it() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let queued = granted(
        &client
            .acquire(acquire("job", "jid"))
            .await
            .unwrap()
            .into_inner(),
    );
    // A waiter in the lock's queue, fair: it stays behind the hand-off.
    let mut waiter_client = server.client().await;
    let waiter = tokio::spawn(async move {
        waiter_client
            .acquire(proto::AcquireRequest {
                wait_ms: 1_500,
                ..acquire("job", "waiter")
            })
            .await
            .unwrap()
            .into_inner()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let run = granted(
        &client
            .acquire(taking("job", "jid:run-1", "jid"))
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(run.holder, "jid:run-1");
    assert!(
        run.fencing_token > queued.fencing_token,
        "{run:?} {queued:?}"
    );
    assert_eq!((run.ttl_ms, run.kind.as_str()), (5_000, "run"));
    assert_eq!(run.metadata.get("stage").map(String::as_str), Some("run"));
    let seen = client.inspect(inspect("job")).await.unwrap().into_inner();
    let holders: Vec<_> = (seen.holders.iter())
        .map(|h| h.grant.as_ref().unwrap().holder.clone())
        .collect();
    assert_eq!(holders, ["jid:run-1"]);

    // The old holder holds nothing: neither its extend nor its release
    // (with or without its old token) touches the run's grant.
    let extended = client
        .extend(proto::ExtendRequest {
            name: "job".into(),
            holder: "jid".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), ExtendStatus::NotHeld);
    for token in [None, Some(queued.fencing_token)] {
        let released = client
            .release(proto::ReleaseRequest {
                fencing_token: token,
                ..release("job", "jid")
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(released.status(), ReleaseStatus::NotHeld, "{token:?}");
    }
    // The waiter was not passed the lock meanwhile: it times out.
    let waited = waiter.await.unwrap();
    assert_eq!(waited.status(), AcquireStatus::NotAcquired, "{waited:?}");

    // A retried take-over (its answer lost) finds the run's grant: the same one.
    let again = client
        .acquire(taking("job", "jid:run-1", "jid"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.status(), AcquireStatus::AlreadyHeld);
    assert_eq!(again.grant.unwrap().fencing_token, run.fencing_token);

    // Released by its token, the lock is free.
    let released = client
        .release(proto::ReleaseRequest {
            fencing_token: Some(run.fencing_token),
            ..release("job", "jid:run-1")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), ReleaseStatus::Released);
    let seen = client.inspect(inspect("job")).await.unwrap().into_inner();
    assert!(seen.holders.is_empty(), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_to_take_over_it_is_an_ordinary_acquire() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // Nobody holds: granted as usual.
    let fresh = client
        .acquire(taking("free", "run-a", "gone"))
        .await
        .unwrap()
        .into_inner();
    granted(&fresh);
    // Someone else holds, and the old holder holds nothing: busy.
    let busy = client
        .acquire(taking("free", "run-b", "gone"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.status(), AcquireStatus::NotAcquired, "{busy:?}");
    // A lapsed grant is not taken over: the permit goes by the usual rules.
    client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(100),
            ..acquire("lapsing", "jid")
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let after = client
        .acquire(taking("lapsing", "run-c", "jid"))
        .await
        .unwrap()
        .into_inner();
    granted(&after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_grant_keeps_its_slot_and_the_count_of_holders() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let sem = |holder: &str| proto::AcquireRequest {
        limit: Some(3),
        ..acquire("sem", holder)
    };
    granted(&client.acquire(sem("a")).await.unwrap().into_inner());
    let b = granted(&client.acquire(sem("b")).await.unwrap().into_inner());
    assert_eq!(b.slot, 2);
    let taken = client
        .acquire(proto::AcquireRequest {
            limit: Some(3),
            ..taking("sem", "b2", "b")
        })
        .await
        .unwrap()
        .into_inner();
    let b2 = granted(&taken);
    assert_eq!((b2.slot, taken.holders), (2, 2), "{taken:?}");
    // The third permit is still free, and only one.
    granted(&client.acquire(sem("c")).await.unwrap().into_inner());
    let full = client.acquire(sem("d")).await.unwrap().into_inner();
    assert_eq!(full.status(), AcquireStatus::NotAcquired);
    // Another limit is the lock's conflict, as for any Acquire.
    let other_limit = client
        .acquire(proto::AcquireRequest {
            limit: Some(5),
            ..taking("sem", "a2", "a")
        })
        .await
        .unwrap_err();
    assert_eq!(other_limit.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_taken_over_is_refused_naming_the_field() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("x", "jid")).await.unwrap();
    let invalid = tonic::Code::InvalidArgument;
    for (req, code) in [
        (taking("x", "jid", "jid"), invalid),
        (taking("x", "run", &"h".repeat(10_000)), invalid),
        (taking("x", "run", "bad\u{1}holder"), invalid),
        (
            taking("x", "run", "session-0190a7b2-0000-7000-8000-000000000000"),
            tonic::Code::PermissionDenied,
        ),
        (
            proto::AcquireRequest {
                mode: proto::LockMode::Write.into(),
                ..taking("x", "run", "jid")
            },
            invalid,
        ),
        (
            proto::AcquireRequest {
                limit: Some(3),
                permits: Some(2),
                ..taking("x", "run", "jid")
            },
            invalid,
        ),
        (
            proto::AcquireRequest {
                name: String::new(),
                names: vec!["x".into(), "y".into()],
                ..taking("x", "run", "jid")
            },
            invalid,
        ),
    ] {
        let status = client.acquire(req).await.unwrap_err();
        assert!(
            status.message().contains("takes_over"),
            "the message names the field: {status:?}"
        );
        assert_eq!(status.code(), code, "{status:?}");
    }
    // Nothing changed: jid still holds.
    let seen = client.inspect(inspect("x")).await.unwrap().into_inner();
    assert_eq!(seen.holders[0].grant.as_ref().unwrap().holder, "jid");

    // An election's grant does not pass (its leader's secret is needed).
    let led = elect(&mut client, campaign("e", "leader-1", "v")).await;
    let status = client
        .acquire(taking("e", "usurper", &led.candidate))
        .await
        .unwrap_err();
    refused(status, tonic::Code::PermissionDenied);

    // Nor does a session take anything over.
    let mut session = Session::open(&mut client, 5_000).await;
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 7,
            acquire: Some(taking("x", "", "jid")),
        }))
        .await;
    match session.next().await {
        Some(Event::Error(error)) => {
            assert_eq!(error.code, tonic::Code::InvalidArgument as i32, "{error:?}");
            assert!(error.message.starts_with("takes_over:"), "{error:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let seen = client.inspect(inspect("x")).await.unwrap().into_inner();
    assert_eq!(seen.holders[0].grant.as_ref().unwrap().holder, "jid");
}
