//! The server's edge against hostile or careless callers, on loopback with
//! a real Redis: metric labels that callers cannot grow, connection caps
//! and timeouts on every port, malformed messages answered
//! INVALID_ARGUMENT.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;

use common::http::get;
use common::*;
use futures::StreamExt;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::{ServerConfig, ServiceArgs};

/// A server with its HTTP port on (and, when asked, auth and a separate
/// health port), stopped when dropped.
struct EdgeServer {
    grpc: SocketAddr,
    http: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl EdgeServer {
    async fn start(redis_url: &str, args: ServiceArgs) -> Self {
        let config = ServerConfig::new(redis_url.to_owned(), &args).unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = EdgeServer {
            grpc: grpc.local_addr().unwrap(),
            http: http.local_addr().unwrap(),
            _stop: {
                let (stop, stopped) = oneshot::channel::<()>();
                let listeners = tumbler::server::Listeners {
                    grpc,
                    http: Some(http),
                    health: None,
                };
                tokio::spawn(tumbler::server::serve_on(config, listeners, async {
                    let _ = stopped.await;
                }));
                stop
            },
        };
        wait_for_health(&server.endpoint(), ServingStatus::Serving).await;
        server
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }
}

/// Service settings with auth on, reading a tokens file that holds one
/// admin token, `good-token`.
fn with_tokens(dir: &tempfile::TempDir) -> ServiceArgs {
    let path: PathBuf = dir.path().join("tokens.toml");
    std::fs::write(
        &path,
        token_entry("ops", "good-token", "admin", "[\"*\"]", ""),
    )
    .unwrap();
    let mut args = service_args();
    args.auth.auth_tokens_file = Some(path);
    args
}

/// One unary call to `path` with an empty message, optionally with a
/// bearer token; its status code.
async fn call_path(channel: Channel, path: String, token: Option<&str>) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    if grpc.ready().await.is_err() {
        return Code::Unavailable;
    }
    let mut request = tonic::Request::new(proto::InspectRequest::default());
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    let codec = tonic_prost::ProstCodec::<proto::InspectRequest, proto::InspectResponse>::default();
    let path = ::http::uri::PathAndQuery::try_from(path).unwrap();
    match grpc.unary(request, path, codec).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_method_names_do_not_grow_the_metrics_page() {
    let redis = start_redis();
    let dir = tempfile::tempdir().unwrap();
    let server = EdgeServer::start(&redis.url(), with_tokens(&dir)).await;
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let flood = |from: usize, count: usize| {
        let channel = channel.clone();
        futures::stream::iter(from..from + count)
            .map(move |i| {
                // Half without a token (refused before routing), half with
                // one (routed, UNIMPLEMENTED).
                let token = (i % 2 == 0).then_some("good-token");
                let path = format!(
                    "/tumbler.v1.LockService/MadeUp{i:06}x{}",
                    uuid::Uuid::now_v7().simple()
                );
                call_path(channel.clone(), path, token)
            })
            .buffer_unordered(32)
            .collect::<Vec<Code>>()
    };
    // Warm-up: every series these calls can create exists afterwards.
    let codes = flood(0, 200).await;
    assert!(codes.contains(&Code::Unauthenticated), "{codes:?}");
    assert!(codes.contains(&Code::Unimplemented), "{codes:?}");
    let before = get(server.http, "/metrics").await.1;

    let codes = flood(200, 3000).await;
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, Code::Unauthenticated | Code::Unimplemented))
    );
    let after = get(server.http, "/metrics").await.1;

    assert!(!after.contains("MadeUp"), "a made-up method became a label");
    // Every method label is one of the service's own (other tests in this
    // process add series of their methods, in parallel).
    let known = [
        "Acquire",
        "Release",
        "Extend",
        "Inspect",
        "Queue",
        "List",
        "ListNamespaces",
        "Reap",
        "Clear",
        "Metrics",
        "Session",
        "Watch",
        "unknown",
    ];
    for label in after.split("method=\"").skip(1) {
        let value = label.split('"').next().unwrap();
        assert!(known.contains(&value), "method label {value:?}");
    }
    // The made-up calls' series: as many and as large after 3,000 more
    // calls as after the first 200 (counts grow by a few digits).
    let unknown = |page: &str| -> (usize, usize) {
        let lines: Vec<&str> = (page.lines())
            .filter(|l| l.contains("method=\"unknown\""))
            .collect();
        (lines.len(), lines.iter().map(|l| l.len()).sum())
    };
    let (series_before, bytes_before) = unknown(&before);
    let (series_after, bytes_after) = unknown(&after);
    assert_eq!(series_before, series_after, "new series appeared");
    assert!(
        bytes_after < bytes_before + 256,
        "the unknown series grew from {bytes_before} to {bytes_after} bytes"
    );
    assert!(after.len() < 64 * 1024, "/metrics is {} bytes", after.len());
    assert!(
        common::http::sample(
            &after,
            "tumbler_rpc_requests_total",
            &[("method", "unknown"), ("code", "UNAUTHENTICATED")]
        )
        .unwrap_or(0.0)
            >= 1600.0
    );
}

