//! The web dashboard on the HTTP port: a few pages of plain HTML, CSS and
//! vanilla JavaScript (embedded in the binary, no build step) that poll
//! JSON endpoints under `/api/v1/`.
//!
//! Every endpoint is one or a few calls of the same [`LockEngine`] methods
//! the gRPC handlers call, with inputs checked by the same
//! [`crate::api::validate`] functions, so bad input gets the gRPC API's
//! message (as a 400) and the numbers are the RPCs' numbers.
//!
//! With an auth tokens file, every page and endpoint needs one of its
//! tokens (a bearer header, or the login cookie; see `login.rs`), and
//! shows only the namespaces that token may see: each handler passes the
//! namespace it reads through `Params::namespace`, which checks it with
//! the caller's [`Access::read`], as the gRPC handlers do. So tumbler's
//! own namespace (`tumbler-system`) shows only to an admin token that
//! names it: not with auth off, not to a `*` token.
//!
//! The overview, the one costly read, is kept per namespace for a second
//! and made once for all concurrent requests (see `overview.rs`).
//!
//! Admin actions (force release of a holder, clear a namespace) exist only
//! when the server runs with `--dashboard-admin`, and, with auth on, only
//! for a token with the admin role in that namespace. Each one is a POST
//! behind a confirmation page, and cross-site POSTs are refused.

mod changelog;
mod edge;
mod login;
mod overview;
mod session;

pub use session::{CookieKey, SESSION_TTL};

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use self::login::Caller;
use crate::api::validate;
use crate::auth::{Access, Authenticator};
use crate::engine::{
    Counters, EngineError, Grant, LockEngine, LockId, MetricsReport, MetricsRow, REAPER_LOCK,
    REAPER_NAMESPACE, ReleaseOutcome,
};
use crate::store::StoreError;

const PAGE: &str = include_str!("assets/page.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

use self::overview::CHART_MINUTES;

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
    /// Host names the dashboard answers besides loopback ones; None: any
    /// (see [`edge`]).
    pub allowed_hosts: Option<Vec<String>>,
    /// Signs the login cookies (`--dashboard-cookie-key-file`, else a
    /// random key of this process).
    pub cookie_key: CookieKey,
}

#[derive(Clone)]
struct Dashboard {
    engine: Arc<LockEngine>,
    options: Options,
    overviews: Arc<overview::Overviews>,
}

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
pub fn router(engine: Arc<LockEngine>, options: Options) -> Router {
    let edge = edge::EdgeOptions {
        allowed_hosts: options.allowed_hosts.clone(),
        hsts: options.secure_cookie,
    };
    let state = Dashboard {
        engine,
        options,
        overviews: Arc::default(),
    };
    let guarded = Router::new()
        .route("/dashboard", get(overview_page))
        .route("/dashboard/", get(overview_page))
        .route("/dashboard/locks", get(locks_page))
        .route("/dashboard/lock", get(lock_page))
        .route("/dashboard/metrics", get(metrics_page))
        .route("/dashboard/reaper", get(reaper_page))
        .route("/dashboard/changelog", get(changelog::changelog_page))
        .route("/dashboard/release", get(confirm_release))
        .route("/dashboard/clear", get(confirm_clear))
        .route("/dashboard/admin/release", post(admin_release))
        .route("/dashboard/admin/clear", post(admin_clear))
        .route("/api/v1/namespaces", get(api_namespaces))
        .route("/api/v1/overview", get(api_overview))
        .route("/api/v1/locks", get(api_locks))
        .route("/api/v1/locks/{*name}", get(api_lock))
        .route("/api/v1/metrics", get(api_metrics))
        .route("/api/v1/reaper", get(api_reaper))
        .route("/api/v1/changelog", get(changelog::api_changelog))
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
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(edge, edge::edge))
}

// ---------------------------------------------------------------- errors

