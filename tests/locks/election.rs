//! Leader election (Campaign, Proclaim, Leader, Resign) through the real
//! server: FIFO among candidates, terms as fencing tokens that strictly
//! rise, a lapsed leader's term refused, bad input named (DESIGN.md
//! invariant 12). Observe and failures: `election_faults.rs`.

use crate::common;

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
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
