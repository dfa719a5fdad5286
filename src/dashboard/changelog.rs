//! The Changelog page and its endpoint: a namespace's latest lock events
//! (kept only for namespaces named by `--changelog-namespaces`; see
//! `engine/changelog.rs`), filtered by name prefix, holder and event.

use axum::extract::{RawQuery, State};
use axum::http::Uri;
use axum::response::Response;
use serde_json::{Value, json};

use super::login::Caller;
use super::{ApiError, ApiResult, Dashboard, Params, json_reply, shell};
use crate::api::validate;
use crate::engine::changelog::ChangelogQuery;
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

fn event_json(e: &LockEvent) -> Value {
    json!({
        "at_ms": e.at_ms,
        "name": e.name,
        "event": e.event,
        "holder": e.holder,
        "fencing_token": e.fencing_token.to_string(),
        "slot": e.slot,
        "kind": e.kind,
        "metadata": e.metadata,
        "ttl_ms": e.ttl_ms,
        "expires_at_ms": e.expires_at_ms,
        "acquired_at_ms": e.acquired_at_ms,
        "hold_ms": e.hold_ms,
        "actor": e.actor,
    })
}

/// `GET /api/v1/changelog?namespace=&prefix=&holder=&event=&limit=`: the
/// namespace's latest lock events that match, newest first.
pub(super) async fn api_changelog(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let params = Params::query(&query);
    let namespace = params.namespace(&access)?;
    let prefix = validate::prefix(params.get("prefix"))?;
    let holder = match params.get("holder") {
        "" => String::new(),
        holder => validate::holder(holder)?,
    };
    let event = params.get("event");
    if !event.is_empty() && !EVENTS.contains(&event) {
        return Err(ApiError::bad_request(format!(
            "event: must be one of {}",
            EVENTS.join(", ")
        )));
    }
    let limit = params.number::<usize>("limit")?.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: must be 1..={MAX_LIMIT}"
        )));
    }
    let query = ChangelogQuery {
        prefix: prefix.clone(),
        holder: holder.clone(),
        event: event.to_owned(),
        limit,
    };
    let page = d.engine.changelog(&namespace, &query).await?;
    json_reply(json!({
        "namespace": namespace,
        "enabled": page.enabled,
        "size": page.size,
        "retention_ms": page.retention_ms,
        "prefix": prefix,
        "holder": holder,
        "event": event,
        "events": page.events.iter().map(event_json).collect::<Vec<_>>(),
        "scanned": page.scanned,
    }))
}

pub(super) async fn changelog_page(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    uri: Uri,
) -> Response {
    shell(&d, &access, &uri, "changelog", "Changelog").await
}
