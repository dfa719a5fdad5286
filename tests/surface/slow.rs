//! Slow request bodies, on loopback with a real Redis and auth on:
//! requests whose headers arrive and whose message does not (an HTTP body
//! that trickles, a gRPC call that sends HEADERS and no DATA) are cut
//! after `--body-read-timeout-ms` (408 and a closed connection; gRPC
//! DEADLINE_EXCEEDED and the stream reset; a Connect call on the gRPC port
//! the same code, Connect's 504; a gRPC-Web call grpc-status 4 too), and,
//! with the connection caps
//! filled by such tricklers from several addresses, `/healthz`, gRPC
//! health and authenticated Acquires are still answered at once.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::ServiceArgs;

const TOKEN: &str = "good-token";

fn tokens() -> String {
    token_entry("ops", TOKEN, "admin", "[\"*\"]", "")
}

/// Caps, long header and idle timeouts (only the body-read timeout can
/// cut the tricklers), and `body_ms` for the body.
fn args(max_connections: u32, per_ip: u32, body_ms: u64) -> ServiceArgs {
    ServiceArgs {
        max_connections: Some(max_connections),
        max_connections_per_ip: per_ip,
        header_read_timeout_ms: 60_000,
        idle_timeout_ms: 60_000,
        body_read_timeout_ms: body_ms,
        ..service_args()
    }
}

/// The gRPC port's address (`http://127.0.0.1:…`).
fn grpc_addr(endpoint: &str) -> SocketAddr {
    endpoint.trim_start_matches("http://").parse().unwrap()
}

async fn server(args: ServiceArgs) -> TestServer {
    TestServer::new()
        .auth(&tokens())
        .args(args)
        .http()
        .start()
        .await
}

/// What an HTTP trickler posts.
#[derive(Clone, Copy)]
enum Post {
    Login,
    Connect,
    /// A gRPC-Web Acquire (binary): a 32-byte message announced.
    GrpcWeb,
}

/// How a trickler's request ended, and when (since it was sent).
#[derive(Debug)]
enum Ended {
    /// An HTTP status (408 expected) then EOF.
    Http(u16),
    /// A gRPC status.
    Grpc(Code),
    /// The connection was closed with no answer (closed to make room).
    Closed,
}

/// A gRPC call to `method` from `from` with the token, on its own
/// connection, whose request stream never yields a message: HEADERS, then
/// nothing. Resolves when the server ends it.
async fn grpc_trickler(
    endpoint: String,
    from: [u8; 4],
    method: &'static str,
) -> tokio::task::JoinHandle<(Ended, Duration)> {
    let channel = Endpoint::from_shared(endpoint)
        .unwrap()
        .local_address(Some(IpAddr::from(from)))
        .connect()
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let mut request = tonic::Request::new(futures::stream::pending::<proto::AcquireRequest>());
        let value = format!("Bearer {TOKEN}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
        let codec =
            tonic_prost::ProstCodec::<proto::AcquireRequest, proto::AcquireResponse>::default();
        let path = ::http::uri::PathAndQuery::from_static(method);
        let sent = Instant::now();
        let ended = match grpc.streaming(request, path, codec).await {
            Err(status) if status.code() == Code::Unavailable || status.code() == Code::Unknown => {
                Ended::Closed
            }
            Err(status) => Ended::Grpc(status.code()),
            Ok(response) => match response.into_inner().next().await {
                Some(Err(status)) => Ended::Grpc(status.code()),
                other => panic!("{method}: answered {other:?}"),
            },
        };
        (ended, sent.elapsed())
    })
}

