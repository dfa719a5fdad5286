//! The Changelog endpoint: a namespace's latest lock events (kept only
//! for namespaces named by `--changelog-namespaces`; see
//! `engine/changelog.rs`), filtered by name prefix, holder and event. Its
//! page is a live page (`pages.rs`).

use axum::extract::State;
use serde::Serialize;

use super::Dashboard;
use super::errors::{ApiError, ApiResult, json_reply};
use super::login::Caller;
use super::params::{ChangelogQuery, Query, readable};
use crate::api::validate;
use crate::engine::changelog::ChangelogQuery as EngineQuery;
use crate::engine::watchers::LockEvent;

/// Events one read returns unless it asks for fewer.
const DEFAULT_LIMIT: usize = 100;
/// Events one read returns at most.
const MAX_LIMIT: usize = 1000;

/// The lock events a changelog may hold (the `event` filter's choices).
pub const EVENTS: &[&str] = &[
    "acquired", "released", "extended", "expired", "lost", "reaped", "cleared", "queued",
    "dequeued", "skipped",
];

#[derive(Serialize)]
struct ChangelogView<'a> {
    namespace: String,
    enabled: bool,
    size: u32,
    retention_ms: u64,
    prefix: String,
    holder: String,
    event: &'a str,
    /// The engine's events as they are (their own `Serialize`).
    events: &'a [LockEvent],
    scanned: usize,
}

/// `GET /api/v1/changelog?namespace=&prefix=&holder=&event=&limit=`: the
/// namespace's latest lock events that match, newest first.
pub(super) async fn api_changelog(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Query(query): Query<ChangelogQuery>,
) -> ApiResult {
    let namespace = readable(&query.namespace, &access)?;
    let prefix = validate::prefix(&query.prefix)?;
    let holder = match query.holder.as_str() {
        "" => String::new(),
        holder => validate::holder(holder)?,
    };
    let event = query.event.as_str();
    if !event.is_empty() && !EVENTS.contains(&event) {
        return Err(ApiError::bad_request(format!(
            "event: must be one of {}",
            EVENTS.join(", ")
        )));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: must be 1..={MAX_LIMIT}"
        )));
    }
    let read = EngineQuery {
        prefix: prefix.clone(),
        holder: holder.clone(),
        event: event.to_owned(),
        limit,
    };
    let page = d.engine.changelog(&namespace, &read).await?;
    json_reply(ChangelogView {
        namespace,
        enabled: page.enabled,
        size: page.size,
        retention_ms: page.retention_ms,
        prefix,
        holder,
        event,
        events: &page.events,
        scanned: page.scanned,
    })
}
