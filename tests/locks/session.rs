//! Sessions: grants kept alive while the stream is open, released when it
//! ends however it ends, and "lost" told to the client.

use crate::common;

use std::time::Duration;

use common::session::{Session, holder_of};
use common::wait::{wait_for, wait_until_async};
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::session_request::Command;
use proto::session_response::Event;
use proto::{AcquireStatus, SessionRequest};
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_grants_outlive_many_ttls_while_the_stream_is_open() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 300).await;
    let reply = session.acquire(1, acquire("long-job", "ignored")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let grant = reply.grant.unwrap();
    assert_eq!(grant.holder, session.id, "the session id is the holder");
    assert_eq!(grant.ttl_ms, 300, "the lease is the session ttl");

    // Five TTLs later it is still held, with the same token, renewed.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        session.keep_alive().await;
    }
    if let Ok(Ok(Some(event))) =
        tokio::time::timeout(Duration::from_millis(10), session.events.message()).await
    {
        panic!("unexpected event while holding: {event:?}");
    }
    let held = holder_of(&mut client, "long-job")
        .await
        .expect("still held");
    assert_eq!(held.fencing_token, grant.fencing_token);
    assert!(held.expires_at_ms > grant.expires_at_ms + 1000, "renewed");
    let busy = client
        .acquire(acquire("long-job", "other"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.status(), AcquireStatus::NotAcquired);

    // Closing the stream releases at once.
    drop(session.commands);
    while session.events.message().await.ok().flatten().is_some() {}
    let released = || {
        let mut client = client.clone();
        async move { holder_of(&mut client, "long-job").await.is_none() }
    };
    wait_until_async(
        "closing the session releases its grant",
        Duration::from_secs(5),
        released,
    )
    .await;
}

