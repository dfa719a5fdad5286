//! The JSON endpoints under `/api/v1/`: each one or a few calls of the
//! same [`LockEngine`](crate::engine::LockEngine) methods the gRPC
//! handlers call, inputs checked by [`crate::api::validate`], answers from
//! `Serialize` view types (the engine's own types where their shape is
//! the answer's). Fencing tokens are strings: they pass 2^53 one day, and
//! JavaScript numbers would round them (the gRPC JSON mapping does the
//! same).

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use serde::Serialize;

use super::errors::{ApiError, ApiResult, json_reply, no_store};
use super::login::Caller;
use super::overview::CHART_MINUTES;
use super::params::{LockQuery, LocksQuery, MetricsQuery, NamespaceQuery, Query, readable};
use super::{Dashboard, MAX_MINUTES, MINUTE_MS};
use crate::api::validate;
use crate::auth::Access;
use crate::engine::{
    Grant, LockId, LockSummary, MetricsReport, QueuedRequest, REAPER_LOCK, REAPER_NAMESPACE,
};
use crate::wallclock::unix_ms;

/// One permit, as the lock and reaper endpoints show it: the engine's
/// `Grant` (its own `Serialize`) and the time it has left.
#[derive(Serialize)]
pub(super) struct GrantView<'a> {
    #[serde(flatten)]
    grant: &'a Grant,
    remaining_ms: i64,
}

impl<'a> GrantView<'a> {
    fn of(grant: &'a Grant, now_ms: i64) -> Self {
        GrantView {
            grant,
            remaining_ms: grant.expires_at_ms - now_ms,
        }
    }
}

/// The namespaces in use that `access` may read (tumbler's own only for
/// an admin token that names it).
pub(super) async fn visible_namespaces(
    d: &Dashboard,
    access: &Access,
) -> Result<Vec<String>, ApiError> {
    let mut namespaces = d.engine.namespaces().await?;
    namespaces.retain(|namespace| access.lists(namespace));
    Ok(namespaces)
}

#[derive(Serialize)]
struct NamespacesView {
    namespaces: Vec<String>,
    sees_default: bool,
}

/// `GET /api/v1/namespaces`: the namespaces in use (those the caller
/// sees), and whether the caller may see `default` (in use or not).
pub(super) async fn api_namespaces(
    State(d): State<Dashboard>,
    Caller(access): Caller,
) -> ApiResult {
    json_reply(NamespacesView {
        namespaces: visible_namespaces(&d, &access).await?,
        sees_default: access.sees("default"),
    })
}

#[derive(Serialize)]
struct LocksView<'a> {
    namespace: String,
    prefix: String,
    locks: Vec<&'a LockSummary>,
    next_page_token: String,
    now_ms: i64,
}

/// `GET /api/v1/locks?namespace=&prefix=&page_size=&page_token=&only_waiting=`:
/// one page of List.
pub(super) async fn api_locks(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Query(query): Query<LocksQuery>,
) -> ApiResult {
    let namespace = readable(&query.namespace, &access)?;
    let prefix = validate::prefix(&query.prefix)?;
    let page_size = validate::page_size(query.page_size.unwrap_or(0))?;
    let from = validate::page_token(&query.page_token)?;
    let page = d
        .engine
        .list(&namespace, &prefix, page_size, from, query.only_waiting)
        .await?;
    // The page in name order (List pages go shard by shard).
    let mut locks: Vec<_> = page.locks.iter().collect();
    locks.sort_by(|a, b| a.name.cmp(&b.name));
    json_reply(LocksView {
        namespace: namespace.into(),
        prefix,
        locks,
        next_page_token: validate::next_page_token(page.next.as_ref()),
        now_ms: page.now_ms,
    })
}

#[derive(Serialize)]
struct LockView<'a> {
    namespace: &'a str,
    name: &'a str,
    limit: u32,
    waiters: u32,
    holders: Vec<GrantView<'a>>,
    queue: QueueView<'a>,
    now_ms: i64,
    admin: bool,
}

#[derive(Serialize)]
struct QueueView<'a> {
    waiters: u32,
    requests: &'a [QueuedRequest],
}

