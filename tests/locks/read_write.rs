//! Read/write locks (decision 0074, invariant 13): any number of readers
//! up to the lock's limit or one writer, never both; fair order (a reader
//! behind a waiting writer waits behind it) unless `prefer_readers`;
//! downgrade kept, upgrade refused; the mode rule fixed while the lock is
//! held; expiry; bad input on gRPC and Connect. Each test has its own
//! Redis and server. Sessions, a crashed replica, the hand-over and
//! contention: `read_write_load.rs`.

use crate::{common, queue};

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, LockMode, ReleaseStatus};
use queue::{spawn_wait, until_queued};
use tonic::Code;
use tonic::transport::Channel;

/// An acquire of `mode` on a read/write lock of at most 3 readers.
pub(super) fn rw(name: &str, holder: &str, mode: LockMode) -> proto::AcquireRequest {
    proto::AcquireRequest {
        mode: mode as i32,
        limit: Some(3),
        ..acquire(name, holder)
    }
}

pub(super) fn read(name: &str, holder: &str) -> proto::AcquireRequest {
    rw(name, holder, LockMode::Read)
}

pub(super) fn write(name: &str, holder: &str) -> proto::AcquireRequest {
    rw(name, holder, LockMode::Write)
}

/// The same request, waiting up to `wait_ms` in the server.
pub(super) fn waiting(request: proto::AcquireRequest, wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait_ms,
        queue_ttl_ms: Some(60_000),
        ..request
    }
}

pub(super) async fn ask(
    client: &mut LockServiceClient<Channel>,
    request: proto::AcquireRequest,
) -> proto::AcquireResponse {
    client.acquire(request).await.unwrap().into_inner()
}

/// Acquires and expects a new grant: its mode and token.
pub(super) async fn granted(
    client: &mut LockServiceClient<Channel>,
    request: proto::AcquireRequest,
) -> proto::Grant {
    let reply = ask(client, request).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    reply.grant.expect("a grant")
}

pub(super) async fn busy(client: &mut LockServiceClient<Channel>, request: proto::AcquireRequest) {
    let reply = ask(client, request).await;
    assert_eq!(reply.status(), AcquireStatus::NotAcquired, "{reply:?}");
}

pub(super) async fn let_go(client: &mut LockServiceClient<Channel>, name: &str, holder: &str) {
    let reply = client.release(release(name, holder)).await.unwrap();
    assert_eq!(reply.into_inner().status(), ReleaseStatus::Released);
}