/// A silent client (a hung process, a network blip) is not a dead one:
/// its stream ends after one session TTL, but its grants live on for one
/// more TTL, unrenewed, in case it resumes; then they expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_clients_grants_outlive_its_stream_by_one_ttl_then_expire() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 500).await;
    let token = session
        .acquire(1, acquire("silent", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;
    // Send nothing; keep the stream open (the sender stays alive).
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(lost.is_empty(), "nothing is lost yet: {lost:?}");
    let held = holder_of(&mut client, "silent").await.expect("kept");
    assert_eq!(
        (held.holder.as_str(), held.fencing_token),
        (session.id.as_str(), token)
    );
    // Nobody renews it any more: it expires within one TTL.
    let freed = || {
        let mut client = client.clone();
        async move { holder_of(&mut client, "silent").await.is_none() }
    };
    wait_until_async(
        "the silent session's grant expires",
        Duration::from_secs(5),
        freed,
    )
    .await;
    drop(session.commands);
}

#[tokio::test]
async fn session_commands_are_validated_and_released_individually() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 5_000).await;
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 7,
            acquire: Some(proto::AcquireRequest {
                limit: Some(0),
                ..acquire("bad", "")
            }),
        }))
        .await;
    match session.next().await {
        Some(Event::Error(error)) => {
            assert_eq!(error.request_id, 7);
            assert_eq!(error.code, tonic::Code::InvalidArgument as i32);
            assert!(error.message.starts_with("limit"), "{}", error.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // The session goes on: two locks, one released by command.
    session.acquire(8, acquire("first", "")).await;
    session.acquire(9, acquire("second", "")).await;
    session
        .send(Command::Release(proto::SessionRelease {
            request_id: 10,
            namespace: String::new(),
            name: "first".into(),
            names: Vec::new(),
        }))
        .await;
    match session.next().await {
        Some(Event::Released(released)) => {
            assert_eq!(released.request_id, 10);
            assert_eq!(
                released.response.unwrap().status(),
                proto::ReleaseStatus::Released
            );
        }
        other => panic!("expected a release reply, got {other:?}"),
    }
    assert!(holder_of(&mut client, "first").await.is_none());
    assert!(holder_of(&mut client, "second").await.is_some());

    // A stream that does not start with open is refused.
    let (commands, outbox) = mpsc::channel(1);
    commands
        .send(SessionRequest {
            command: Some(Command::KeepAlive(proto::SessionKeepAlive {})),
        })
        .await
        .unwrap();
    let err = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_process_releases_its_lock_to_a_waiter_on_another_replica() {
    let redis = start_redis();
    let near = TestServer::new().redis(&redis.url()).start().await;
    let far = TestServer::new().redis(&redis.url()).start().await;
    // The client is `tumbler hold --session`, its own process, with a 30 s
    // session TTL: only the release on disconnect can hand the lock over
    // quickly.
    let mut holder = hold_in_session(&near, "shared-job").await;

    let mut waiter = far.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                wait_ms: 3_000,
                ..acquire("shared-job", "next")
            })
            .await
    });
    let mut client = far.client().await;
    until_waiters(&mut client, "shared-job", 1).await;
    holder.start_kill().unwrap();
    holder.wait().await.unwrap();
    let reply = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_of_a_killed_replica_expire_at_their_ttl_and_are_never_renewed_again() {
    let redis = start_redis();
    let observer = TestServer::new().redis(&redis.url()).start().await;
    let mut client = observer.client().await;
    let mut replica = TumblerProcess::start(&redis.url(), &[]).await;
    let mut remote = replica.client().await;
    let mut session = Session::open(&mut remote, 600).await;
    session.acquire(1, acquire("orphaned", "")).await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        session.keep_alive().await;
    }
    replica.kill();
    let last = holder_of(&mut client, "orphaned")
        .await
        .expect("held at the kill");
    // No renewal after the replica died: the expiry never moves again, and
    // the lock frees at it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(still) = holder_of(&mut client, "orphaned").await {
        assert_eq!(
            still.expires_at_ms, last.expires_at_ms,
            "renewed after the replica died"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(holder_of(&mut client, "orphaned").await.is_none());
    let next = client
        .acquire(acquire("orphaned", "next"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.status(), AcquireStatus::Acquired);
    assert!(next.grant.unwrap().acquired_at_ms >= last.expires_at_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_longer_than_the_ttl_tells_the_client_its_grant_is_lost() {
    let mut redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 600).await;
    let grant = session
        .acquire(1, acquire("fragile", ""))
        .await
        .grant
        .unwrap();
    redis.kill();
    let lost = loop {
        session.keep_alive().await;
        match tokio::time::timeout(Duration::from_millis(100), session.events.message()).await {
            Ok(Ok(Some(proto::SessionResponse {
                event: Some(Event::Lost(lost)),
            }))) => break lost,
            Ok(other) => panic!("unexpected: {other:?}"),
            Err(_) => continue,
        }
    };
    assert_eq!(lost.name, "fragile");
    assert_eq!(lost.fencing_token, grant.fencing_token);
    assert_eq!(lost.reason, "redis unavailable");
    redis.restart().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_lock_delay_a_dead_session_keeps_its_lock_for_the_delay() {
    let mut args = service_args();
    args.session_lock_delay_ms = 800;
    let server = TestServer::new().args(args).start().await;
    let mut client = server.client().await;

    // Closed on purpose: released at once, delay or not.
    let mut closing = Session::open(&mut client, 30_000).await;
    closing.acquire(1, acquire("polite", "")).await;
    drop(closing.commands);
    while let Ok(Some(_)) = closing.events.message().await {}
    let released = || {
        let mut client = client.clone();
        async move { holder_of(&mut client, "polite").await.is_none() }
    };
    wait_until_async(
        "a closed session's lock is released",
        Duration::from_secs(5),
        released,
    )
    .await;

    // Died (the client process is killed): the lock stays held for the
    // delay, then frees.
    let mut dying = hold_in_session(&server, "delayed").await;
    let grant = holder_of(&mut client, "delayed").await.expect("held");
    dying.start_kill().unwrap();
    dying.wait().await.unwrap();
    let delayed = wait_for(
        "the lease cut to the lock-delay",
        Duration::from_secs(5),
        || {
            let mut client = client.clone();
            async move {
                let held = holder_of(&mut client, "delayed")
                    .await
                    .expect("still held during the delay");
                (held.expires_at_ms < grant.expires_at_ms).then_some(held)
            }
        },
    )
    .await;
    assert_eq!(delayed.fencing_token, grant.fencing_token);
    assert_eq!(delayed.ttl_ms, 800);
    let next = client
        .acquire(proto::AcquireRequest {
            wait_ms: 5_000,
            ..acquire("delayed", "next")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.status(), AcquireStatus::Acquired);
    assert!(next.grant.unwrap().acquired_at_ms >= delayed.expires_at_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_at_most_1000_commands_at_once() {
    const RUNNING: u64 = 1000;
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // RUNNING locks held by someone else, so the session's acquires wait
    // (taken 50 at a time: a thousand at once only measures how busy the
    // machine is).
    use futures::StreamExt;
    futures::stream::iter(0..RUNNING)
        .for_each_concurrent(50, |i| {
            let mut client = client.clone();
            async move {
                let reply = client
                    .acquire(acquire(&format!("busy-{i}"), "other"))
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(reply.status(), AcquireStatus::Acquired);
            }
        })
        .await;

    let mut session = Session::open(&mut client, 30_000).await;
    for i in 0..RUNNING {
        session
            .send(Command::Acquire(proto::SessionAcquire {
                request_id: i + 1,
                acquire: Some(proto::AcquireRequest {
                    wait_ms: 60_000,
                    ..acquire(&format!("busy-{i}"), "")
                }),
            }))
            .await;
    }
    // One more is refused, and the session goes on.
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: RUNNING + 1,
            acquire: Some(acquire("free", "")),
        }))
        .await;
    match session.next().await {
        Some(Event::Error(error)) => {
            assert_eq!(error.request_id, RUNNING + 1);
            assert_eq!(error.code, tonic::Code::ResourceExhausted as i32);
            assert!(error.message.starts_with("command"), "{}", error.message);
        }
        other => panic!("expected the extra command refused, got {other:?}"),
    }
    until_waiters(&mut client, "busy-0", 1).await;
    // One finishes (its lock is released to it): room for one more.
    client.release(release("busy-0", "other")).await.unwrap();
    match session.next().await {
        Some(Event::Acquired(acquired)) => {
            assert_eq!(acquired.request_id, 1);
            assert_eq!(acquired.response.unwrap().status(), AcquireStatus::Acquired);
        }
        other => panic!("expected the first acquire granted, got {other:?}"),
    }
    let reply = session.acquire(RUNNING + 2, acquire("free", "")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

/// A session's acquire is held to the lock's limit like any other: one of
/// another limit is refused on the stream (FAILED_PRECONDITION naming both
/// limits) and the session goes on.
#[tokio::test]
async fn a_session_acquire_with_another_limit_is_refused_on_the_stream() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("shared", "plain")).await.unwrap();
    let mut session = Session::open(&mut client, 5_000).await;
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 9,
            acquire: Some(proto::AcquireRequest {
                limit: Some(3),
                ..acquire("shared", "")
            }),
        }))
        .await;
    match session.next().await {
        Some(Event::Error(error)) => {
            assert_eq!(error.request_id, 9);
            assert_eq!(error.code, tonic::Code::FailedPrecondition as i32);
            assert!(
                error.message.contains("limit 1") && error.message.contains("limit 3"),
                "{}",
                error.message
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The session still works.
    let reply = session.acquire(10, acquire("other", "")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

/// A silent session ends DEADLINE_EXCEEDED without `lost`, and its client
/// may take it back with its grants (same tokens) on a new stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_ends_deadline_exceeded_and_resumes_with_its_grants() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 800).await;
    let token = session
        .acquire(1, acquire("quiet", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(lost.is_empty(), "{lost:?}");

    let (resumed, opened) = Session::resume(&mut client, &session.id, &session.secret)
        .await
        .expect("resumed within the ttl");
    assert!(opened.resumed);
    assert_eq!(opened.session_id, session.id);
    assert_eq!(opened.ttl_ms, 800, "a resumed session keeps its ttl");
    assert_eq!(opened.grants.len(), 1, "{opened:?}");
    assert_eq!(
        (
            opened.grants[0].name.as_str(),
            opened.grants[0].fencing_token
        ),
        ("quiet", token)
    );
    // Renewed again: held well past the old lease.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        resumed.keep_alive().await;
    }
    let held = holder_of(&mut client, "quiet").await.expect("still held");
    assert_eq!(held.fencing_token, token);
    drop(session.commands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_command_ends_the_session_resource_exhausted_after_its_lost_grants() {
    let server = TestServer::new()
        .args(tumbler::config::ServiceArgs {
            max_request_bytes: 1024,
            ..service_args()
        })
        .start()
        .await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 10_000).await;
    for (id, name) in [(1, "kept-a"), (2, "kept-b")] {
        let reply = session.acquire(id, acquire(name, "")).await;
        assert_eq!(reply.status(), AcquireStatus::Acquired);
    }
    // One command larger than the server reads.
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 3,
            acquire: Some(proto::AcquireRequest {
                metadata: [("blob".to_string(), "x".repeat(4096))].into(),
                ..acquire("too-big", "")
            }),
        }))
        .await;
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let mut names: Vec<&str> = lost.iter().map(|l| l.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["kept-a", "kept-b"]);
    for name in ["kept-a", "kept-b"] {
        assert!(holder_of(&mut client, name).await.is_none(), "{name}");
    }
}

#[tokio::test]
async fn a_session_the_client_closes_ends_ok_without_lost_events() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 10_000).await;
    session.acquire(1, acquire("closing", "")).await;
    let (commands, mut ended) = (session.commands, session.events);
    drop(commands);
    let mut events = Vec::new();
    let end = loop {
        match ended.message().await {
            Ok(Some(event)) => events.push(event),
            Ok(None) => break Ok(()),
            Err(status) => break Err(status),
        }
    };
    assert!(end.is_ok(), "{end:?}");
    assert!(events.is_empty(), "{events:?}");
}

/// A drained replica ends its sessions with UNAVAILABLE and the
/// `tumbler-resume: elsewhere` trailer, keeps their grants, and another
/// replica resumes them with the same tokens and renews them from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_a_draining_replica_resumes_on_another_with_the_same_grants() {
    let redis = start_redis();
    let mut leaving = TestServer::new().redis(&redis.url()).start().await;
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut near = leaving.client().await;
    let mut far = staying.client().await;
    let mut session = Session::open(&mut near, 1_000).await;
    let mut tokens = Vec::new();
    for (id, name) in [(1, "kept-a"), (2, "kept-b")] {
        let grant = session.acquire(id, acquire(name, "")).await.grant.unwrap();
        tokens.push((name.to_owned(), grant.fencing_token));
    }

    leaving.begin_shutdown();
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("tumbler-resume")
            .map(|v| v.to_str().unwrap()),
        Some("elsewhere")
    );
    assert!(lost.is_empty(), "a drain loses nothing: {lost:?}");
    for (name, token) in &tokens {
        let held = holder_of(&mut far, name)
            .await
            .expect("kept through the drain");
        assert_eq!(held.fencing_token, *token);
    }

    let (resumed, opened) = Session::resume(&mut far, &session.id, &session.secret)
        .await
        .unwrap();
    let mut kept: Vec<(String, u64)> = opened
        .grants
        .iter()
        .map(|g| (g.name.clone(), g.fencing_token))
        .collect();
    kept.sort();
    assert_eq!(kept, tokens);
    assert!(opened.lost.is_empty(), "{opened:?}");
    // Renewed by the new replica well past three old leases.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        resumed.keep_alive().await;
    }
    for (name, token) in &tokens {
        let held = holder_of(&mut far, name).await.expect("renewed elsewhere");
        assert_eq!(held.fencing_token, *token);
    }
    // Closing the resumed session ends it for good.
    let mut resumed = resumed;
    let (closed, _) = tokio::sync::mpsc::channel(1);
    drop(std::mem::replace(&mut resumed.commands, closed));
    let (_, status) = resumed.until_ended().await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    for (name, _) in &tokens {
        assert!(holder_of(&mut far, name).await.is_none(), "{name}");
    }
    let again = Session::resume(&mut far, &session.id, &session.secret).await;
    assert_eq!(again.err().map(|s| s.code()), Some(tonic::Code::NotFound));
}

