//! Read/write locks (decision 0074, invariant 13) beyond one client: a
//! crashed replica's waiting writer, sessions (resume, the stream's
//! rules), the hand-over (decision 0068), and many clients mixing readers,
//! writers, barging readers and downgrades, checking as they hold the
//! lock that a writer is alone. The single-client rules:
//! `read_write.rs`.

use crate::{common, queue, read_write};

use std::time::Duration;

use common::session::Session;
use common::*;
use proto::{AcquireStatus, LockMode};
use queue::spawn_wait;
use queue::until_queued;
use read_write::{grant_of, granted, inspected, let_go, modes, queued_modes, read, waiting, write};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_replicas_waiting_writer_is_skipped_after_its_request_ttl() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    granted(&mut client, read("doc", "r1")).await;
    let mut replica = TumblerProcess::start(&redis.url(), &[]).await;
    let crashed = spawn_wait(
        replica.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(1_000),
            ..waiting(write("doc", "w"), 60_000)
        },
    );
    until_queued(&mut client, "doc", 1).await;
    // The live waiter's replica looks again at its own request TTL's pace.
    let reader = spawn_wait(
        server.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(1_000),
            ..waiting(read("doc", "r2"), 20_000)
        },
    );
    until_queued(&mut client, "doc", 2).await;
    replica.kill();
    let _ = crashed.await;
    let started = tokio::time::Instant::now();
    let_go(&mut client, "doc", "r1").await;
    // The writer's request lapses within its TTL; the reader behind it
    // is granted then, not at its own wait's end.
    let r2 = grant_of(reader).await;
    assert_eq!(r2.mode(), LockMode::Read);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(queued_modes(&mut client, "doc").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_keeps_its_read_grant_and_token() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, read("doc", "other")).await;
    let mut session = Session::open(&mut client, 800).await;
    let reply = session.acquire(1, read("doc", "")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let grant = reply.grant.unwrap();
    assert_eq!(grant.mode(), LockMode::Read);
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(lost.is_empty(), "{lost:?}");
    let (resumed, opened) = Session::resume(&mut client, &session.id, &session.secret)
        .await
        .expect("resumed within the ttl");
    assert_eq!(opened.grants.len(), 1, "{opened:?}");
    assert_eq!(opened.grants[0].fencing_token, grant.fencing_token);
    resumed.keep_alive().await;
    let (mode, holders) = modes(&mut client, "doc").await;
    assert_eq!(mode, LockMode::Read);
    assert_eq!(holders.len(), 2, "{holders:?}");
    let state = inspected(&mut client, "doc").await;
    assert!(
        (state.holders.iter())
            .any(|h| h.grant.as_ref().unwrap().fencing_token == grant.fencing_token)
    );
    drop(session.commands);
    drop(resumed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_acquire_follows_the_same_mode_rules_on_the_stream() {
    use proto::session_request::Command;
    use proto::session_response::Event;
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, acquire("plain", "p1")).await;
    let mut session = Session::open(&mut client, 5_000).await;
    let cases = [
        (
            proto::AcquireRequest {
                mode: 9,
                ..acquire("doc", "")
            },
            Code::InvalidArgument,
            "mode",
        ),
        (
            proto::AcquireRequest {
                prefer_readers: true,
                ..write("doc", "")
            },
            Code::InvalidArgument,
            "prefer_readers",
        ),
        (read("plain", ""), Code::FailedPrecondition, "plain lock"),
    ];
    for (id, (request, code, words)) in (1..).zip(cases) {
        session
            .send(Command::Acquire(proto::SessionAcquire {
                request_id: id,
                acquire: Some(request),
            }))
            .await;
        match session.next().await {
            Some(Event::Error(error)) => {
                assert_eq!((error.request_id, error.code), (id, code as i32));
                assert!(error.message.contains(words), "{}", error.message);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // The session goes on: a write grant on the stream.
    let reply = session.acquire(10, write("doc", "")).await;
    assert_eq!(reply.grant.unwrap().mode(), LockMode::Write);
    drop(session.commands);
}

/// `service_args` with the hand-over on (decision 0068).
fn hand_over() -> tumbler::config::ServiceArgs {
    tumbler::config::ServiceArgs {
        hand_over: true,
        ..service_args()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hand_over_gives_a_writer_head_then_a_run_of_readers() {
    let server = TestServer::new().args(hand_over()).start().await;
    let mut client = server.client().await;
    granted(&mut client, write("doc", "w1")).await;
    let w2 = spawn_wait(server.client().await, waiting(write("doc", "w2"), 15_000));
    until_queued(&mut client, "doc", 1).await;
    let mut readers = Vec::new();
    for (i, reader) in ["r1", "r2"].into_iter().enumerate() {
        readers.push(spawn_wait(
            server.client().await,
            waiting(read("doc", reader), 15_000),
        ));
        until_queued(&mut client, "doc", i + 2).await;
    }
    // The writer at the head is handed the lock; the readers stay behind.
    let_go(&mut client, "doc", "w1").await;
    let handed = grant_of(w2).await;
    assert_eq!(handed.mode(), LockMode::Write);
    assert_eq!(
        modes(&mut client, "doc").await,
        (LockMode::Write, vec![("w2".to_owned(), LockMode::Write)])
    );
    assert_eq!(queued_modes(&mut client, "doc").await.len(), 2);
    // Its release hands a read permit to each reader in turn.
    let_go(&mut client, "doc", "w2").await;
    let mut tokens = vec![handed.fencing_token];
    for reader in readers {
        let grant = grant_of(reader).await;
        assert_eq!(grant.mode(), LockMode::Read);
        tokens.push(grant.fencing_token);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let (mode, holders) = modes(&mut client, "doc").await;
    assert_eq!((mode, holders.len()), (LockMode::Read, 2));
}

/// Clients loop on one lock with readers, writers, barging readers and
/// downgrades, and check as they hold it that a writer is alone and
/// readers stay within the limit (the counters move only between a grant's
/// reply and its release's request, while the server says it is held).
async fn never_a_writer_beside_anyone(args: tumbler::config::ServiceArgs) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
    let server = TestServer::new().args(args).start().await;
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let mut client = server.client().await;
        let (readers, writers) = (readers.clone(), writers.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("c{i}");
            let mut last_token = 0;
            for round in 0..12u64 {
                let kind = (i + round) % 4;
                let request = match kind {
                    0 | 1 => write("mix", &holder),
                    2 => read("mix", &holder),
                    _ => proto::AcquireRequest {
                        prefer_readers: true,
                        ..read("mix", &holder)
                    },
                };
                let grant = grant_of(spawn_wait(client.clone(), waiting(request, 20_000))).await;
                assert!(grant.fencing_token > last_token);
                last_token = grant.fencing_token;
                let mut writing = grant.mode() == LockMode::Write;
                if writing {
                    assert_eq!(writers.fetch_add(1, SeqCst), 0, "two writers");
                    assert_eq!(readers.load(SeqCst), 0, "a writer beside readers");
                } else {
                    let before = readers.fetch_add(1, SeqCst);
                    assert!(before < 3, "more readers than the limit");
                    assert_eq!(writers.load(SeqCst), 0, "a reader beside a writer");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                if writing && kind == 1 {
                    // Downgrade: counted as a reader from its reply on.
                    readers.fetch_add(1, SeqCst);
                    writers.fetch_sub(1, SeqCst);
                    let grant = granted(&mut client, read("mix", &holder)).await;
                    assert_eq!(grant.fencing_token, last_token);
                    writing = false;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                if writing {
                    writers.fetch_sub(1, SeqCst);
                } else {
                    readers.fetch_sub(1, SeqCst);
                }
                let_go(&mut client, "mix", &holder).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut client = server.client().await;
    let state = inspected(&mut client, "mix").await;
    assert_eq!((state.holders.len(), state.waiters), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_a_writer_beside_anyone_under_contention() {
    never_a_writer_beside_anyone(service_args()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_a_writer_beside_anyone_under_contention_with_the_hand_over() {
    never_a_writer_beside_anyone(hand_over()).await;
}
