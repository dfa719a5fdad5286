//! Multi-locks through a session of the Rust client (`Session::lock_all`,
//! `Session::release_all`, decision 78): the set granted with a token per
//! name and held by the session; a lock of it is released only with the
//! set; a lock of it taken away loses the whole set (a `Lost` event each,
//! the rest released by the server); a dropped wait leaves the server.

use std::time::Duration;

use super::{client_of, holders, queued};
use crate::common::TestServer;
use crate::common::wait::wait_until_async;
use tumbler_client::{Client, Error, Session, SessionEvent};

async fn open(client: &Client, ttl: Duration) -> Session {
    client.session().ttl(ttl).open().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_set_is_held_by_the_session_and_released_whole() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let session = open(&client, Duration::from_secs(5)).await;
    let grants = session
        .lock_all(&["cs-a", "cs-b"], Duration::ZERO)
        .await
        .unwrap();
    let names: Vec<&str> = grants.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["cs-a", "cs-b"]);
    for grant in &grants {
        assert_eq!(
            holders(&client, &grant.name).await,
            vec![(session.id().id.clone(), grant.fencing_token)]
        );
    }
    assert_eq!(session.grants().len(), 2);

    // One lock of the set alone is refused; the set is released whole.
    match session.release("cs-a").await {
        Err(Error::Status(status)) => {
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
            assert!(status.message().starts_with("name:"), "{status:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(session.release_all(&["cs-a", "cs-b"]).await.unwrap());
    assert!(holders(&client, "cs-a").await.is_empty());
    assert!(holders(&client, "cs-b").await.is_empty());
    assert!(session.grants().is_empty());
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_of_the_set_taken_away_loses_the_whole_set() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let session = open(&client, Duration::from_millis(600)).await;
    let mut events = session.events();
    let grants = session
        .lock_all(&["cl-a", "cl-b", "cl-c"], Duration::ZERO)
        .await
        .unwrap();
    // Taken away behind the session's back, as Redis losing it would (a
    // plain Release of a session's grant is refused, decision 0082).
    let taken = &grants[1];
    let id = session.id().id.clone();
    assert!(
        !client
            .release(&taken.name, &id, Some(taken.fencing_token))
            .await
            .unwrap_or(false),
        "a plain Release of a session's grant is refused"
    );
    crate::common::lose_lock(server.redis_url(), &taken.name).await;
    let mut lost = Vec::new();
    while lost.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("lost events within 5 s")
            .unwrap();
        if let SessionEvent::Lost { grant, reason } = event {
            lost.push((grant.name, reason));
        }
    }
    lost.sort();
    assert_eq!(
        lost,
        [
            ("cl-a".to_owned(), "set broken".to_owned()),
            ("cl-b".to_owned(), "not held".to_owned()),
            ("cl-c".to_owned(), "set broken".to_owned()),
        ]
    );
    assert!(session.grants().is_empty());
    wait_until_async(
        "the rest of the set is released",
        Duration::from_secs(5),
        || async {
            holders(&client, "cl-a").await.is_empty() && holders(&client, "cl-c").await.is_empty()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_for_a_set_leaves_the_server_and_takes_nothing() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let blocker = client
        .lock("cw-b")
        .holder("blocker")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let session = open(&client, Duration::from_secs(5)).await;
    let id = session.id().id.clone();
    let waiting = session.lock_all(&["cw-a", "cw-b"], Duration::from_secs(20));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err()
    );
    wait_until_async(
        "the dropped set leaves the queue",
        Duration::from_secs(2),
        || async { !queued(&client, "cw-b").await.contains(&id) },
    )
    .await;
    assert!(blocker.release().await.unwrap());
    // The session goes on, holding nothing of the set; a later set is
    // granted at once.
    assert!(holders(&client, "cw-a").await.is_empty());
    let grants = session
        .lock_all(&["cw-a", "cw-b"], Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(grants.len(), 2);
    session.close().await.unwrap();
    assert!(holders(&client, "cw-b").await.is_empty());
}