/// A POST from `from` whose body (100 bytes announced) comes a byte every
/// 200 ms: a dashboard login (`Login`) or a Connect Acquire on the gRPC
/// port (`Connect`). Resolves when the server answers or closes.
async fn http_trickler(
    to: SocketAddr,
    from: [u8; 4],
    post: Post,
) -> tokio::task::JoinHandle<(Ended, Duration)> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    let mut stream = socket.connect(to).await.unwrap();
    tokio::spawn(async move {
        let (path, content_type, start) = match post {
            Post::Login => (
                "/dashboard/login",
                "application/x-www-form-urlencoded",
                "token=",
            ),
            Post::Connect => (
                "/tumbler.v1.LockService/Acquire",
                "application/json",
                "{\"name\": \"",
            ),
            Post::GrpcWeb => (
                "/tumbler.v1.LockService/Acquire",
                "application/grpc-web+proto",
                "\0\0\0\0\x20\x0a",
            ),
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {to}\r\nContent-Type: {content_type}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{start}"
        );
        let sent = Instant::now();
        if stream.write_all(head.as_bytes()).await.is_err() {
            return (Ended::Closed, sent.elapsed());
        }
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => reply.extend_from_slice(&buf[..n]),
                Err(_) => {
                    // Still open: one more byte (a write error means closed).
                    if stream.write_all(b"x").await.is_err() {
                        break;
                    }
                }
            }
        }
        let took = sent.elapsed();
        let reply = String::from_utf8_lossy(&reply);
        // gRPC-Web's status, in the headers (trailers-only) or its trailers frame.
        let grpc_status = reply
            .to_ascii_lowercase()
            .split("grpc-status:")
            .nth(1)
            .and_then(|rest| {
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
            })
            .and_then(|code| code.parse::<i32>().ok());
        let ended = match (reply.split(' ').nth(1), grpc_status) {
            (Some(_), Some(code)) => Ended::Grpc(Code::from(code)),
            (Some(code), None) => Ended::Http(code.parse().unwrap()),
            (None, _) => Ended::Closed,
        };
        (ended, took)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_that_do_not_come_are_cut_after_the_body_read_timeout() {
    let timeout = Duration::from_millis(1_500);
    let server = server(args(10_000, 1_000, 1_500)).await;
    let endpoint = server.endpoint();

    // A lock held, for a wait that outlasts the timeout (its message came:
    // a wait is work, never cut).
    let mut client = bearer_client(&endpoint, TOKEN).await;
    client.acquire(acquire("held", "holder")).await.unwrap();
    let mut waiting = bearer_client(&endpoint, TOKEN).await;
    let wait = tokio::spawn(async move {
        let started = Instant::now();
        let reply = waiting
            .acquire(proto::AcquireRequest {
                wait_ms: 2_500,
                ..acquire("held", "patient")
            })
            .await;
        (reply, started.elapsed())
    });

    let from = [127, 0, 0, 1];
    let tricklers = vec![
        (
            "Acquire",
            grpc_trickler(endpoint.clone(), from, "/tumbler.v1.LockService/Acquire").await,
        ),
        (
            "Watch",
            grpc_trickler(endpoint.clone(), from, "/tumbler.v1.LockService/Watch").await,
        ),
        (
            "Session",
            grpc_trickler(endpoint.clone(), from, "/tumbler.v1.LockService/Session").await,
        ),
        (
            "Health",
            grpc_trickler(endpoint.clone(), from, "/grpc.health.v1.Health/Check").await,
        ),
        (
            "login",
            http_trickler(server.http(), from, Post::Login).await,
        ),
        (
            "connect",
            http_trickler(grpc_addr(&endpoint), from, Post::Connect).await,
        ),
        (
            "grpc-web",
            http_trickler(grpc_addr(&endpoint), from, Post::GrpcWeb).await,
        ),
    ];
    // A client that is slow but in time: its message after half the timeout.
    let mut grpc = tonic::client::Grpc::new(
        Channel::from_shared(endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    grpc.ready().await.unwrap();
    let slow = futures::stream::once(async {
        tokio::time::sleep(Duration::from_millis(750)).await;
        acquire("slow-but-in-time", "me")
    });
    let mut request = tonic::Request::new(slow);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let codec = tonic_prost::ProstCodec::<proto::AcquireRequest, proto::AcquireResponse>::default();
    let path = ::http::uri::PathAndQuery::from_static("/tumbler.v1.LockService/Acquire");
    let response = grpc.streaming(request, path, codec).await.expect("in time");
    let reply = response.into_inner().next().await.unwrap().unwrap();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired);

    for (what, trickler) in tricklers {
        let (ended, took) = trickler.await.unwrap();
        println!("{what} trickler: {ended:?} after {took:?}");
        match (what, &ended) {
            ("login", Ended::Http(408)) => {}
            ("login", other) => panic!("login: {other:?}"),
            // Connect's status for DEADLINE_EXCEEDED, as gRPC's tricklers get.
            ("connect", Ended::Http(504)) => {}
            ("connect", other) => panic!("connect: {other:?}"),
            (_, Ended::Grpc(Code::DeadlineExceeded)) => {}
            (what, other) => panic!("{what}: {other:?}"),
        }
        assert!(
            took >= timeout - Duration::from_millis(50),
            "{what} cut early, after {took:?}"
        );
        assert!(
            took < timeout + Duration::from_secs(2),
            "{what} cut late, after {took:?}"
        );
    }
    // The wait ran its course.
    let (reply, took) = wait.await.unwrap();
    let reply = reply.expect("the wait is not cut").into_inner();
    assert_eq!(reply.reason(), proto::NotAcquiredReason::Timeout);
    assert!(took >= Duration::from_millis(2_400), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_caps_tricklers_give_way_to_health_and_authenticated_calls() {
    // 40 connections per port, 20 per address; 4 s for a body.
    let timeout = Duration::from_secs(4);
    let server = server(args(40, 20, 4_000)).await;
    let endpoint = server.endpoint();

    // Both ports filled by tricklers from four addresses: authenticated
    // gRPC calls that send no message, and dashboard logins whose body
    // trickles.
    let mut tricklers = Vec::new();
    for host in [2u8, 3] {
        for _ in 0..20 {
            let method = "/tumbler.v1.LockService/Acquire";
            tricklers.push(grpc_trickler(endpoint.clone(), [127, 0, 0, host], method).await);
        }
    }
    for host in [4u8, 5] {
        for _ in 0..20 {
            tricklers.push(http_trickler(server.http(), [127, 0, 0, host], Post::Login).await);
        }
    }
    let filled = Instant::now();
    // Give the calls time to be in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Health, /healthz and an authenticated Acquire, each on a new
    // connection, answered at once (long before the tricklers' timeout).
    let mut answered = Vec::new();
    for round in 0..3 {
        let started = Instant::now();
        assert_eq!(
            health_status(&endpoint, "").await.unwrap(),
            ServingStatus::Serving
        );
        let (status, body) = common::http::get(server.http(), "/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        let mut client = bearer_client(&endpoint, TOKEN).await;
        let reply = client
            .acquire(acquire(&format!("at-the-caps-{round}"), "me"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), proto::AcquireStatus::Acquired);
        answered.push(started.elapsed());
    }
    println!("health + /healthz + Acquire at the caps: {answered:?}");
    assert!(
        filled.elapsed() < timeout,
        "answered only after {:?}",
        filled.elapsed()
    );

    // Every trickler ended: closed to make room, or answered 408 /
    // DEADLINE_EXCEEDED at the timeout.
    let (mut closed, mut timed_out) = (0, 0);
    let mut last = Duration::ZERO;
    for trickler in tricklers {
        let (ended, took) = trickler.await.unwrap();
        match ended {
            Ended::Closed => closed += 1,
            Ended::Http(408) | Ended::Grpc(Code::DeadlineExceeded) => {
                assert!(took >= timeout - Duration::from_millis(50), "{took:?}");
                timed_out += 1;
            }
            other => panic!("{other:?} after {took:?}"),
        }
        last = last.max(took);
    }
    println!(
        "80 tricklers: {closed} closed for room, {timed_out} cut at the timeout; the last after {last:?}"
    );
    // Each port made room at least once (the new callers' connections
    // close after them, giving their places back).
    assert!(closed >= 2, "room was made by closing tricklers: {closed}");
    assert!(timed_out > 0);
    assert!(last < timeout + Duration::from_secs(3), "{last:?}");
}
