//! How a session's stream ends at its edges: a client that cancels (an
//! HTTP/2 reset) is always a dead client, one that closes is always a
//! closed session, however the two sides' news interleave; a session whose
//! record Redis lost ends NOT_FOUND with every grant reported lost.
//! Commands on one lock run in the order they were sent, answered or not.

use crate::common;

use std::time::Duration;

use common::session::{Session, holder_of};
use common::wait::wait_until_async;
use common::*;

const ROUNDS: usize = 50;
const LOCK_DELAY_MS: u64 = 5_000;

/// A Session stream spoken in raw HTTP/2, so that it can be cancelled as
/// grpcio's `call.cancel()` and a Go context cancel do: an RST_STREAM
/// (CANCEL) with no end of stream before it.
struct RawSession {
    send: h2::SendStream<tonic::codegen::Bytes>,
    body: h2::RecvStream,
    buffer: Vec<u8>,
}

impl RawSession {
    /// Opens a session (30 s TTL) and acquires `name` in it.
    async fn open_holding(addr: std::net::SocketAddr, name: &str) -> RawSession {
        use proto::session_request::Command;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = tonic::codegen::http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/tumbler.v1.LockService/Session"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        send_command(
            &mut send,
            Command::Open(proto::SessionOpen {
                ttl_ms: Some(30_000),
                ..Default::default()
            }),
        );
        let mut session = RawSession {
            send,
            body: response.await.unwrap().into_body(),
            buffer: Vec::new(),
        };
        assert!(matches!(
            session.message().await.event,
            Some(proto::session_response::Event::Opened(_))
        ));
        session.command(Command::Acquire(proto::SessionAcquire {
            request_id: 1,
            acquire: Some(acquire(name, "")),
        }));
        assert!(matches!(
            session.message().await.event,
            Some(proto::session_response::Event::Acquired(_))
        ));
        session
    }

    fn command(&mut self, command: proto::session_request::Command) {
        send_command(&mut self.send, command);
    }

    async fn message(&mut self) -> proto::SessionResponse {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes(self.buffer[1..5].try_into().unwrap()) as usize;
                if self.buffer.len() >= 5 + len {
                    let message: Vec<u8> = self.buffer.drain(..5 + len).skip(5).collect();
                    return prost::Message::decode(message.as_slice()).unwrap();
                }
            }
            let data = self.body.data().await.expect("a message").unwrap();
            let _ = self.body.flow_control().release_capacity(data.len());
            self.buffer.extend_from_slice(&data);
        }
    }

    /// Cancels the stream: RST_STREAM (CANCEL), nothing before it.
    fn cancel(mut self) {
        self.send.send_reset(h2::Reason::CANCEL);
    }
}

/// One gRPC message (uncompressed, length-prefixed) on a raw stream.
fn send_command(
    send: &mut h2::SendStream<tonic::codegen::Bytes>,
    command: proto::session_request::Command,
) {
    let message = prost::Message::encode_to_vec(&proto::SessionRequest {
        command: Some(command),
    });
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    send.send_data(frame.into(), false).unwrap();
}

/// 50 sessions cancelled (RST_STREAM CANCEL, as other languages' clients
/// cancel a call) all end as dead clients: the lock-delay is applied to
/// every grant (its lease becomes the delay), none is released at once.
/// 50 sessions closed (request side ended, reading to the end) all end OK
/// with their grants released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_is_always_a_dead_client_and_a_closed_one_always_closed() {
    let mut args = service_args();
    args.session_lock_delay_ms = LOCK_DELAY_MS;
    let server = TestServer::new().args(args).start().await;
    let mut client = server.client().await;

    let mut cancelled = Vec::new();
    let mut closed = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("cancel-{i}");
        cancelled.push((RawSession::open_holding(server.addr, &name).await, name));
        let mut session = Session::open(&mut client, 30_000).await;
        let name = format!("close-{i}");
        session.acquire(1, acquire(&name, "")).await;
        closed.push((session, name));
    }
    let mut names = Vec::new();
    for (session, name) in cancelled {
        session.cancel();
        names.push(name);
    }
    // Close: the command side ends, the events are read to the end.
    let mut ends = tokio::task::JoinSet::new();
    for (mut session, name) in closed {
        ends.spawn(async move {
            let (closed, _) = tokio::sync::mpsc::channel(1);
            drop(std::mem::replace(&mut session.commands, closed));
            let (lost, status) = session.until_ended().await;
            (name, lost, status)
        });
    }
    while let Some(end) = ends.join_next().await {
        let (name, lost, status) = end.unwrap();
        assert_eq!(status.code(), tonic::Code::Ok, "{name}: {status:?}");
        assert!(lost.is_empty(), "{name}: {lost:?}");
        assert!(
            holder_of(&mut client, &name).await.is_none(),
            "{name} released at once"
        );
    }

    // Every cancelled session's grant was cut to the lock-delay (the dead
    // client's path) once the resume grace passed; none was released.
    for name in &names {
        let mut delayed = None;
        for _ in 0..100 {
            match holder_of(&mut client, name).await {
                Some(grant) if grant.ttl_ms == LOCK_DELAY_MS => {
                    delayed = Some(grant);
                    break;
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                None => panic!("{name}: released at once, as a closed session"),
            }
        }
        assert!(delayed.is_some(), "{name}: the lock-delay was not applied");
    }
}

