//! Revocation revokes: removing a token, or a namespace from a token, in
//! the tokens file (rewritten on disk, as a Secret update does) ends what
//! the token was doing there. A waiting unary Acquire ends
//! (UNAUTHENTICATED, or PERMISSION_DENIED for a namespace taken away) and
//! is never granted afterwards; a session releases its grants in a
//! namespace taken away ("not permitted") and goes on elsewhere; a
//! session's waiting acquire there is refused. Real server, real Redis.

use std::time::Duration;

use super::auth::{
    ADMIN, Client, TEAM_A, bearer, entry, holders, open_session, replace_tokens_file,
    session_acquire_command, setup_with, tokens_file,
};
use crate::common::proto;
use proto::session_response::Event;
use tonic::Code;

const MULTI: &str = "multi-secret";

fn waiting(namespace: &str, name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: namespace.into(),
        name: name.into(),
        holder: holder.into(),
        wait_ms: 20_000,
        ttl_ms: Some(30_000),
        ..Default::default()
    }
}

async fn take(client: &mut Client, namespace: &str, name: &str, holder: &str) {
    let reply = client
        .acquire(proto::AcquireRequest {
            namespace: namespace.into(),
            name: name.into(),
            holder: holder.into(),
            ttl_ms: Some(30_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired, "{name}");
}

async fn queue_len(admin: &mut Client, namespace: &str, name: &str) -> usize {
    admin
        .queue(proto::QueueRequest {
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .requests
        .len()
}

/// A token's waiting Acquire ends UNAUTHENTICATED when the token leaves
/// the file, leaves the queue, and the permit freed later goes to nobody
/// on its behalf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_waiting_acquire_ends_unauthenticated_and_is_never_granted() {
    let s = setup_with(&tokens_file()).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    take(&mut admin, "team-a", "busy", "admin").await;
    let mut team_a = bearer(&s.server, TEAM_A).await;
    let wait = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let result = team_a.acquire(waiting("team-a", "busy", "waiter")).await;
        (result, started.elapsed())
    });
    until_waiting(&mut admin, "team-a", "busy", 1).await;

    replace_tokens_file(&s.path, &without_team_a());
    let (result, waited) = wait.await.unwrap();
    let status = result.expect_err("the wait ends with an error");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(waited < Duration::from_secs(10), "ended after {waited:?}");
    assert_eq!(queue_len(&mut admin, "team-a", "busy").await, 0);

    the_freed_permit_goes_to_nobody(&mut admin).await;
}

/// The tokens file without team-a's token.
fn without_team_a() -> String {
    tokens_file().replace(&entry("team-a", TEAM_A, "client", r#"["team-a"]"#, ""), "")
}

/// The admin releases team-a/busy; the permit it frees goes to nobody on
/// the revoked waiter's behalf.
async fn the_freed_permit_goes_to_nobody(admin: &mut Client) {
    admin
        .release(proto::ReleaseRequest {
            namespace: "team-a".into(),
            name: "busy".into(),
            holder: "admin".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(holders(admin, "team-a", "busy").await, 0);
}

/// Waits (up to 10 s) until `n` requests wait for the lock.
async fn until_waiting(admin: &mut Client, namespace: &str, name: &str, n: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = admin
            .inspect(proto::InspectRequest {
                namespace: namespace.into(),
                name: name.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if seen.waiters >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: {n} waiters within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A namespace taken from a token: its waiting unary Acquire there ends
/// PERMISSION_DENIED; its session releases the grant it held there (told
/// `lost`, "not permitted") and refuses its waiting acquire there, and
/// goes on in the namespace it keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_taken_from_a_token_ends_its_waits_and_session_grants_there() {
    let multi = |namespaces: &str| entry("multi", MULTI, "client", namespaces, "");
    let file = format!("{}{}", tokens_file(), multi(r#"["team-a", "team-b"]"#));
    let s = setup_with(&file).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    take(&mut admin, "team-a", "busy", "admin").await;
    take(&mut admin, "team-a", "busy-for-session", "admin").await;

    let mut client = bearer(&s.server, MULTI).await;
    let (commands, mut events) = open_session(&mut client).await;
    for (id, namespace, name) in [(1, "team-a", "x"), (2, "team-b", "y")] {
        commands
            .send(session_acquire_command(id, namespace, name))
            .await
            .unwrap();
        let reply = events.message().await.unwrap().unwrap();
        assert!(matches!(reply.event, Some(Event::Acquired(_))), "{reply:?}");
    }
    // The session also waits in team-a.
    commands
        .send(proto::SessionRequest {
            command: Some(proto::session_request::Command::Acquire(
                proto::SessionAcquire {
                    request_id: 3,
                    acquire: Some(waiting("team-a", "busy-for-session", "")),
                },
            )),
        })
        .await
        .unwrap();
    let mut unary = client.clone();
    let wait = tokio::spawn(async move { unary.acquire(waiting("team-a", "busy", "w")).await });
    until_waiting(&mut admin, "team-a", "busy", 1).await;
    until_waiting(&mut admin, "team-a", "busy-for-session", 1).await;

    replace_tokens_file(
        &s.path,
        &format!("{}{}", tokens_file(), multi(r#"["team-b"]"#)),
    );

    let status = wait.await.unwrap().expect_err("the unary wait ends");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // The session: `lost` for team-a/x, and its wait there refused, in
    // either order; then it goes on.
    let (mut lost, mut refused) = (None, None);
    while lost.is_none() || refused.is_none() {
        let next = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("the session tells within 10 s")
            .unwrap()
            .expect("the session goes on");
        match next.event {
            Some(Event::Lost(grant)) => lost = Some(grant),
            Some(Event::Error(e)) => refused = Some(e),
            other => panic!("unexpected {other:?}"),
        }
    }
    let lost = lost.unwrap();
    assert_eq!(
        (
            lost.namespace.as_str(),
            lost.name.as_str(),
            lost.reason.as_str()
        ),
        ("team-a", "x", "not permitted")
    );
    let refused = refused.unwrap();
    assert_eq!(
        (refused.request_id, refused.code),
        (3, Code::PermissionDenied as i32),
        "{refused:?}"
    );
    assert_eq!(
        holders(&mut admin, "team-a", "x").await,
        0,
        "released at once"
    );
    assert_eq!(queue_len(&mut admin, "team-a", "busy").await, 0);
    assert_eq!(queue_len(&mut admin, "team-a", "busy-for-session").await, 0);

    // team-b goes on: its grant is still held, and a new acquire there
    // works.
    assert_eq!(holders(&mut admin, "team-b", "y").await, 1);
    commands
        .send(session_acquire_command(4, "team-b", "z"))
        .await
        .unwrap();
    let reply = events.message().await.unwrap().unwrap();
    assert!(matches!(reply.event, Some(Event::Acquired(_))), "{reply:?}");
    // And team-a is refused from now on.
    commands
        .send(session_acquire_command(5, "team-a", "again"))
        .await
        .unwrap();
    let reply = events.message().await.unwrap().unwrap();
    match reply.event {
        Some(Event::Error(e)) => assert_eq!(e.code, Code::PermissionDenied as i32),
        other => panic!("{other:?}"),
    }
}

/// The same over Connect: a waiting Acquire sent with `curl` ends
/// `unauthenticated` (401) when its token leaves the file, and the permit
/// freed later goes to nobody on its behalf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_waiting_connect_acquire_ends_unauthenticated() {
    let s = setup_with(&tokens_file()).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    take(&mut admin, "team-a", "busy", "admin").await;
    let bearer_header = format!("authorization: Bearer {TEAM_A}");
    let wait = async {
        let started = std::time::Instant::now();
        let body = serde_json::json!({
            "namespace": "team-a", "name": "busy", "holder": "waiter",
            "waitMs": 20000, "ttlMs": "30000",
        });
        let answer =
            super::connect::call(&s.server, "Acquire", body, &["-H", &bearer_header]).await;
        (answer, started.elapsed())
    };
    let revoke = async {
        until_waiting(&mut admin, "team-a", "busy", 1).await;
        replace_tokens_file(&s.path, &without_team_a());
    };
    let ((answer, waited), ()) = tokio::join!(wait, revoke);
    answer.error(401, "unauthenticated");
    assert!(waited < Duration::from_secs(10), "ended after {waited:?}");
    assert_eq!(queue_len(&mut admin, "team-a", "busy").await, 0);

    the_freed_permit_goes_to_nobody(&mut admin).await;
}
