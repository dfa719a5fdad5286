//! The dashboard's JSON endpoints and admin routes on the HTTP port of a
//! live in-process server with a real Redis: the same numbers as the gRPC
//! API, the same validation messages (as 400s), and admin actions refused
//! unless `--dashboard-admin` turned them on. With a tokens file: nothing
//! but the login form, `/metrics` and `/healthz` without a valid token
//! (bearer header or login cookie), a client token limited to its
//! namespaces, admin actions only for admin tokens.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::http::{Reply, fetch, http};
use common::*;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::{ServerConfig, ServiceArgs};

/// A server with its HTTP port (and the dashboard) on.
struct DashServer {
    grpc: String,
    http: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl DashServer {
    async fn start(redis_url: &str, admin: bool) -> Self {
        Self::launch(redis_url, admin, None).await
    }

    /// A server with auth on, reading (and re-reading) `tokens`.
    async fn with_tokens(redis_url: &str, admin: bool, tokens: &Path) -> Self {
        Self::launch(redis_url, admin, Some(tokens.to_owned())).await
    }

    async fn launch(redis_url: &str, admin: bool, tokens: Option<PathBuf>) -> Self {
        let mut args = service_args();
        args.reap_interval_ms = 200;
        args.auth.auth_tokens_file = tokens;
        args.auth.auth_reload_interval_ms = 100;
        Self::launch_with(redis_url, admin, &args).await
    }

    async fn launch_with(redis_url: &str, admin: bool, args: &ServiceArgs) -> Self {
        let mut config = ServerConfig::new(redis_url.to_owned(), args).unwrap();
        config.dashboard_admin = admin;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = format!("http://{}", listener.local_addr().unwrap());
        let http_addr = http.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(tumbler::server::serve_with_http(
            config,
            listener,
            Some(http),
            async {
                let _ = stopped.await;
            },
        ));
        wait_for_health(&grpc, ServingStatus::Serving).await;
        DashServer {
            grpc,
            http: http_addr,
            _stop: stop,
        }
    }

    async fn client(
        &self,
    ) -> proto::lock_service_client::LockServiceClient<tonic::transport::Channel> {
        proto::lock_service_client::LockServiceClient::connect(self.grpc.clone())
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> (u16, String) {
        http(self.http, "GET", path, &[], "").await
    }

    async fn get_json(&self, path: &str) -> (u16, Value) {
        let (status, body) = self.get(path).await;
        let json = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"));
        (status, json)
    }

    async fn post_form(&self, path: &str, headers: &[(&str, &str)], form: &str) -> (u16, String) {
        let reply = self.post(path, headers, form).await;
        (reply.status, reply.body)
    }

    /// A form POST; the whole reply.
    async fn post(&self, path: &str, headers: &[(&str, &str)], form: &str) -> Reply {
        let mut all = vec![("Content-Type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        fetch(self.http, "POST", path, &all, form).await
    }

    /// A GET with `headers`; the whole reply.
    async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        fetch(self.http, "GET", path, headers, "").await
    }
}

fn kinded(name: &str, holder: &str, kind: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        kind: kind.into(),
        ..acquire(name, holder)
    }
}

/// worker-1 holds `reports` (kind export, with metadata), worker-2 was
/// denied, worker-3 waits in its queue; runner-a and runner-b hold two of
/// three permits of `jobs/nightly`. Returns worker-1's fencing token and
/// the waiter's task.
async fn scene(server: &DashServer) -> (u64, tokio::task::JoinHandle<proto::AcquireResponse>) {
    let mut client = server.client().await;
    let mut first = kinded("reports", "worker-1", "export");
    first.metadata.insert("team".into(), "billing".into());
    let grant = client
        .acquire(first)
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    client
        .acquire(kinded("reports", "worker-2", "export"))
        .await
        .unwrap();
    let mut waiting = server.client().await;
    let waiter = tokio::spawn(async move {
        waiting
            .acquire(proto::AcquireRequest {
                wait_ms: 30_000,
                ..kinded("reports", "worker-3", "export")
            })
            .await
            .unwrap()
            .into_inner()
    });
    for holder in ["runner-a", "runner-b"] {
        client
            .acquire(proto::AcquireRequest {
                limit: Some(3),
                ..kinded("jobs/nightly", holder, "batch")
            })
            .await
            .unwrap();
    }
    // The waiter is queued once Inspect counts it.
    until_waiters(&mut client, "reports", 1).await;
    (grant.fencing_token, waiter)
}

fn counters(row: &Value) -> Vec<u64> {
    [
        "acquired",
        "denied",
        "timed_out",
        "released",
        "extended",
        "expired",
        "reaped",
        "errors",
    ]
    .iter()
    .map(|k| row[k].as_u64().unwrap())
    .collect()
}

fn rpc_counters(row: &proto::MetricsRow) -> Vec<u64> {
    vec![
        row.acquired,
        row.denied,
        row.timed_out,
        row.released,
        row.extended,
        row.expired,
        row.reaped,
        row.errors,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoints_show_what_the_grpc_api_shows() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let (token, _waiter) = scene(&server).await;
    let mut client = server.client().await;

    // List, with a prefix, and paging.
    let (status, page) = server.get_json("/api/v1/locks").await;
    assert_eq!(status, 200, "{page}");
    let mut names: Vec<(String, u64, u64, u64)> = page["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                l["holders"].as_u64().unwrap(),
                l["limit"].as_u64().unwrap(),
                l["waiters"].as_u64().unwrap(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("jobs/nightly".to_owned(), 2, 3, 0),
            ("reports".to_owned(), 1, 1, 1)
        ]
    );
    assert_eq!(page["next_page_token"], "");
    let (_, page) = server.get_json("/api/v1/locks?prefix=jobs%2F").await;
    assert_eq!(page["locks"].as_array().unwrap().len(), 1);
    assert_eq!(page["locks"][0]["name"], "jobs/nightly");
    let (_, first) = server.get_json("/api/v1/locks?page_size=1").await;
    assert_eq!(first["locks"].as_array().unwrap().len(), 1);
    let next = first["next_page_token"].as_str().unwrap();
    assert!(!next.is_empty());
    let (_, second) = server
        .get_json(&format!("/api/v1/locks?page_size=1&page_token={next}"))
        .await;
    assert_eq!(second["locks"].as_array().unwrap().len(), 1);
    assert_ne!(second["locks"][0]["name"], first["locks"][0]["name"]);

    // One lock: Inspect and Queue.
    let (status, lock) = server.get_json("/api/v1/locks/reports").await;
    assert_eq!(status, 200, "{lock}");
    assert_eq!(lock["limit"], 1);
    assert_eq!(lock["waiters"], 1);
    assert_eq!(lock["admin"], false);
    let holder = &lock["holders"][0];
    assert_eq!(holder["holder"], "worker-1");
    assert_eq!(holder["fencing_token"], token.to_string());
    assert_eq!(holder["slot"], 1);
    assert_eq!(holder["kind"], "export");
    assert_eq!(holder["metadata"]["team"], "billing");
    let remaining = holder["remaining_ms"].as_i64().unwrap();
    assert!((1..=30_000).contains(&remaining), "{remaining}");
    let queued = &lock["queue"]["requests"];
    assert_eq!(queued.as_array().unwrap().len(), 1);
    assert_eq!(queued[0]["holder"], "worker-3");
    assert_eq!(queued[0]["position"], 1);
    assert_eq!(queued[0]["fair"], true);
    // Names with a slash work as a path.
    let (status, jobs) = server.get_json("/api/v1/locks/jobs%2Fnightly").await;
    assert_eq!(status, 200, "{jobs}");
    assert_eq!(jobs["holders"].as_array().unwrap().len(), 2);

    // Metrics: the Metrics RPC's numbers.
    let (status, metrics) = server.get_json("/api/v1/metrics?minutes=60").await;
    assert_eq!(status, 200, "{metrics}");
    let rpc = client
        .metrics(proto::MetricsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let shown: Vec<(String, Vec<u64>)> = metrics["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row["kind"].as_str().unwrap().to_owned(), counters(row)))
        .collect();
    let expected: Vec<(String, Vec<u64>)> = rpc
        .totals
        .iter()
        .map(|row| (row.kind.clone(), rpc_counters(row)))
        .collect();
    assert_eq!(shown, expected);
    assert_eq!(
        counters(&metrics["overall"]),
        rpc_counters(rpc.overall.as_ref().unwrap())
    );
    // export: 1 acquired, 1 denied; batch: 2 acquired.
    assert_eq!(shown[0].0, "batch");
    assert_eq!(shown[0].1[0], 2);
    assert_eq!(shown[1].1[..2], [1, 1]);
    let (_, only) = server.get_json("/api/v1/metrics?kind=batch").await;
    assert_eq!(only["totals"].as_array().unwrap().len(), 1);

    // Overview.
    let (status, overview) = server.get_json("/api/v1/overview").await;
    assert_eq!(status, 200, "{overview}");
    assert_eq!(overview["locks"], 2);
    assert_eq!(overview["locks_held"], 2);
    assert_eq!(overview["holders"], 3);
    assert_eq!(overview["waiters"], 1);
    assert_eq!(overview["busiest"][0]["name"], "reports");
    assert_eq!(overview["last_hour"]["acquired"], 3);
    assert_eq!(overview["series"].as_array().unwrap().len(), 60);
    let charted: u64 = overview["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["acquired"].as_u64().unwrap())
        .sum();
    assert_eq!(charted, 3);

    // tumbler-system is tumbler's own (the reaper's lock): with auth off
    // it holds a lock but is not shown, and none of its endpoints answer.
    let mut redis_conn = redis_conn(&redis.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while scan_keys(&mut redis_conn, "tumbler:{tumbler-system:*")
        .await
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reaper never took its lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, namespaces) = server.get_json("/api/v1/namespaces").await;
    let listed = namespaces["namespaces"].as_array().unwrap();
    assert!(listed.contains(&"default".into()), "{namespaces}");
    assert!(!listed.contains(&"tumbler-system".into()), "{namespaces}");
    for path in [
        "/api/v1/reaper",
        "/api/v1/locks?namespace=tumbler-system",
        "/api/v1/locks/reaper?namespace=tumbler-system",
        "/api/v1/overview?namespace=tumbler-system",
        "/api/v1/metrics?namespace=tumbler-system",
    ] {
        let (status, body) = server.get_json(path).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(
            body["error"], "namespace: tumbler-system is reserved for tumbler's own locks",
            "{path}"
        );
        assert!(!body.to_string().contains("replica-"), "{path}: {body}");
    }
    for path in [
        "/dashboard/reaper",
        "/dashboard/locks?namespace=tumbler-system",
        "/dashboard/lock?namespace=tumbler-system&name=reaper",
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 403, "{path}");
        assert!(body.contains("reserved for tumbler"), "{path}: {body}");
    }

    // The pages and their assets are served.
    for path in [
        "/dashboard",
        "/dashboard/locks",
        "/dashboard/lock?name=reports",
        "/dashboard/metrics",
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 200, "{path}");
        assert!(body.contains("<main id=\"main\""), "{path}");
        assert!(body.contains("data-admin=\"off\""), "{path}");
        assert!(
            !body.contains("/dashboard/reaper"),
            "no Reaper link: {path}"
        );
        assert!(
            !body.contains("/dashboard/logout"),
            "no login without auth: {path}"
        );
    }
    // Auth off: nothing to log in to.
    let login = server.get_with("/dashboard/login", &[]).await;
    assert_eq!(login.status, 303);
    assert_eq!(login.header("location"), Some("/dashboard"));
    let (status, js) = server.get("/dashboard/assets/app.js").await;
    assert_eq!(status, 200);
    assert!(js.contains("REFRESH_MS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_with_the_grpc_message() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let mut client = server.client().await;

    // The same rule and message as the gRPC API's INVALID_ARGUMENT.
    let grpc = client
        .inspect(proto::InspectRequest {
            namespace: "no spaces".into(),
            name: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(grpc.code(), tonic::Code::InvalidArgument);
    let (status, body) = server
        .get_json("/api/v1/locks/x?namespace=no%20spaces")
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], grpc.message());
    assert_eq!(body["code"], "INVALID_ARGUMENT");

    let long = "n".repeat(513);
    let grpc = client.inspect(inspect(&long)).await.unwrap_err();
    let (status, body) = server.get_json(&format!("/api/v1/locks/{long}")).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], grpc.message());

    let grpc = client
        .list(proto::ListRequest {
            page_token: "garbage!".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let (status, body) = server.get_json("/api/v1/locks?page_token=garbage!").await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], grpc.message());

    let cases = [
        (
            "/api/v1/locks?page_size=5000",
            "page_size: must be at most 1000",
        ),
        (
            "/api/v1/locks?page_size=many",
            "page_size: must be a whole number",
        ),
        (
            "/api/v1/locks/x?max_entries=2000",
            "max_entries: must be at most 1000",
        ),
        (
            "/api/v1/metrics?minutes=0",
            "minutes: must be between 1 and 1440",
        ),
        ("/api/v1/metrics?kind=Upper", "kind: "),
        ("/api/v1/overview?namespace=a%2Fb", "namespace: "),
    ];
    for (path, message) in cases {
        let (status, body) = server.get_json(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap().starts_with(message),
            "{path}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_are_refused_when_admin_is_off() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let (token, _waiter) = scene(&server).await;
    let mut client = server.client().await;

    let release =
        format!("namespace=default&name=reports&holder=worker-1&fencing_token={token}&confirm=yes");
    let (status, body) = server
        .post_form("/dashboard/admin/release", &[], &release)
        .await;
    assert_eq!(status, 403);
    assert!(body.contains("--dashboard-admin"), "{body}");
    let (status, _) = server
        .post_form(
            "/dashboard/admin/clear",
            &[],
            "namespace=default&typed=default&confirm=yes",
        )
        .await;
    assert_eq!(status, 403);
    for page in [
        "/dashboard/release?name=reports&holder=worker-1",
        "/dashboard/clear",
    ] {
        assert_eq!(server.get(page).await.0, 403, "{page}");
    }
    // GET on an admin action is not one.
    assert_eq!(server.get("/dashboard/admin/release").await.0, 405);

    let state = client
        .inspect(inspect("reports"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.holders.len(), 1, "nothing was released");
    assert_eq!(state.waiters, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_when_enabled_need_confirmation_and_same_origin() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), true).await;
    let (token, waiter) = scene(&server).await;
    let mut client = server.client().await;

    // The confirmation page shows the grant and posts its token.
    let (status, page) = server
        .get("/dashboard/release?name=reports&holder=worker-1")
        .await;
    assert_eq!(status, 200);
    assert!(page.contains(&format!("value=\"{token}\"")), "{page}");

    let form = format!("name=reports&holder=worker-1&fencing_token={token}");
    // Without the confirmation: refused.
    let (status, _) = server
        .post_form("/dashboard/admin/release", &[], &form)
        .await;
    assert_eq!(status, 400);
    // From another site: refused.
    let confirmed = format!("{form}&confirm=yes");
    let (status, _) = server
        .post_form(
            "/dashboard/admin/release",
            &[("Origin", "http://elsewhere.example")],
            &confirmed,
        )
        .await;
    // An open dashboard's Host/Origin allow-list answers first (421); the
    // cross-site check behind it would say 403.
    assert_eq!(status, 421);
    // Pinned to another token: nothing happens.
    let stale = "name=reports&holder=worker-1&fencing_token=1&confirm=yes";
    let (status, body) = server
        .post_form("/dashboard/admin/release", &[], stale)
        .await;
    assert_eq!(status, 200);
    assert!(body.contains("nothing changed"), "{body}");
    assert_eq!(
        client
            .inspect(inspect("reports"))
            .await
            .unwrap()
            .into_inner()
            .holders[0]
            .grant
            .as_ref()
            .unwrap()
            .holder,
        "worker-1"
    );

    // Confirmed, same origin: released, and the waiter gets the lock.
    let (status, body) = server
        .post_form(
            "/dashboard/admin/release",
            &[("Sec-Fetch-Site", "same-origin")],
            &confirmed,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("was released"), "{body}");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(granted.grant.unwrap().holder, "worker-3");

    // Clear: the namespace must be typed.
    let (status, _) = server
        .post_form(
            "/dashboard/admin/clear",
            &[],
            "namespace=default&typed=defualt&confirm=yes",
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        client
            .list(proto::ListRequest::default())
            .await
            .unwrap()
            .into_inner()
            .locks
            .len(),
        2
    );
    let (status, body) = server
        .post_form(
            "/dashboard/admin/clear",
            &[],
            "namespace=default&typed=default&confirm=yes",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("2 locks cleared, 3 grants released"),
        "{body}"
    );
    assert!(
        client
            .list(proto::ListRequest::default())
            .await
            .unwrap()
            .into_inner()
            .locks
            .is_empty()
    );
}

// ------------------------------------------------------------ with auth on

const OPS: &str = "ops-secret";
const VIEWER: &str = "viewer-secret";
const TEAM_A: &str = "team-a-secret";
const TEAM_A_ADMIN: &str = "team-a-admin-secret";
const EXPIRED: &str = "expired-secret";
const SYSTEM: &str = "system-secret";
const UNAUTHENTICATED: &str = "authentication required: send a valid token as \
     `authorization: Bearer <token>`, or log in at /dashboard/login";

/// ops: admin everywhere; viewer: client everywhere; team-a: client in
/// team-a; team-a-admin: admin in team-a only; old: expired; system:
/// admin naming tumbler-system (the one that may read it).
fn tokens_file() -> String {
    [
        token_entry("ops", OPS, "admin", r#"["*"]"#, ""),
        token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""),
        token_entry("team-a", TEAM_A, "client", r#"["team-a"]"#, ""),
        token_entry("team-a-admin", TEAM_A_ADMIN, "admin", r#"["team-a"]"#, ""),
        token_entry(
            "old",
            EXPIRED,
            "client",
            r#"["*"]"#,
            "expires_at = \"2020-01-01T00:00:00Z\"",
        ),
        token_entry("system", SYSTEM, "admin", r#"["tumbler-system"]"#, ""),
    ]
    .concat()
}

/// A Redis, a tokens file and a server with auth on; worker-1 holds
/// `reports` in `default`, a-worker holds `a-lock` in team-a, b-worker
/// holds `b-lock` in team-b (all acquired with the ops token).
struct AuthSetup {
    _redis: tumbler::dev::RedisServer,
    _dir: tempfile::TempDir,
    tokens: PathBuf,
    server: DashServer,
    ops: BearerClient,
}

impl AuthSetup {
    async fn start(admin: bool) -> Self {
        let redis = start_redis();
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, tokens_file()).unwrap();
        let server = DashServer::with_tokens(&redis.url(), admin, &tokens).await;
        let mut ops = bearer_client(&server.grpc, OPS).await;
        for (namespace, name, holder) in [
            ("default", "reports", "worker-1"),
            ("team-a", "a-lock", "a-worker"),
            ("team-b", "b-lock", "b-worker"),
        ] {
            let reply = ops
                .acquire(proto::AcquireRequest {
                    namespace: namespace.into(),
                    ..acquire(name, holder)
                })
                .await
                .unwrap()
                .into_inner();
            assert!(reply.grant.is_some(), "{namespace}/{name}");
        }
        AuthSetup {
            _redis: redis,
            _dir: dir,
            tokens,
            server,
            ops,
        }
    }

    /// The holders of `namespace/name`, through gRPC.
    async fn holders(&self, namespace: &str, name: &str) -> Vec<String> {
        let state = self
            .ops
            .clone()
            .inspect(proto::InspectRequest {
                namespace: namespace.into(),
                name: name.into(),
            })
            .await
            .unwrap()
            .into_inner();
        state
            .holders
            .into_iter()
            .map(|h| h.grant.unwrap().holder)
            .collect()
    }

    /// Logs in with `token` on the form; the reply.
    async fn log_in(&self, token: &str, next: &str) -> Reply {
        let form = format!("token={}&next={}", url_encode(token), url_encode(next));
        self.server.post("/dashboard/login", &[], &form).await
    }

    /// Logs in with `token` and returns the `Cookie` header value to send.
    async fn cookie(&self, token: &str) -> String {
        let reply = self.log_in(token, "").await;
        assert_eq!(reply.status, 303, "{reply:?}");
        let set = reply.header("set-cookie").expect("a cookie");
        set.split(';').next().unwrap().to_owned()
    }
}

/// Percent-encoding as HTML forms do.
fn url_encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

const PAGES: [&str; 9] = [
    "/dashboard",
    "/dashboard/changelog?event=released",
    "/dashboard/",
    "/dashboard/locks?prefix=r",
    "/dashboard/lock?name=reports",
    "/dashboard/metrics",
    "/dashboard/reaper",
    "/dashboard/release?name=reports&holder=worker-1",
    "/dashboard/clear",
];

const ENDPOINTS: [&str; 7] = [
    "/api/v1/namespaces",
    "/api/v1/changelog",
    "/api/v1/overview",
    "/api/v1/locks",
    "/api/v1/locks/reports",
    "/api/v1/metrics",
    "/api/v1/reaper",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_nothing_is_shown_without_a_valid_token() {
    let setup = AuthSetup::start(true).await;
    let server = &setup.server;
    // What a browser would send after logging in with each bad token.
    let bad_cookies: Vec<String> = ["nope", EXPIRED]
        .iter()
        .map(|t| format!("tumbler_token={}", base64url(t)))
        .collect();

    for page in PAGES {
        // No token: to the login form, coming back here afterwards.
        let reply = server.get_with(page, &[]).await;
        assert_eq!(reply.status, 303, "{page}: {reply:?}");
        let location = reply.header("location").unwrap();
        assert_eq!(
            location,
            format!("/dashboard/login?next={}", url_encode(page)),
            "{page}"
        );
        assert!(!reply.body.contains("worker-1"), "{page}");
        // A cookie that does not (or no longer) work: the same, and the
        // browser is told to drop it.
        for cookie in &bad_cookies {
            let reply = server.get_with(page, &[("Cookie", cookie)]).await;
            assert_eq!(reply.status, 303, "{page} {cookie}");
            assert_eq!(reply.header("location"), Some(location), "{page}");
            let cleared = reply.header("set-cookie").unwrap();
            assert!(cleared.starts_with("tumbler_token=;"), "{cleared}");
            assert!(cleared.contains("Max-Age=0"), "{cleared}");
        }
        // A bad bearer header: the same.
        let reply = server
            .get_with(page, &[("Authorization", &bearer("nope"))])
            .await;
        assert_eq!(reply.status, 303, "{page}");
    }

    // Endpoints: 401 with one fixed message, whatever was wrong.
    let expected = serde_json::json!({ "error": UNAUTHENTICATED, "code": "UNAUTHENTICATED" });
    for endpoint in ENDPOINTS {
        let mut refusals = vec![server.get_with(endpoint, &[]).await];
        for header in [
            bearer("nope"),
            bearer(EXPIRED),
            "Basic b3BzLXNlY3JldA==".into(),
            "Bearer".into(),
        ] {
            refusals.push(
                server
                    .get_with(endpoint, &[("Authorization", &header)])
                    .await,
            );
        }
        for cookie in &bad_cookies {
            refusals.push(server.get_with(endpoint, &[("Cookie", cookie)]).await);
        }
        // A good cookie does not rescue a bad bearer header.
        let good = setup.cookie(OPS).await;
        refusals.push(
            server
                .get_with(
                    endpoint,
                    &[("Cookie", &good), ("Authorization", &bearer("nope"))],
                )
                .await,
        );
        for reply in refusals {
            assert_eq!(reply.status, 401, "{endpoint}: {reply:?}");
            assert_eq!(reply.json(), expected, "{endpoint}");
            assert_eq!(
                reply.header("www-authenticate"),
                Some("Bearer realm=\"tumbler\"")
            );
            assert_eq!(reply.header("content-type"), Some("application/json"));
        }
    }

    // Admin POSTs without a token do nothing.
    for (path, form) in [
        (
            "/dashboard/admin/release",
            "namespace=default&name=reports&holder=worker-1&fencing_token=1&confirm=yes",
        ),
        (
            "/dashboard/admin/clear",
            "namespace=default&typed=default&confirm=yes",
        ),
    ] {
        let reply = server.post(path, &[], form).await;
        assert_eq!(reply.status, 303, "{path}");
        assert_eq!(reply.header("location"), Some("/dashboard/login"));
        let reply = server
            .post(path, &[("Authorization", &bearer(EXPIRED))], form)
            .await;
        assert_eq!(reply.status, 303, "{path}");
    }
    assert_eq!(setup.holders("default", "reports").await, ["worker-1"]);

    // Open: Prometheus, probes, the login form and its stylesheet.
    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("tumbler_"), "{metrics}");
    assert_eq!(server.get("/healthz").await, (200, "ok\n".to_owned()));
    let (status, login) = server.get("/dashboard/login").await;
    assert_eq!(status, 200);
    assert!(login.contains("<label for=\"token\">"), "{login}");
    assert_eq!(server.get("/dashboard/assets/style.css").await.0, 200);
}

/// A token as the login cookie carries it.
fn base64url(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_sets_a_locked_down_cookie_that_then_opens_the_dashboard() {
    let setup = AuthSetup::start(false).await;

    // The form, carrying where to go afterwards.
    let (status, form) = setup
        .server
        .get("/dashboard/login?next=%2Fdashboard%2Flocks")
        .await;
    assert_eq!(status, 200);
    assert!(form.contains("action=\"/dashboard/login\""), "{form}");
    assert!(
        form.contains("name=\"next\" value=\"/dashboard/locks\""),
        "{form}"
    );
    assert!(form.contains("type=\"password\""), "{form}");

    // Unknown and expired tokens: refused, no cookie, the same message.
    for token in ["nope", EXPIRED, ""] {
        let reply = setup.log_in(token, "/dashboard/locks").await;
        assert_eq!(reply.status, 401, "{token}: {reply:?}");
        assert_eq!(reply.header("set-cookie"), None);
        assert!(
            reply
                .body
                .contains("That token was not accepted: it is unknown or has expired."),
            "{}",
            reply.body
        );
        assert!(reply.body.contains("aria-invalid=\"true\""));
    }
    // A login posted from another site: refused.
    let reply = setup
        .server
        .post(
            "/dashboard/login",
            &[("Sec-Fetch-Site", "cross-site")],
            &format!("token={VIEWER}"),
        )
        .await;
    assert_eq!(reply.status, 403);
    assert_eq!(reply.header("set-cookie"), None);

    // A good token: the cookie, and on to `next`.
    let reply = setup.log_in(VIEWER, "/dashboard/locks").await;
    assert_eq!(reply.status, 303, "{reply:?}");
    assert_eq!(reply.header("location"), Some("/dashboard/locks"));
    let set = reply.header("set-cookie").unwrap();
    let mut parts = set.split("; ");
    let pair = parts.next().unwrap();
    assert!(pair.starts_with("tumbler_token="), "{set}");
    assert_ne!(pair, "tumbler_token=");
    assert!(!pair.contains(VIEWER), "the cookie is encoded: {set}");
    let mut attributes: Vec<&str> = parts.collect();
    attributes.sort();
    // Plain HTTP here: not Secure (tests/surface/tls.rs checks Secure over TLS).
    assert_eq!(attributes, ["HttpOnly", "Path=/", "SameSite=Strict"]);
    let cookie = pair.to_owned();

    // `next` never leaves the dashboard.
    for next in ["//evil.example/x", "https://evil.example/", "/api/v1/locks"] {
        let reply = setup.log_in(VIEWER, next).await;
        assert_eq!(reply.status, 303);
        assert_eq!(reply.header("location"), Some("/dashboard"), "{next}");
    }

    // The cookie opens pages and endpoints.
    let page = setup
        .server
        .get_with("/dashboard/lock?name=reports", &[("Cookie", &cookie)])
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("Token <strong>viewer</strong>"));
    assert!(page.body.contains("action=\"/dashboard/logout\""));
    let lock = setup
        .server
        .get_with("/api/v1/locks/reports", &[("Cookie", &cookie)])
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
    assert_eq!(lock.json()["holders"][0]["holder"], "worker-1");
    // So does a bearer header, for scripts.
    let scripted = setup
        .server
        .get_with(
            "/api/v1/locks/reports",
            &[("Authorization", &bearer(VIEWER))],
        )
        .await;
    assert_eq!(scripted.status, 200);
    assert_eq!(scripted.json()["holders"][0]["holder"], "worker-1");

    // Logging out drops the cookie.
    let out = setup
        .server
        .post("/dashboard/logout", &[("Cookie", &cookie)], "")
        .await;
    assert_eq!(out.status, 303);
    assert_eq!(out.header("location"), Some("/dashboard/login"));
    let cleared = out.header("set-cookie").unwrap();
    assert!(cleared.starts_with("tumbler_token=;") && cleared.contains("Max-Age=0"));

    // The token leaves the file: the same authenticator refuses it on
    // the dashboard (cookie and header) and over gRPC, without a restart.
    let mut viewer_grpc = bearer_client(&setup.server.grpc, VIEWER).await;
    viewer_grpc.inspect(inspect("reports")).await.unwrap();
    let without_viewer =
        tokens_file().replace(&token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""), "");
    std::fs::write(&setup.tokens, without_viewer).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = setup
            .server
            .get_with("/api/v1/locks/reports", &[("Cookie", &cookie)])
            .await;
        if reply.status == 401 {
            break;
        }
        assert_eq!(reply.status, 200);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removed token still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let page = setup
        .server
        .get_with("/dashboard", &[("Cookie", &cookie)])
        .await;
    assert_eq!(page.status, 303);
    let header = setup
        .server
        .get_with("/api/v1/namespaces", &[("Authorization", &bearer(VIEWER))])
        .await;
    assert_eq!(header.status, 401);
    assert_eq!(
        viewer_grpc
            .inspect(inspect("reports"))
            .await
            .unwrap_err()
            .code(),
        tonic::Code::Unauthenticated
    );
    // Tokens still in the file keep working.
    assert_eq!(setup.holders("default", "reports").await, ["worker-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_sees_only_its_namespaces() {
    let setup = AuthSetup::start(true).await;
    let server = &setup.server;
    let team_a = bearer(TEAM_A);
    let as_team_a = [("Authorization", team_a.as_str())];

    // The namespaces in use, filtered to the token's.
    let reply = server.get_with("/api/v1/namespaces", &as_team_a).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["namespaces"], serde_json::json!(["team-a"]));
    assert_eq!(reply.json()["sees_default"], false);
    let ops = server
        .get_with("/api/v1/namespaces", &[("Authorization", &bearer(OPS))])
        .await
        .json();
    assert_eq!(ops["sees_default"], true);
    for namespace in ["default", "team-a", "team-b"] {
        assert!(
            ops["namespaces"]
                .as_array()
                .unwrap()
                .contains(&namespace.into()),
            "{ops}"
        );
    }

    // Its own namespace: every endpoint answers.
    let (list, lock) = (
        server
            .get_with("/api/v1/locks?namespace=team-a", &as_team_a)
            .await,
        server
            .get_with("/api/v1/locks/a-lock?namespace=team-a", &as_team_a)
            .await,
    );
    assert_eq!(list.status, 200);
    assert_eq!(list.json()["locks"][0]["name"], "a-lock");
    assert_eq!(lock.json()["holders"][0]["holder"], "a-worker");
    assert_eq!(lock.json()["admin"], false);
    for endpoint in [
        "/api/v1/overview?namespace=team-a",
        "/api/v1/metrics?namespace=team-a",
        "/api/v1/changelog?namespace=team-a",
    ] {
        assert_eq!(server.get_with(endpoint, &as_team_a).await.status, 200);
    }

    // Any other namespace (default included): 403, saying nothing more.
    let denied =
        serde_json::json!({ "error": "this token may not do that", "code": "PERMISSION_DENIED" });
    for endpoint in [
        "/api/v1/locks?namespace=team-b",
        "/api/v1/locks",
        "/api/v1/locks/b-lock?namespace=team-b",
        "/api/v1/locks/reports",
        "/api/v1/overview?namespace=team-b",
        "/api/v1/overview",
        "/api/v1/metrics?namespace=team-b",
        "/api/v1/metrics?namespace=no-such-team",
        "/api/v1/changelog?namespace=team-b",
        "/api/v1/changelog",
    ] {
        let reply = server.get_with(endpoint, &as_team_a).await;
        assert_eq!(reply.status, 403, "{endpoint}: {reply:?}");
        assert_eq!(reply.json(), denied, "{endpoint}");
        assert!(!reply.body.contains("b-worker"));
    }
    // tumbler-system says it is reserved, as the gRPC API does.
    let reaper = server.get_with("/api/v1/reaper", &as_team_a).await;
    assert_eq!(reaper.status, 403);
    assert!(reaper.body.contains("reserved for tumbler"), "{reaper:?}");

    // Pages: a namespace of its own renders; others are 403; with none,
    // the token is sent to its own.
    let page = server
        .get_with("/dashboard/lock?namespace=team-a&name=a-lock", &as_team_a)
        .await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("/dashboard/reaper"), "no Reaper link");
    for path in [
        "/dashboard/locks?namespace=team-b",
        "/dashboard/lock?namespace=team-b&name=b-lock",
        "/dashboard/metrics?namespace=default",
        "/dashboard/changelog?namespace=team-b",
    ] {
        let reply = server.get_with(path, &as_team_a).await;
        assert_eq!(reply.status, 403, "{path}");
        assert!(reply.body.contains("this token may not do that"), "{path}");
    }
    let reply = server.get_with("/dashboard/reaper", &as_team_a).await;
    assert_eq!(reply.status, 403);
    let landing = server
        .get_with("/dashboard/locks?prefix=a", &as_team_a)
        .await;
    assert_eq!(landing.status, 303);
    assert_eq!(
        landing.header("location"),
        Some("/dashboard/locks?prefix=a&namespace=team-a")
    );
    // Not even a token for every namespace (client or admin) sees
    // tumbler's own namespace: not listed, not readable, no Reaper link.
    for token in [VIEWER, OPS] {
        let header = bearer(token);
        let as_token = [("Authorization", header.as_str())];
        for path in [
            "/api/v1/reaper",
            "/dashboard/reaper",
            "/api/v1/locks?namespace=tumbler-system",
            "/api/v1/locks/reaper?namespace=tumbler-system",
            "/api/v1/overview?namespace=tumbler-system",
        ] {
            let reply = server.get_with(path, &as_token).await;
            assert_eq!(reply.status, 403, "{token} {path}: {reply:?}");
            assert!(reply.body.contains("reserved for tumbler"), "{path}");
        }
        let listed = server.get_with("/api/v1/namespaces", &as_token).await;
        assert!(!listed.body.contains("tumbler-system"), "{listed:?}");
        let page = server.get_with("/dashboard/locks", &as_token).await;
        assert_eq!(page.status, 200);
        assert!(!page.body.contains("/dashboard/reaper"), "no Reaper link");
    }
    // An admin token that names it reads it: the reaper's page and lock.
    let system = bearer(SYSTEM);
    let as_system = [("Authorization", system.as_str())];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reaper = server.get_with("/api/v1/reaper", &as_system).await;
        assert_eq!(reaper.status, 200, "{reaper:?}");
        if reaper.json()["held"] == true {
            assert!(
                reaper.json()["holder"]["holder"]
                    .as_str()
                    .unwrap()
                    .starts_with("replica-")
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no reaper");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let page = server.get_with("/dashboard/reaper", &as_system).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("/dashboard/reaper"), "the Reaper link");
    let lock = server
        .get_with("/api/v1/locks/reaper?namespace=tumbler-system", &as_system)
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
    assert_eq!(lock.json()["admin"], false, "read only, never admin");
    let list = server
        .get_with("/api/v1/locks?namespace=tumbler-system", &as_system)
        .await;
    assert_eq!(list.status, 200, "{list:?}");
    assert_eq!(list.json()["locks"][0]["name"], "reaper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_need_the_flag_and_an_admin_token_for_the_namespace() {
    let setup = AuthSetup::start(true).await;
    let release = |namespace: &str, name: &str, holder: &str| {
        format!("namespace={namespace}&name={name}&holder={holder}&fencing_token=&confirm=yes")
    };

    // A client token: no admin controls, confirmation pages and POSTs 403.
    let viewer = bearer(VIEWER);
    let as_viewer = [("Authorization", viewer.as_str())];
    let lock = setup
        .server
        .get_with("/api/v1/locks/reports", &as_viewer)
        .await;
    assert_eq!(lock.json()["admin"], false);
    assert_eq!(
        setup
            .server
            .get_with("/api/v1/overview", &as_viewer)
            .await
            .json()["admin"],
        false
    );
    let page = setup
        .server
        .get_with("/dashboard/lock?name=reports", &as_viewer)
        .await;
    assert!(page.body.contains("data-admin=\"denied\""), "{}", page.body);
    for path in [
        "/dashboard/release?name=reports&holder=worker-1",
        "/dashboard/clear",
    ] {
        let reply = setup.server.get_with(path, &as_viewer).await;
        assert_eq!(reply.status, 403, "{path}");
        assert!(reply.body.contains("this token may not do that"));
    }
    let viewer_cookie = setup.cookie(VIEWER).await;
    for headers in [
        vec![("Authorization", viewer.as_str())],
        vec![
            ("Cookie", viewer_cookie.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
    ] {
        let reply = setup
            .server
            .post(
                "/dashboard/admin/release",
                &headers,
                &release("default", "reports", "worker-1"),
            )
            .await;
        assert_eq!(reply.status, 403, "{reply:?}");
        let reply = setup
            .server
            .post(
                "/dashboard/admin/clear",
                &headers,
                "namespace=default&typed=default&confirm=yes",
            )
            .await;
        assert_eq!(reply.status, 403);
    }
    assert_eq!(setup.holders("default", "reports").await, ["worker-1"]);

    // An admin token of team-a: admin there, nothing elsewhere.
    let team_admin = bearer(TEAM_A_ADMIN);
    let as_team_admin = [("Authorization", team_admin.as_str())];
    let reply = setup
        .server
        .post(
            "/dashboard/admin/release",
            &as_team_admin,
            &release("default", "reports", "worker-1"),
        )
        .await;
    assert_eq!(reply.status, 403);
    assert_eq!(setup.holders("default", "reports").await, ["worker-1"]);
    let lock = setup
        .server
        .get_with("/api/v1/locks/a-lock?namespace=team-a", &as_team_admin)
        .await;
    assert_eq!(lock.json()["admin"], true);
    let reply = setup
        .server
        .post(
            "/dashboard/admin/release",
            &as_team_admin,
            &release("team-a", "a-lock", "a-worker"),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(reply.body.contains("was released"));
    assert!(setup.holders("team-a", "a-lock").await.is_empty());

    // An admin token for every namespace, logged in: controls shown, the
    // confirmation step and the same-origin check still apply.
    let ops = setup.cookie(OPS).await;
    let as_ops = [("Cookie", ops.as_str())];
    let lock = setup
        .server
        .get_with("/api/v1/locks/reports", &as_ops)
        .await
        .json();
    assert_eq!(lock["admin"], true);
    // The overview is shared between callers; its admin flag is each one's.
    let overview = setup.server.get_with("/api/v1/overview", &as_ops).await;
    assert_eq!(overview.json()["admin"], true);
    assert_eq!(overview.json()["locks"], 1);
    let token = lock["holders"][0]["fencing_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = setup
        .server
        .get_with("/dashboard/lock?name=reports", &as_ops)
        .await;
    assert!(page.body.contains("data-admin=\"on\""));
    let confirm = setup
        .server
        .get_with("/dashboard/release?name=reports&holder=worker-1", &as_ops)
        .await;
    assert_eq!(confirm.status, 200);
    assert!(confirm.body.contains(&format!("value=\"{token}\"")));
    let form = format!("namespace=default&name=reports&holder=worker-1&fencing_token={token}");
    let unconfirmed = setup
        .server
        .post("/dashboard/admin/release", &as_ops, &form)
        .await;
    assert_eq!(unconfirmed.status, 400);
    let cross_site = setup
        .server
        .post(
            "/dashboard/admin/release",
            &[("Cookie", &ops), ("Sec-Fetch-Site", "cross-site")],
            &format!("{form}&confirm=yes"),
        )
        .await;
    assert_eq!(cross_site.status, 403);
    assert_eq!(setup.holders("default", "reports").await, ["worker-1"]);
    let done = setup
        .server
        .post(
            "/dashboard/admin/release",
            &[("Cookie", &ops), ("Sec-Fetch-Site", "same-origin")],
            &format!("{form}&confirm=yes"),
        )
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    assert!(done.body.contains("was released"));
    assert!(setup.holders("default", "reports").await.is_empty());
    let cleared = setup
        .server
        .post(
            "/dashboard/admin/clear",
            &as_ops,
            "namespace=team-b&typed=team-b&confirm=yes",
        )
        .await;
    assert_eq!(cleared.status, 200, "{cleared:?}");
    assert!(cleared.body.contains("1 locks cleared, 1 grants released"));
    assert!(setup.holders("team-b", "b-lock").await.is_empty());

    // Without --dashboard-admin, an admin token gets no admin actions.
    let flagless = DashServer::with_tokens(&setup._redis.url(), false, &setup.tokens).await;
    let mut ops_grpc = bearer_client(&flagless.grpc, OPS).await;
    ops_grpc
        .acquire(acquire("reports", "worker-9"))
        .await
        .unwrap();
    let ops_header = bearer(OPS);
    let as_ops_bearer = [("Authorization", ops_header.as_str())];
    let lock = flagless
        .get_with("/api/v1/locks/reports", &as_ops_bearer)
        .await
        .json();
    assert_eq!(lock["admin"], false);
    let reply = flagless
        .post(
            "/dashboard/admin/release",
            &as_ops_bearer,
            &release("default", "reports", "worker-9"),
        )
        .await;
    assert_eq!(reply.status, 403);
    assert!(reply.body.contains("--dashboard-admin"));
    assert_eq!(setup.holders("default", "reports").await, ["worker-9"]);
}

// ------------------------------------------------------------ login sessions

/// `value` with the byte at `at` changed to another cookie-safe one.
fn altered(value: &str, at: usize) -> String {
    let mut bytes = value.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// The status of `GET /api/v1/namespaces` with the login cookie `cookie`.
async fn with_cookie(server: &DashServer, cookie: &str) -> u16 {
    server
        .get_with("/api/v1/namespaces", &[("Cookie", cookie)])
        .await
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_cookie_is_a_signed_session_not_the_token() {
    use base64::Engine as _;
    let setup = AuthSetup::start(false).await;
    let cookie = setup.cookie(VIEWER).await;
    let value = cookie.strip_prefix("tumbler_token=").unwrap();

    // The token is nowhere in it, in any encoding; its name is.
    for form in [
        VIEWER.to_owned(),
        base64url(VIEWER),
        base64::engine::general_purpose::STANDARD.encode(VIEWER),
        hex::encode(VIEWER),
        tumbler::auth::token_digest(VIEWER),
    ] {
        assert!(!value.contains(&form), "{form} in {cookie}");
    }
    assert!(value.contains(&base64url("viewer")), "{cookie}");
    assert_eq!(with_cookie(&setup.server, &cookie).await, 200);

    // Tampered: a byte of the signature, of the expiry, of the name; a
    // session naming another token under the viewer's signature; the
    // raw token as an older dashboard stored it. All refused, and a page
    // drops the cookie.
    let session = value.find("s1.").expect("a session value");
    let mut forged: Vec<String> = [0, session + 3, value.len() - 1]
        .iter()
        .map(|&at| format!("tumbler_token={}", altered(value, at)))
        .collect();
    forged.push(cookie.replace(&base64url("viewer"), &base64url("ops")));
    forged.push(format!("tumbler_token={}", base64url(VIEWER)));
    for bad in &forged {
        assert_ne!(bad, &cookie);
        assert_eq!(with_cookie(&setup.server, bad).await, 401, "{bad}");
        let page = setup
            .server
            .get_with("/dashboard", &[("Cookie", bad)])
            .await;
        assert_eq!(page.status, 303, "{bad}");
        assert!(page.header("set-cookie").unwrap().contains("Max-Age=0"));
    }

    // Replicas sharing --dashboard-cookie-key-file accept each other's
    // logins; a replica with its own (random) key does not.
    let key_dir = tempfile::tempdir().unwrap();
    let key_file = key_dir.path().join("cookie.key");
    std::fs::write(&key_file, "k3y-0f-at-least-32-bytes-for-both-replicas\n").unwrap();
    let mut args = service_args();
    args.auth.auth_tokens_file = Some(setup.tokens.clone());
    args.dashboard_cookie_key_file = Some(key_file);
    let (a, b) = (
        DashServer::launch_with(&setup._redis.url(), false, &args).await,
        DashServer::launch_with(&setup._redis.url(), false, &args).await,
    );
    let form = format!("token={}", url_encode(VIEWER));
    let login = a.post("/dashboard/login", &[], &form).await;
    let shared = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(with_cookie(&b, &shared).await, 200, "replica b");
    assert_eq!(with_cookie(&setup.server, &shared).await, 401, "own key");
    assert_eq!(with_cookie(&a, &cookie).await, 401, "another key");

    // A new secret under the same name ends the old secret's sessions
    // (without a restart); the new secret logs in.
    let rotated = tokens_file().replace(
        &token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""),
        &token_entry("viewer", "viewer-new-secret", "client", r#"["*"]"#, ""),
    );
    std::fs::write(&setup.tokens, rotated).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while with_cookie(&setup.server, &cookie).await != 401 || with_cookie(&b, &shared).await != 401
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old secret's session still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let renewed = setup.cookie("viewer-new-secret").await;
    assert_eq!(with_cookie(&setup.server, &renewed).await, 200);

    // The token expires in the file: its session ends with it.
    let expired = tokens_file().replace(
        &token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""),
        &token_entry(
            "viewer",
            "viewer-new-secret",
            "client",
            r#"["*"]"#,
            "expires_at = \"2020-01-01T00:00:00Z\"",
        ),
    );
    std::fs::write(&setup.tokens, expired).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while with_cookie(&setup.server, &renewed).await != 401 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an expired token's session still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Logging out tells the browser to drop the cookie.
    let out = setup
        .server
        .post("/dashboard/logout", &[("Cookie", &renewed)], "")
        .await;
    assert_eq!(out.status, 303);
    let cleared = out.header("set-cookie").unwrap();
    assert!(cleared.starts_with("tumbler_token=;") && cleared.contains("Max-Age=0"));
}

#[test]
fn a_short_cookie_key_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("cookie.key");
    std::fs::write(&key_file, "short\n").unwrap();
    let mut args = service_args();
    args.dashboard_cookie_key_file = Some(key_file);
    let err = ServerConfig::new("redis://127.0.0.1:1".into(), &args)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--dashboard-cookie-key-file") && err.contains("at least 32 bytes"),
        "{err}"
    );
}

// ------------------------------------------------------------ HSTS

/// A CA (PEM) and a certificate and key for `localhost` signed by it.
fn localhost_certificate() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "dashboard test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// `GET path` over TLS (trusting `ca`, verifying `localhost`): the reply's
/// head (status line and headers, names lowercased by the server).
async fn https_head(addr: SocketAddr, ca: &str, path: &str) -> String {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto::ring};

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // A peer that closes without close_notify ends in an error after the
    // whole response; what was read is kept.
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(head, _)| head.to_owned())
}

const DASHBOARD_PATHS: [&str; 5] = [
    "/dashboard",
    "/dashboard/locks",
    "/api/v1/overview",
    "/dashboard/assets/app.js",
    "/",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsts_is_sent_over_tls_and_not_over_plain_http() {
    let redis = start_redis();
    let (ca, cert, key) = localhost_certificate();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let files = tumbler::tls::TlsFiles {
        cert: cert_file,
        key: key_file,
        client_ca: None,
    };
    let mut tls = tumbler::tls::TlsSettings::load(files, None).unwrap();
    tls.http = true;
    let mut config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    config.tls = Some(tls);
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_addr, health_addr) = (http.local_addr().unwrap(), health.local_addr().unwrap());
    let _server = TestServer::spawn_on(
        config,
        tumbler::server::Listeners {
            grpc: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            http: Some(http),
            health: Some(health),
        },
    );
    wait_for_health(&format!("http://{health_addr}"), ServingStatus::Serving).await;
    for path in DASHBOARD_PATHS {
        let head = https_head(http_addr, &ca, path).await;
        let status = head.lines().next().unwrap_or("");
        assert!(
            status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.1 303"),
            "{path}: {head}"
        );
        assert!(
            head.lines()
                .any(|line| line == "strict-transport-security: max-age=31536000"),
            "{path}: {head}"
        );
    }

    // The same dashboard over plain HTTP: the other headers, no HSTS (a
    // browser ignores it there, and it would pin nothing).
    let plain = DashServer::start(&redis.url(), false).await;
    for path in DASHBOARD_PATHS {
        let reply = plain.get_with(path, &[]).await;
        assert!(matches!(reply.status, 200 | 303), "{path}: {reply:?}");
        assert!(reply.header("content-security-policy").is_some(), "{path}");
        assert_eq!(reply.header("strict-transport-security"), None, "{path}");
    }
}

// ------------------------------------------------------------ overview cost

/// Redis' call counts of `commands` (INFO commandstats), in that order.
async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
    commands: &[&str],
) -> Vec<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    commands
        .iter()
        .map(|command| {
            info.lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse().unwrap())
        })
        .collect()
}

/// The commands an overview walk sends: SCAN (List finds lock keys) and
/// HGETALL (List's function reads each lock; Metrics one per minute).
/// Nothing else here sends them: the reaper is off and the probe's
/// acquires are uncontended.
const OVERVIEW_COMMANDS: [&str; 2] = ["scan", "hgetall"];

/// What [`overview_under_load`] saw.
#[derive(Debug)]
struct OverviewLoad {
    /// Redis calls of one overview walk of the 10,000 locks, measured alone.
    walk: Vec<u64>,
    /// Redis calls while the overview loops ran (acquires alone subtracted).
    hammered: Vec<u64>,
    overview_requests: u64,
    overview_errors: u64,
    seconds: f64,
    acquires_alone: Vec<Duration>,
    acquires_loaded: Vec<Duration>,
    acquires_failed: u64,
}

fn p50(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// Acquire+release pairs on fresh names for `seconds`: each acquire's
/// latency, and how many were not granted.
async fn acquire_probe(server: &DashServer, seconds: f64) -> (Vec<Duration>, u64) {
    let mut client = server.client().await;
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let (mut latencies, mut failed) = (Vec::new(), 0);
    let mut i = 0u64;
    while tokio::time::Instant::now() < until {
        i += 1;
        let name = format!("probe-{i}");
        let started = std::time::Instant::now();
        let granted = client
            .acquire(acquire(&name, "probe"))
            .await
            .is_ok_and(|reply| reply.into_inner().grant.is_some());
        latencies.push(started.elapsed());
        if granted {
            client.release(release(&name, "probe")).await.unwrap();
        } else {
            failed += 1;
        }
    }
    (latencies, failed)
}

/// 10,000 locks held in `bulk`; acquires on other locks for `seconds`
/// alone, then again while 8 loops fetch `bulk`'s overview as fast as
/// they can.
async fn overview_under_load(seconds: f64) -> OverviewLoad {
    let redis = start_redis();
    let server = DashServer::launch_with(&redis.url(), false, &service_args()).await;
    let mut conn = redis_conn(&redis.url()).await;

    // 10,000 locks, 16 clients at a time.
    let fill: Vec<_> = (0..16)
        .map(|worker| {
            let endpoint = server.grpc.clone();
            tokio::spawn(async move {
                let mut client = proto::lock_service_client::LockServiceClient::connect(endpoint)
                    .await
                    .unwrap();
                for i in (worker..10_000).step_by(16) {
                    let reply = client
                        .acquire(proto::AcquireRequest {
                            namespace: "bulk".into(),
                            ttl_ms: Some(600_000),
                            ..acquire(&format!("job-{i:05}"), "filler")
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    assert!(reply.grant.is_some());
                }
            })
        })
        .collect();
    for task in fill {
        task.await.unwrap();
    }

    // One walk, alone: what it costs Redis.
    let before = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let (status, overview) = server.get_json("/api/v1/overview?namespace=bulk").await;
    assert_eq!(status, 200, "{overview}");
    assert_eq!(overview["locks"], 10_000, "{overview}");
    let after = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let walk: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(walk.iter().all(|&calls| calls > 0), "{walk:?}");

    // Acquires alone.
    let before = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let (acquires_alone, failed_alone) = acquire_probe(&server, seconds).await;
    let after = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let background: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();

    // Acquires while 8 loops hammer the overview.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let http_addr = server.http;
    let loops: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut errors) = (0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, _) =
                        http(http_addr, "GET", "/api/v1/overview?namespace=bulk", &[], "").await;
                    if status == 200 {
                        ok += 1;
                    } else {
                        errors += 1;
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    let before = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let started = std::time::Instant::now();
    let (acquires_loaded, failed_loaded) = acquire_probe(&server, seconds).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut overview_requests, mut overview_errors) = (0, 0);
    for task in loops {
        let (ok, errors) = task.await.unwrap();
        overview_requests += ok;
        overview_errors += errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let hammered: Vec<u64> = after
        .iter()
        .zip(&before)
        .zip(&background)
        .map(|((a, b), bg)| (a - b).saturating_sub((*bg as f64 * elapsed / seconds) as u64))
        .collect();
    OverviewLoad {
        walk,
        hammered,
        overview_requests,
        overview_errors,
        seconds: elapsed,
        acquires_alone,
        acquires_loaded,
        acquires_failed: failed_alone + failed_loaded,
    }
}

impl OverviewLoad {
    /// Walks Redis did for the overview while it was hammered, by the
    /// command that shows the most.
    fn walks(&self) -> f64 {
        self.hammered
            .iter()
            .zip(&self.walk)
            .map(|(&calls, &per_walk)| calls as f64 / per_walk as f64)
            .fold(0.0, f64::max)
    }

    fn report(&self) -> String {
        let (alone, loaded) = (p50(&self.acquires_alone), p50(&self.acquires_loaded));
        format!(
            "overview: {} requests in {:.1} s by 8 loops, {:.1} walks' worth of Redis work \
             (one walk: {:?} calls of {:?}; while hammered: {:?}); acquire p50 {:.2} ms alone \
             ({} acquires), {:.2} ms with the overview loops ({} acquires): ratio {:.2}",
            self.overview_requests,
            self.seconds,
            self.walks(),
            self.walk,
            OVERVIEW_COMMANDS,
            self.hammered,
            alone.as_secs_f64() * 1e3,
            self.acquires_alone.len(),
            loaded.as_secs_f64() * 1e3,
            self.acquires_loaded.len(),
            loaded.as_secs_f64() / alone.as_secs_f64(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_costs_redis_one_walk_per_second_however_often_it_is_asked() {
    let seconds = 3.0;
    let load = overview_under_load(seconds).await;
    println!("{}", load.report());
    assert_eq!(load.overview_errors, 0, "{load:?}");
    // About one walk per second (each kept for a second after it ends),
    // plus the one under way at either end.
    let most = load.seconds.ceil() + 2.0;
    assert!(load.walks() <= most, "{}", load.report());
    // ...while the loops asked many times more often.
    assert!(
        load.overview_requests as f64 >= 3.0 * most,
        "{}",
        load.report()
    );
    // Acquires kept being granted throughout.
    assert_eq!(load.acquires_failed, 0, "{}", load.report());
    assert!(!load.acquires_loaded.is_empty());
}

/// The figures for BENCHMARKS.md ("Dashboard overview under load"):
/// `cargo test --profile bench --test surface -- --ignored --nocapture dashboard::overview_latency`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn overview_latency_ratio_for_the_benchmarks() {
    let load = overview_under_load(10.0).await;
    println!("{}", load.report());
    assert_eq!(load.acquires_failed, 0);
}

/// A server whose namespaces all keep a changelog, HTTP port on.
async fn changelog_server(redis_url: &str) -> DashServer {
    let mut args = service_args();
    args.changelog_namespaces = vec!["*".into()];
    args.shards = 8;
    DashServer::launch_with(redis_url, false, &args).await
}

#[tokio::test]
async fn the_changelog_page_renders_and_keeps_hostile_names_as_data() {
    let redis = start_redis();
    let server = changelog_server(&redis.url()).await;
    let mut client = server.client().await;
    let hostile = "<script>alert(1)</script>&\"'";
    let holder = "<img src=x onerror=alert(2)>";
    client.acquire(acquire(hostile, holder)).await.unwrap();
    client.release(release(hostile, holder)).await.unwrap();

    // The page: the shell app.js fills in, with a Changelog tab marked
    // current, and nothing of a hostile query string echoed raw.
    let query = url_encode(hostile);
    let (status, page) = server
        .get(&format!(
            "/dashboard/changelog?prefix={query}&holder={query}"
        ))
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("data-page=\"changelog\""), "{page}");
    assert!(
        page.contains("<a href=\"/dashboard/changelog\" data-keep-namespace aria-current=\"page\">Changelog</a>"),
        "{page}"
    );
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("onerror"), "{page}");
    // The script renders text only through textContent (h()).
    let (_, script) = server.get("/dashboard/assets/app.js").await;
    assert!(script.contains("function renderChangelog(d)"));
    assert!(!script.contains("innerHTML"));

    // The endpoint: the names as JSON data, exactly as given.
    let (status, log) = server
        .get_json(&format!("/api/v1/changelog?prefix={query}"))
        .await;
    assert_eq!(status, 200, "{log}");
    let events = log["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{log}");
    for (event, expected) in events.iter().zip(["released", "acquired"]) {
        assert_eq!(event["event"], expected);
        assert_eq!(event["name"], hostile);
        assert_eq!(event["holder"], holder);
    }
    let (_, by_holder) = server
        .get_json(&format!("/api/v1/changelog?holder={}", url_encode(holder)))
        .await;
    assert_eq!(by_holder["events"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn the_locks_tab_lists_a_page_in_name_order() {
    let redis = start_redis();
    let server = changelog_server(&redis.url()).await;
    let mut client = server.client().await;
    let names = [
        "delta", "alpha", "echo", "charlie", "bravo", "golf", "foxtrot", "hotel",
    ];
    for name in names {
        client.acquire(acquire(name, "h")).await.unwrap();
    }
    let (status, page) = server.get_json("/api/v1/locks?page_size=100").await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<&str> = page["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    let mut sorted = names.to_vec();
    sorted.sort();
    assert_eq!(listed, sorted);
}

/// An engine error gets the status of the gRPC code the API gives it,
/// through the dashboard's one table: a full queue or a namespace at its
/// limit is 429 as it is RESOURCE_EXHAUSTED over gRPC (the dashboard said
/// 503 before), a session resumed elsewhere 409 (ABORTED, was 503), Redis
/// trouble 503, a reply the engine cannot read 500 (never 400).
#[test]
fn engine_errors_get_the_status_of_their_grpc_code() {
    use tonic::Code;
    use tumbler::dashboard::{engine_code, engine_error_status, http_status};
    use tumbler::engine::EngineError;
    use tumbler::store::StoreError;

    let cases = [
        (EngineError::QueueFull(8), Code::ResourceExhausted, 429),
        (
            EngineError::TooManyWaiters(100),
            Code::ResourceExhausted,
            429,
        ),
        (
            EngineError::TooManyInNamespace(10),
            Code::ResourceExhausted,
            429,
        ),
        (EngineError::NamespaceFull, Code::ResourceExhausted, 429),
        (
            EngineError::Store(StoreError::Unavailable("connection refused".into())),
            Code::Unavailable,
            503,
        ),
        (EngineError::ShuttingDown, Code::Unavailable, 503),
        (
            EngineError::Store(StoreError::Protocol("odd reply".into())),
            Code::Internal,
            500,
        ),
        (EngineError::SessionMoved, Code::Aborted, 409),
        (
            EngineError::LimitMismatch {
                lock_limit: 1,
                requested: 2,
            },
            Code::FailedPrecondition,
            400,
        ),
    ];
    for (err, code, status) in cases {
        assert_eq!(engine_code(&err), code, "{err}");
        assert_eq!(engine_error_status(&err).as_u16(), status, "{err}");
    }
    // The refusals that come as gRPC statuses (validation, auth, rate).
    for (code, status, name) in [
        (Code::InvalidArgument, 400, "INVALID_ARGUMENT"),
        (Code::Unauthenticated, 401, "UNAUTHENTICATED"),
        (Code::PermissionDenied, 403, "PERMISSION_DENIED"),
        (Code::NotFound, 404, "NOT_FOUND"),
        (Code::ResourceExhausted, 429, "RESOURCE_EXHAUSTED"),
        (Code::Internal, 500, "INTERNAL"),
        (Code::Unknown, 500, "UNKNOWN"),
        (Code::Unavailable, 503, "UNAVAILABLE"),
    ] {
        assert_eq!(http_status(code), (status.try_into().unwrap(), name));
    }
}
