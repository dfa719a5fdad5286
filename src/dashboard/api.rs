//! The JSON endpoints under `/api/v1/`: each one or a few calls of the
//! same [`EngineFace`](tumbler_engine::EngineFace) methods the gRPC
//! handlers call, inputs checked by [`crate::service::validate`].
//!
//! One JSON dialect across the project: answers are the proto3 JSON
//! mapping, as Connect and `tumbler … -o json` speak it. Where an answer is
//! an RPC's, it is that RPC's message (built by `service::replies`,
//! serialized by the proto crate's generated serde); the dashboard's own
//! fields follow the same rules ([`Int64`]): lowerCamel names, 64-bit
//! integers as strings (fencing tokens pass 2^53 one day, and JavaScript
//! numbers would round them), fields at their default value left out of
//! proto messages.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use serde::Serialize;

use super::errors::{ApiError, ApiResult, json_reply, no_store};
use super::login::Caller;
use super::overview::CHART_MINUTES;
use super::params::{
    LockQuery, LocksQuery, MetricsQuery, NamespaceQuery, Query, WaitsQuery, readable,
};
use super::{Dashboard, MAX_MINUTES, MINUTE_MS};
use crate::auth::Access;
use crate::proto;
use crate::service::replies;
use crate::service::validate;
use tumbler_engine::wallclock::unix_ms;
use tumbler_engine::{LockId, REAPER_LOCK, REAPER_NAMESPACE};

/// A 64-bit integer of a dashboard view, as the proto3 JSON mapping
/// writes `int64` and `uint64`: a decimal string.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Int64(pub(super) i64);

impl Serialize for Int64 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl From<u64> for Int64 {
    fn from(n: u64) -> Self {
        Int64(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// The namespaces in use that `access` may read (tumbler's own only for
/// an admin token that names it).
pub(super) async fn visible_namespaces(
    d: &Dashboard,
    access: &Access,
) -> Result<Vec<String>, ApiError> {
    let mut namespaces = d.engine.walks().namespaces().await?;
    namespaces.retain(|namespace| access.lists(namespace));
    Ok(namespaces)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
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

/// A page of List, with what it was asked for.
#[derive(Serialize)]
struct LocksView {
    namespace: String,
    prefix: String,
    #[serde(flatten)]
    page: proto::ListResponse,
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
        .walks()
        .list(&namespace, &prefix, (page_size, from), query.only_waiting)
        .await?;
    let mut page = replies::list_response(page);
    // The page in name order (List pages go shard by shard).
    page.locks.sort_by(|a, b| a.name.cmp(&b.name));
    json_reply(LocksView {
        namespace: namespace.into(),
        prefix,
        page,
    })
}

/// Inspect and Queue of one lock, and whether the caller may use the
/// admin actions on it.
#[derive(Serialize)]
struct LockView {
    #[serde(flatten)]
    state: proto::InspectResponse,
    queue: proto::QueueResponse,
    admin: bool,
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
    let state = d.engine.locks().inspect(&lock).await?;
    let queue = d.engine.locks().queue(&lock, most).await?;
    json_reply(LockView {
        admin: d.shows_admin(&access, &lock.namespace),
        queue: replies::queue_response(&lock, queue),
        state: replies::inspect_response(&lock, state),
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

/// The Metrics RPC's report, with the namespace it is of.
#[derive(Serialize)]
struct MetricsView<'a> {
    namespace: &'a str,
    #[serde(flatten)]
    report: proto::MetricsResponse,
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
        .walks()
        .metrics(&namespace, (from_ms, to_ms), kind.as_ref())
        .await?;
    json_reply(MetricsView {
        namespace: &namespace,
        report: replies::metrics_response(report, from_ms, to_ms),
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
    let shared = d.overviews.get(&*d.engine, &namespace).await?;
    let body = shared.body(d.shows_admin(&access, &namespace)).to_owned();
    Ok((
        no_store(),
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReaperView {
    namespace: &'static str,
    name: &'static str,
    held: bool,
    /// The reaping replica's grant (Inspect's first holder).
    holder: Option<proto::HolderInfo>,
    namespaces: Vec<String>,
    now_ms: Int64,
}

/// `GET /api/v1/reaper`: which replica reaps now (Inspect of
/// `tumbler-system/reaper`, so only for callers who may read that
/// namespace: an admin token naming it), and the namespaces it visits
/// that the caller sees.
pub(super) async fn api_reaper(State(d): State<Dashboard>, Caller(access): Caller) -> ApiResult {
    access.read(REAPER_NAMESPACE)?;
    let lock = LockId::reaper();
    let state = replies::inspect_response(&lock, d.engine.locks().inspect(&lock).await?);
    let holder = state.holders.into_iter().next();
    json_reply(ReaperView {
        namespace: REAPER_NAMESPACE,
        name: REAPER_LOCK,
        held: holder.is_some(),
        holder,
        namespaces: visible_namespaces(&d, &access).await?,
        now_ms: Int64(state.now_ms),
    })
}

/// One step of a wait-for chain: `holder` waits for `lock`, held by
/// `heldBy`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WaitStepView {
    holder: String,
    lock: String,
    held_by: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WaitsView {
    namespace: String,
    /// Each chain from a waiting holder nobody waits on, on while the
    /// holder it waits on waits too (a cycle ends where it comes round),
    /// among this page's edges.
    chains: Vec<Vec<WaitStepView>>,
    /// Where the next page starts (`page_token=`); empty at the end.
    next_page_token: String,
}

/// `GET /api/v1/waits?namespace=&page_token=`: one page of the namespace's
/// current wait-for chains (decisions 0077, 0081), from its wait-for
/// registry: waits of holders that may hold other locks (a holder the
/// server made up records none). A page reads at most 50 fields and
/// 256 KiB of edges; concurrent requests for one page share one read, kept
/// a second.
pub(super) async fn api_waits(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Query(query): Query<WaitsQuery>,
) -> ApiResult {
    let namespace = readable(&query.namespace, &access)?;
    let page = validate::waits_page_token(&query.page_token)?;
    let engine = &d.engine;
    let found = (d.waits)
        .get((namespace.to_string(), page), || async {
            Ok(Arc::new(
                engine.walks().wait_chains(&namespace, page).await?,
            ))
        })
        .await?;
    let chains = (found.chains.iter())
        .map(|chain| {
            (chain.iter())
                .map(|step| WaitStepView {
                    holder: step.holder.clone(),
                    lock: step.lock.clone(),
                    held_by: step.held_by.clone(),
                })
                .collect()
        })
        .collect();
    json_reply(WaitsView {
        namespace: namespace.to_string(),
        chains,
        next_page_token: validate::next_waits_page_token(found.next),
    })
}
