//! The dashboard's JSON endpoints and admin routes on the HTTP port of a
//! live in-process server with a real Redis: the same numbers as the gRPC
//! API, the same validation messages (as 400s), and admin actions refused
//! unless `--dashboard-admin` turned them on. With a tokens file: nothing
//! but the login form, `/metrics` and `/healthz` without a valid token
//! (bearer header or login cookie), a client token limited to its
//! namespaces, admin actions only for admin tokens.
//!
//! This file holds what the rooms share (a server with its HTTP port, the
//! scene most tests look at); each room is a file: `open` (auth off: JSON,
//! validation, admin switches, pages), `auth` (tokens and tenancy),
//! `login` (the login cookie, HSTS), `overview` (what the overview costs
//! Redis under load), `read_write` (a read/write lock's mode, its
//! holders' and waiters'), `throttle` (failed logins per client address),
//! `visible` (bidi and invisible characters shown escaped), `waits` (the
//! wait-for chains), `weighted` (a semaphore's permits in use, its
//! holders' permits and slots).

mod auth;
mod login;
mod open;
mod overview;
mod read_write;
mod throttle;
mod visible;
mod waits;
mod weighted;

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::http::{Reply, fetch, http, int, items};
use common::*;
use serde_json::Value;
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::{ServerConfig, ServiceArgs};

/// A server with its HTTP port (and the dashboard) on.
struct DashServer {
    grpc: String,
    http: SocketAddr,
    _server: TestServer,
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
        let server = TestServer::new()
            .redis(redis_url)
            .args(args.clone())
            .http()
            .config(move |config| config.dashboard_admin = admin)
            .start()
            .await;
        DashServer {
            grpc: server.endpoint(),
            http: server.http(),
            _server: server,
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

/// Each of `held` granted, then `waiter` (with a 30 s wait) queued behind
/// them on `name`: the waiter's task, its reply when it is granted.
async fn holders_and_a_waiter(
    server: &DashServer,
    name: &str,
    held: Vec<proto::AcquireRequest>,
    waiter: proto::AcquireRequest,
) -> tokio::task::JoinHandle<proto::AcquireResponse> {
    let mut client = server.client().await;
    for request in held {
        let holder = request.holder.clone();
        let reply = client.acquire(request).await.unwrap().into_inner();
        assert_eq!(reply.status(), proto::AcquireStatus::Acquired, "{holder}");
    }
    let mut waiting = server.client().await;
    let task = tokio::spawn(async move {
        let request = proto::AcquireRequest {
            wait_ms: 30_000,
            ..waiter
        };
        waiting.acquire(request).await.unwrap().into_inner()
    });
    until_waiters(&mut client, name, 1).await;
    task
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

/// Percent-encoding as HTML forms do.
fn url_encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A token as the login cookie carries it.
fn base64url(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}