/// `GET /api/v1/locks/{name}?namespace=&max_entries=`: Inspect and Queue.
pub(super) async fn api_lock(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Path(name): Path<String>,
    Query(query): Query<LockQuery>,
) -> ApiResult {
    let lock = LockId {
        namespace: readable(&query.namespace, &access)?,
        name: validate::name(&name)?,
    };
    let most = validate::max_entries(query.max_entries.unwrap_or(0))?;
    let state = d.engine.inspect(&lock).await?;
    let queue = d.engine.queue(&lock, most).await?;
    json_reply(LockView {
        namespace: &lock.namespace,
        name: &lock.name,
        limit: state.limit,
        waiters: state.waiters,
        holders: state
            .holders
            .iter()
            .map(|grant| GrantView::of(grant, state.now_ms))
            .collect(),
        queue: QueueView {
            waiters: queue.waiters,
            requests: &queue.requests,
        },
        now_ms: state.now_ms,
        admin: d.shows_admin(&access, &lock.namespace),
    })
}

/// The metrics range of a request: `from_ms`/`to_ms` as the Metrics RPC
/// takes them, or `minutes` back from now (default 60).
fn metrics_range(query: &MetricsQuery) -> Result<(i64, i64), ApiError> {
    let now = unix_ms();
    if query.from_ms.is_some() || query.to_ms.is_some() {
        return Ok(validate::metrics_range(
            query.from_ms.unwrap_or(0),
            query.to_ms.unwrap_or(0),
            now,
        )?);
    }
    let minutes = query.minutes.unwrap_or(CHART_MINUTES);
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

#[derive(Serialize)]
struct MetricsView<'a> {
    namespace: &'a str,
    from_ms: i64,
    to_ms: i64,
    /// minutes, totals, overall: the engine's report as it is.
    #[serde(flatten)]
    report: &'a MetricsReport,
}

/// `GET /api/v1/metrics?namespace=&minutes=&kind=` (or `from_ms`/`to_ms`):
/// the Metrics RPC's report.
pub(super) async fn api_metrics(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Query(query): Query<MetricsQuery>,
) -> ApiResult {
    let namespace = readable(&query.namespace, &access)?;
    let (from_ms, to_ms) = metrics_range(&query)?;
    let kind = match query.kind.as_str() {
        "" => None,
        kind => Some(validate::kind(kind)?),
    };
    let report = d
        .engine
        .metrics(&namespace, from_ms, to_ms, kind.as_deref())
        .await?;
    json_reply(MetricsView {
        namespace: &namespace,
        from_ms,
        to_ms,
        report: &report,
    })
}

/// `GET /api/v1/overview?namespace=`: what the overview page shows, from
/// List (walked up to 10,000 locks) and Metrics (the last hour), made at
/// most about once a second per namespace (see `overview.rs`).
pub(super) async fn api_overview(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Query(query): Query<NamespaceQuery>,
) -> ApiResult {
    let namespace = readable(&query.namespace, &access)?;
    let shared = d.overviews.get(&d.engine, &namespace).await?;
    let body = shared.body(d.shows_admin(&access, &namespace)).to_owned();
    Ok((
        no_store(),
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

#[derive(Serialize)]
struct ReaperView<'a> {
    namespace: &'static str,
    name: &'static str,
    held: bool,
    holder: Option<GrantView<'a>>,
    namespaces: Vec<String>,
    now_ms: i64,
}

/// `GET /api/v1/reaper`: which replica reaps now (Inspect of
/// `tumbler-system/reaper`, so only for callers who may read that
/// namespace: an admin token naming it), and the namespaces it visits
/// that the caller sees.
pub(super) async fn api_reaper(State(d): State<Dashboard>, Caller(access): Caller) -> ApiResult {
    access.read(REAPER_NAMESPACE)?;
    let lock = LockId::reaper();
    let state = d.engine.inspect(&lock).await?;
    let holder = state
        .holders
        .first()
        .map(|grant| GrantView::of(grant, state.now_ms));
    json_reply(ReaperView {
        namespace: REAPER_NAMESPACE,
        name: REAPER_LOCK,
        held: holder.is_some(),
        holder,
        namespaces: visible_namespaces(&d, &access).await?,
        now_ms: state.now_ms,
    })
}