/// An endpoint's failure: a status and a message, as JSON
/// (`{"error": "...", "code": "..."}`).
#[derive(Clone, Debug)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "INVALID_ARGUMENT",
            message: message.into(),
        }
    }

    fn admin_off() -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            code: "PERMISSION_DENIED",
            message: ADMIN_OFF.into(),
        }
    }

    /// No valid token: one fixed message, whatever was wrong with it.
    fn unauthenticated() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "UNAUTHENTICATED",
            message: UNAUTHENTICATED.into(),
        }
    }
}

const ADMIN_OFF: &str = "admin actions are off: start tumbler with --dashboard-admin \
     (TUMBLER_DASHBOARD_ADMIN=true) to enable them";

const UNAUTHENTICATED: &str = "authentication required: send a valid token as \
     `authorization: Bearer <token>`, or log in at /dashboard/login";

/// The gRPC API's refusals keep their meaning: a validation failure is a
/// 400 with its message, a namespace or role the token lacks a 403, a
/// token over its request rate a 429.
impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        let (status_code, code) = match status.code() {
            tonic::Code::Unauthenticated => return ApiError::unauthenticated(),
            tonic::Code::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
            tonic::Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
            _ => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        };
        ApiError {
            status: status_code,
            code,
            message: status.message().to_owned(),
        }
    }
}

/// The same mapping the gRPC handlers use: Redis trouble is 503
/// (UNAVAILABLE), a reply the engine cannot read 500 (INTERNAL).
impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::Store(StoreError::Unavailable(detail)) => {
                tracing::warn!(%detail, "redis unavailable (dashboard)");
                crate::observe::redis_error("unavailable");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "UNAVAILABLE",
                    message: format!("lock store unavailable: {detail}"),
                }
            }
            EngineError::Store(StoreError::Protocol(detail)) => {
                tracing::error!(%detail, "unexpected redis reply (dashboard)");
                crate::observe::redis_error("protocol");
                ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    code: "INTERNAL",
                    message: "lock store answered unexpectedly".into(),
                }
            }
            other => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "UNAVAILABLE",
                message: other.to_string(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.message, "code": self.code });
        (self.status, json_headers(), body.to_string()).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

fn json_headers() -> [(header::HeaderName, &'static str); 2] {
    [
        (header::CONTENT_TYPE, "application/json"),
        (header::CACHE_CONTROL, "no-store"),
    ]
}

fn json_reply(value: Value) -> ApiResult {
    Ok((json_headers(), value.to_string()).into_response())
}

// ---------------------------------------------------------------- inputs

/// Query-string or form parameters (the last value of a repeated key wins).
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(raw: &[u8]) -> Self {
        Params(form_urlencoded::parse(raw).into_owned().collect())
    }

    fn query(raw: &Option<String>) -> Self {
        Params::parse(raw.as_deref().unwrap_or("").as_bytes())
    }

    fn get(&self, key: &str) -> &str {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
    }

    /// A whole number, or None when the parameter is absent or empty.
    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, ApiError> {
        match self.get(key) {
            "" => Ok(None),
            text => text
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("{key}: must be a whole number"))),
        }
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), "1" | "true" | "on" | "yes")
    }

    /// The `namespace` parameter (empty: `default`), valid and one the
    /// caller may read (as Inspect and List would allow it); every
    /// namespace a handler reads comes from here.
    fn namespace(&self, access: &Access) -> Result<String, ApiError> {
        let namespace = validate::namespace(self.get("namespace"))?;
        access.read(&namespace)?;
        Ok(namespace)
    }
}

/// This replica's clock in Unix ms (only to place a metrics range, as the
/// Metrics RPC does).
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

// ---------------------------------------------------------------- JSON

fn counters_json(c: &Counters) -> Value {
    json!({
        "acquired": c.acquired,
        "denied": c.denied,
        "timed_out": c.timed_out,
        "released": c.released,
        "extended": c.extended,
        "expired": c.expired,
        "reaped": c.reaped,
        "cleared": c.cleared,
        "errors": c.errors,
    })
}

fn row_json(row: &MetricsRow) -> Value {
    let mut value = counters_json(&row.counters);
    value["minute_ms"] = json!(row.minute_ms);
    value["kind"] = json!(row.kind);
    value
}

