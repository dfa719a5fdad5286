//! Sessions: grants kept alive while the stream is open, released when it
//! ends however it ends, and "lost" told to the client.

mod common;

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::session_request::Command;
use proto::session_response::Event;
use proto::{AcquireStatus, SessionRequest};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// A client's side of a session: the command sender and the event stream.
struct Session {
    commands: mpsc::Sender<SessionRequest>,
    events: tonic::Streaming<proto::SessionResponse>,
    id: String,
}

impl Session {
    async fn open(client: &mut LockServiceClient<Channel>, ttl_ms: u64) -> Session {
        let (commands, outbox) = mpsc::channel(16);
        commands
            .send(SessionRequest {
                command: Some(Command::Open(proto::SessionOpen {
                    ttl_ms: Some(ttl_ms),
                })),
            })
            .await
            .unwrap();
        let mut events = client
            .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
            .await
            .unwrap()
            .into_inner();
        let Some(Event::Opened(opened)) = events.message().await.unwrap().unwrap().event else {
            panic!("the first event is not opened");
        };
        assert_eq!(opened.ttl_ms, ttl_ms);
        Session {
            commands,
            events,
            id: opened.session_id,
        }
    }

    async fn send(&self, command: Command) {
        self.commands
            .send(SessionRequest {
                command: Some(command),
            })
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Option<Event> {
        tokio::time::timeout(Duration::from_secs(10), self.events.message())
            .await
            .expect("an event within 10 s")
            .ok()
            .flatten()
            .and_then(|r| r.event)
    }

    async fn acquire(
        &mut self,
        request_id: u64,
        request: proto::AcquireRequest,
    ) -> proto::AcquireResponse {
        self.send(Command::Acquire(proto::SessionAcquire {
            request_id,
            acquire: Some(request),
        }))
        .await;
        match self.next().await {
            Some(Event::Acquired(acquired)) => {
                assert_eq!(acquired.request_id, request_id);
                acquired.response.unwrap()
            }
            other => panic!("expected an acquire reply, got {other:?}"),
        }
    }

    async fn keep_alive(&self) {
        self.send(Command::KeepAlive(proto::SessionKeepAlive {}))
            .await;
    }
}

async fn holder_of(client: &mut LockServiceClient<Channel>, name: &str) -> Option<proto::Grant> {
    let seen = client.inspect(inspect(name)).await.unwrap().into_inner();
    seen.holders.into_iter().next().and_then(|h| h.grant)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_grants_outlive_many_ttls_while_the_stream_is_open() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
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
    let mut released = false;
    for _ in 0..50 {
        if holder_of(&mut client, "long-job").await.is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "closing the session did not release its grant");
}

#[tokio::test]
async fn a_silent_client_loses_its_session_after_one_ttl() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
    let mut client = server.client().await;
    // A long lease would keep the lock for a minute; the silence ends the
    // session (and releases the lock) after one session TTL instead.
    let mut session = Session::open(&mut client, 500).await;
    let reply = session.acquire(1, acquire("silent", "ignored")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    // Send nothing; keep the stream open (the sender stays alive).
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = session.events.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "the session did not end");
    assert!(holder_of(&mut client, "silent").await.is_none());
    drop(session.commands);
}

#[tokio::test]
async fn session_commands_are_validated_and_released_individually() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
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
    let near = TestServer::start(&redis.url()).await;
    let far = TestServer::start(&redis.url()).await;
    // The client is `tumbler hold --session`, its own process, with a 30 s
    // session TTL: only the release on disconnect can hand the lock over
    // quickly.
    let mut holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .args([
            "hold",
            "shared-job",
            "--session",
            "--ttl-ms",
            "30000",
            "--addr",
            &near.endpoint(),
        ])
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
    assert!(line.starts_with("HOLDING shared-job"), "{line}");

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
    let observer = TestServer::start(&redis.url()).await;
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
    let server = TestServer::start(&redis.url()).await;
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
    let redis = start_redis();
    let mut args = service_args();
    args.session_lock_delay_ms = 800;
    let server = TestServer::start_with(&redis.url(), args).await;
    let mut client = server.client().await;

    // Closed on purpose: released at once, delay or not.
    let mut closing = Session::open(&mut client, 30_000).await;
    closing.acquire(1, acquire("polite", "")).await;
    drop(closing.commands);
    while let Ok(Some(_)) = closing.events.message().await {}
    let mut released = false;
    for _ in 0..50 {
        if holder_of(&mut client, "polite").await.is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "a closed session's lock was not released");

    // Died (the client process is killed): the lock stays held for the
    // delay, then frees.
    let mut dying = tokio::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .args([
            "hold",
            "delayed",
            "--session",
            "--ttl-ms",
            "30000",
            "--addr",
            &server.endpoint(),
        ])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(dying.stderr.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut stderr, &mut line)
        .await
        .unwrap();
    assert!(line.starts_with("HOLDING delayed"), "{line}");
    let grant = holder_of(&mut client, "delayed").await.expect("held");
    dying.start_kill().unwrap();
    dying.wait().await.unwrap();
    let mut delayed = None;
    for _ in 0..50 {
        let held = holder_of(&mut client, "delayed")
            .await
            .expect("still held during the delay");
        if held.expires_at_ms < grant.expires_at_ms {
            delayed = Some(held);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let delayed = delayed.expect("the lease was not cut to the lock-delay");
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
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
    let mut client = server.client().await;
    // RUNNING locks held by someone else, so the session's acquires wait.
    let mut holding = tokio::task::JoinSet::new();
    for i in 0..RUNNING {
        let mut client = client.clone();
        holding.spawn(async move {
            let reply = client
                .acquire(acquire(&format!("busy-{i}"), "other"))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired);
        });
    }
    while let Some(done) = holding.join_next().await {
        done.unwrap();
    }

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
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
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

/// Reads a session to its end: the `lost` events on the way, and the
/// status it ended with (OK for a clean end).
async fn until_ended(session: &mut Session) -> (Vec<proto::GrantLost>, tonic::Status) {
    let mut lost = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), session.events.message())
            .await
            .expect("the session ends within 10 s");
        match next {
            Ok(Some(proto::SessionResponse {
                event: Some(Event::Lost(grant)),
            })) => lost.push(grant),
            Ok(Some(_)) => {}
            Ok(None) => return (lost, tonic::Status::ok("")),
            Err(status) => return (lost, status),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_ends_deadline_exceeded_after_telling_its_lost_grants() {
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 500).await;
    let token = session
        .acquire(1, acquire("quiet", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;
    let (lost, status) = until_ended(&mut session).await;
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].name, "quiet");
    assert_eq!(lost[0].fencing_token, token);
    assert_eq!(lost[0].reason, "session ended");
    assert!(holder_of(&mut client, "quiet").await.is_none());
    drop(session.commands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_command_ends_the_session_resource_exhausted_after_its_lost_grants() {
    let redis = start_redis();
    let server = TestServer::start_with(
        &redis.url(),
        tumbler::config::ServiceArgs {
            max_request_bytes: 1024,
            ..service_args()
        },
    )
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
    let (lost, status) = until_ended(&mut session).await;
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
    let redis = start_redis();
    let server = TestServer::start(&redis.url()).await;
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
