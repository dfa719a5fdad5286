//! The dashboard with auth on: nothing but the login form, `/metrics` and
//! `/healthz` without a valid token; a client token limited to its
//! namespaces; admin actions only for admin tokens of the namespace.

use super::*;

// ------------------------------------------------------------ with auth on

pub(super) const OPS: &str = "ops-secret";
pub(super) const VIEWER: &str = "viewer-secret";
pub(super) const TEAM_A: &str = "team-a-secret";
pub(super) const TEAM_A_ADMIN: &str = "team-a-admin-secret";
pub(super) const EXPIRED: &str = "expired-secret";
pub(super) const SYSTEM: &str = "system-secret";
pub(super) const UNAUTHENTICATED: &str = "authentication required: send a valid token as \
     `authorization: Bearer <token>`, or log in at /dashboard/login";

/// ops: admin everywhere; viewer: client everywhere; team-a: client in
/// team-a; team-a-admin: admin in team-a only; old: expired; system:
/// admin naming tumbler-system (the one that may read it).
pub(super) fn tokens_file() -> String {
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
pub(super) struct AuthSetup {
    pub(super) _redis: tumbler::dev::RedisServer,
    pub(super) _dir: tempfile::TempDir,
    pub(super) tokens: PathBuf,
    pub(super) server: DashServer,
    pub(super) ops: BearerClient,
}

impl AuthSetup {
    pub(super) async fn start(admin: bool) -> Self {
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
    pub(super) async fn holders(&self, namespace: &str, name: &str) -> Vec<String> {
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
    pub(super) async fn log_in(&self, token: &str, next: &str) -> Reply {
        let form = format!("token={}&next={}", url_encode(token), url_encode(next));
        self.server.post("/dashboard/login", &[], &form).await
    }

    /// Logs in with `token` and returns the `Cookie` header value to send.
    pub(super) async fn cookie(&self, token: &str) -> String {
        let reply = self.log_in(token, "").await;
        assert_eq!(reply.status, 303, "{reply:?}");
        let set = reply.header("set-cookie").expect("a cookie");
        set.split(';').next().unwrap().to_owned()
    }
}

pub(super) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

pub(super) const PAGES: [&str; 9] = [
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

pub(super) const ENDPOINTS: [&str; 7] = [
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
    let expected = serde_json::json!({ "code": "unauthenticated", "message": UNAUTHENTICATED });
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
    assert_eq!(reply.json()["seesDefault"], false);
    let ops = server
        .get_with("/api/v1/namespaces", &[("Authorization", &bearer(OPS))])
        .await
        .json();
    assert_eq!(ops["seesDefault"], true);
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
    assert_eq!(lock.json()["holders"][0]["grant"]["holder"], "a-worker");
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
        serde_json::json!({ "code": "permission_denied", "message": "this token may not do that" });
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
                reaper.json()["holder"]["grant"]["holder"]
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
    assert_eq!(overview.json()["locks"], "1");
    let token = lock["holders"][0]["grant"]["fencingToken"]
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
