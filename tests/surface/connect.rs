//! The Connect protocol on the gRPC port, driven by the real `curl`: unary
//! calls over HTTP/1.1 and HTTP/2 (JSON and binary), a waiting Acquire
//! bounded by `Connect-Timeout-Ms`, refusals of bad input as Connect
//! errors (nothing applied), tokens and namespaces as over gRPC, one lock
//! taken over one transport and released over the other, and Watch
//! followed with `curl -N`; Redis gone is `unavailable`, never a grant.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, proto, service_args, token_entry};
use prost::Message;
use serde_json::{Value, json};

/// One `curl` call: the HTTP status and the body.
pub(super) struct Answer {
    pub(super) status: u16,
    body: Vec<u8>,
}

impl Answer {
    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts a Connect error with `code` and returns its message.
    pub(super) fn error(&self, status: u16, code: &str) -> String {
        let body = self.json();
        assert_eq!(
            (self.status, body["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
        body["message"].as_str().unwrap_or_default().to_owned()
    }
}

async fn curl(server: &TestServer, method: &str, args: &[&str], body: &[u8]) -> Answer {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("body");
    std::fs::write(&input, body).unwrap();
    let output = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "-X",
            "POST",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "--data-binary",
        ])
        .arg(format!("@{}", input.display()))
        .args(args)
        .arg(format!(
            "{}/tumbler.v1.LockService/{method}",
            server.endpoint()
        ))
        .output()
        .await
        .expect("curl must be installed");
    assert!(
        output.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out = output.stdout;
    let split = out.iter().rposition(|&b| b == b'\n').unwrap();
    Answer {
        status: std::str::from_utf8(&out[split + 1..])
            .unwrap()
            .parse()
            .unwrap(),
        body: out[..split].to_vec(),
    }
}

/// A JSON call over HTTP/1.1 (`extra`: more curl arguments).
pub(super) async fn call(server: &TestServer, method: &str, body: Value, extra: &[&str]) -> Answer {
    let mut args = vec!["-H", "content-type: application/json"];
    args.extend_from_slice(extra);
    curl(server, method, &args, body.to_string().as_bytes()).await
}

#[tokio::test]
async fn unary_calls_over_http1_and_http2_in_json_and_protobuf() {
    let server = TestServer::new().start().await;
    let acquired = call(
        &server,
        "Acquire",
        json!({"name": "c", "holder": "a", "ttlMs": "30000"}),
        &[],
    )
    .await;
    assert_eq!(acquired.status, 200);
    let grant = acquired.json();
    assert_eq!(grant["status"], "ACQUIRE_STATUS_ACQUIRED", "{grant}");
    let token = grant["grant"]["fencingToken"]
        .as_str()
        .expect("64-bit as a string")
        .to_owned();

    let busy = call(
        &server,
        "Acquire",
        json!({"name": "c", "holder": "b"}),
        &["--http2-prior-knowledge"],
    )
    .await;
    assert_eq!(busy.json()["reason"], "NOT_ACQUIRED_REASON_BUSY");

    let extended = call(
        &server,
        "Extend",
        json!({"name": "c", "holder": "a", "ttlMs": 60000, "fencingToken": token}),
        &[],
    )
    .await;
    assert_eq!(
        extended.json()["status"],
        "EXTEND_STATUS_EXTENDED",
        "{}",
        extended.json()
    );

    let inspected = call(
        &server,
        "Inspect",
        json!({"name": "c"}),
        &["--http2-prior-knowledge"],
    )
    .await
    .json();
    assert_eq!(
        inspected["holders"][0]["grant"]["holder"], "a",
        "{inspected}"
    );
    assert_eq!(inspected["holders"][0]["grant"]["ttlMs"], "60000");

    // Enum by number and proto field names are read too, as the mapping says.
    let released = call(
        &server,
        "Release",
        json!({"name": "c", "holder": "a", "fencing_token": token}),
        &[],
    )
    .await;
    assert_eq!(released.json()["status"], "RELEASE_STATUS_RELEASED");

    // application/proto: the protobuf bytes in, the protobuf bytes out.
    let request = common::acquire("p", "a").encode_to_vec();
    let answer = curl(
        &server,
        "Acquire",
        &["-H", "content-type: application/proto"],
        &request,
    )
    .await;
    assert_eq!(answer.status, 200);
    let reply = proto::AcquireResponse::decode(answer.body.as_slice()).unwrap();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired);

    // ListNamespaces with an empty body (the empty message).
    let namespaces = curl(
        &server,
        "ListNamespaces",
        &["-H", "content-type: application/json"],
        b"",
    )
    .await;
    assert_eq!(
        namespaces.status,
        200,
        "{}",
        String::from_utf8_lossy(&namespaces.body)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn connect_timeout_ms_bounds_a_waiting_acquire() {
    let server = TestServer::new().start().await;
    call(&server, "Acquire", json!({"name": "w", "holder": "a"}), &[]).await;
    let started = Instant::now();
    let answer = call(
        &server,
        "Acquire",
        json!({"name": "w", "holder": "b", "waitMs": "20000"}),
        &["-H", "connect-timeout-ms: 700"],
    )
    .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The engine answers just before the deadline (TIMEOUT), or the RPC
    // layer does (deadline_exceeded): never a grant.
    if answer.status == 200 {
        assert_eq!(
            answer.json()["reason"],
            "NOT_ACQUIRED_REASON_TIMEOUT",
            "{}",
            answer.json()
        );
    } else {
        answer.error(504, "deadline_exceeded");
    }
    let bad = call(
        &server,
        "Inspect",
        json!({"name": "w"}),
        &["-H", "connect-timeout-ms: soon"],
    )
    .await;
    assert!(
        bad.error(400, "invalid_argument")
            .contains("Connect-Timeout-Ms")
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_a_connect_error_naming_its_cause_and_changes_nothing() {
    let server = TestServer::new()
        .args(tumbler::config::ServiceArgs {
            max_request_bytes: 4096,
            ..service_args()
        })
        .start()
        .await;
    let json_call = ["-H", "content-type: application/json"];
    let malformed = curl(&server, "Acquire", &json_call, b"{\"name\": \"x\",").await;
    assert!(
        malformed
            .error(400, "invalid_argument")
            .starts_with("malformed JSON")
    );
    let wrong_type = call(&server, "Acquire", json!({"name": "x", "ttlMs": [1]}), &[]).await;
    assert!(
        wrong_type
            .error(400, "invalid_argument")
            .starts_with("ttlMs: ")
    );
    let wrong_enum = call(&server, "Acquire", json!({"name": 5}), &[]).await;
    assert!(
        wrong_enum
            .error(400, "invalid_argument")
            .starts_with("name: ")
    );
    let big = curl(
        &server,
        "Release",
        &json_call,
        br#"{"name":"x","holder":"a","fencingToken":9007199254740993}"#,
    )
    .await;
    assert!(
        big.error(400, "invalid_argument")
            .contains("fencingToken: the JSON number 9007199254740993 is above 2^53")
    );
    let unknown = call(&server, "Acquire", json!({"name": "x", "ttlMS": 5}), &[]).await;
    assert!(
        unknown
            .error(400, "invalid_argument")
            .contains("unknown field `ttlMS`")
    );
    let invalid = call(&server, "Acquire", json!({"name": ""}), &[]).await;
    assert!(invalid.error(400, "invalid_argument").contains("name"));
    let oversize = json!({"name": "x", "metadata": "m".repeat(5000)});
    let oversize = call(&server, "Acquire", oversize, &[]).await;
    assert!(
        oversize
            .error(429, "resource_exhausted")
            .contains("4096-byte limit")
    );
    let garbage = curl(
        &server,
        "Acquire",
        &["-H", "content-type: application/proto"],
        b"\xff\xff\xff",
    )
    .await;
    garbage.error(400, "invalid_argument");
    for content_type in [
        "content-type: text/plain",
        "content-type:",
        "content-type: application/connect+json",
    ] {
        let refused = curl(&server, "Acquire", &["-H", content_type], b"{}").await;
        assert_eq!(refused.status, 415, "{content_type}");
        // In words: what came and what is expected.
        let line = String::from_utf8_lossy(&refused.body);
        assert!(line.contains("application/json"), "{content_type}: {line}");
        let named = if content_type == "content-type:" {
            "no content-type"
        } else {
            content_type.trim_start_matches("content-type: ")
        };
        assert!(line.contains(named), "{content_type}: {line}");
    }
    let session = call(&server, "Session", json!({}), &[]).await;
    assert!(session.error(404, "unimplemented").contains("gRPC only"));
    // Nothing was applied by any of them.
    let inspected = call(&server, "Inspect", json!({"name": "x"}), &[])
        .await
        .json();
    assert!(inspected.get("holders").is_none(), "{inspected}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_authority_whatever_the_transport() {
    let server = TestServer::new().start().await;
    let mut grpc = server.client().await;
    // Taken over gRPC, released over Connect with its fencing token.
    let grant = grpc
        .acquire(common::acquire("t", "a"))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let busy = call(&server, "Acquire", json!({"name": "t", "holder": "b"}), &[]).await;
    assert_eq!(busy.json()["reason"], "NOT_ACQUIRED_REASON_BUSY");
    let token = grant.fencing_token.to_string();
    let released = call(
        &server,
        "Release",
        json!({"name": "t", "holder": "a", "fencingToken": token}),
        &[],
    )
    .await;
    assert_eq!(released.json()["status"], "RELEASE_STATUS_RELEASED");
    // Taken over Connect, released over gRPC.
    let taken = call(&server, "Acquire", json!({"name": "t", "holder": "c"}), &[])
        .await
        .json();
    let token: u64 = taken["grant"]["fencingToken"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let busy = grpc
        .acquire(common::acquire("t", "d"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.status(), proto::AcquireStatus::NotAcquired);
    let released = grpc
        .release(proto::ReleaseRequest {
            fencing_token: Some(token),
            ..common::release("t", "c")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), proto::ReleaseStatus::Released);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn tokens_and_namespaces_apply_as_over_grpc() {
    let tokens = [
        token_entry("a", "team-a-token", "client", r#"["team-a"]"#, ""),
        token_entry("b", "team-b-token", "client", r#"["team-b"]"#, ""),
    ]
    .concat();
    let server = TestServer::new().auth(&tokens).start().await;
    let lock = json!({"namespace": "team-a", "name": "n", "holder": "a"});
    let missing = call(&server, "Acquire", lock.clone(), &[]).await;
    missing.error(401, "unauthenticated");
    let wrong = call(
        &server,
        "Acquire",
        lock.clone(),
        &["-H", "authorization: Bearer nope"],
    )
    .await;
    wrong.error(401, "unauthenticated");
    let other = call(
        &server,
        "Acquire",
        lock.clone(),
        &["-H", "authorization: Bearer team-b-token"],
    )
    .await;
    let denied = other.error(403, "permission_denied");
    assert_eq!(denied, "this token may not do that");
    let own = call(
        &server,
        "Acquire",
        lock,
        &["-H", "authorization: Bearer team-a-token"],
    )
    .await;
    assert_eq!(own.json()["status"], "ACQUIRE_STATUS_ACQUIRED");
    server.shutdown().await.unwrap();
}

/// Reads Connect envelopes until the end-of-stream one.
/// The whole envelopes at the start of `data` (a partial one at its end,
/// still arriving, is left out).
fn envelopes(mut data: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while data.len() >= 5 {
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        if data.len() < 5 + len {
            break;
        }
        out.push((data[0], serde_json::from_slice(&data[5..5 + len]).unwrap()));
        data = &data[5 + len..];
    }
    out
}

#[tokio::test]
async fn watch_streams_lock_events_to_curl_n() {
    let server = TestServer::new().start().await;
    let request = br#"{"namespace":"default","name":"s","initialState":true}"#;
    let mut body = vec![0, 0, 0, 0, request.len() as u8];
    body.extend_from_slice(request);
    let watch = {
        let url = format!("{}/tumbler.v1.LockService/Watch", server.endpoint());
        let mut command = tokio::process::Command::new("curl");
        command
            .args([
                "-sS",
                "-N",
                "--max-time",
                "3",
                "-H",
                "content-type: application/connect+json",
                "--data-binary",
                "@-",
            ])
            .arg(url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&body).await.unwrap();
        drop(stdin);
        child
    };
    // `synced` comes once the watcher is registered: what follows is seen.
    use tokio::io::AsyncReadExt;
    let mut watch = watch;
    let mut stdout = watch.stdout.take().unwrap();
    let mut received = Vec::new();
    let events = |received: &[u8]| -> Vec<String> {
        envelopes(received)
            .into_iter()
            .map(|(_, e)| e["event"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    while !events(&received).contains(&"synced".to_owned()) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(3), stdout.read(&mut chunk))
            .await
            .expect("synced within curl's --max-time")
            .unwrap();
        assert!(n > 0, "the stream ended before synced: {received:?}");
        received.extend_from_slice(&chunk[..n]);
    }
    call(&server, "Acquire", json!({"name": "s", "holder": "a"}), &[]).await;
    call(&server, "Release", json!({"name": "s", "holder": "a"}), &[]).await;
    stdout.read_to_end(&mut received).await.unwrap();
    watch.wait().await.unwrap();
    assert_eq!(
        events(&received),
        ["synced", "acquired", "released"],
        "{:?}",
        String::from_utf8_lossy(&received)
    );

    // A refused Watch ends at once, its error in the end-of-stream message.
    let request = br#"{"namespace":"Bad Name!"}"#;
    let mut body = vec![0, 0, 0, 0, request.len() as u8];
    body.extend_from_slice(request);
    let refused = curl(
        &server,
        "Watch",
        &["-H", "content-type: application/connect+json"],
        &body,
    )
    .await;
    assert_eq!(refused.status, 200);
    let end = envelopes(&refused.body);
    assert_eq!((end.len(), end[0].0), (1, 2));
    assert_eq!(end[0].1["error"]["code"], "invalid_argument", "{:?}", end);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_election_over_connect_json() {
    let server = TestServer::new().start().await;
    let elected = call(
        &server,
        "Campaign",
        json!({"name": "e", "candidate": "a", "value": "host-a", "ttlMs": "30000"}),
        &[],
    )
    .await;
    assert_eq!(elected.status, 200);
    let elected = elected.json();
    assert_eq!(elected["elected"], true, "{elected}");
    let term = elected["leader"]["term"]
        .as_str()
        .expect("64-bit as a string")
        .to_owned();
    let secret = elected["secret"]
        .as_str()
        .expect("the winner's secret")
        .to_owned();
    let leader = call(&server, "Leader", json!({"name": "e"}), &[])
        .await
        .json();
    assert_eq!(
        (
            leader["leader"]["candidate"].as_str(),
            leader["leader"]["value"].as_str()
        ),
        (Some("a"), Some("host-a"))
    );
    let proclaimed = call(
        &server,
        "Proclaim",
        json!({"name": "e", "candidate": "a", "term": term, "value": "host-a2", "secret": secret}),
        &["--http2-prior-knowledge"],
    )
    .await
    .json();
    assert_eq!(
        proclaimed["status"], "PROCLAIM_STATUS_PROCLAIMED",
        "{proclaimed}"
    );
    // A missing term is refused naming it, as over gRPC.
    let refused = call(
        &server,
        "Resign",
        json!({"name": "e", "candidate": "a"}),
        &[],
    )
    .await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("term:"),
        "{}",
        refused.json()
    );
    let resigned = call(
        &server,
        "Resign",
        json!({"name": "e", "candidate": "a", "term": term, "secret": secret}),
        &[],
    )
    .await
    .json();
    assert_eq!(resigned["status"], "RESIGN_STATUS_RESIGNED", "{resigned}");
    let nobody = call(&server, "Leader", json!({"name": "e"}), &[])
        .await
        .json();
    assert!(nobody.get("leader").is_none(), "{nobody}");
    server.shutdown().await.unwrap();
}

/// Redis gone: `503 unavailable`, never a grant.
#[tokio::test]
async fn redis_trouble_is_unavailable() {
    let redis = common::start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    drop(redis);
    let answer = call(&server, "Acquire", json!({"name": "r", "holder": "a"}), &[]).await;
    answer.error(503, "unavailable");
    server.shutdown().await.unwrap();
}

/// A call sent to the HTTP port by mistake is told where calls go, in
/// words, as is any other unknown path there.
#[tokio::test]
async fn the_http_ports_404_says_what_the_port_serves() {
    let server = TestServer::new().http().start().await;
    let (status, body) = common::http::http(
        server.http(),
        "POST",
        "/tumbler.v1.LockService/Acquire",
        &[("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("tumbler's HTTP port"), "{body}");
    assert!(body.contains("gRPC port"), "{body}");
    let (status, body) = common::http::get(server.http(), "/nothing").await;
    assert_eq!(status, 404);
    assert!(body.contains("no GET /nothing here"), "{body}");
}