/// Tokens are strings: they pass 2^53 one day, and JavaScript numbers
/// would round them (the gRPC JSON mapping does the same).
fn grant_json(grant: &Grant, now_ms: i64) -> Value {
    json!({
        "holder": grant.holder,
        "fencing_token": grant.fencing_token.to_string(),
        "slot": grant.slot,
        "acquired_at_ms": grant.acquired_at_ms,
        "expires_at_ms": grant.expires_at_ms,
        "remaining_ms": grant.expires_at_ms - now_ms,
        "ttl_ms": grant.ttl_ms,
        "kind": grant.kind,
        "metadata": grant.metadata,
    })
}

// ---------------------------------------------------------------- API

/// The namespaces in use that `access` may read (tumbler's own only for
/// an admin token that names it).
async fn visible_namespaces(d: &Dashboard, access: &Access) -> Result<Vec<String>, ApiError> {
    let mut namespaces = d.engine.namespaces().await?;
    namespaces.retain(|namespace| access.lists(namespace));
    Ok(namespaces)
}

/// `GET /api/v1/namespaces`: the namespaces in use (those the caller
/// sees), and whether the caller may see `default` (in use or not).
async fn api_namespaces(State(d): State<Dashboard>, Caller(access): Caller) -> ApiResult {
    let namespaces = visible_namespaces(&d, &access).await?;
    json_reply(json!({
        "namespaces": namespaces,
        "sees_default": access.sees("default"),
    }))
}

/// `GET /api/v1/locks?namespace=&prefix=&page_size=&page_token=&only_waiting=`:
/// one page of List.
async fn api_locks(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let params = Params::query(&query);
    let namespace = params.namespace(&access)?;
    let prefix = validate::prefix(params.get("prefix"))?;
    let page_size = validate::page_size(params.number("page_size")?.unwrap_or(0))?;
    let from = validate::page_token(params.get("page_token"))?;
    let only_waiting = params.flag("only_waiting");
    let page = d
        .engine
        .list(&namespace, &prefix, page_size, from, only_waiting)
        .await?;
    // The page in name order (List pages go shard by shard).
    let mut found: Vec<_> = page.locks.iter().collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    let locks: Vec<Value> = found
        .into_iter()
        .map(|lock| {
            json!({
                "name": lock.name,
                "holders": lock.holders,
                "limit": lock.limit,
                "waiters": lock.waiters,
                "next_expiry_at_ms": lock.next_expiry_at_ms,
            })
        })
        .collect();
    json_reply(json!({
        "namespace": namespace,
        "prefix": prefix,
        "locks": locks,
        "next_page_token": page.next.as_ref().map(validate::encode_page_token).unwrap_or_default(),
        "now_ms": page.now_ms,
    }))
}

/// `GET /api/v1/locks/{name}?namespace=&max_entries=`: Inspect and Queue.
async fn api_lock(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let params = Params::query(&query);
    let lock = LockId {
        namespace: params.namespace(&access)?,
        name: validate::name(&name)?,
    };
    let most = validate::max_entries(params.number("max_entries")?.unwrap_or(0))?;
    let state = d.engine.inspect(&lock).await?;
    let queue = d.engine.queue(&lock, most).await?;
    let holders: Vec<Value> = state
        .holders
        .iter()
        .map(|grant| grant_json(grant, state.now_ms))
        .collect();
    let requests: Vec<Value> = queue
        .requests
        .iter()
        .map(|r| {
            json!({
                "holder": r.holder,
                "position": r.position,
                "priority": r.priority,
                "enqueued_at_ms": r.enqueued_at_ms,
                "expires_at_ms": r.expires_at_ms,
                "wait_deadline_ms": r.wait_deadline_ms,
                "fair": r.fair,
                "kind": r.kind,
            })
        })
        .collect();
    json_reply(json!({
        "namespace": lock.namespace,
        "name": lock.name,
        "limit": state.limit,
        "waiters": state.waiters,
        "holders": holders,
        "queue": { "waiters": queue.waiters, "requests": requests },
        "now_ms": state.now_ms,
        "admin": d.shows_admin(&access, &lock.namespace),
    }))
}