/// A resume with a wrong secret is refused and changes nothing (the
/// session's stream goes on); an unknown or malformed id is refused too.
/// A live session with a wrong secret and an unknown id get the same
/// answer (NOT_FOUND, same message): nobody learns whether an id is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_with_a_wrong_secret_or_unknown_session_is_refused_and_changes_nothing() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 600).await;
    let token = session
        .acquire(1, acquire("mine", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;

    let wrong = "0".repeat(64);
    let refused = Session::resume(&mut client, &session.id, &wrong)
        .await
        .err()
        .expect("a wrong secret is refused");
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    let unknown = Session::resume(&mut client, "session-0000", &session.secret)
        .await
        .err()
        .expect("an unknown id is refused");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert_eq!(refused.message(), unknown.message());
    for (id, secret, field) in [
        (
            "not-a-session",
            session.secret.as_str(),
            "resume.session_id",
        ),
        (session.id.as_str(), "short", "resume.secret"),
    ] {
        let status = Session::resume(&mut client, id, secret)
            .await
            .err()
            .unwrap();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }

    // The session was not taken over: it goes on renewing its grant.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        session.keep_alive().await;
    }
    let held = holder_of(&mut client, "mine").await.expect("still held");
    assert_eq!(held.fencing_token, token);
    let reply = session.acquire(2, acquire("also-mine", "")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

/// A stream that breaks (its connection closes without the stream being
/// closed: the client's process died, or a proxy dropped it) is a dead
/// client's, unless the session is resumed at once: a client whose
/// connection a proxy dropped reconnects and keeps its grants; one that
/// does not come back frees them within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_keeps_its_grants_only_for_a_prompt_resume() {
    let server = TestServer::new().start().await;
    let mut direct = server.client().await;
    let proxy = common::proxy::CuttableProxy::start(server.addr).await;
    let mut through_proxy = LockServiceClient::connect(proxy.endpoint()).await.unwrap();

    // Cut and resumed at once: kept.
    let mut session = Session::open(&mut through_proxy, 10_000).await;
    let token = session
        .acquire(1, acquire("proxied", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;
    proxy.cut();
    let (resumed, opened) = Session::resume(&mut direct, &session.id, &session.secret)
        .await
        .unwrap();
    assert_eq!(opened.grants.len(), 1, "{opened:?}");
    assert_eq!(opened.grants[0].fencing_token, token);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let held = holder_of(&mut direct, "proxied").await.expect("kept");
    assert_eq!(held.fencing_token, token);
    drop(resumed);
    drop(session);

    // Cut and never resumed: freed within a second, though the lease is
    // ten seconds.
    let mut through_proxy = LockServiceClient::connect(proxy.endpoint()).await.unwrap();
    let mut session = Session::open(&mut through_proxy, 10_000).await;
    session.acquire(1, acquire("abandoned", "")).await;
    let cut = std::time::Instant::now();
    proxy.cut();
    let freed = wait_for(
        "a dead client's grant released",
        Duration::from_secs(5),
        || {
            let mut direct = direct.clone();
            async move {
                let gone = holder_of(&mut direct, "abandoned").await.is_none();
                gone.then(|| cut.elapsed())
            }
        },
    )
    .await;
    assert!(
        freed < Duration::from_millis(1_500),
        "freed after {freed:?}"
    );
    drop(session);
}

/// Waiting Acquires of a draining replica answer UNAVAILABLE but keep
/// their places: retried on another replica (same holders) in any order,
/// they are granted in their original order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_draining_replica_keep_their_place_in_line() {
    let redis = start_redis();
    let mut leaving = TestServer::new().redis(&redis.url()).start().await;
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut far = staying.client().await;
    far.acquire(acquire("line", "first")).await.unwrap();
    let waiting_request = |holder: &str| proto::AcquireRequest {
        wait_ms: 20_000,
        queue_ttl_ms: Some(5_000),
        ..acquire("line", holder)
    };
    let mut waits = Vec::new();
    for holder in ["w1", "w2", "w3"] {
        let mut near = leaving.client().await;
        let request = waiting_request(holder);
        waits.push(tokio::spawn(async move { near.acquire(request).await }));
        until_waiters(&mut far, "line", waits.len() as u32).await;
    }
    leaving.begin_shutdown();
    for wait in waits {
        let status = wait.await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    // Still queued, in order.
    let queue = far
        .queue(proto::QueueRequest {
            namespace: String::new(),
            name: "line".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let order: Vec<&str> = queue.requests.iter().map(|r| r.holder.as_str()).collect();
    assert_eq!(order, ["w1", "w2", "w3"]);

    // Retried elsewhere, last first.
    let mut retries = Vec::new();
    for holder in ["w3", "w2", "w1"] {
        let mut client = staying.client().await;
        let request = waiting_request(holder);
        retries.push((
            holder,
            tokio::spawn(async move { client.acquire(request).await }),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut granted = Vec::new();
    far.release(release("line", "first")).await.unwrap();
    let mut retries: Vec<_> = retries.into_iter().collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !retries.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "granted only {granted:?} within 30 s"
        );
        let holder = holder_of(&mut far, "line").await;
        if let Some(grant) = holder
            && granted.last() != Some(&grant.holder)
        {
            granted.push(grant.holder.clone());
            retries.retain(|(h, _)| *h != grant.holder);
            far.release(release("line", &grant.holder)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(granted, ["w1", "w2", "w3"]);
}

/// A session whose TTL passed with nobody serving it is over: its resume
/// is refused NOT_FOUND, and its grants are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_left_past_its_ttl_cannot_be_resumed() {
    let redis = start_redis();
    let mut leaving = TestServer::new().redis(&redis.url()).start().await;
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut near = leaving.client().await;
    let mut far = staying.client().await;
    let mut session = Session::open(&mut near, 300).await;
    session.acquire(1, acquire("left", "")).await;
    leaving.begin_shutdown();
    let (_, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // Past the TTL it is over, though its record lingers (for a late
    // stream to learn it moved): NOT_FOUND, not a resume with every grant
    // lost.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(holder_of(&mut far, "left").await.is_none());
    let mut conn = redis_conn(&redis.url()).await;
    let records = scan_keys(&mut conn, "*:s:{session-*").await;
    assert_eq!(records.len(), 1, "the record still lingers: {records:?}");
    let late = Session::resume(&mut far, &session.id, &session.secret).await;
    assert_eq!(late.err().map(|s| s.code()), Some(tonic::Code::NotFound));
}

/// `tumbler hold NAME --session` (a 30 s session TTL), its own process,
/// once it says it holds the lock.
async fn hold_in_session(server: &TestServer, name: &str) -> tokio::process::Child {
    let mut holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .args(["hold", name, "--session", "--ttl-ms", "30000"])
        .args(["--addr", &server.endpoint()])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(holder.stderr.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut stderr, &mut line)
        .await
        .unwrap();
    assert!(line.starts_with(&format!("HOLDING {name}")), "{line}");
    // The rest of its stderr is drained, so that its later lines neither
    // fill the pipe nor meet a closed one.
    tokio::spawn(async move { tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await });
    holder
}
