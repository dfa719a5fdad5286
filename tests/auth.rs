//! Token authentication and namespace authorization, through the real
//! gRPC server with a tokens file: missing, unknown and expired tokens are
//! UNAUTHENTICATED on every RPC; a client token is PERMISSION_DENIED on
//! every RPC outside its namespaces and on admin-only ones; the file is
//! re-read without a restart; per-token request rates hold.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestServer, proto, service_args, start_redis};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tumbler::auth::token_digest;
use tumbler::config::{AuthArgs, ServiceArgs};
use tumbler::proto::lock_service_client::LockServiceClient;

const TEAM_A: &str = "team-a-secret";
const SHARED: &str = "shared-secret";
const ADMIN: &str = "admin-secret";
const EXPIRED: &str = "expired-secret";
const SLOW: &str = "slow-secret";

fn entry(name: &str, token: &str, role: &str, namespaces: &str, extra: &str) -> String {
    format!(
        "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nrole = \"{role}\"\nnamespaces = {namespaces}\n{extra}\n",
        token_digest(token)
    )
}

fn tokens_file() -> String {
    [
        entry("team-a", TEAM_A, "client", r#"["team-a"]"#, ""),
        entry("shared", SHARED, "client", r#"["shared.*"]"#, ""),
        entry("ops", ADMIN, "admin", r#"["*"]"#, ""),
        entry(
            "old",
            EXPIRED,
            "client",
            r#"["team-a"]"#,
            "expires_at = \"2020-01-01T00:00:00Z\"",
        ),
        entry(
            "slow",
            SLOW,
            "client",
            r#"["team-a"]"#,
            "requests_per_second = 1",
        ),
    ]
    .concat()
}

fn auth_args(path: &Path) -> ServiceArgs {
    ServiceArgs {
        auth: AuthArgs {
            auth_tokens_file: Some(path.to_owned()),
            no_auth: false,
            auth_reload_interval_ms: 100,
        },
        ..service_args()
    }
}

struct Setup {
    _redis: tumbler::dev::RedisServer,
    _dir: tempfile::TempDir,
    path: PathBuf,
    server: TestServer,
}

async fn setup() -> Setup {
    let redis = start_redis();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, tokens_file()).unwrap();
    let server = TestServer::start_with(&redis.url(), auth_args(&path)).await;
    Setup {
        _redis: redis,
        _dir: dir,
        path,
        server,
    }
}

/// Sends `authorization` as given (None: no header).
#[derive(Clone)]
struct Header(Option<String>);

impl tonic::service::Interceptor for Header {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        Ok(req)
    }
}

type Client = LockServiceClient<InterceptedService<Channel, Header>>;

async fn client(server: &TestServer, header: Option<String>) -> Client {
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    LockServiceClient::with_interceptor(channel, Header(header))
}

async fn bearer(server: &TestServer, token: &str) -> Client {
    client(server, Some(format!("Bearer {token}"))).await
}

fn code<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// Calls every RPC of the lock service on a lock of `namespace` and
/// returns each RPC's status code (Ok when answered). Session commands
/// report their refusal inside the stream; that code is returned.
async fn every_rpc(client: &mut Client, namespace: &str) -> Vec<(&'static str, Code, String)> {
    let mut out = Vec::new();
    let mut record = |rpc: &'static str, result: Result<(), tonic::Status>| {
        let (code, message) = match result {
            Ok(()) => (Code::Ok, String::new()),
            Err(s) => (s.code(), s.message().to_owned()),
        };
        out.push((rpc, code, message));
    };
    let name = "report".to_string();
    let ns = namespace.to_string();
    let acquire = proto::AcquireRequest {
        namespace: ns.clone(),
        name: name.clone(),
        holder: "h".into(),
        ..Default::default()
    };
    record("Acquire", client.acquire(acquire.clone()).await.map(drop));
    record(
        "Extend",
        client
            .extend(proto::ExtendRequest {
                namespace: ns.clone(),
                name: name.clone(),
                holder: "h".into(),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record(
        "Release",
        client
            .release(proto::ReleaseRequest {
                namespace: ns.clone(),
                name: name.clone(),
                holder: "h".into(),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record(
        "Inspect",
        client
            .inspect(proto::InspectRequest {
                namespace: ns.clone(),
                name: name.clone(),
            })
            .await
            .map(drop),
    );
    record(
        "Queue",
        client
            .queue(proto::QueueRequest {
                namespace: ns.clone(),
                name: name.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record(
        "List",
        client
            .list(proto::ListRequest {
                namespace: ns.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record(
        "Reap",
        client
            .reap(proto::ReapRequest {
                namespace: ns.clone(),
                older_than_ms: None,
            })
            .await
            .map(drop),
    );
    record(
        "ReapWithCutoff",
        client
            .reap(proto::ReapRequest {
                namespace: ns.clone(),
                older_than_ms: Some(3_600_000),
            })
            .await
            .map(drop),
    );
    record(
        "Metrics",
        client
            .metrics(proto::MetricsRequest {
                namespace: ns.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record(
        "Watch",
        client
            .watch(proto::WatchRequest {
                namespace: ns.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record("SessionAcquire", session_acquire(client, acquire).await);
    record(
        "Clear",
        client
            .clear(proto::ClearRequest {
                namespace: ns.clone(),
            })
            .await
            .map(drop),
    );
    out
}

/// Opens a session, sends one acquire command and returns how it was
/// answered: Ok for a reply, the refusal's code otherwise.
async fn session_acquire(
    client: &mut Client,
    acquire: proto::AcquireRequest,
) -> Result<(), tonic::Status> {
    use proto::session_request::Command;
    use proto::session_response::Event;
    let commands = vec![
        Command::Open(proto::SessionOpen {
            ttl_ms: Some(10_000),
        }),
        Command::Acquire(proto::SessionAcquire {
            request_id: 7,
            acquire: Some(acquire),
        }),
    ]
    .into_iter()
    .map(|c| proto::SessionRequest { command: Some(c) });
    // Keep the stream open until the answer arrives.
    let outbound = tokio_stream::iter(commands).chain(tokio_stream::pending());
    let mut events = client.session(outbound).await?.into_inner();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("session answers")?
            .expect("session stays open");
        match event.event {
            Some(Event::Acquired(_)) => return Ok(()),
            Some(Event::Error(e)) if e.request_id == 7 => {
                return Err(tonic::Status::new(Code::from(e.code), e.message));
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_unknown_malformed_and_expired_tokens_are_unauthenticated_on_every_rpc() {
    let s = setup().await;
    for header in [
        None,
        Some("Bearer not-a-token".to_string()),
        Some(format!("Basic {TEAM_A}")),
        Some(TEAM_A.to_string()),
        Some(format!("Bearer {EXPIRED}")),
        Some(format!("Bearer {}", token_digest(TEAM_A))),
    ] {
        let mut c = client(&s.server, header.clone()).await;
        let answers = every_rpc(&mut c, "team-a").await;
        assert_eq!(answers.len(), 12);
        for (rpc, code, message) in answers {
            assert_eq!(
                code,
                Code::Unauthenticated,
                "{rpc} with {header:?}: {message}"
            );
            assert_eq!(message, "missing, unknown or expired bearer token", "{rpc}");
        }
        let namespaces = c.list_namespaces(proto::ListNamespacesRequest {}).await;
        assert_eq!(code(namespaces), Code::Unauthenticated);
    }
    // Health needs no token: probes carry none.
    assert_eq!(
        s.server.health("").await.unwrap(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_is_denied_every_rpc_outside_its_namespaces() {
    let s = setup().await;
    let mut team_a = bearer(&s.server, TEAM_A).await;
    for namespace in ["team-b", "default", "team-a2", "shared.x"] {
        for (rpc, code, message) in every_rpc(&mut team_a, namespace).await {
            assert_eq!(
                code,
                Code::PermissionDenied,
                "{rpc} in {namespace}: {message}"
            );
            // The denial names neither the namespace nor the token.
            assert_eq!(message, "this token may not do that", "{rpc}");
        }
    }
    // A prefix pattern: shared.* but not shared itself.
    let mut shared = bearer(&s.server, SHARED).await;
    for (rpc, code, _) in every_rpc(&mut shared, "shared").await {
        assert_eq!(code, Code::PermissionDenied, "{rpc} in shared");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_works_in_its_namespaces_but_not_as_admin() {
    let s = setup().await;
    for (token, namespace) in [(TEAM_A, "team-a"), (SHARED, "shared.jobs")] {
        let mut c = bearer(&s.server, token).await;
        for (rpc, code, message) in every_rpc(&mut c, namespace).await {
            let expected = match rpc {
                "Clear" | "ReapWithCutoff" => Code::PermissionDenied,
                _ => Code::Ok,
            };
            assert_eq!(code, expected, "{rpc} in {namespace}: {message}");
        }
    }
    // The admin token may do everything, anywhere.
    let mut admin = bearer(&s.server, ADMIN).await;
    for namespace in ["team-a", "team-b"] {
        for (rpc, code, message) in every_rpc(&mut admin, namespace).await {
            assert_eq!(code, Code::Ok, "admin {rpc} in {namespace}: {message}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_only_its_own_namespaces() {
    let s = setup().await;
    let mut admin = bearer(&s.server, ADMIN).await;
    for namespace in ["team-a", "team-b", "shared.jobs", "shared.mail"] {
        let granted = admin
            .acquire(proto::AcquireRequest {
                namespace: namespace.into(),
                name: "x".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(granted.status(), proto::AcquireStatus::Acquired);
    }
    let list = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            c.list_namespaces(proto::ListNamespacesRequest {})
                .await
                .unwrap()
                .into_inner()
                .namespaces
        }
    };
    assert_eq!(
        list(&mut admin).await,
        ["shared.jobs", "shared.mail", "team-a", "team-b"]
    );
    assert_eq!(list(&mut bearer(&s.server, TEAM_A).await).await, ["team-a"]);
    assert_eq!(
        list(&mut bearer(&s.server, SHARED).await).await,
        ["shared.jobs", "shared.mail"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_file_is_reloaded_without_a_restart() {
    let s = setup().await;
    let mut team_a = bearer(&s.server, TEAM_A).await;
    let mut newcomer = bearer(&s.server, "new-secret").await;
    let inspect = |ns: &str| proto::InspectRequest {
        namespace: ns.into(),
        name: "x".into(),
    };
    assert_eq!(
        code(newcomer.inspect(inspect("team-c")).await),
        Code::Unauthenticated
    );

    // Replace the file (as a Secret update would): team-a is gone, a new
    // token appears.
    let next = entry("team-c", "new-secret", "client", r#"["team-c"]"#, "");
    let staged = s.path.with_extension("new");
    std::fs::write(&staged, &next).unwrap();
    std::fs::rename(&staged, &s.path).unwrap();
    wait_until(|| async { code(newcomer.clone().inspect(inspect("team-c")).await) == Code::Ok })
        .await;
    assert_eq!(
        code(team_a.inspect(inspect("team-a")).await),
        Code::Unauthenticated
    );

    // A broken file is refused and the tokens in force stay.
    std::fs::write(&s.path, "[[token]]\nname = 3\n").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(code(newcomer.inspect(inspect("team-c")).await), Code::Ok);
    assert_eq!(
        code(team_a.inspect(inspect("team-a")).await),
        Code::Unauthenticated
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_request_rate_is_resource_exhausted_and_others_are_not() {
    let s = setup().await;
    let mut slow = bearer(&s.server, SLOW).await;
    let mut team_a = bearer(&s.server, TEAM_A).await;
    let inspect = proto::InspectRequest {
        namespace: "team-a".into(),
        name: "x".into(),
    };
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(code(slow.inspect(inspect.clone()).await));
    }
    // One request per second: the first passes, a burst right after it
    // cannot all pass.
    assert_eq!(codes[0], Code::Ok, "{codes:?}");
    assert!(codes.contains(&Code::ResourceExhausted), "{codes:?}");
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, Code::Ok | Code::ResourceExhausted))
    );
    // Another token is not slowed, and the server stays healthy.
    for _ in 0..5 {
        assert_eq!(code(team_a.inspect(inspect.clone()).await), Code::Ok);
    }
    // The budget comes back.
    wait_until(|| async { code(slow.clone().inspect(inspect.clone()).await) == Code::Ok }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_to_start_without_a_choice_about_authentication() {
    let redis = start_redis();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "off"])
        .args(["--redis-url", &redis.url()])
        .env_remove("TUMBLER_NO_AUTH")
        .env_remove("TUMBLER_AUTH_TOKENS_FILE")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--auth-tokens-file") && stderr.contains("--no-auth"),
        "{stderr}"
    );

    // A tokens file that does not parse stops it too, naming the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, "[[token]]\nname = \"x\"\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "off"])
        .args(["--redis-url", &redis.url()])
        .args(["--auth-tokens-file", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--auth-tokens-file"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sends_its_token_and_makes_entries_that_work() {
    let redis = start_redis();
    let dir = tempfile::tempdir().unwrap();
    // `tumbler token` makes the token and its file entry.
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .args(["token", "--name", "ci", "--namespace", "builds"])
        .output()
        .unwrap();
    assert!(made.status.success());
    let text = String::from_utf8(made.stdout).unwrap();
    let token = text
        .lines()
        .find_map(|l| l.trim_start_matches('#').trim().strip_prefix("tmb_"))
        .map(|t| format!("tmb_{t}"))
        .expect("a token line");
    assert!(!text.contains(&format!("sha256 = \"{token}\"")));
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, &text).unwrap();
    let server = TestServer::start_with(&redis.url(), auth_args(&path)).await;

    let cli = |args: &[&str], token: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"));
        command
            .args(args)
            .args(["--addr", &server.endpoint()])
            .env_remove("TUMBLER_TOKEN");
        if let Some(token) = token {
            command.env("TUMBLER_TOKEN", token);
        }
        command.output().unwrap()
    };
    let held = cli(&["acquire", "--namespace", "builds", "main"], Some(&token));
    assert!(
        held.status.success(),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    let other = cli(&["inspect", "--namespace", "deploys", "main"], Some(&token));
    assert_eq!(other.status.code(), Some(77));
    assert!(String::from_utf8_lossy(&other.stderr).contains("PERMISSION_DENIED"));
    let anonymous = cli(&["inspect", "--namespace", "builds", "main"], None);
    assert_eq!(anonymous.status.code(), Some(77));
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("UNAUTHENTICATED"));
}

/// Polls `check` until it holds (up to 10 s).
async fn wait_until<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("condition not reached within 10 s");
}
