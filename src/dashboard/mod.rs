//! The web dashboard on the HTTP port: a few pages of plain HTML, CSS and
//! vanilla JavaScript (embedded in the binary, no build step) that poll
//! JSON endpoints under `/api/v1/`. This file holds what the dashboard is
//! (its [`Options`] and state) and its routes; the rest by concern:
//!
//! - `api.rs`: the JSON endpoints, each one or a few calls of the same
//!   [`EngineFace`] methods the gRPC handlers call, with inputs checked by
//!   the same [`crate::service::validate`] functions, so bad input gets the
//!   gRPC API's message (as a 400) and the numbers are the RPCs' numbers;
//! - `params.rs`: each endpoint's query or form as a `Deserialize` struct;
//! - `errors.rs`: the JSON error and the one table from error to status;
//! - `pages.rs` and `templates/`: the page shells (askama templates);
//! - `admin.rs`: force release and clear;
//! - `login.rs`, `session.rs`: who is looking; `edge.rs`: the Host check
//!   and security headers; `overview.rs`: the overview's shared walk;
//!   `changelog.rs`: the Changelog endpoint; `flight.rs`: the single
//!   flight both share; `visible.rs`: control, bidi and invisible
//!   characters shown as `\u{…}` escapes (app.js does the same on the
//!   live pages).
//!
//! With an auth tokens file, every page and endpoint needs one of its
//! tokens (a bearer header, or the login cookie; see `login.rs`), and
//! shows only the namespaces that token may see: each handler passes the
//! namespace it reads through `params::readable`, which checks it with
//! the caller's [`Access::read`], as the gRPC handlers do. So tumbler's
//! own namespace (`tumbler-system`) shows only to an admin token that
//! names it: not with auth off, not to a `*` token.
//!
//! Admin actions (force release of a holder, clear a namespace) exist only
//! when the server runs with `--dashboard-admin`, and, with auth on, only
//! for a token with the admin role in that namespace. Each one is a POST
//! behind a confirmation page, and cross-site POSTs are refused.

mod admin;
mod api;
mod changelog;
mod edge;
mod errors;
mod flight;
mod login;
mod overview;
mod pages;
mod params;
mod session;
mod visible;

pub use session::{CookieKey, SESSION_TTL};

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth::{Access, Authenticator};
use crate::service::validate;
use tumbler_engine::EngineFace;

const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

const MINUTE_MS: i64 = 60_000;
/// Largest `minutes` the metrics endpoint takes (the counters' retention).
const MAX_MINUTES: i64 = validate::MAX_METRICS_RANGE_MS / MINUTE_MS;

/// What the dashboard offers, and to whom.
#[derive(Clone, Default)]
pub struct Options {
    /// Admin actions on (`--dashboard-admin`); off by default.
    pub admin: bool,
    /// The tokens gRPC checks (the same instance, so a reload of the file
    /// applies to both); None: auth is off and the dashboard is open.
    pub auth: Option<Arc<Authenticator>>,
    /// Mark the login cookie `Secure` (the HTTP port is served over TLS);
    /// also sends Strict-Transport-Security.
    pub secure_cookie: bool,
    /// The Host rule, the gRPC port's too (`crate::origin`; see [`edge`]).
    pub hosts: crate::origin::HostRule,
    /// Signs the login cookies (`--dashboard-cookie-key-file`, else a
    /// random key of this process).
    pub cookie_key: CookieKey,
    /// Failed logins per client address (shared with session resumes).
    pub auth_throttle: Arc<crate::auth::Throttle>,
}

#[derive(Clone)]
struct Dashboard {
    engine: Arc<dyn EngineFace>,
    options: Options,
    overviews: Arc<overview::Overviews>,
    changelogs: Arc<changelog::Changelogs>,
    /// Pages of wait-for chains, one read for concurrent equal requests
    /// (as the overview's walk: kept a second, two reads at once).
    waits: Arc<WaitsFlights>,
}

/// Pages of wait-for chains by (namespace, page).
type WaitsFlights = flight::Flights<(String, Option<u64>), Arc<tumbler_engine::WaitChainsPage>>;

impl Dashboard {
    /// Whether `access` may use the admin actions in `namespace` here: the
    /// flag is on and the caller has the admin role there (always, with
    /// auth off).
    fn shows_admin(&self, access: &Access, namespace: &str) -> bool {
        self.options.admin && access.may_admin(namespace)
    }
}

/// The dashboard's pages, assets and JSON endpoints. Everything but the
/// login and logout routes, the static assets and `/` (a redirect) goes
/// through `login::require_access`.
pub fn router(engine: Arc<dyn EngineFace>, options: Options) -> Router {
    let edge = edge::EdgeOptions {
        hosts: options.hosts.clone(),
        hsts: options.secure_cookie,
    };
    let changelogs =
        changelog::Changelogs::new(engine.walks().changelog_settings().reads_per_second);
    let state = Dashboard {
        engine,
        options,
        overviews: Arc::default(),
        changelogs: Arc::new(changelogs),
        waits: Arc::new(flight::Flights::new(overview::PASSES, overview::FRESH_FOR)),
    };
    let guarded = Router::new()
        .route("/dashboard", get(pages::overview_page))
        .route("/dashboard/", get(pages::overview_page))
        .route("/dashboard/locks", get(pages::locks_page))
        .route("/dashboard/lock", get(pages::lock_page))
        .route("/dashboard/metrics", get(pages::metrics_page))
        .route("/dashboard/reaper", get(pages::reaper_page))
        .route("/dashboard/changelog", get(pages::changelog_page))
        .route("/dashboard/release", get(admin::confirm_release))
        .route("/dashboard/clear", get(admin::confirm_clear))
        .route("/dashboard/admin/release", post(admin::admin_release))
        .route("/dashboard/admin/clear", post(admin::admin_clear))
        .route("/api/v1/namespaces", get(api::api_namespaces))
        .route("/api/v1/overview", get(api::api_overview))
        .route("/api/v1/locks", get(api::api_locks))
        .route("/api/v1/locks/{*name}", get(api::api_lock))
        .route("/api/v1/metrics", get(api::api_metrics))
        .route("/api/v1/reaper", get(api::api_reaper))
        .route("/api/v1/changelog", get(changelog::api_changelog))
        .route("/api/v1/waits", get(api::api_waits))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            login::require_access,
        ));
    Router::new()
        .route("/", get(|| async { redirect("/dashboard") }))
        .route(
            "/dashboard/login",
            get(login::login_page).post(login::log_in),
        )
        .route("/dashboard/logout", post(login::log_out))
        .route("/dashboard/assets/app.js", get(app_js))
        .route("/dashboard/assets/style.css", get(style_css))
        .merge(guarded)
        .fallback(not_found)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(edge, edge::edge))
}

fn redirect(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response()
}

async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

async fn style_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        STYLE_CSS,
    )
        .into_response()
}

/// Any other path of the HTTP port: 404 with a line that says what the
/// port serves (a Connect or gRPC call sent here by mistake learns where
/// to send it), under the same Host rule and security headers.
async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let line = format!(
        "no {method} {path} here: this is tumbler's HTTP port (/metrics, /healthz, /dashboard, \
         /api/v1/...); gRPC, Connect and gRPC-Web calls go to the gRPC port (--listen)\n",
        path = uri.path()
    );
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        line,
    )
        .into_response()
}