/// The metrics range of a request: `from_ms`/`to_ms` as the Metrics RPC
/// takes them, or `minutes` back from now (default 60).
fn metrics_range(params: &Params) -> Result<(i64, i64), ApiError> {
    let now = unix_ms();
    let from_ms: Option<i64> = params.number("from_ms")?;
    let to_ms: Option<i64> = params.number("to_ms")?;
    if from_ms.is_some() || to_ms.is_some() {
        return Ok(validate::metrics_range(
            from_ms.unwrap_or(0),
            to_ms.unwrap_or(0),
            now,
        )?);
    }
    let minutes: i64 = params.number("minutes")?.unwrap_or(CHART_MINUTES);
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(ApiError::bad_request(format!(
            "minutes: must be between 1 and {MAX_MINUTES} (the counters' retention)"
        )));
    }
    Ok(validate::metrics_range(
        now - minutes * MINUTE_MS,
        now,
        now,
    )?)
}

fn report_json(report: &MetricsReport, from_ms: i64, to_ms: i64) -> Value {
    json!({
        "from_ms": from_ms,
        "to_ms": to_ms,
        "minutes": report.minutes.iter().map(row_json).collect::<Vec<_>>(),
        "totals": report.totals.iter().map(row_json).collect::<Vec<_>>(),
        "overall": row_json(&report.overall),
    })
}

/// `GET /api/v1/metrics?namespace=&minutes=&kind=` (or `from_ms`/`to_ms`):
/// the Metrics RPC's report.
async fn api_metrics(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let params = Params::query(&query);
    let namespace = params.namespace(&access)?;
    let (from_ms, to_ms) = metrics_range(&params)?;
    let kind = match params.get("kind") {
        "" => None,
        kind => Some(validate::kind(kind)?),
    };
    let report = d
        .engine
        .metrics(&namespace, from_ms, to_ms, kind.as_deref())
        .await?;
    let mut value = report_json(&report, from_ms, to_ms);
    value["namespace"] = json!(namespace);
    json_reply(value)
}

/// `GET /api/v1/overview?namespace=`: what the overview page shows, from
/// List (walked up to 10,000 locks) and Metrics (the last hour), made at
/// most about once a second per namespace (see `overview.rs`).
async fn api_overview(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let params = Params::query(&query);
    let namespace = params.namespace(&access)?;
    let shared = d.overviews.get(&d.engine, &namespace).await?;
    let body = shared.body(d.shows_admin(&access, &namespace)).to_owned();
    Ok((json_headers(), body).into_response())
}

/// `GET /api/v1/reaper`: which replica reaps now (Inspect of
/// `tumbler-system/reaper`, so only for callers who may read that
/// namespace: an admin token naming it), and the namespaces it visits
/// that the caller sees.
async fn api_reaper(State(d): State<Dashboard>, Caller(access): Caller) -> ApiResult {
    access.read(REAPER_NAMESPACE)?;
    let lock = LockId {
        namespace: REAPER_NAMESPACE.into(),
        name: REAPER_LOCK.into(),
    };
    let state = d.engine.inspect(&lock).await?;
    let namespaces = visible_namespaces(&d, &access).await?;
    let holder = state.holders.first().map(|g| grant_json(g, state.now_ms));
    json_reply(json!({
        "namespace": REAPER_NAMESPACE,
        "name": REAPER_LOCK,
        "held": holder.is_some(),
        "holder": holder,
        "namespaces": namespaces,
        "now_ms": state.now_ms,
    }))
}

// ---------------------------------------------------------------- pages

fn redirect(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response()
}

/// Who a page is rendered for: the caller, and the namespace the page is
/// about (which decides whether its admin controls show).
struct View<'a> {
    d: &'a Dashboard,
    access: &'a Access,
    namespace: &'a str,
}

impl<'a> View<'a> {
    /// A view of the namespace named in `params` (`default` when none).
    fn of(d: &'a Dashboard, access: &'a Access, params: &'a Params) -> Self {
        let namespace = match params.get("namespace") {
            "" => "default",
            named => named,
        };
        View {
            d,
            access,
            namespace,
        }
    }

