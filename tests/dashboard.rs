//! The dashboard's JSON endpoints and admin routes on the HTTP port of a
//! live in-process server with a real Redis: the same numbers as the gRPC
//! API, the same validation messages (as 400s), and admin actions refused
//! unless `--dashboard-admin` turned them on.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::ServerConfig;

/// A server with its HTTP port (and the dashboard) on.
struct DashServer {
    grpc: String,
    http: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl DashServer {
    async fn start(redis_url: &str, admin: bool) -> Self {
        let mut args = service_args();
        args.reap_interval_ms = 200;
        let mut config = ServerConfig::new(redis_url.to_owned(), &args).unwrap();
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
        let mut all = vec![("Content-Type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        http(self.http, "POST", path, &all, form).await
    }
}

/// One HTTP/1.1 request on a fresh connection; the status and the body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .expect("the HTTP port answers")
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
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

    // Reaper: this replica holds tumbler-system/reaper.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, reaper) = server.get_json("/api/v1/reaper").await;
        assert_eq!(status, 200, "{reaper}");
        if reaper["held"] == true {
            assert!(
                reaper["holder"]["holder"]
                    .as_str()
                    .unwrap()
                    .starts_with("replica-")
            );
            assert!(
                reaper["namespaces"]
                    .as_array()
                    .unwrap()
                    .contains(&"default".into())
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reaper: {reaper}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, namespaces) = server.get_json("/api/v1/namespaces").await;
    assert!(
        namespaces["namespaces"]
            .as_array()
            .unwrap()
            .contains(&"default".into())
    );

    // The pages and their assets are served.
    for path in [
        "/dashboard",
        "/dashboard/locks",
        "/dashboard/lock?name=reports",
        "/dashboard/metrics",
        "/dashboard/reaper",
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 200, "{path}");
        assert!(body.contains("<main id=\"main\""), "{path}");
        assert!(body.contains("data-admin=\"off\""), "{path}");
    }
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
    assert_eq!(status, 403);
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
