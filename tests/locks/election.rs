//! Leader election (Campaign, Proclaim, Leader, Resign) through the real
//! server: FIFO among candidates, terms as fencing tokens that strictly
//! rise, a lapsed leader's term refused, bad input named (DESIGN.md
//! invariant 12). Observe and failures: `election_faults.rs`.

use crate::common;

use std::time::Duration;

use common::session::{Session, holder_of};
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::session_request::Command;
use proto::session_response::Event;
use proto::{ProclaimStatus, ResignStatus};
use tonic::transport::Channel;

pub(crate) fn campaign(name: &str, candidate: &str, value: &str) -> proto::CampaignRequest {
    proto::CampaignRequest {
        name: name.into(),
        candidate: candidate.into(),
        value: value.into(),
        ttl_ms: Some(30_000),
        wait_ms: Some(10_000),
        ..Default::default()
    }
}

/// A won campaign: the leadership, and the secret only its winner is told.
#[derive(Debug)]
pub(crate) struct Won {
    pub leader: proto::Leadership,
    pub secret: String,
}

impl std::ops::Deref for Won {
    type Target = proto::Leadership;
    fn deref(&self) -> &proto::Leadership {
        &self.leader
    }
}

pub(crate) async fn elect(
    client: &mut LockServiceClient<Channel>,
    request: proto::CampaignRequest,
) -> Won {
    let reply = client.campaign(request).await.unwrap().into_inner();
    assert!(reply.elected, "elected: {reply:?}");
    Won {
        leader: reply.leader.unwrap(),
        secret: reply.secret,
    }
}

