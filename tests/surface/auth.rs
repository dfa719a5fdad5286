//! Token authentication and namespace authorization, through the real
//! gRPC server with a tokens file: missing, unknown and expired tokens are
//! UNAUTHENTICATED on every RPC; a client token is PERMISSION_DENIED on
//! every RPC outside its namespaces and on admin-only ones; the file is
//! re-read without a restart; per-token request rates hold.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::wait::wait_until_async;
use common::{TestServer, proto, service_args, start_redis};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tumbler::auth::token_digest;
use tumbler::config::{AuthArgs, ServiceArgs};
use tumbler::proto::lock_service_client::LockServiceClient;

pub(super) const TEAM_A: &str = "team-a-secret";
const SHARED: &str = "shared-secret";
pub(super) const ADMIN: &str = "admin-secret";
const EXPIRED: &str = "expired-secret";
const SLOW: &str = "slow-secret";
const SYSTEM_READER: &str = "system-reader-secret";

pub(super) fn entry(name: &str, token: &str, role: &str, namespaces: &str, extra: &str) -> String {
    format!(
        "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nrole = \"{role}\"\nnamespaces = {namespaces}\n{extra}\n",
        token_digest(token)
    )
}

pub(super) fn tokens_file() -> String {
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
        entry(
            "system-reader",
            SYSTEM_READER,
            "admin",
            r#"["tumbler-system"]"#,
            "",
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

pub(super) struct Setup {
    _redis: tumbler::dev::RedisServer,
    _dir: tempfile::TempDir,
    pub(super) path: PathBuf,
    pub(super) server: TestServer,
}

async fn setup() -> Setup {
    setup_with(&tokens_file()).await
}

pub(super) async fn setup_with(tokens: &str) -> Setup {
    let redis = start_redis();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, tokens).unwrap();
    let server = TestServer::new()
        .redis(&redis.url())
        .args(auth_args(&path))
        .start()
        .await;
    Setup {
        _redis: redis,
        _dir: dir,
        path,
        server,
    }
}

/// Sends `authorization` as given (None: no header).
#[derive(Clone)]
pub(super) struct Header(Option<String>);

impl tonic::service::Interceptor for Header {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        Ok(req)
    }
}

pub(super) type Client = LockServiceClient<InterceptedService<Channel, Header>>;

async fn client(server: &TestServer, header: Option<String>) -> Client {
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    LockServiceClient::with_interceptor(channel, Header(header))
}

