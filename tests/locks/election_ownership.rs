//! Who may act for a leadership or a session (DESIGN.md invariant 18,
//! decision 0082): Proclaim and Resign need the leader's secret, not its
//! readable candidate and term; a session's grants act only through its
//! stream; only a Campaign's grant leads, an election's name takes no
//! mode or permits, and a leader's Campaign with a new value publishes it.
//! Each test is one attack from outside, with real processes.

use crate::common;
use crate::election::{campaign, elect, leader, next_change, proclaim, resign};

use std::time::Duration;

use common::session::{Session, holder_of};
use common::*;
use proto::session_request::Command;
use proto::session_response::Event;
use proto::{ProclaimStatus, ResignStatus};

/// A refusal for want of the leader's proof (decision 0082).
fn not_yours(status: tonic::Status, field: &str) {
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{field}:")),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_and_resign_need_the_leaders_secret_not_its_readable_name_and_term() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let a = elect(&mut client, campaign("e-owned", "a", "v1")).await;
    let other = elect(&mut client, campaign("e-other", "a", "o")).await;
    assert_eq!(a.secret.len(), 64, "{a:?}");
    assert_ne!(a.secret, other.secret);
    // What anyone with the namespace reads: the candidate and the term.
    let shown = leader(&mut client, "e-owned").await.unwrap();
    let proclaim_with = |secret: &str| proto::ProclaimRequest {
        name: "e-owned".into(),
        candidate: shown.candidate.clone(),
        term: shown.term,
        value: "hijacked".into(),
        secret: secret.into(),
        ..Default::default()
    };
    let resign_with = |secret: &str| proto::ResignRequest {
        name: "e-owned".into(),
        candidate: shown.candidate.clone(),
        term: shown.term,
        secret: secret.into(),
        ..Default::default()
    };
    // No secret, another leadership's secret, a made-up one: refused.
    for secret in ["", other.secret.as_str(), &"0".repeat(64)] {
        not_yours(
            client.proclaim(proclaim_with(secret)).await.unwrap_err(),
            "secret",
        );
        not_yours(
            client.resign(resign_with(secret)).await.unwrap_err(),
            "secret",
        );
    }
    // A plain Release (or a set's) of the leader's grant, pinned to the
    // readable term, is no way round it.
    not_yours(
        client
            .release(proto::ReleaseRequest {
                fencing_token: Some(shown.term),
                ..release("e-owned", "a")
            })
            .await
            .unwrap_err(),
        "secret",
    );
    let in_set = client
        .release(proto::ReleaseRequest {
            names: vec!["e-owned".into(), "e-other-set".into()],
            ..release("", "a")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(in_set.status(), proto::ReleaseStatus::NotHeld);
    let still = leader(&mut client, "e-owned").await.unwrap();
    assert_eq!(
        (still.candidate.as_str(), still.term, still.value.as_str()),
        ("a", a.term, "v1")
    );
    // The leader itself, with its secret.
    assert_eq!(
        proclaim(&mut client, "e-owned", "a", a.term, &a.secret, "v2").await,
        ProclaimStatus::Proclaimed
    );
    assert_eq!(
        resign(&mut client, "e-owned", "a", a.term, &a.secret).await,
        ResignStatus::Resigned
    );
    assert_eq!(leader(&mut client, "e-owned").await, None);
    // Once over, the secret is no key to anything: NOT_LEADER.
    assert_eq!(
        proclaim(&mut client, "e-owned", "a", a.term, &a.secret, "v3").await,
        ProclaimStatus::NotLeader
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_grants_are_acted_on_only_through_its_session() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 30_000).await;
    let held = session.acquire(1, acquire("s-owned", "ignored")).await;
    assert_eq!(held.status(), proto::AcquireStatus::Acquired);
    let token = held.grant.unwrap().fencing_token;
    // The session id is readable (Inspect shows it as the holder).
    let shown = holder_of(&mut client, "s-owned").await.unwrap();
    assert_eq!(shown.holder, session.id);
    not_yours(
        client
            .release(proto::ReleaseRequest {
                fencing_token: Some(token),
                ..release("s-owned", &session.id)
            })
            .await
            .unwrap_err(),
        "holder",
    );
    not_yours(
        client
            .extend(proto::ExtendRequest {
                name: "s-owned".into(),
                holder: session.id.clone(),
                fencing_token: Some(token),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        "holder",
    );
    not_yours(
        client
            .acquire(acquire("s-owned", &session.id))
            .await
            .unwrap_err(),
        "holder",
    );
    not_yours(
        client
            .campaign(campaign("s-elect", &session.id, "v"))
            .await
            .unwrap_err(),
        "candidate",
    );
    let still = holder_of(&mut client, "s-owned").await.unwrap();
    assert_eq!(
        (still.holder.as_str(), still.fencing_token),
        (session.id.as_str(), token)
    );
    // Its stream releases it.
    session
        .send(Command::Release(proto::SessionRelease {
            request_id: 2,
            name: "s-owned".into(),
            ..Default::default()
        }))
        .await;
    assert!(matches!(session.next().await, Some(Event::Released(_))));
    assert_eq!(holder_of(&mut client, "s-owned").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elections_name_takes_no_mode_or_permits_and_only_a_campaign_leads() {
    use proto::LockMode;
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // A reader of limit 1 on a name: nobody leads, and a Campaign is
    // refused at once rather than waiting behind the reader.
    client
        .acquire(proto::AcquireRequest {
            mode: LockMode::Read as i32,
            ..acquire("e-read", "reader")
        })
        .await
        .unwrap();
    assert_eq!(leader(&mut client, "e-read").await, None);
    let mut observed = client
        .observe(proto::LeaderRequest {
            name: "e-read".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_change(&mut observed).await;
    assert_eq!(
        (first.event.as_str(), first.leader),
        ("current", None),
        "a reader is no leader to Observe either"
    );
    drop(observed);
    let started = std::time::Instant::now();
    let refused = client
        .campaign(campaign("e-read", "c", "v"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("election"), "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused, not queued"
    );
    // A semaphore's name too.
    client
        .acquire(proto::AcquireRequest {
            limit: Some(3),
            permits: Some(2),
            ..acquire("e-permits", "p")
        })
        .await
        .unwrap();
    let refused = client
        .campaign(campaign("e-permits", "c", "v"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    // A plain Acquire's grant on a free name is no leader either.
    client.acquire(acquire("e-plain", "p")).await.unwrap();
    assert_eq!(leader(&mut client, "e-plain").await, None);

    // While a Campaign leads, a mode or permits are refused.
    let a = elect(&mut client, campaign("e-kind", "a", "v")).await;
    for request in [
        proto::AcquireRequest {
            mode: LockMode::Read as i32,
            ..acquire("e-kind", "r")
        },
        proto::AcquireRequest {
            mode: LockMode::Write as i32,
            ..acquire("e-kind", "w")
        },
        proto::AcquireRequest {
            limit: Some(2),
            permits: Some(2),
            ..acquire("e-kind", "p")
        },
    ] {
        let refused = client.acquire(request).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
    }
    let shown = leader(&mut client, "e-kind").await.unwrap();
    assert_eq!((shown.candidate.as_str(), shown.term), ("a", a.term));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_campaign_with_a_new_value_publishes_it_in_the_same_term() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut watcher = server.client().await;
    let a = elect(&mut client, campaign("e-again", "a", "v1")).await;
    let mut changes = watcher
        .observe(proto::LeaderRequest {
            name: "e-again".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_change(&mut changes).await;
    assert_eq!(first.leader.unwrap().value, "v1");
    // Someone else campaigning in the leader's name with another value:
    // refused, nothing changes.
    not_yours(
        client
            .campaign(campaign("e-again", "a", "forged"))
            .await
            .unwrap_err(),
        "secret",
    );
    // The same value without the secret: the leadership, no secret.
    let retry = client
        .campaign(campaign("e-again", "a", "v1"))
        .await
        .unwrap()
        .into_inner();
    assert!(retry.elected && retry.secret.is_empty(), "{retry:?}");
    // The leader, with its secret and a new value: published, same term.
    let again = client
        .campaign(proto::CampaignRequest {
            secret: a.secret.clone(),
            ..campaign("e-again", "a", "v2")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(again.elected, "{again:?}");
    assert_eq!(again.secret, a.secret);
    let shown = again.leader.unwrap();
    assert_eq!((shown.term, shown.value.as_str()), (a.term, "v2"));
    assert_eq!(leader(&mut client, "e-again").await.unwrap().value, "v2");
    let change = next_change(&mut changes).await;
    let told = change.leader.clone().unwrap();
    assert_eq!(
        (change.event.as_str(), told.term, told.value.as_str()),
        ("proclaimed", a.term, "v2")
    );
}