pub(crate) async fn leader(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> Option<proto::Leadership> {
    client
        .leader(proto::LeaderRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .leader
}

pub(crate) async fn proclaim(
    client: &mut LockServiceClient<Channel>,
    name: &str,
    candidate: &str,
    term: u64,
    secret: &str,
    value: &str,
) -> ProclaimStatus {
    client
        .proclaim(proto::ProclaimRequest {
            name: name.into(),
            candidate: candidate.into(),
            term,
            value: value.into(),
            secret: secret.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

pub(crate) async fn resign(
    client: &mut LockServiceClient<Channel>,
    name: &str,
    candidate: &str,
    term: u64,
    secret: &str,
) -> ResignStatus {
    client
        .resign(proto::ResignRequest {
            name: name.into(),
            candidate: candidate.into(),
            term,
            secret: secret.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

pub(crate) async fn next_change(
    changes: &mut tonic::Streaming<proto::LeaderChange>,
) -> proto::LeaderChange {
    tokio::time::timeout(Duration::from_secs(5), changes.message())
        .await
        .expect("a leader change within 5 s")
        .unwrap()
        .expect("the stream goes on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_are_elected_in_arrival_order_with_rising_terms_and_resign_hands_over() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let a = elect(&mut client, campaign("e-fifo", "a", "host-a")).await;
    assert_eq!((a.candidate.as_str(), a.value.as_str()), ("a", "host-a"));
    assert!(a.term > 0);
    // A retry of the leader's campaign is the same leadership.
    assert_eq!(
        elect(&mut client, campaign("e-fifo", "a", "host-a"))
            .await
            .term,
        a.term
    );

    // Five candidates queue behind, one at a time so their order is known.
    let mut waiting = Vec::new();
    for i in 0..5 {
        let mut c = server.client().await;
        let name = format!("c{i}");
        waiting.push(tokio::spawn(async move {
            let reply = c
                .campaign(campaign("e-fifo", &name, &format!("host-{name}")))
                .await
                .unwrap()
                .into_inner();
            (name, reply)
        }));
        until_waiters(&mut client, "e-fifo", i + 1).await;
    }
    let now = leader(&mut client, "e-fifo").await.unwrap();
    assert_eq!(
        (now.candidate.as_str(), now.term, now.value.as_str()),
        ("a", a.term, "host-a")
    );

    // Each resignation elects the next in line, with a higher term.
    let (mut previous, mut term, mut secret) = ("a".to_owned(), a.term, a.secret.clone());
    for (i, handle) in waiting.into_iter().enumerate() {
        assert_eq!(
            resign(&mut client, "e-fifo", &previous, term, &secret).await,
            ResignStatus::Resigned
        );
        let (name, reply) = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the next candidate is elected at once")
            .unwrap();
        assert_eq!(name, format!("c{i}"));
        let elected = reply.leader.unwrap();
        assert!(reply.elected && elected.candidate == name);
        assert!(elected.term > term, "terms strictly rise");
        assert_eq!(elected.value, format!("host-{name}"));
        // The old term acts no more.
        assert_eq!(
            resign(&mut client, "e-fifo", &previous, term, &secret).await,
            ResignStatus::NotLeader
        );
        assert_eq!(reply.secret.len(), 64, "the winner is told its secret");
        (previous, term, secret) = (name, elected.term, reply.secret);
    }
    assert_eq!(
        resign(&mut client, "e-fifo", &previous, term, &secret).await,
        ResignStatus::Resigned
    );
    assert_eq!(leader(&mut client, "e-fifo").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_changes_the_value_only_for_the_leader_with_its_term() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let a = elect(&mut client, campaign("e-proclaim", "a", "v1")).await;
    assert_eq!(
        proclaim(&mut client, "e-proclaim", "a", a.term + 1, &a.secret, "x").await,
        ProclaimStatus::NotLeader
    );
    assert_eq!(
        proclaim(&mut client, "e-proclaim", "b", a.term, &a.secret, "x").await,
        ProclaimStatus::NotLeader
    );
    assert_eq!(leader(&mut client, "e-proclaim").await.unwrap().value, "v1");
    let reply = client
        .proclaim(proto::ProclaimRequest {
            name: "e-proclaim".into(),
            candidate: "a".into(),
            term: a.term,
            value: "v2 / \"quoted\" ✓".into(),
            secret: a.secret.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), ProclaimStatus::Proclaimed);
    let now = leader(&mut client, "e-proclaim").await.unwrap();
    assert_eq!(
        (now.term, now.value.as_str()),
        (a.term, "v2 / \"quoted\" ✓")
    );
    assert_eq!(reply.leader.unwrap().value, now.value);
    // A plain Acquire's holder of another name has no election value, and
    // a semaphore has no leader.
    client
        .acquire(proto::AcquireRequest {
            limit: Some(2),
            ..acquire("e-semaphore", "s")
        })
        .await
        .unwrap();
    assert_eq!(leader(&mut client, "e-semaphore").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leader_is_replaced_and_its_term_is_refused_for_good() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let a = elect(
        &mut client,
        proto::CampaignRequest {
            ttl_ms: Some(300),
            ..campaign("e-lapse", "a", "old")
        },
    )
    .await;
    // b waits; it is elected when a's lease lapses, with no call from a.
    let mut b_client = server.client().await;
    let started = std::time::Instant::now();
    let b = elect(&mut b_client, campaign("e-lapse", "b", "new")).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "elected at the lapse"
    );
    assert!(b.term > a.term);
    // a learns it lost: every act under its old term is refused.
    assert_eq!(
        proclaim(&mut client, "e-lapse", "a", a.term, &a.secret, "still me").await,
        ProclaimStatus::NotLeader
    );
    assert_eq!(
        resign(&mut client, "e-lapse", "a", a.term, &a.secret).await,
        ResignStatus::NotLeader
    );
    let extended = client
        .extend(proto::ExtendRequest {
            name: "e-lapse".into(),
            holder: "a".into(),
            fencing_token: Some(a.term),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), proto::ExtendStatus::NotHeld);
    // Campaigning again is a new term, above b's: never the old one.
    let b_now = leader(&mut client, "e-lapse").await.unwrap();
    assert_eq!(
        (b_now.candidate.as_str(), b_now.value.as_str()),
        ("b", "new")
    );
    assert_eq!(
        resign(&mut b_client, "e-lapse", "b", b.term, &b.secret).await,
        ResignStatus::Resigned
    );
    let again = elect(&mut client, campaign("e-lapse", "a", "back")).await;
    assert!(again.term > b.term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_election_input_is_invalid_argument_naming_the_field() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let refused = |status: tonic::Status, field: &str| {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{status:?}"
        );
    };
    let long = "x".repeat(1025);
    refused(
        client
            .campaign(campaign("e-bad", "a", &long))
            .await
            .unwrap_err(),
        "value",
    );
    refused(
        client.campaign(campaign("", "a", "v")).await.unwrap_err(),
        "name",
    );
    refused(
        client
            .campaign(campaign("e-bad", "a\nb", "v"))
            .await
            .unwrap_err(),
        "candidate",
    );
    refused(
        client
            .campaign(proto::CampaignRequest {
                wait_ms: Some(u64::MAX),
                ..campaign("e-bad", "a", "v")
            })
            .await
            .unwrap_err(),
        "wait_ms",
    );
    refused(
        client
            .proclaim(proto::ProclaimRequest {
                name: "e-bad".into(),
                candidate: "a".into(),
                term: 0,
                ..Default::default()
            })
            .await
            .unwrap_err(),
        "term",
    );
    refused(
        client
            .resign(proto::ResignRequest {
                name: "e-bad".into(),
                candidate: "".into(),
                term: 1,
                ..Default::default()
            })
            .await
            .unwrap_err(),
        "candidate",
    );
    refused(
        client
            .proclaim(proto::ProclaimRequest {
                name: "e-bad".into(),
                candidate: "a".into(),
                term: 1,
                value: long,
                ..Default::default()
            })
            .await
            .unwrap_err(),
        "value",
    );
}

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