    /// A page: the shell around `main`, with the nav marking `page` current.
    fn page(&self, page: &str, title: &str, main: &str) -> Response {
        let nav = [
            ("overview", "/dashboard", "Overview"),
            ("locks", "/dashboard/locks", "Locks"),
            ("metrics", "/dashboard/metrics", "Metrics"),
            ("changelog", "/dashboard/changelog", "Changelog"),
            ("reaper", "/dashboard/reaper", "Reaper"),
        ]
        .iter()
        // The reaper page is Inspect of a lock in tumbler-system.
        .filter(|(id, _, _)| *id != "reaper" || self.access.lists(REAPER_NAMESPACE))
        .map(|(id, href, label)| {
            let current = if *id == page || (*id == "locks" && page == "lock") {
                " aria-current=\"page\""
            } else {
                ""
            };
            format!("<li><a href=\"{href}\" data-keep-namespace{current}>{label}</a></li>")
        })
        .collect::<String>();
        // on: admin controls show; denied: the flag is on but this token
        // is not an admin here; off: the flag is off.
        let admin = match (
            self.d.options.admin,
            self.d.shows_admin(self.access, self.namespace),
        ) {
            (false, _) => "off",
            (true, true) => "on",
            (true, false) => "denied",
        };
        let html = PAGE
            .replace("{{title}}", &escape(title))
            .replace("{{page}}", page)
            .replace("{{admin}}", admin)
            .replace("{{nav}}", &nav)
            .replace("{{session}}", &self.session())
            .replace("{{main}}", main);
        (
            [
                (header::CACHE_CONTROL, "no-store"),
                (header::X_FRAME_OPTIONS, "DENY"),
            ],
            Html(html),
        )
            .into_response()
    }

    /// With auth on: who is logged in, and the logout button.
    fn session(&self) -> String {
        if self.d.options.auth.is_none() || !matches!(self.access, Access::Token(_)) {
            return String::new();
        }
        format!(
            "<form class=\"session\" method=\"post\" action=\"/dashboard/logout\">\
             <span>Token <strong>{}</strong></span> \
             <button type=\"submit\" class=\"secondary\">Log out</button></form>",
            escape(self.access.who())
        )
    }

    /// A server-rendered page (confirmations and results), with its status.
    fn plain(&self, status: StatusCode, title: &str, main: String) -> Response {
        let mut response = self.page("admin", title, &main);
        *response.status_mut() = status;
        response
    }

    fn error(&self, err: ApiError) -> Response {
        let heading = match err.status {
            StatusCode::FORBIDDEN => "Not allowed",
            _ => "Not done",
        };
        self.plain(
            err.status,
            heading,
            format!(
                "<h1>{heading}</h1>\n<p role=\"alert\">{}</p>\n<p><a href=\"/dashboard\">Back to the overview</a></p>",
                escape(&err.message)
            ),
        )
    }
}

/// The body of a page that app.js fills in.
fn live(heading: &str) -> String {
    format!(
        "<h1 id=\"heading\">{}</h1>\n<div id=\"content\" data-live><p>Loading…</p></div>\n\
         <noscript><p>This page needs JavaScript to load its data; the same data is at \
         <a href=\"/api/v1/overview\">/api/v1/</a>.</p></noscript>",
        escape(heading)
    )
}

/// A page app.js fills in, for the namespace in its query. The caller must
/// see that namespace (403 otherwise); one who names none and may not see
/// `default` is sent on to a namespace of its own.
async fn shell(d: &Dashboard, access: &Access, uri: &Uri, id: &str, title: &str) -> Response {
    let params = Params::query(&uri.query().map(str::to_owned));
    if params.get("namespace").is_empty() && !access.sees("default") {
        if let Some(home) = landing_namespace(d, access).await {
            return redirect(&with_param(uri, "namespace", &home));
        }
        return View::of(d, access, &params).plain(
            StatusCode::FORBIDDEN,
            "Choose a namespace",
            "<h1>Choose a namespace</h1>\n<p>This token may not see the <code>default</code> \
             namespace: type one of its namespaces in the header.</p>"
                .into(),
        );
    }
    let view = View::of(d, access, &params);
    // A malformed name still gets the page: its endpoints answer 400 with
    // the rule.
    if validate::namespace(view.namespace).is_ok()
        && let Err(denied) = access.read(view.namespace)
    {
        return view.error(denied.into());
    }
    view.page(id, title, &live(title))
}

