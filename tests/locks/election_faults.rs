//! Leader election under change and failure: Observe's leader changes
//! (the current leader, then each election, value, resignation, lapse and
//! removal), a replica's SIGKILL with a candidate waiting on it, and a
//! session's leadership kept through its replica's SIGKILL by resume.

use crate::common;
use crate::election::{campaign, elect, leader, next_change, proclaim, resign};

use std::time::Duration;

use common::*;
use proto::{ProclaimStatus, ResignStatus};

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
        resign(&mut client, "e-observe", "probe", a.term, &a.secret).await;
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
        proclaim(&mut client, "e-observe", "a", a.term, &a.secret, "v2").await,
        ProclaimStatus::Proclaimed
    );
    let change = next_change(&mut changes).await;
    assert_eq!(
        (change.event.as_str(), change.leader.unwrap().value.as_str()),
        ("proclaimed", "v2")
    );
    assert_eq!(
        resign(&mut client, "e-observe", "a", a.term, &a.secret).await,
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
            secret: a.secret.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.status(), ProclaimStatus::NotLeader);
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
        proclaim(
            &mut far,
            "e-session",
            &session.id,
            term,
            &session.secret,
            "moved"
        )
        .await,
        ProclaimStatus::Proclaimed
    );
    resumed
        .send(Command::Release(proto::SessionRelease {
            request_id: 8,
            name: "e-session".into(),
            names: Vec::new(),
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