/// Redis loses its data (FLUSHALL) under an open session: the stream ends
/// NOT_FOUND and the client is told every grant lost (not ABORTED as if
/// another stream had resumed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_record_redis_lost_ends_not_found_with_its_grants_lost() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 600).await;
    for (id, name) in [(1, "flushed-1"), (2, "flushed-2")] {
        session.acquire(id, acquire(name, "")).await;
    }
    let mut conn = redis_conn(server.redis_url()).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();

    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let mut names: Vec<&str> = lost.iter().map(|l| l.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["flushed-1", "flushed-2"], "{lost:?}");
    // And it cannot be resumed. (Meanwhile the replica may answer
    // UNAVAILABLE: with the key layout's marker flushed too, it serves
    // again only once it has checked the layout anew.)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let late = loop {
        let late = Session::resume(&mut client, &session.id, &session.secret).await;
        match late {
            Err(status)
                if status.code() == tonic::Code::Unavailable
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            late => break late.err(),
        }
    };
    assert_eq!(
        late.as_ref().map(|s| s.code()),
        Some(tonic::Code::NotFound),
        "{late:?}"
    );
}

fn release_command(request_id: u64, name: &str) -> proto::session_request::Command {
    proto::session_request::Command::Release(proto::SessionRelease {
        request_id,
        namespace: "default".into(),
        name: name.into(),
        names: Vec::new(),
    })
}

fn acquire_command(
    request_id: u64,
    request: proto::AcquireRequest,
) -> proto::session_request::Command {
    proto::session_request::Command::Acquire(proto::SessionAcquire {
        request_id,
        acquire: Some(request),
    })
}

/// Reads `n` events; the answers by request id (Acquired / Released /
/// Error as text).
async fn answers(session: &mut Session, n: usize) -> std::collections::BTreeMap<u64, String> {
    use proto::session_response::Event;
    let mut by_id = std::collections::BTreeMap::new();
    while by_id.len() < n {
        match session.next().await {
            Some(Event::Acquired(a)) => {
                let granted = a.response.is_some_and(|r| r.grant.is_some());
                by_id.insert(a.request_id, format!("acquired {granted}"));
            }
            Some(Event::Released(r)) => {
                let status = r.response.unwrap().status();
                by_id.insert(r.request_id, format!("{status:?}"));
            }
            Some(Event::Error(e)) => {
                by_id.insert(
                    e.request_id,
                    format!("error {:?}", tonic::Code::from(e.code)),
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    by_id
}

/// Commands on one lock, sent without waiting for answers, take effect in
/// the order they were sent: release-then-acquire ends held, and
/// acquire-then-release ends free, every time (run concurrently they
/// could swap). A release sent behind a waiting acquire of its lock stops
/// that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_one_lock_take_effect_in_the_order_sent() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 10_000).await;
    for round in 0..ROUNDS as u64 {
        let name = format!("ordered-{round}");
        let id = round * 10;
        session.send(release_command(id + 1, &name)).await;
        session
            .send(acquire_command(id + 2, acquire(&name, "")))
            .await;
        let got = answers(&mut session, 2).await;
        assert_eq!(got[&(id + 1)], "NotHeld", "round {round}: {got:?}");
        assert_eq!(got[&(id + 2)], "acquired true", "round {round}: {got:?}");
        let grant = holder_of(&mut client, &name).await;
        assert_eq!(
            grant.map(|g| g.holder),
            Some(session.id.clone()),
            "round {round}"
        );

        session.send(release_command(id + 3, &name)).await;
        session
            .send(acquire_command(id + 4, acquire(&name, "")))
            .await;
        session.send(release_command(id + 5, &name)).await;
        let got = answers(&mut session, 3).await;
        assert_eq!(
            [&got[&(id + 3)], &got[&(id + 4)], &got[&(id + 5)]],
            ["Released", "acquired true", "Released"],
            "round {round}"
        );
        assert!(
            holder_of(&mut client, &name).await.is_none(),
            "round {round}"
        );
    }

    // Another holder has the lock; the session waits for it, then
    // releases it: the wait stops at once, nothing stays queued.
    let name = "ordered-busy";
    let taken = client
        .acquire(acquire(name, "other"))
        .await
        .unwrap()
        .into_inner();
    assert!(taken.grant.is_some());
    let waiting = proto::AcquireRequest {
        wait_ms: 30_000,
        ..acquire(name, "")
    };
    session.send(acquire_command(901, waiting)).await;
    let queued = |mut client: proto::lock_service_client::LockServiceClient<_>| async move {
        let queue = client
            .queue(proto::QueueRequest {
                namespace: "default".into(),
                name: name.into(),
                max_entries: 5,
            })
            .await
            .unwrap()
            .into_inner();
        queue.waiters
    };
    wait_until_async(
        "the session's acquire waits",
        Duration::from_secs(10),
        || {
            let client = client.clone();
            async move { queued(client).await == 1 }
        },
    )
    .await;
    let started = std::time::Instant::now();
    session.send(release_command(902, name)).await;
    let got = answers(&mut session, 2).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(got[&901], "error Cancelled", "{got:?}");
    assert_eq!(got[&902], "NotHeld", "{got:?}");
    assert_eq!(queued(client.clone()).await, 0, "still queued");
}