pub(super) async fn inspected(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> proto::InspectResponse {
    client.inspect(inspect(name)).await.unwrap().into_inner()
}

/// The lock's mode and its holders with their grants' modes, by holder.
pub(super) async fn modes(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> (LockMode, Vec<(String, LockMode)>) {
    let state = inspected(client, name).await;
    let mut holders: Vec<(String, LockMode)> = (state.holders.iter())
        .map(|h| {
            let grant = h.grant.as_ref().unwrap();
            (grant.holder.clone(), grant.mode())
        })
        .collect();
    holders.sort();
    (state.mode(), holders)
}

/// The waiting requests' holders and modes, in queue order.
pub(super) async fn queued_modes(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> Vec<(String, LockMode)> {
    let reply = client
        .queue(proto::QueueRequest {
            name: name.into(),
            max_entries: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (reply.requests.iter())
        .map(|r| (r.holder.clone(), r.mode()))
        .collect()
}

/// Awaits a background acquire and expects a grant.
pub(super) async fn grant_of(
    task: tokio::task::JoinHandle<Result<proto::AcquireResponse, tonic::Status>>,
) -> proto::Grant {
    let reply = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the waiting acquire ends")
        .unwrap()
        .unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    reply.grant.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_up_to_the_limit_and_a_writer_is_alone() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut tokens = Vec::new();
    for reader in ["r1", "r2", "r3"] {
        let grant = granted(&mut client, read("doc", reader)).await;
        assert_eq!(grant.mode(), LockMode::Read);
        tokens.push(grant.fencing_token);
    }
    // The limit's next reader and any writer wait.
    busy(&mut client, read("doc", "r4")).await;
    busy(&mut client, write("doc", "w1")).await;
    let (mode, holders) = modes(&mut client, "doc").await;
    assert_eq!(mode, LockMode::Read);
    assert_eq!(
        holders,
        vec![
            ("r1".to_owned(), LockMode::Read),
            ("r2".to_owned(), LockMode::Read),
            ("r3".to_owned(), LockMode::Read)
        ]
    );
    // Readers exclude a writer until the last one goes.
    let_go(&mut client, "doc", "r1").await;
    let_go(&mut client, "doc", "r2").await;
    busy(&mut client, write("doc", "w1")).await;
    let_go(&mut client, "doc", "r3").await;
    let writer = granted(&mut client, write("doc", "w1")).await;
    assert_eq!((writer.mode(), writer.slot), (LockMode::Write, 1));
    tokens.push(writer.fencing_token);
    // A writer excludes readers and other writers.
    busy(&mut client, read("doc", "r1")).await;
    busy(&mut client, write("doc", "w2")).await;
    assert_eq!(
        modes(&mut client, "doc").await,
        (LockMode::Write, vec![("w1".to_owned(), LockMode::Write)])
    );
    // Extended, it stays a write grant.
    let extended = client
        .extend(proto::ExtendRequest {
            name: "doc".into(),
            holder: "w1".into(),
            ttl_ms: Some(20_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.grant.unwrap().mode(), LockMode::Write);
    // Its retry is the same grant.
    let again = ask(&mut client, write("doc", "w1")).await;
    assert_eq!(again.status(), AcquireStatus::AlreadyHeld);
    assert_eq!(again.grant.unwrap().fencing_token, writer.fencing_token);
    let_go(&mut client, "doc", "w1").await;
    tokens.push(granted(&mut client, read("doc", "r5")).await.fencing_token);
    let_go(&mut client, "doc", "r5").await;
    tokens.push(granted(&mut client, write("doc", "w2")).await.fencing_token);
    // Tokens rise strictly across read and write grants.
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // The lock's header carries the letter (`w3` while the writer holds).
    let mut conn = redis_conn(server.redis_url()).await;
    let keys = scan_keys(&mut conn, "*:l:doc").await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let header: String = redis::cmd("HGET")
        .arg(&keys[0])
        .arg("_")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(header.starts_with("w3|1|"), "{header}");
    let_go(&mut client, "doc", "w2").await;
    // Nothing lingers once the last holder is gone.
    assert!(scan_keys(&mut conn, "*:doc").await.is_empty());
    let state = inspected(&mut client, "doc").await;
    assert_eq!(
        (state.mode(), state.holders.len(), state.waiters),
        (LockMode::Unspecified, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_a_waiting_writer_waits_behind_it_unless_it_prefers_readers() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let r1 = granted(&mut client, read("doc", "r1")).await;
    let writer = spawn_wait(server.client().await, waiting(write("doc", "w"), 15_000));
    until_queued(&mut client, "doc", 1).await;
    // A fair reader does not pass the waiting writer, though a read
    // permit is free.
    busy(&mut client, read("doc", "r2")).await;
    let reader = spawn_wait(server.client().await, waiting(read("doc", "r3"), 15_000));
    until_queued(&mut client, "doc", 2).await;
    assert_eq!(
        queued_modes(&mut client, "doc").await,
        vec![
            ("w".to_owned(), LockMode::Write),
            ("r3".to_owned(), LockMode::Read)
        ]
    );
    // prefer_readers barges past it.
    let barging = granted(
        &mut client,
        proto::AcquireRequest {
            prefer_readers: true,
            ..read("doc", "r4")
        },
    )
    .await;
    assert_eq!(barging.mode(), LockMode::Read);
    // The writer comes in when the readers are gone; the reader behind it
    // still waits.
    let_go(&mut client, "doc", "r1").await;
    assert_eq!(queued_modes(&mut client, "doc").await.len(), 2);
    let_go(&mut client, "doc", "r4").await;
    let w = grant_of(writer).await;
    assert_eq!(w.mode(), LockMode::Write);
    assert!(w.fencing_token > barging.fencing_token && barging.fencing_token > r1.fencing_token);
    assert_eq!(
        queued_modes(&mut client, "doc").await,
        vec![("r3".to_owned(), LockMode::Read)]
    );
    assert_eq!(modes(&mut client, "doc").await.0, LockMode::Write);
    let_go(&mut client, "doc", "w").await;
    let r3 = grant_of(reader).await;
    assert_eq!(r3.mode(), LockMode::Read);
    assert!(r3.fencing_token > w.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_that_prefers_readers_takes_a_freed_read_permit_past_a_writer() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    for reader in ["r1", "r2", "r3"] {
        granted(&mut client, read("doc", reader)).await;
    }
    let writer = spawn_wait(server.client().await, waiting(write("doc", "w"), 15_000));
    until_queued(&mut client, "doc", 1).await;
    let barging = spawn_wait(
        server.client().await,
        waiting(
            proto::AcquireRequest {
                prefer_readers: true,
                ..read("doc", "r4")
            },
            15_000,
        ),
    );
    until_queued(&mut client, "doc", 2).await;
    // A read permit frees: the barging reader takes it at once (leases
    // are 30 s: no expiry wakes it), the writer still waits.
    let_go(&mut client, "doc", "r1").await;
    let r4 = tokio::time::timeout(Duration::from_secs(5), barging)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(r4.status(), AcquireStatus::Acquired, "{r4:?}");
    assert_eq!(
        queued_modes(&mut client, "doc").await,
        vec![("w".to_owned(), LockMode::Write)]
    );
    for reader in ["r2", "r3", "r4"] {
        let_go(&mut client, "doc", reader).await;
    }
    assert_eq!(grant_of(writer).await.mode(), LockMode::Write);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_a_writer_come_in_together_in_queue_order() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, write("doc", "w")).await;
    let mut readers = Vec::new();
    for (i, reader) in ["r1", "r2", "r3"].into_iter().enumerate() {
        readers.push(spawn_wait(
            server.client().await,
            waiting(read("doc", reader), 15_000),
        ));
        until_queued(&mut client, "doc", i + 1).await;
    }
    let last = spawn_wait(server.client().await, waiting(write("doc", "w2"), 15_000));
    until_queued(&mut client, "doc", 4).await;
    let_go(&mut client, "doc", "w").await;
    let mut tokens = Vec::new();
    for reader in readers {
        tokens.push(grant_of(reader).await.fencing_token);
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "queue order: {tokens:?}"
    );
    assert_eq!(
        queued_modes(&mut client, "doc").await,
        vec![("w2".to_owned(), LockMode::Write)]
    );
    for reader in ["r1", "r2", "r3"] {
        let_go(&mut client, "doc", reader).await;
    }
    assert_eq!(grant_of(last).await.mode(), LockMode::Write);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_asks_read_is_downgraded_and_lets_readers_in() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let writer = granted(&mut client, write("doc", "w")).await;
    let reader = spawn_wait(server.client().await, waiting(read("doc", "r1"), 15_000));
    until_queued(&mut client, "doc", 1).await;
    let downgraded = granted(&mut client, read("doc", "w")).await;
    assert_eq!(downgraded.mode(), LockMode::Read);
    assert_eq!(downgraded.fencing_token, writer.fencing_token);
    assert_eq!(downgraded.slot, writer.slot);
    let r1 = grant_of(reader).await;
    assert!(r1.fencing_token > writer.fencing_token);
    assert_eq!(
        modes(&mut client, "doc").await,
        (
            LockMode::Read,
            vec![
                ("r1".to_owned(), LockMode::Read),
                ("w".to_owned(), LockMode::Read)
            ]
        )
    );
    // Now a reader: asking READ again is the same grant.
    let again = ask(&mut client, read("doc", "w")).await;
    assert_eq!(again.status(), AcquireStatus::AlreadyHeld);
    assert_eq!(again.grant.unwrap().fencing_token, writer.fencing_token);
    // Two grants, two releases: the downgrade is not counted as a grant,
    // but as itself.
    let_go(&mut client, "doc", "w").await;
    let_go(&mut client, "doc", "r1").await;
    let counted = common::wait::wait_for("the counts", Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            let report = client
                .metrics(proto::MetricsRequest::default())
                .await
                .unwrap()
                .into_inner();
            report.overall.filter(|o| o.released >= 2)
        }
    })
    .await;
    assert_eq!(
        (counted.acquired, counted.released, counted.downgraded),
        (2, 2, 1),
        "{counted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_asks_write_is_refused_and_keeps_its_read_grant() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let r1 = granted(&mut client, read("doc", "r1")).await;
    let refused = client.acquire(write("doc", "r1")).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("upgrade"),
        "{}",
        refused.message()
    );
    let state = inspected(&mut client, "doc").await;
    assert_eq!(state.mode(), LockMode::Read);
    let held = state.holders[0].grant.as_ref().unwrap();
    assert_eq!(
        (held.holder.as_str(), held.fencing_token, held.mode()),
        ("r1", r1.fencing_token, LockMode::Read)
    );
    // Release, then WRITE: granted.
    let_go(&mut client, "doc", "r1").await;
    assert_eq!(
        granted(&mut client, write("doc", "r1")).await.mode(),
        LockMode::Write
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mode_rule_is_fixed_while_the_lock_is_held_or_waited_for() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // A plain lock refuses read/write requests, its holder's too.
    granted(&mut client, acquire("plain", "p1")).await;
    for request in [read("plain", "r1"), write("plain", "p1")] {
        let refused = client.acquire(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(
            refused.message().contains("plain lock"),
            "{}",
            refused.message()
        );
    }
    // A read/write lock refuses plain requests while held, and while only
    // waited for by a writer behind a reader.
    granted(&mut client, read("rw", "r1")).await;
    let writer = spawn_wait(server.client().await, waiting(write("rw", "w"), 15_000));
    until_queued(&mut client, "rw", 1).await;
    for request in [acquire("rw", "p2"), acquire("rw", "r1")] {
        let refused = client.acquire(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(
            refused.message().contains("read/write lock"),
            "{}",
            refused.message()
        );
    }
    // Once the lock is gone, either kind is accepted.
    let_go(&mut client, "plain", "p1").await;
    assert_eq!(
        granted(&mut client, write("plain", "w9")).await.mode(),
        LockMode::Write
    );
    let_go(&mut client, "rw", "r1").await;
    grant_of(writer).await;
    let_go(&mut client, "rw", "w").await;
    let plain = granted(&mut client, acquire("rw", "p2")).await;
    assert_eq!(plain.mode(), LockMode::Unspecified);
    assert_eq!(
        inspected(&mut client, "rw").await.mode(),
        LockMode::Unspecified
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_writer_lets_the_waiting_readers_in() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let writer = granted(
        &mut client,
        proto::AcquireRequest {
            ttl_ms: Some(300),
            ..write("doc", "w")
        },
    )
    .await;
    let first = spawn_wait(server.client().await, waiting(read("doc", "r1"), 15_000));
    until_queued(&mut client, "doc", 1).await;
    let second = spawn_wait(server.client().await, waiting(read("doc", "r2"), 15_000));
    until_queued(&mut client, "doc", 2).await;
    let (r1, r2) = (grant_of(first).await, grant_of(second).await);
    assert!(r1.fencing_token > writer.fencing_token && r2.fencing_token > r1.fencing_token);
    let (mode, holders) = modes(&mut client, "doc").await;
    assert_eq!((mode, holders.len()), (LockMode::Read, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_modes_are_invalid_arguments_on_grpc_and_connect() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let cases = [
        (
            proto::AcquireRequest {
                mode: 7,
                ..acquire("doc", "a")
            },
            "mode",
        ),
        (
            proto::AcquireRequest {
                prefer_readers: true,
                ..write("doc", "a")
            },
            "prefer_readers",
        ),
        (
            proto::AcquireRequest {
                prefer_readers: true,
                ..acquire("doc", "a")
            },
            "prefer_readers",
        ),
    ];
    for (request, field) in cases {
        let refused = client.acquire(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().starts_with(field),
            "{}",
            refused.message()
        );
    }
    // The same answers through Connect's JSON.
    for (body, field) in [
        (
            r#"{"name":"doc","holder":"a","mode":"LOCK_MODE_WRITE","preferReaders":true}"#,
            "prefer_readers",
        ),
        (r#"{"name":"doc","holder":"a","mode":7}"#, "mode"),
    ] {
        http::assert_connect_acquire_invalid(&server.endpoint(), body, field).await;
    }
    // Nothing was taken: a read is granted with the max limit when absent.
    let grant = granted(
        &mut client,
        proto::AcquireRequest {
            mode: LockMode::Read as i32,
            ..acquire("doc", "a")
        },
    )
    .await;
    assert_eq!(grant.mode(), LockMode::Read);
    let limit = inspected(&mut client, "doc").await.limit;
    assert!(limit > 1, "{limit}");
}
