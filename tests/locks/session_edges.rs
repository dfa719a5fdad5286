//! How a session's stream ends at its edges: a client that cancels (an
//! HTTP/2 reset) is always a dead client, one that closes is always a
//! closed session, however the two sides' news interleave; a session whose
//! record Redis lost ends NOT_FOUND with every grant reported lost.

use crate::common;

use std::time::Duration;

use common::session::{Session, holder_of};
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
    // And it cannot be resumed.
    let late = Session::resume(&mut client, &session.id, &session.secret).await;
    assert_eq!(late.err().map(|s| s.code()), Some(tonic::Code::NotFound));
}
