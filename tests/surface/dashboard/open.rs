//! The dashboard with auth off: its JSON shows what the gRPC API shows,
//! bad input is a 400 with the gRPC message, admin routes only with
//! `--dashboard-admin`, the changelog and locks pages, and the one table
//! from engine errors to HTTP statuses.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoints_show_what_the_grpc_api_shows() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let (token, _waiter) = scene(&server).await;
    let mut client = server.client().await;

    // List, with a prefix, and paging.
    let (status, page) = server.get_json("/api/v1/locks").await;
    assert_eq!(status, 200, "{page}");
    let mut names: Vec<(String, i64, i64, i64)> = items(&page["locks"])
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                int(&l["holders"]),
                int(&l["limit"]),
                int(&l["waiters"]),
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
    // The List RPC's messages in the JSON Connect writes: one dialect.
    let mut rpc = client
        .list(proto::ListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .locks;
    rpc.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(page["locks"], serde_json::to_value(&rpc).unwrap());
    // proto3 JSON: an empty page token and a zero count are left out.
    assert!(page.get("nextPageToken").is_none(), "{page}");
    assert!(page["locks"][0].get("waiters").is_none(), "{page}");
    let (_, page) = server.get_json("/api/v1/locks?prefix=jobs%2F").await;
    assert_eq!(page["locks"].as_array().unwrap().len(), 1);
    assert_eq!(page["locks"][0]["name"], "jobs/nightly");
    let (_, first) = server.get_json("/api/v1/locks?page_size=1").await;
    assert_eq!(first["locks"].as_array().unwrap().len(), 1);
    let next = first["nextPageToken"].as_str().unwrap();
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
    let grant = &holder["grant"];
    assert_eq!(grant["holder"], "worker-1");
    // 64-bit integers are strings, as the proto3 JSON mapping has them.
    assert_eq!(grant["fencingToken"], token.to_string());
    assert_eq!(grant["ttlMs"], "30000");
    assert_eq!(grant["slot"], 1);
    assert_eq!(grant["kind"], "export");
    assert_eq!(grant["metadata"]["team"], "billing");
    let remaining: i64 = holder["remainingMs"].as_str().unwrap().parse().unwrap();
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
    // The same messages in the same JSON as Connect's: one dialect.
    assert_eq!(
        metrics["totals"],
        serde_json::to_value(&rpc.totals).unwrap()
    );
    assert_eq!(
        metrics["overall"],
        serde_json::to_value(&rpc.overall).unwrap()
    );
    // export: 1 acquired, 1 denied; batch: 2 acquired.
    let totals = items(&metrics["totals"]);
    assert_eq!(totals[0]["kind"], "batch");
    assert_eq!(totals[0]["acquired"], "2");
    assert_eq!(
        (int(&totals[1]["acquired"]), int(&totals[1]["denied"])),
        (1, 1)
    );
    let (_, only) = server.get_json("/api/v1/metrics?kind=batch").await;
    assert_eq!(only["totals"].as_array().unwrap().len(), 1);

    // Overview.
    let (status, overview) = server.get_json("/api/v1/overview").await;
    assert_eq!(status, 200, "{overview}");
    assert_eq!(overview["locks"], "2");
    assert_eq!(overview["locksHeld"], "2");
    assert_eq!(overview["holders"], "3");
    assert_eq!(overview["waiters"], "1");
    assert_eq!(overview["busiest"][0]["name"], "reports");
    assert_eq!(overview["lastHour"]["acquired"], "3");
    assert_eq!(overview["series"].as_array().unwrap().len(), 60);
    let charted: i64 = overview["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| int(&p["acquired"]))
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
            body["message"], "namespace: tumbler-system is reserved for tumbler's own locks",
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
    assert_eq!(body["message"], grpc.message());
    assert_eq!(body["code"], "invalid_argument");

    let long = "n".repeat(513);
    let grpc = client.inspect(inspect(&long)).await.unwrap_err();
    let (status, body) = server.get_json(&format!("/api/v1/locks/{long}")).await;
    assert_eq!(status, 400);
    assert_eq!(body["message"], grpc.message());

    let grpc = client
        .list(proto::ListRequest {
            page_token: "garbage!".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let (status, body) = server.get_json("/api/v1/locks?page_token=garbage!").await;
    assert_eq!(status, 400);
    assert_eq!(body["message"], grpc.message());

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
            body["message"].as_str().unwrap().starts_with(message),
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
    use tumbler::service::errors::{engine_code, engine_error_status, http_status};
    use tumbler_engine::{EngineError, store_failed};
    use tumbler_store::StoreError;

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
            store_failed(StoreError::Unavailable("connection refused".into())),
            Code::Unavailable,
            503,
        ),
        (EngineError::ShuttingDown, Code::Unavailable, 503),
        (
            store_failed(StoreError::Protocol("odd reply".into())),
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
    // The refusals that come as gRPC statuses (validation, auth, rate),
    // with Connect's code names (the dashboard's errors are Connect's).
    for (code, status, name) in [
        (Code::InvalidArgument, 400, "invalid_argument"),
        (Code::Unauthenticated, 401, "unauthenticated"),
        (Code::PermissionDenied, 403, "permission_denied"),
        (Code::NotFound, 404, "not_found"),
        (Code::ResourceExhausted, 429, "resource_exhausted"),
        (Code::Internal, 500, "internal"),
        (Code::Unknown, 500, "unknown"),
        (Code::Unavailable, 503, "unavailable"),
    ] {
        assert_eq!(http_status(code), (status.try_into().unwrap(), name));
    }
}
