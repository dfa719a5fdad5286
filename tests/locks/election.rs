//! Leader election (Campaign, Proclaim, Leader, Observe, Resign) through
//! the real server: FIFO among candidates, terms as fencing tokens that
//! strictly rise, a lapsed leader's term refused, a replica's SIGKILL, and
//! the leader changes Observe tells (DESIGN.md invariant 12).

use crate::common;

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{ProclaimStatus, ResignStatus};
use tonic::transport::Channel;

fn campaign(name: &str, candidate: &str, value: &str) -> proto::CampaignRequest {
    proto::CampaignRequest {
        name: name.into(),
        candidate: candidate.into(),
        value: value.into(),
        ttl_ms: Some(30_000),
        wait_ms: Some(10_000),
        ..Default::default()
    }
}

async fn elect(
    client: &mut LockServiceClient<Channel>,
    request: proto::CampaignRequest,
) -> proto::Leadership {
    let reply = client.campaign(request).await.unwrap().into_inner();
    assert!(reply.elected, "elected: {reply:?}");
    reply.leader.unwrap()
}

async fn leader(client: &mut LockServiceClient<Channel>, name: &str) -> Option<proto::Leadership> {
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

async fn proclaim(
    client: &mut LockServiceClient<Channel>,
    name: &str,
    candidate: &str,
    term: u64,
    value: &str,
) -> ProclaimStatus {
    client
        .proclaim(proto::ProclaimRequest {
            name: name.into(),
            candidate: candidate.into(),
            term,
            value: value.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

async fn resign(
    client: &mut LockServiceClient<Channel>,
    name: &str,
    candidate: &str,
    term: u64,
) -> ResignStatus {
    client
        .resign(proto::ResignRequest {
            name: name.into(),
            candidate: candidate.into(),
            term,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

async fn next_change(changes: &mut tonic::Streaming<proto::LeaderChange>) -> proto::LeaderChange {
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
    let (mut previous, mut term) = ("a".to_owned(), a.term);
    for (i, handle) in waiting.into_iter().enumerate() {
        assert_eq!(
            resign(&mut client, "e-fifo", &previous, term).await,
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
            resign(&mut client, "e-fifo", &previous, term).await,
            ResignStatus::NotLeader
        );
        (previous, term) = (name, elected.term);
    }
    assert_eq!(
        resign(&mut client, "e-fifo", &previous, term).await,
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
        proclaim(&mut client, "e-proclaim", "a", a.term + 1, "x").await,
        ProclaimStatus::NotLeader
    );
    assert_eq!(
        proclaim(&mut client, "e-proclaim", "b", a.term, "x").await,
        ProclaimStatus::NotLeader
    );
    assert_eq!(leader(&mut client, "e-proclaim").await.unwrap().value, "v1");
    let reply = client
        .proclaim(proto::ProclaimRequest {
            name: "e-proclaim".into(),
            candidate: "a".into(),
            term: a.term,
            value: "v2 / \"quoted\" ✓".into(),
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
        proclaim(&mut client, "e-lapse", "a", a.term, "still me").await,
        ProclaimStatus::NotLeader
    );
    assert_eq!(
        resign(&mut client, "e-lapse", "a", a.term).await,
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
        resign(&mut b_client, "e-lapse", "b", b.term).await,
        ResignStatus::Resigned
    );
    let again = elect(&mut client, campaign("e-lapse", "a", "back")).await;
    assert!(again.term > b.term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_tells_the_current_leader_then_every_change() {
    let redis = start_redis();
    let observing = TestServer::new().redis(&redis.url()).start().await;
    let acting = TestServer::new().redis(&redis.url()).start().await;
    let mut watcher = observing.client().await;
    let mut client = acting.client().await;
    let mut changes = watcher
        .observe(proto::LeaderRequest {
            name: "e-observe".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_change(&mut changes).await;
    assert_eq!((first.event.as_str(), first.leader), ("current", None));
    // Events travel once the other replica knows the namespace is watched
    // (within a second): campaign and resign until a change shows, then
    // drain what the probes told.
    let mut heard = false;
    for _ in 0..100 {
        let a = elect(&mut client, campaign("e-observe", "probe", "")).await;
        resign(&mut client, "e-observe", "probe", a.term).await;
        if let Ok(Ok(Some(_))) =
            tokio::time::timeout(Duration::from_millis(100), changes.message()).await
        {
            heard = true;
            break;
        }
    }
    assert!(heard, "the observer never heard the election");
    while let Ok(Ok(Some(_))) =
        tokio::time::timeout(Duration::from_millis(300), changes.message()).await
    {}
    let a = elect(&mut client, campaign("e-observe", "a", "v1")).await;
    let change = next_change(&mut changes).await;
    let shown = change.leader.clone().unwrap();
    assert_eq!(
        (
            change.event.as_str(),
            shown.candidate.as_str(),
            shown.term,
            shown.value.as_str()
        ),
        ("elected", "a", a.term, "v1")
    );
    assert_eq!(
        proclaim(&mut client, "e-observe", "a", a.term, "v2").await,
        ProclaimStatus::Proclaimed
    );
    let change = next_change(&mut changes).await;
    assert_eq!(
        (change.event.as_str(), change.leader.unwrap().value.as_str()),
        ("proclaimed", "v2")
    );
    assert_eq!(
        resign(&mut client, "e-observe", "a", a.term).await,
        ResignStatus::Resigned
    );
    let change = next_change(&mut changes).await;
    assert_eq!(
        (change.event.as_str(), change.ended_term, change.leader),
        ("resigned", a.term, None)
    );
    // A lease that lapses with nobody in line is a change too.
    let b = elect(
        &mut client,
        proto::CampaignRequest {
            ttl_ms: Some(300),
            ..campaign("e-observe", "b", "short")
        },
    )
    .await;
    assert_eq!(next_change(&mut changes).await.event, "elected");
    let change = next_change(&mut changes).await;
    assert_eq!(
        (change.event.as_str(), change.ended_term),
        ("expired", b.term)
    );
    // A new observer starts with the leader of the moment.
    let c = elect(&mut client, campaign("e-observe", "c", "now")).await;
    let mut late = watcher
        .observe(proto::LeaderRequest {
            name: "e-observe".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_change(&mut late).await;
    assert_eq!(
        (first.event.as_str(), first.leader.unwrap().term),
        ("current", c.term)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_of_a_killed_replica_is_skipped_and_a_killed_leaders_replica_leaves_its_lease()
{
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    let mut doomed = TumblerProcess::start(&redis.url(), &[]).await;
    let mut doomed_client = doomed.client().await;
    // The leader campaigns through the doomed replica; a candidate waits there too.
    let a = elect(
        &mut doomed_client,
        proto::CampaignRequest {
            ttl_ms: Some(1_000),
            ..campaign("e-kill", "a", "on-doomed")
        },
    )
    .await;
    let waiting = tokio::spawn(async move {
        doomed_client
            .campaign(proto::CampaignRequest {
                queue_ttl_ms: Some(500),
                ..campaign("e-kill", "b", "on-doomed")
            })
            .await
    });
    until_waiters(&mut client, "e-kill", 1).await;
    doomed.kill();
    assert!(
        waiting.await.unwrap().is_err(),
        "the killed replica's campaign fails"
    );
    // c, on a live replica, is elected once a's lease lapses and b's
    // candidacy (nobody refreshes it) is skipped: within a lease and a
    // queue TTL, not b's whole wait.
    let started = std::time::Instant::now();
    let c = elect(&mut client, campaign("e-kill", "c", "alive")).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert!(c.term > a.term);
    assert_eq!(leader(&mut client, "e-kill").await.unwrap().candidate, "c");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_campaign_keeps_its_leadership_through_a_replica_sigkill_by_resume() {
    use common::session::Session;
    use proto::session_request::Command;
    use proto::session_response::Event;
    let redis = start_redis();
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut far = staying.client().await;
    let mut doomed = TumblerProcess::start(&redis.url(), &[]).await;
    let mut near = doomed.client().await;
    let mut session = Session::open(&mut near, 1_500).await;
    session
        .send(Command::Campaign(proto::SessionCampaign {
            request_id: 7,
            campaign: Some(campaign(
                "e-session",
                "ignored: the session's",
                "on-session",
            )),
        }))
        .await;
    let grant = match session.next().await {
        Some(Event::Acquired(acquired)) => {
            assert_eq!(acquired.request_id, 7);
            acquired.response.unwrap().grant.unwrap()
        }
        other => panic!("expected the campaign's reply, got {other:?}"),
    };
    assert_eq!(grant.holder, session.id, "the candidate is the session");
    assert_eq!(
        grant.metadata.get("").map(String::as_str),
        Some("on-session")
    );
    let term = grant.fencing_token;
    let shown = leader(&mut far, "e-session").await.unwrap();
    assert_eq!(
        (shown.candidate.as_str(), shown.term, shown.value.as_str()),
        (session.id.as_str(), term, "on-session")
    );
    // Another candidate waits on the other replica.
    let mut rival = staying.client().await;
    let rival =
        tokio::spawn(async move { rival.campaign(campaign("e-session", "rival", "r")).await });
    until_waiters(&mut far, "e-session", 1).await;

    // The session's replica dies; the client resumes on the other one
    // within the TTL and keeps the leadership, same term, same value.
    doomed.kill();
    let (mut resumed, opened) = Session::resume(&mut far, &session.id, &session.secret)
        .await
        .unwrap();
    assert!(opened.resumed);
    assert_eq!(opened.grants.len(), 1, "{opened:?}");
    assert_eq!(
        (
            opened.grants[0].name.as_str(),
            opened.grants[0].fencing_token
        ),
        ("e-session", term)
    );
    // Several TTLs later it still leads: the new replica renews it.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        resumed.keep_alive().await;
    }
    let shown = leader(&mut far, "e-session").await.unwrap();
    assert_eq!((shown.term, shown.value.as_str()), (term, "on-session"));
    assert!(!rival.is_finished(), "nobody else was elected meanwhile");
    // The leader proclaims through the unary RPC (candidate: the session
    // id), then resigns by releasing: the rival is elected at once.
    assert_eq!(
        proclaim(&mut far, "e-session", &session.id, term, "moved").await,
        ProclaimStatus::Proclaimed
    );
    resumed
        .send(Command::Release(proto::SessionRelease {
            request_id: 8,
            name: "e-session".into(),
            ..Default::default()
        }))
        .await;
    assert!(matches!(resumed.next().await, Some(Event::Released(_))));
    let elected = tokio::time::timeout(Duration::from_secs(5), rival)
        .await
        .expect("the rival is elected at once")
        .unwrap()
        .unwrap()
        .into_inner();
    assert!(elected.elected && elected.leader.unwrap().term > term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_tells_a_leadership_cleared_by_an_admin_as_removed() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let namespace = "e-clear";
    let a = elect(
        &mut client,
        proto::CampaignRequest {
            namespace: namespace.into(),
            ..campaign("e-removed", "a", "v")
        },
    )
    .await;
    let mut changes = client
        .observe(proto::LeaderRequest {
            namespace: namespace.into(),
            name: "e-removed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_change(&mut changes).await;
    assert_eq!(
        (first.event.as_str(), first.leader.unwrap().term),
        ("current", a.term)
    );
    // The observer's own replica publishes once it knows of the watch:
    // clear until the removal shows (a later clear finds nothing).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let removed = loop {
        client
            .clear(proto::ClearRequest {
                namespace: namespace.into(),
            })
            .await
            .unwrap();
        if let Ok(change) =
            tokio::time::timeout(Duration::from_millis(200), changes.message()).await
        {
            break change.unwrap().unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the clear was never observed"
        );
    };
    assert_eq!(
        (removed.event.as_str(), removed.ended_term, removed.leader),
        ("removed", a.term, None)
    );
    let mut client = server.client().await;
    let gone = client
        .leader(proto::LeaderRequest {
            namespace: namespace.into(),
            name: "e-removed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.leader, None);
    let refused = client
        .proclaim(proto::ProclaimRequest {
            namespace: namespace.into(),
            name: "e-removed".into(),
            candidate: "a".into(),
            term: a.term,
            value: "x".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.status(), ProclaimStatus::NotLeader);
}
