//! The Changelog endpoint: a namespace's latest lock events (kept only
//! for namespaces named by `--changelog-namespaces`; see
//! `engine/changelog.rs`), filtered by name prefix, holder and event. Its
//! page is a live page (`pages.rs`).

use std::collections::BTreeMap;

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

/// One event; its fencing token as a string (see `api.rs`).
#[derive(Serialize)]
struct EventView<'a> {
    at_ms: i64,
    name: &'a str,
    event: &'a str,
    holder: &'a str,
    fencing_token: String,
    slot: u32,
    kind: &'a str,
    metadata: &'a BTreeMap<String, String>,
    ttl_ms: u64,
    expires_at_ms: i64,
    acquired_at_ms: i64,
    hold_ms: u64,
    actor: &'a str,
}

impl<'a> From<&'a LockEvent> for EventView<'a> {
    fn from(e: &'a LockEvent) -> Self {
        EventView {
            at_ms: e.at_ms,
            name: &e.name,
            event: &e.event,
            holder: &e.holder,
            fencing_token: e.fencing_token.to_string(),
            slot: e.slot,
            kind: &e.kind,
            metadata: &e.metadata,
            ttl_ms: e.ttl_ms,
            expires_at_ms: e.expires_at_ms,
            acquired_at_ms: e.acquired_at_ms,
            hold_ms: e.hold_ms,
            actor: &e.actor,
        }
    }
}

#[derive(Serialize)]
struct ChangelogView<'a> {
    namespace: String,
    enabled: bool,
    size: u32,
    retention_ms: u64,
    prefix: String,
    holder: String,
    event: &'a str,
    events: Vec<EventView<'a>>,
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
        events: page.events.iter().map(EventView::from).collect(),
        scanned: page.scanned,
    })
}