/// Opens `count` TCP connections to `to` from `from` (a loopback
/// address), sending `first` on each (nothing when empty). Connections
/// the server refuses at once still count: the kernel completes them.
async fn open_sockets(from: [u8; 4], to: SocketAddr, count: usize, first: &[u8]) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(2), socket.connect(to)).await
        else {
            continue;
        };
        if !first.is_empty() {
            let _ = stream.write_all(first).await;
        }
        sockets.push(stream);
    }
    sockets
}

/// How many of `sockets` the server still holds open: a read that waits
/// (nothing to read, no EOF) within `within` means open.
async fn still_open(sockets: &mut [TcpStream], within: Duration) -> usize {
    let checks = sockets.iter_mut().map(|socket| async move {
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, socket.read(&mut buf)).await {
                Err(_) => return true,
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                // Server data (an HTTP/2 SETTINGS frame, a 408): read on.
                Ok(Ok(_)) => continue,
            }
        }
    });
    futures::future::join_all(checks)
        .await
        .into_iter()
        .filter(|open| *open)
        .count()
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SLOW_HEADER: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";

fn limited_args(
    max_connections: u32,
    per_ip: u32,
    header_read_timeout_ms: u64,
    idle_timeout_ms: u64,
) -> ServiceArgs {
    ServiceArgs {
        max_connections: Some(max_connections),
        max_connections_per_ip: per_ip,
        header_read_timeout_ms,
        idle_timeout_ms,
        ..service_args()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_sockets_leaves_health_and_acquire_answerable() {
    let redis = start_redis();
    // Low caps, long timeouts: only the caps can keep the flood out.
    let server = EdgeServer::start(&redis.url(), limited_args(300, 150, 60_000, 60_000)).await;

    // 2,000 sockets on the gRPC port from 20 addresses (100 each, idle or
    // preface-only), and 1,000 on the HTTP port (10 addresses, 100 each,
    // idle or half a request header).
    let mut grpc_flood = Vec::new();
    let mut http_flood = Vec::new();
    for host in 2..22u8 {
        let first = if host % 2 == 0 { PREFACE } else { b"" as &[u8] };
        grpc_flood.extend(open_sockets([127, 0, 0, host], server.grpc, 100, first).await);
    }
    for host in 2..12u8 {
        let first = if host % 2 == 0 {
            SLOW_HEADER
        } else {
            b"" as &[u8]
        };
        http_flood.extend(open_sockets([127, 0, 0, host], server.http, 100, first).await);
    }
    // One address over its cap: the excess is refused.
    let mut one_address = open_sockets([127, 0, 0, 30], server.grpc, 400, b"").await;

    // New callers still get through: health over gRPC, /healthz, Acquire.
    for _ in 0..3 {
        assert_eq!(
            health_status(&server.endpoint(), "").await.unwrap(),
            ServingStatus::Serving
        );
        let (status, body) = get(server.http, "/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
    }
    let mut client = proto::lock_service_client::LockServiceClient::connect(server.endpoint())
        .await
        .unwrap();
    let reply = client
        .acquire(acquire("under-flood", "me"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired);

    // The server holds no more than its caps.
    let held_grpc = still_open(&mut grpc_flood, Duration::from_millis(300)).await;
    let held_http = still_open(&mut http_flood, Duration::from_millis(300)).await;
    let held_one = still_open(&mut one_address, Duration::from_millis(300)).await;
    assert!(
        held_grpc <= 300,
        "{held_grpc} flood sockets open on the gRPC port"
    );
    assert!(
        held_http <= 300,
        "{held_http} flood sockets open on the HTTP port"
    );
    assert!(held_one <= 150, "{held_one} sockets open from one address");
    // ...and did take connections in up to them.
    assert!(
        held_grpc + held_one >= 200,
        "gRPC held {held_grpc} + {held_one}"
    );
    assert!(held_http >= 200, "HTTP held {held_http}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_preface_only_and_slow_header_sockets_are_closed_but_waits_are_not() {
    let redis = start_redis();
    // 400 ms to start a request, 800 ms idle between requests.
    let server = EdgeServer::start(&redis.url(), limited_args(10_000, 1_000, 400, 800)).await;
    let mut silent = open_sockets([127, 0, 0, 1], server.grpc, 100, b"").await;
    let mut preface = open_sockets([127, 0, 0, 1], server.grpc, 100, PREFACE).await;
    let mut slow_http = open_sockets([127, 0, 0, 1], server.http, 100, SLOW_HEADER).await;
    let mut silent_http = open_sockets([127, 0, 0, 1], server.http, 100, b"").await;
    assert_eq!(silent.len() + preface.len(), 200);

    // A caller that made one call and went quiet, and one that waits for
    // a held lock longer than the idle timeout.
    let mut quiet = proto::lock_service_client::LockServiceClient::connect(server.endpoint())
        .await
        .unwrap();
    quiet.acquire(acquire("held", "holder")).await.unwrap();
    let mut waiter = proto::lock_service_client::LockServiceClient::connect(server.endpoint())
        .await
        .unwrap();
    let wait = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                wait_ms: 2_000,
                ..acquire("held", "patient")
            })
            .await
    });

    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // Slow senders keep sending and are cut all the same.
    for socket in slow_http.iter_mut() {
        let _ = socket.write_all(b"x").await;
    }
    assert_eq!(still_open(&mut silent, Duration::from_millis(300)).await, 0);
    assert_eq!(
        still_open(&mut preface, Duration::from_millis(300)).await,
        0
    );
    assert_eq!(
        still_open(&mut slow_http, Duration::from_millis(300)).await,
        0
    );
    assert_eq!(
        still_open(&mut silent_http, Duration::from_millis(300)).await,
        0
    );

    // The wait is a request in flight: it runs its full course.
    let waited = wait.await.unwrap().expect("the wait is not cut");
    assert_eq!(
        waited.into_inner().reason(),
        proto::NotAcquiredReason::Timeout
    );
    // The quiet caller's connection was closed; its next call reconnects.
    let reply = quiet
        .release(release("held", "holder"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), proto::ReleaseStatus::Released);
}

/// Raw bytes as a gRPC message, both ways.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_protobuf_is_invalid_argument() {
    let redis = start_redis();
    let server = EdgeServer::start(&redis.url(), service_args()).await;
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let garbage: [&[u8]; 3] = [
        // Field 1, length-delimited, with a length varint that never ends.
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        // Field 1 claims 100 bytes and brings 3.
        b"\x0a\x64abc",
        // Field 1 (a string) is not UTF-8.
        b"\x0a\x02\xc3\x28",
    ];
    for (i, bytes) in garbage.into_iter().enumerate() {
        for method in ["Acquire", "Release", "Inspect"] {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.unwrap();
            let path =
                ::http::uri::PathAndQuery::try_from(format!("/tumbler.v1.LockService/{method}"))
                    .unwrap();
            let status = grpc
                .unary(tonic::Request::new(bytes.to_vec()), path, RawCodec)
                .await
                .expect_err("garbage is refused");
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "garbage {i} to {method}: {status:?}"
            );
        }
    }
    // The server is fine afterwards.
    let mut client = proto::lock_service_client::LockServiceClient::new(channel);
    client
        .acquire(acquire("after-garbage", "me"))
        .await
        .unwrap();
}