pub(super) async fn bearer(server: &TestServer, token: &str) -> Client {
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
    // A Batch answers OK and each item as its own call: its one item's
    // error is the answer here.
    let item = proto::BatchItem {
        call: Some(proto::batch_item::Call::Acquire(acquire.clone())),
    };
    record(
        "Batch",
        client
            .batch(proto::BatchRequest { items: vec![item] })
            .await
            .and_then(|reply| match reply.into_inner().results.pop() {
                Some(proto::BatchResult {
                    result: Some(proto::batch_result::Result::Error(e)),
                }) => Err(tonic::Status::new(Code::from(e.code), e.message)),
                _ => Ok(()),
            }),
    );
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
    // The election RPCs, on an election of their own.
    let election = "leader".to_string();
    record(
        "Campaign",
        client
            .campaign(proto::CampaignRequest {
                namespace: ns.clone(),
                name: election.clone(),
                candidate: "c".into(),
                wait_ms: Some(0),
                ..Default::default()
            })
            .await
            .map(drop),
    );
    record(
        "Leader",
        client
            .leader(proto::LeaderRequest {
                namespace: ns.clone(),
                name: election.clone(),
            })
            .await
            .map(drop),
    );
    record(
        "Proclaim",
        client
            .proclaim(proto::ProclaimRequest {
                namespace: ns.clone(),
                name: election.clone(),
                candidate: "c".into(),
                term: 1,
                value: "v".into(),
                secret: "not-the-leaders".into(),
            })
            .await
            .map(drop),
    );
    record(
        "Observe",
        client
            .observe(proto::LeaderRequest {
                namespace: ns.clone(),
                name: election.clone(),
            })
            .await
            .map(drop),
    );
    record(
        "Resign",
        client
            .resign(proto::ResignRequest {
                namespace: ns.clone(),
                name: election.clone(),
                candidate: "c".into(),
                term: 1,
                secret: "not-the-leaders".into(),
            })
            .await
            .map(drop),
    );
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
            ..Default::default()
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
        assert_eq!(answers.len(), 18);
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
    wait_until_async(
        "the new token is accepted",
        Duration::from_secs(10),
        || async { code(newcomer.clone().inspect(inspect("team-c")).await) == Code::Ok },
    )
    .await;
    assert_eq!(
        code(team_a.inspect(inspect("team-a")).await),
        Code::Unauthenticated
    );

    // A broken file is refused and the tokens in force stay; so is an
    // empty one (a file caught mid-write: `fs::write` truncates first).
    std::fs::write(&s.path, "").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(code(newcomer.inspect(inspect("team-c")).await), Code::Ok);
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
    wait_until_async("the budget comes back", Duration::from_secs(10), || async {
        code(slow.clone().inspect(inspect.clone()).await) == Code::Ok
    })
    .await;
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
    let server = TestServer::new().auth(&text).start().await;

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

/// Replaces the tokens file at once, as a Secret update does.
pub(super) fn replace_tokens_file(path: &Path, text: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// A session opened with `token`: its command sender and events.
pub(super) async fn open_session(
    client: &mut Client,
) -> (
    tokio::sync::mpsc::Sender<proto::SessionRequest>,
    tonic::Streaming<proto::SessionResponse>,
) {
    use proto::session_request::Command;
    let (commands, outbox) = tokio::sync::mpsc::channel(256);
    commands
        .send(proto::SessionRequest {
            command: Some(Command::Open(proto::SessionOpen {
                ttl_ms: Some(10_000),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
    let mut events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .unwrap()
        .into_inner();
    let opened = events.message().await.unwrap().unwrap();
    assert!(matches!(
        opened.event,
        Some(proto::session_response::Event::Opened(_))
    ));
    (commands, events)
}

pub(super) fn session_acquire_command(
    id: u64,
    namespace: &str,
    name: &str,
) -> proto::SessionRequest {
    proto::SessionRequest {
        command: Some(proto::session_request::Command::Acquire(
            proto::SessionAcquire {
                request_id: id,
                acquire: Some(proto::AcquireRequest {
                    namespace: namespace.into(),
                    name: name.into(),
                    ..Default::default()
                }),
            },
        )),
    }
}

/// Reads a session to its end: the `lost` events it told, and the status
/// it ended with.
pub(super) async fn session_end(
    events: &mut tonic::Streaming<proto::SessionResponse>,
) -> (Vec<proto::GrantLost>, tonic::Status) {
    use proto::session_response::Event;
    let mut lost = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), events.message())
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

/// Reads a watch to its end; the status it ended with.
async fn watch_end(events: &mut tonic::Streaming<proto::LockEvent>) -> tonic::Status {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("the watch ends within 10 s");
        match next {
            Ok(Some(_)) => {}
            Ok(None) => return tonic::Status::ok(""),
            Err(status) => return status,
        }
    }
}

pub(super) async fn holders(admin: &mut Client, namespace: &str, name: &str) -> usize {
    admin
        .inspect(proto::InspectRequest {
            namespace: namespace.into(),
            name: name.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .holders
        .len()
}

/// Opens a session holding `team-a/held` and a watch on `team-a` with
/// `token`; returns them once both work.
async fn session_and_watch(
    server: &TestServer,
    token: &str,
) -> (
    tokio::sync::mpsc::Sender<proto::SessionRequest>,
    tonic::Streaming<proto::SessionResponse>,
    tonic::Streaming<proto::LockEvent>,
) {
    use proto::session_response::Event;
    let mut c = bearer(server, token).await;
    let (commands, mut events) = open_session(&mut c).await;
    commands
        .send(session_acquire_command(1, "team-a", "held"))
        .await
        .unwrap();
    let reply = events.message().await.unwrap().unwrap();
    let Some(Event::Acquired(acquired)) = reply.event else {
        panic!("expected a grant, got {reply:?}");
    };
    assert_eq!(
        acquired.response.unwrap().status(),
        proto::AcquireStatus::Acquired
    );
    let watch = c
        .watch(proto::WatchRequest {
            namespace: "team-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (commands, events, watch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_session_with_lost_grants_and_its_watch() {
    let s = setup().await;
    let mut admin = bearer(&s.server, ADMIN).await;
    let (commands, mut events, mut watch) = session_and_watch(&s.server, TEAM_A).await;
    assert_eq!(holders(&mut admin, "team-a", "held").await, 1);

    // team-a's token leaves the file; the others stay.
    let without_team_a =
        tokens_file().replace(&entry("team-a", TEAM_A, "client", r#"["team-a"]"#, ""), "");
    assert_ne!(without_team_a, tokens_file());
    replace_tokens_file(&s.path, &without_team_a);

    let (lost, status) = session_end(&mut events).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(
        (lost[0].namespace.as_str(), lost[0].name.as_str()),
        ("team-a", "held")
    );
    assert_eq!(lost[0].reason, "session ended");
    assert_eq!(watch_end(&mut watch).await.code(), Code::Unauthenticated);
    // The grant was released at once, not left to its lease.
    assert_eq!(holders(&mut admin, "team-a", "held").await, 0);
    drop(commands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_expires_ends_its_streams_at_its_expiry() {
    // The file holds whole seconds: the token expires at the written time,
    // which is up to a second before `now + 3 s`.
    let written =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3));
    let expires = humantime::parse_rfc3339(&written.to_string()).unwrap();
    let brief = entry(
        "brief",
        "brief-secret",
        "client",
        r#"["team-a"]"#,
        &format!("expires_at = \"{written}\""),
    );
    let s = setup_with(&format!("{}{brief}", tokens_file())).await;
    let mut admin = bearer(&s.server, ADMIN).await;
    let (commands, mut events, mut watch) = session_and_watch(&s.server, "brief-secret").await;

    // No reload happens: the expiry alone ends both streams.
    let (lost, status) = session_end(&mut events).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(std::time::SystemTime::now() + Duration::from_millis(100) >= expires);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(watch_end(&mut watch).await.code(), Code::Unauthenticated);
    assert_eq!(holders(&mut admin, "team-a", "held").await, 0);
    drop(commands);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_commands_are_charged_to_the_tokens_request_rate() {
    use proto::session_response::Event;
    let five = entry(
        "five",
        "five-secret",
        "client",
        r#"["team-a"]"#,
        "requests_per_second = 5",
    );
    let s = setup_with(&format!("{}{five}", tokens_file())).await;
    let mut c = bearer(&s.server, "five-secret").await;
    let (commands, mut events) = open_session(&mut c).await;
    let started = std::time::Instant::now();
    for id in 1..=200 {
        commands
            .send(session_acquire_command(id, "team-a", &format!("lock-{id}")))
            .await
            .unwrap();
    }
    let (mut granted, mut limited) = (0, 0);
    while granted + limited < 200 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("every command is answered")
            .unwrap()
            .unwrap();
        match event.event {
            Some(Event::Acquired(_)) => granted += 1,
            Some(Event::Error(e)) => {
                assert_eq!(e.code, Code::ResourceExhausted as i32, "{}", e.message);
                assert!(e.message.contains("rate"), "{}", e.message);
                limited += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // At 5 per second (a burst of 5 first), as unary calls would be.
    let allowed = 5 + 5 * started.elapsed().as_secs() as usize + 1;
    assert!(
        granted <= allowed,
        "{granted} grants, at most {allowed} allowed"
    );
    assert!(granted >= 1, "the first commands pass");
    // The session goes on, and its budget comes back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    commands
        .send(session_acquire_command(1000, "team-a", "later"))
        .await
        .unwrap();
    let event = events.message().await.unwrap().unwrap();
    assert!(matches!(event.event, Some(Event::Acquired(_))), "{event:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbler_system_is_reserved_even_for_everywhere_tokens_and_without_auth() {
    let s = setup().await;
    let reserved = "namespace: tumbler-system is reserved for tumbler's own locks";
    // An admin token for every namespace: no RPC at all.
    let mut admin = bearer(&s.server, ADMIN).await;
    for (rpc, code, message) in every_rpc(&mut admin, "tumbler-system").await {
        assert_eq!(code, Code::PermissionDenied, "{rpc}: {message}");
        assert_eq!(message, reserved, "{rpc}");
    }
    // An admin token that names it exactly may read it, nothing more.
    let mut reader = bearer(&s.server, SYSTEM_READER).await;
    for (rpc, code, message) in every_rpc(&mut reader, "tumbler-system").await {
        let expected = match rpc {
            "Inspect" | "Queue" | "List" | "Leader" => Code::Ok,
            _ => Code::PermissionDenied,
        };
        assert_eq!(code, expected, "{rpc}: {message}");
    }
    // Without authentication: nobody.
    let open = TestServer::new().redis(&s._redis.url()).start().await;
    let mut anyone = client(&open, None).await;
    for (rpc, code, message) in every_rpc(&mut anyone, "tumbler-system").await {
        assert_eq!(code, Code::PermissionDenied, "--no-auth {rpc}: {message}");
        assert_eq!(message, reserved, "{rpc}");
    }
}

/// Opens a stream whose first message is `open`; the opened event (or the
/// refusal), the stream's events and its command sender.
async fn open_stream(
    client: &mut Client,
    open: proto::SessionOpen,
) -> Result<
    (
        proto::SessionOpened,
        tonic::Streaming<proto::SessionResponse>,
        tokio::sync::mpsc::Sender<proto::SessionRequest>,
    ),
    tonic::Status,
> {
    use proto::session_request::Command;
    use proto::session_response::Event;
    let (commands, outbox) = tokio::sync::mpsc::channel(8);
    commands
        .send(proto::SessionRequest {
            command: Some(Command::Open(open)),
        })
        .await
        .unwrap();
    let mut events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await?
        .into_inner();
    match events.message().await?.and_then(|m| m.event) {
        Some(Event::Opened(opened)) => Ok((opened, events, commands)),
        other => panic!("expected opened, got {other:?}"),
    }
}

/// A session belongs to its token: another token (even one with the same
/// namespaces) cannot resume it, secret or not, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_be_resumed_with_another_token() {
    use proto::session_request::Command;
    let s = setup().await;
    let mut owner = bearer(&s.server, TEAM_A).await;
    let (opened, mut events, commands) = open_stream(
        &mut owner,
        proto::SessionOpen {
            ttl_ms: Some(1_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    commands
        .send(proto::SessionRequest {
            command: Some(Command::Acquire(proto::SessionAcquire {
                request_id: 1,
                acquire: Some(proto::AcquireRequest {
                    namespace: "team-a".into(),
                    ..common::acquire("owned", "")
                }),
            })),
        })
        .await
        .unwrap();
    events.message().await.unwrap().expect("acquired");

    let resume = proto::SessionOpen {
        ttl_ms: None,
        resume: Some(proto::SessionResume {
            session_id: opened.session_id.clone(),
            secret: opened.resume_secret.clone(),
        }),
    };
    let mut other = bearer(&s.server, SLOW).await;
    // Refused as an unknown session is: another token learns nothing.
    let refused = open_stream(&mut other, resume.clone()).await.err().unwrap();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let mut admin = bearer(&s.server, ADMIN).await;
    let refused = open_stream(&mut admin, resume.clone()).await.err().unwrap();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");

    // The owner's stream still serves the session: its grant is renewed.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        commands
            .send(proto::SessionRequest {
                command: Some(Command::KeepAlive(proto::SessionKeepAlive {})),
            })
            .await
            .unwrap();
    }
    assert_eq!(holders(&mut admin, "team-a", "owned").await, 1);
    // And the owner's token may resume it (taking it over).
    let (resumed, _, _) = open_stream(&mut owner, resume).await.unwrap();
    assert!(resumed.resumed);
    assert_eq!(resumed.grants.len(), 1, "{resumed:?}");
}

/// A client of `token` whose connections come from `from` (a loopback
/// address of its own, as another host's would).
async fn bearer_from(server: &TestServer, token: &str, from: [u8; 4]) -> Client {
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .local_address(Some(std::net::IpAddr::from(from)))
        .connect()
        .await
        .unwrap();
    LockServiceClient::with_interceptor(channel, Header(Some(format!("Bearer {token}"))))
}

/// Failed resumes (wrong secret, unknown id: counted alike) are throttled
/// per client address: past the limit (10 a minute by default) that
/// address is refused RESOURCE_EXHAUSTED, even with the right secret, and
/// nothing is looked up; another address resumes the session as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_resumes_are_throttled_per_address() {
    let s = setup().await;
    let mut owner = bearer(&s.server, TEAM_A).await;
    let (opened, _events, _commands) = open_stream(
        &mut owner,
        proto::SessionOpen {
            ttl_ms: Some(10_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let resume = |secret: &str| proto::SessionOpen {
        ttl_ms: None,
        resume: Some(proto::SessionResume {
            session_id: opened.session_id.clone(),
            secret: secret.to_owned(),
        }),
    };
    let wrong = "0".repeat(64);

    let mut guesser = bearer_from(&s.server, TEAM_A, [127, 0, 0, 2]).await;
    for attempt in 1..=10 {
        let refused = open_stream(&mut guesser, resume(&wrong))
            .await
            .err()
            .unwrap();
        assert_eq!(
            refused.code(),
            Code::NotFound,
            "attempt {attempt}: {refused:?}"
        );
    }
    for secret in [wrong.as_str(), opened.resume_secret.as_str()] {
        let throttled = open_stream(&mut guesser, resume(secret))
            .await
            .err()
            .unwrap();
        assert_eq!(throttled.code(), Code::ResourceExhausted, "{throttled:?}");
    }

    let mut elsewhere = bearer_from(&s.server, TEAM_A, [127, 0, 0, 3]).await;
    let (resumed, _, _) = open_stream(&mut elsewhere, resume(&opened.resume_secret))
        .await
        .expect("another address resumes as usual");
    assert!(resumed.resumed);
}