/// Where a caller who may not see `default` starts: a namespace its token
/// names, else the first namespace in use that it sees.
async fn landing_namespace(d: &Dashboard, access: &Access) -> Option<String> {
    if let Some(home) = access.home_namespace() {
        return Some(home.to_owned());
    }
    visible_namespaces(d, access).await.ok()?.into_iter().next()
}

/// `uri` with the query parameter `key` set to `value`.
fn with_param(uri: &Uri, key: &str, value: &str) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        if k != key {
            query.append_pair(&k, &v);
        }
    }
    query.append_pair(key, value);
    format!("{}?{}", uri.path(), query.finish())
}

async fn overview_page(State(d): State<Dashboard>, Caller(access): Caller, uri: Uri) -> Response {
    shell(&d, &access, &uri, "overview", "Overview").await
}

async fn locks_page(State(d): State<Dashboard>, Caller(access): Caller, uri: Uri) -> Response {
    shell(&d, &access, &uri, "locks", "Locks").await
}

async fn lock_page(State(d): State<Dashboard>, Caller(access): Caller, uri: Uri) -> Response {
    shell(&d, &access, &uri, "lock", "Lock").await
}

async fn metrics_page(State(d): State<Dashboard>, Caller(access): Caller, uri: Uri) -> Response {
    shell(&d, &access, &uri, "metrics", "Metrics").await
}

async fn reaper_page(State(d): State<Dashboard>, Caller(access): Caller) -> Response {
    let view = View {
        d: &d,
        access: &access,
        namespace: REAPER_NAMESPACE,
    };
    match access.read(REAPER_NAMESPACE) {
        Ok(()) => view.page("reaper", "Reaper", &live("Reaper")),
        Err(denied) => view.error(denied.into()),
    }
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

/// HTML-escapes text for element content and quoted attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn url_encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn lock_href(lock: &LockId) -> String {
    format!(
        "/dashboard/lock?namespace={}&name={}",
        url_encode(&lock.namespace),
        url_encode(&lock.name)
    )
}

// ---------------------------------------------------------------- admin

/// The namespace of an admin page or action, once allowed: the flag on,
/// the name valid, and the caller an admin there (anyone, with auth off).
fn admin_namespace(d: &Dashboard, access: &Access, params: &Params) -> Result<String, ApiError> {
    if !d.options.admin {
        return Err(ApiError::admin_off());
    }
    let namespace = validate::namespace(params.get("namespace"))?;
    access.admin(&namespace)?;
    Ok(namespace)
}

/// `GET /dashboard/release?namespace=&name=&holder=`: the confirmation
/// page for a force release, showing the grant it will end.
async fn confirm_release(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    RawQuery(query): RawQuery,
) -> Response {
    let params = Params::query(&query);
    let view = View::of(&d, &access, &params);
    release_preview(&view, &params)
        .await
        .unwrap_or_else(|err| view.error(err))
}