/// One HTTP/1.1 GET with exactly these headers (Host included); the
/// status line and the head, lowercased.
async fn raw_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .unwrap()
        .unwrap();
    let reply = String::from_utf8_lossy(&reply).to_string();
    let status = reply.split(' ').nth(1).unwrap().parse().unwrap();
    let head = reply.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    (status, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_dashboard_answers_only_loopback_and_configured_host_names() {
    let redis = start_redis();
    let args = ServiceArgs {
        dashboard_allowed_hosts: vec!["locks.internal".into()],
        ..service_args()
    };
    // No tokens file: the dashboard is open, so the Host check is on.
    let server = EdgeServer::start(&redis.url(), args).await;
    let port = server.http.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "locks.internal".to_owned(),
    ] {
        let (status, head) = raw_get(server.http, "/api/v1/overview", &[("Host", &host)]).await;
        assert_eq!(status, 200, "{host}: {head}");
    }
    // DNS rebinding: the attacker's name, pointed at this address.
    for headers in [
        vec![("Host", format!("evil.example:{port}"))],
        vec![("Host", "evil.example".to_owned())],
        vec![
            ("Host", format!("127.0.0.1:{port}")),
            ("Origin", "http://evil.example".to_owned()),
        ],
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        for path in ["/api/v1/overview", "/dashboard", "/dashboard/admin/clear"] {
            let (status, head) = raw_get(server.http, path, &headers).await;
            assert_eq!(status, 421, "{headers:?} {path}: {head}");
        }
    }
    // Scrapers and probes use the pod's address: not the dashboard's concern.
    let (status, _) = raw_get(server.http, "/healthz", &[("Host", "10.1.2.3:9090")]).await;
    assert_eq!(status, 200);
    let (status, _) = raw_get(server.http, "/metrics", &[("Host", "10.1.2.3:9090")]).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_response_carries_the_security_headers() {
    let redis = start_redis();
    let server = EdgeServer::start(&redis.url(), service_args()).await;
    let host = server.http.to_string();
    for path in [
        "/dashboard",
        "/dashboard/login",
        "/dashboard/assets/app.js",
        "/api/v1/overview",
        "/api/v1/locks/missing",
        "/dashboard/no-such-page",
    ] {
        let (_, head) = raw_get(server.http, path, &[("Host", &host)]).await;
        for wanted in [
            "content-security-policy: default-src 'none'; script-src 'self'",
            "x-content-type-options: nosniff",
            "referrer-policy: no-referrer",
            "x-frame-options: deny",
        ] {
            assert!(head.contains(wanted), "{path}: no {wanted:?} in {head}");
        }
        // Plaintext: no HSTS (it is sent only when the port serves TLS).
        assert!(!head.contains("strict-transport-security"), "{path}");
    }
}
