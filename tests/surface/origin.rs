//! The gRPC port's Host/Origin rule (DESIGN invariant 19, `src/origin.rs`),
//! driven by the real `curl` over HTTP/1.1 and HTTP/2 against a server on
//! loopback with a real Redis: with auth off, Connect and gRPC-Web answer
//! only loopback and configured Host names (a DNS-rebinding page's Host is
//! refused, and its Acquire or Clear changes nothing); a browser Origin
//! that is not listed in `--cors-allow-origin` is refused whatever the
//! auth mode; a listed one gets a working preflight and readable answers;
//! native gRPC with any `:authority` is served as before.

use crate::common;

use std::net::SocketAddr;

use common::{TestServer, proto, service_args, token_entry};
use prost::Message;
use serde_json::{Value, json};
use tonic::transport::Endpoint;
use tumbler::config::ServiceArgs;

const APP: &str = "http://app.test:8080";

/// One answer: status, headers (names lowercased), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A Connect refusal: 403, `permission_denied`; its message.
    fn denied(&self) -> String {
        let body = self.json();
        assert_eq!(
            (self.status, body["code"].as_str()),
            (403, Some("permission_denied")),
            "{body}"
        );
        assert!(
            self.header("access-control-allow-origin").is_none(),
            "a refusal carries no CORS header"
        );
        body["message"].as_str().unwrap().to_owned()
    }

    /// A gRPC-Web answer's grpc-status: in its headers (trailers-only),
    /// else in the trailers frame at the end of its body.
    fn grpc_status(&self) -> Option<i32> {
        if let Some(status) = self.header("grpc-status") {
            return status.parse().ok();
        }
        let mut data = &self.body[..];
        while data.len() >= 5 {
            let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
            let (flag, frame) = (data[0], &data[5..5 + len]);
            if flag & 0x80 != 0 {
                let text = String::from_utf8_lossy(frame).to_ascii_lowercase();
                return text.lines().find_map(|line| {
                    line.strip_prefix("grpc-status:")
                        .map(|v| v.trim().parse().unwrap())
                });
            }
            data = &data[5 + len..];
        }
        None
    }
}

/// One request with `curl` to the gRPC port: `method`, `path`, headers
/// (a `Host` among them replaces the address's own; over HTTP/2 it is
/// the `:authority`), the body.
async fn curl(
    to: SocketAddr,
    http2: bool,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("body");
    let head = dir.path().join("head");
    std::fs::write(&input, body).unwrap();
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["-sS", "-X", method, "-o", "-", "-D"])
        .arg(&head)
        .arg(if http2 {
            "--http2-prior-knowledge"
        } else {
            "--http1.1"
        });
    if method != "OPTIONS" {
        command
            .arg("--data-binary")
            .arg(format!("@{}", input.display()));
    }
    for (name, value) in headers {
        command.args(["-H", &format!("{name}: {value}")]);
    }
    let output = command
        .arg(format!("http://{to}{path}"))
        .output()
        .await
        .expect("curl must be installed");
    assert!(
        output.status.success(),
        "curl {method} {path} {headers:?} (HTTP/2: {http2}): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let head = std::fs::read_to_string(&head).unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: output.stdout,
    }
}

fn grpc_addr(server: &TestServer) -> SocketAddr {
    server.addr
}

/// A Connect JSON call of `method` with `headers`.
async fn connect(
    server: &TestServer,
    http2: bool,
    method: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let path = format!("/tumbler.v1.LockService/{method}");
    curl(
        grpc_addr(server),
        http2,
        "POST",
        &path,
        &all,
        body.to_string().as_bytes(),
    )
    .await
}

/// A gRPC-Web Acquire (binary) of `name` for `holder`, with `headers`.
async fn grpc_web_acquire(
    server: &TestServer,
    http2: bool,
    name: &str,
    holder: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let message = common::acquire(name, holder).encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let mut all = vec![
        ("content-type", "application/grpc-web+proto"),
        ("x-grpc-web", "1"),
    ];
    all.extend_from_slice(headers);
    curl(
        grpc_addr(server),
        http2,
        "POST",
        "/tumbler.v1.LockService/Acquire",
        &all,
        &frame,
    )
    .await
}