async fn release_preview(view: &View<'_>, params: &Params) -> Result<Response, ApiError> {
    let lock = LockId {
        namespace: admin_namespace(view.d, view.access, params)?,
        name: validate::name(params.get("name"))?,
    };
    let holder = validate::holder(params.get("holder"))?;
    let state = view.d.engine.inspect(&lock).await?;
    let Some(grant) = state.holders.iter().find(|g| g.holder == holder) else {
        return Ok(view.plain(
            StatusCode::NOT_FOUND,
            "Not held",
            format!(
                "<h1>Not held</h1>\n<p><code>{}</code> holds no permit of <code>{}</code> any more.</p>\n\
                 <p><a href=\"{}\">Back to the lock</a></p>",
                escape(&holder),
                escape(&lock.name),
                escape(&lock_href(&lock))
            ),
        ));
    };
    let main = format!(
        "<h1>Force release?</h1>\n\
         <p>This ends the grant below now, as if its holder had released it. The holder is not \
         told: if it is still working, it works without the lock (its next Extend answers \
         NOT_HELD, and a fenced resource refuses its token once a newer one is used).</p>\n\
         <dl class=\"facts\">\
         <dt>Namespace</dt><dd><code>{ns}</code></dd>\
         <dt>Lock</dt><dd><code>{name}</code></dd>\
         <dt>Holder</dt><dd><code>{holder}</code></dd>\
         <dt>Fencing token</dt><dd><code>{token}</code></dd>\
         <dt>Slot</dt><dd>{slot}</dd>\
         <dt>Remaining lease</dt><dd>{remaining:.1} s</dd></dl>\n\
         <form method=\"post\" action=\"/dashboard/admin/release\">\
         <input type=\"hidden\" name=\"namespace\" value=\"{ns}\">\
         <input type=\"hidden\" name=\"name\" value=\"{name}\">\
         <input type=\"hidden\" name=\"holder\" value=\"{holder}\">\
         <input type=\"hidden\" name=\"fencing_token\" value=\"{token}\">\
         <p>Only this grant (token {token}) is released: if the holder has re-acquired since, \
         nothing happens.</p>\
         <button type=\"submit\" name=\"confirm\" value=\"yes\" class=\"danger\">Release this grant</button> \
         <a href=\"{back}\">Cancel</a></form>",
        ns = escape(&lock.namespace),
        name = escape(&lock.name),
        holder = escape(&grant.holder),
        token = grant.fencing_token,
        slot = grant.slot,
        remaining = (grant.expires_at_ms - state.now_ms) as f64 / 1000.0,
        back = escape(&lock_href(&lock)),
    );
    Ok(view.plain(StatusCode::OK, "Force release?", main))
}

/// Refuses a POST a browser sent from another site. The login cookie is
/// SameSite=Strict already; this also covers an open dashboard (auth off)
/// and older browsers. Clients that are not browsers send neither header
/// and pass.
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        (Some(origin), Some(host)) => {
            let origin = origin.to_str().unwrap_or("");
            let origin = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            host.to_str().is_ok_and(|host| host == origin)
        }
        _ => true,
    }
}

/// Checks what every admin POST needs (admin allowed in the namespace,
/// same origin, confirmed) and returns the namespace.
fn admin_guard(
    d: &Dashboard,
    access: &Access,
    headers: &HeaderMap,
    params: &Params,
) -> Result<String, ApiError> {
    let namespace = admin_namespace(d, access, params)?;
    if !same_origin(headers) {
        return Err(ApiError {
            status: StatusCode::FORBIDDEN,
            code: "PERMISSION_DENIED",
            message: "cross-site requests are refused".into(),
        });
    }
    if params.get("confirm") != "yes" {
        return Err(ApiError::bad_request(
            "confirm: must be yes (use the confirmation page)",
        ));
    }
    Ok(namespace)
}

/// `POST /dashboard/admin/release` (form: namespace, name, holder,
/// fencing_token, confirm=yes): the same engine release as the Release
/// RPC, pinned to the token shown on the confirmation page.
async fn admin_release(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = Params::parse(&body);
    let view = View::of(&d, &access, &params);
    do_release(&view, &headers, &params)
        .await
        .unwrap_or_else(|err| view.error(err))
}

async fn do_release(view: &View<'_>, headers: &HeaderMap, params: &Params) -> ApiResult {
    let lock = LockId {
        namespace: admin_guard(view.d, view.access, headers, params)?,
        name: validate::name(params.get("name"))?,
    };
    let holder = validate::holder(params.get("holder"))?;
    let token = validate::fencing_token(params.number("fencing_token")?)?;
    let engine = &view.d.engine;
    let outcome = engine.release(&lock, &holder, token).await?;
    let released = matches!(outcome, ReleaseOutcome::Released { .. });
    crate::observe::released(engine.layout(), &lock, &holder, token, outcome);
    tracing::warn!(namespace = %lock.namespace, name = %lock.name, %holder, released, who = %view.access.who(), "force release from the dashboard");
    let (title, text) = if released {
        ("Released", "was released")
    } else {
        (
            "Not held",
            "was not held any more (released, expired, or re-acquired with another token): nothing changed",
        )
    };
    Ok(view.plain(
        StatusCode::OK,
        title,
        format!(
            "<h1>{title}</h1>\n<p role=\"status\">The grant of <code>{}</code> on <code>{}</code> {text}.</p>\n\
             <p><a href=\"{}\">Back to the lock</a></p>",
            escape(&holder),
            escape(&lock.name),
            escape(&lock_href(&lock))
        ),
    ))
}

/// `GET /dashboard/clear?namespace=`: the confirmation page for clearing
/// a namespace; the namespace must be typed to confirm.
async fn confirm_clear(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    RawQuery(query): RawQuery,
) -> Response {
    let params = Params::query(&query);
    let view = View::of(&d, &access, &params);
    let namespace = match admin_namespace(&d, &access, &params) {
        Ok(namespace) => namespace,
        Err(err) => return view.error(err),
    };
    let main = format!(
        "<h1>Clear namespace <code>{ns}</code>?</h1>\n\
         <p>This releases <strong>every lock</strong> and drops <strong>every waiting request</strong> \
         of the namespace <code>{ns}</code>, as the Clear RPC does. Holders are not told; waiting \
         RPCs join their queues again.</p>\n\
         <form method=\"post\" action=\"/dashboard/admin/clear\">\
         <input type=\"hidden\" name=\"namespace\" value=\"{ns}\">\
         <input type=\"hidden\" name=\"confirm\" value=\"yes\">\
         <p><label for=\"typed\">Type the namespace name to confirm</label><br>\
         <input id=\"typed\" name=\"typed\" autocomplete=\"off\" required spellcheck=\"false\"></p>\
         <button type=\"submit\" class=\"danger\">Clear {ns}</button> \
         <a href=\"/dashboard?namespace={q}\">Cancel</a></form>",
        ns = escape(&namespace),
        q = escape(&url_encode(&namespace)),
    );
    view.plain(StatusCode::OK, "Clear namespace?", main)
}

/// `POST /dashboard/admin/clear` (form: namespace, typed = the namespace,
/// confirm=yes): the same engine clear as the Clear RPC.
async fn admin_clear(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = Params::parse(&body);
    let view = View::of(&d, &access, &params);
    do_clear(&view, &headers, &params)
        .await
        .unwrap_or_else(|err| view.error(err))
}

async fn do_clear(view: &View<'_>, headers: &HeaderMap, params: &Params) -> ApiResult {
    let namespace = admin_guard(view.d, view.access, headers, params)?;
    if params.get("typed") != namespace {
        return Err(ApiError::bad_request(
            "typed: must be the namespace's name, to confirm",
        ));
    }
    let counts = view.d.engine.clear(&namespace).await?;
    tracing::warn!(?counts, %namespace, who = %view.access.who(), "namespace cleared from the dashboard");
    Ok(view.plain(
        StatusCode::OK,
        "Cleared",
        format!(
            "<h1>Cleared <code>{ns}</code></h1>\n<p role=\"status\">{} locks cleared, {} grants released, \
             {} waiting requests dropped.</p>\n<p><a href=\"/dashboard?namespace={q}\">Back to the overview</a></p>",
            counts.locks,
            counts.grants,
            counts.requests,
            ns = escape(&namespace),
            q = escape(&url_encode(&namespace)),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn cross_site_posts_are_refused() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers));
        headers.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(same_origin(&headers));
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "127.0.0.1:9090".parse().unwrap());
        headers.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, "http://127.0.0.1:9090".parse().unwrap());
        assert!(same_origin(&headers));
    }
}