/// The holders of `name` in `default`, asked over native gRPC.
async fn holders(server: &TestServer, name: &str) -> Vec<String> {
    let mut client = server.client().await;
    let reply = client
        .inspect(proto::InspectRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (reply.holders.into_iter())
        .filter_map(|h| h.grant.map(|g| g.holder))
        .collect()
}

async fn open_server(args: ServiceArgs) -> TestServer {
    TestServer::new().args(args).start().await
}

#[tokio::test]
async fn with_auth_off_connect_and_grpc_web_answer_only_loopback_and_configured_hosts() {
    let server = open_server(ServiceArgs {
        dashboard_allowed_hosts: vec!["locks.internal".into()],
        ..service_args()
    })
    .await;
    let port = server.addr.port();
    let evil = format!("evil.example:{port}");
    let acquire = |holder: &str| json!({"name": "doc", "holder": holder, "ttlMs": "60000"});

    // A DNS-rebinding page's requests, over HTTP/1.1 (what a browser
    // speaks to a plaintext port) and HTTP/2: refused, nothing applied.
    for http2 in [false, true] {
        let refused = connect(
            &server,
            http2,
            "Acquire",
            acquire("evil"),
            &[("host", &evil)],
        )
        .await;
        let message = refused.denied();
        assert!(message.contains("evil.example"), "{message}");
        assert!(message.contains("--allowed-hosts"), "{message}");
        let refused = grpc_web_acquire(&server, http2, "doc", "evil", &[("host", &evil)]).await;
        assert_eq!(refused.status, 200);
        assert_eq!(refused.grpc_status(), Some(7), "PERMISSION_DENIED");
        assert!(
            refused
                .header("grpc-message")
                .unwrap()
                .contains("evil.example"),
            "{:?}",
            refused.headers
        );
    }
    // The Host as the rebinding page sends it, with its Origin.
    let origin = format!("http://{evil}");
    let refused = connect(
        &server,
        false,
        "Acquire",
        acquire("evil"),
        &[("host", &evil), ("origin", &origin)],
    )
    .await;
    refused.denied();
    assert!(holders(&server, "doc").await.is_empty());

    // Loopback names and addresses, and the configured name, are served.
    for (i, host) in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "locks.internal".to_owned(),
        format!("LOCKS.internal:{port}"),
    ]
    .iter()
    .enumerate()
    {
        let holder = format!("h{i}");
        let taken = connect(
            &server,
            false,
            "Acquire",
            acquire(&holder),
            &[("host", host)],
        )
        .await;
        assert_eq!(taken.status, 200, "{host}");
        assert_eq!(taken.json()["status"], "ACQUIRE_STATUS_ACQUIRED", "{host}");
        connect(
            &server,
            true,
            "Release",
            json!({"name": "doc", "holder": holder}),
            &[("host", host)],
        )
        .await;
        let taken = grpc_web_acquire(&server, false, "web", &holder, &[("host", host)]).await;
        assert_eq!(taken.grpc_status(), Some(0), "{host}");
    }
    assert_eq!(holders(&server, "web").await, ["h0"]);

    // Clear, the worst a rebinding page could do: refused, locks kept.
    let cleared = connect(&server, false, "Clear", json!({}), &[("host", &evil)]).await;
    cleared.denied();
    assert_eq!(holders(&server, "web").await, ["h0"]);

    // Native gRPC over HTTP/2 with any :authority (a Service's name) is
    // not a browser's: served.
    let channel = Endpoint::from_shared(server.endpoint())
        .unwrap()
        .origin(format!("http://tumbler.prod.svc:{port}").parse().unwrap())
        .connect()
        .await
        .unwrap();
    let mut native = proto::lock_service_client::LockServiceClient::new(channel);
    let reply = native
        .acquire(common::acquire("native", "n"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_browser_origin_not_listed_is_refused_whatever_the_auth_mode() {
    let token = "good-token";
    let with_auth = TestServer::new()
        .auth(&token_entry("ops", token, "admin", "[\"*\"]", ""))
        .start()
        .await;
    let without_auth = open_server(service_args()).await;
    let bearer = format!("Bearer {token}");
    for (server, auth) in [(&with_auth, true), (&without_auth, false)] {
        let host = server.addr.to_string();
        let mut headers = vec![("host", host.as_str())];
        if auth {
            headers.push(("authorization", bearer.as_str()));
        }
        let served = connect(
            server,
            false,
            "Acquire",
            json!({"name": "o", "holder": "plain"}),
            &headers,
        )
        .await;
        assert_eq!(served.json()["status"], "ACQUIRE_STATUS_ACQUIRED");
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:1",
            APP, // listed nowhere here
        ] {
            let mut with_origin = headers.clone();
            with_origin.push(("origin", origin));
            let refused = connect(
                server,
                false,
                "Acquire",
                json!({"name": "o2", "holder": "page"}),
                &with_origin,
            )
            .await;
            let message = refused.denied();
            assert!(message.contains("--cors-allow-origin"), "{message}");
            let refused = grpc_web_acquire(server, true, "o2", "page", &with_origin).await;
            assert_eq!(refused.grpc_status(), Some(7), "auth {auth}: {origin}");
            // No preflight either.
            let preflight = curl(
                server.addr,
                false,
                "OPTIONS",
                "/tumbler.v1.LockService/Acquire",
                &[
                    ("host", &host),
                    ("origin", origin),
                    ("access-control-request-method", "POST"),
                ],
                b"",
            )
            .await;
            preflight.denied();
        }
        // Native gRPC carrying an Origin is a browser's too.
        let mut client = server.client().await;
        let mut request = tonic::Request::new(common::acquire("o2", "grpc-page"));
        let metadata = request.metadata_mut();
        metadata.insert("origin", "http://evil.example".parse().unwrap());
        metadata.insert("authorization", bearer.parse().unwrap());
        let status = client.acquire(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    }
    // Nothing a refused page sent was applied.
    let mut client = common::bearer_client(&with_auth.endpoint(), token).await;
    let reply = client
        .inspect(proto::InspectRequest {
            name: "o2".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.holders.is_empty());
    assert!(holders(&without_auth, "o2").await.is_empty());
}

#[tokio::test]
async fn a_listed_origin_gets_a_preflight_and_readable_answers() {
    let server = open_server(ServiceArgs {
        cors_allow_origin: vec![APP.into()],
        ..service_args()
    })
    .await;
    let host = server.addr.to_string();
    let preflight = |origin: &'static str, http2: bool| {
        let host = host.clone();
        let to = server.addr;
        async move {
            curl(
                to,
                http2,
                "OPTIONS",
                "/tumbler.v1.LockService/Acquire",
                &[
                    ("host", &host),
                    ("origin", origin),
                    ("access-control-request-method", "POST"),
                    (
                        "access-control-request-headers",
                        "content-type,connect-protocol-version,connect-timeout-ms",
                    ),
                ],
                b"",
            )
            .await
        }
    };
    for http2 in [false, true] {
        let answer = preflight(APP, http2).await;
        assert_eq!(answer.status, 204, "{:?}", answer.headers);
        assert_eq!(answer.header("access-control-allow-origin"), Some(APP));
        assert_eq!(answer.header("access-control-allow-methods"), Some("POST"));
        let allowed = answer.header("access-control-allow-headers").unwrap();
        for name in [
            "content-type",
            "connect-protocol-version",
            "connect-timeout-ms",
            "x-grpc-web",
            "x-user-agent",
            "grpc-timeout",
            "authorization",
        ] {
            assert!(allowed.contains(name), "{name} in {allowed}");
        }
        let exposed = answer.header("access-control-expose-headers").unwrap();
        for name in [
            "grpc-status",
            "grpc-message",
            "trailer-tumbler-locks-cleared",
        ] {
            assert!(exposed.contains(name), "{name} in {exposed}");
        }
        assert!(answer.header("vary").unwrap().contains("Origin"));
        assert!(answer.header("access-control-max-age").is_some());
    }
    // Another origin, or the listed one with another scheme or port: no.
    for origin in [
        "http://evil.example",
        "https://app.test:8080",
        "http://app.test",
    ] {
        preflight(origin, false).await.denied();
    }

    // The listed page's calls: served, with CORS headers.
    let headers = [("host", host.as_str()), ("origin", APP)];
    let taken = connect(
        &server,
        false,
        "Acquire",
        json!({"name": "app", "holder": "page"}),
        &headers,
    )
    .await;
    assert_eq!(taken.json()["status"], "ACQUIRE_STATUS_ACQUIRED");
    assert_eq!(taken.header("access-control-allow-origin"), Some(APP));
    assert!(taken.header("vary").unwrap().contains("Origin"));
    assert!((taken.header("access-control-expose-headers").unwrap()).contains("grpc-status"));
    let web = grpc_web_acquire(&server, false, "app-web", "page", &headers).await;
    assert_eq!(web.grpc_status(), Some(0));
    assert_eq!(web.header("access-control-allow-origin"), Some(APP));
    // An error is readable too (a Connect error, with CORS headers).
    let bad = connect(
        &server,
        false,
        "Acquire",
        json!({"name": "", "holder": "page"}),
        &headers,
    )
    .await;
    assert_eq!(bad.json()["code"], "invalid_argument");
    assert_eq!(bad.header("access-control-allow-origin"), Some(APP));

    // A listed Origin does not lift the Host rule (auth is off): a page
    // rebinding app.test to this address is refused.
    let rebound = format!("app.test:{}", server.addr.port());
    let refused = connect(
        &server,
        false,
        "Acquire",
        json!({"name": "app", "holder": "rebound"}),
        &[("host", &rebound), ("origin", APP)],
    )
    .await;
    refused.denied();
    assert_eq!(holders(&server, "app").await, ["page"]);
    server.shutdown().await.unwrap();
}
