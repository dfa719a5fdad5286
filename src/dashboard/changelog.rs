//! The Changelog endpoint: a namespace's lock events, newest first, in
//! pages (kept only for namespaces named by `--changelog-namespaces`; see
//! `engine/changelog.rs`), filtered by name prefix, holder and event. Its
//! page is a live page (`pages.rs`).
//!
//! A read is bounded by the engine (entries per shard, entries per page);
//! here, the same read asked by several requests at once is made once and
//! kept for [`FRESH_FOR`] (single flight, as the overview's walk), at most
//! [`PASSES`] reads run at once on a replica, and each caller (its token,
//! or with auth off its address) may read `--changelog-reads-per-second`.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use serde::Serialize;

use super::Dashboard;
use super::api::Int64;
use super::errors::{ApiError, ApiResult, json_reply};
use super::flight::Flights;
use super::login::Caller;
use super::params::{ChangelogQuery, Query, readable};
use crate::auth::CallerRate;
use crate::limits::ConnState;
use crate::proto;
use crate::service::replies::ToProto;
use crate::service::validate;
use tumbler_engine::changelog::{ChangelogEvent, ChangelogPage, ChangelogQuery as EngineQuery};

/// Events one read returns unless it asks for fewer.
const DEFAULT_LIMIT: usize = 100;
/// Events one read returns at most.
const MAX_LIMIT: usize = 1000;
/// How long a read's answer serves the same read again.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// Changelog reads one replica makes at once, whatever they ask (each
/// with two function calls in flight at most: `engine/changelog.rs`).
const PASSES: usize = 2;

/// The lock events a changelog may hold (the `event` filter's choices).
pub const EVENTS: &[&str] = &[
    "acquired",
    "released",
    "extended",
    "expired",
    "lost",
    "reaped",
    "cleared",
    "queued",
    "dequeued",
    "skipped",
    "downgraded",
];

/// The changelog reads of one dashboard: shared answers and the callers'
/// rates.
pub(super) struct Changelogs {
    flights: Flights<(String, EngineQuery), Arc<ChangelogPage>>,
    rate: CallerRate,
}

impl Changelogs {
    pub(super) fn new(reads_per_second: NonZeroU32) -> Self {
        Changelogs {
            flights: Flights::new(PASSES, FRESH_FOR),
            rate: CallerRate::per_second(reads_per_second),
        }
    }
}

/// The client's address, when the HTTP port knows it (it puts each
/// request's connection into its extensions): the rate of a caller
/// without a token is its address's.
pub(super) struct Peer(Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<Arc<ConnState>>()
                .map(|conn| conn.peer().ip()),
        ))
    }
}

/// A page of a changelog, in the proto3 JSON mapping as every `/api/v1`
/// answer (see `api.rs`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChangelogView<'a> {
    namespace: String,
    enabled: bool,
    size: u32,
    retention_ms: Int64,
    prefix: String,
    holder: String,
    event: &'a str,
    events: Vec<EventView>,
    /// Entries this page read from Redis, matching or not.
    scanned: u32,
    /// Where the next page starts (`page_token=`); empty at the end.
    next_page_token: String,
}

/// One entry: the lock event as Watch sends it (`proto::LockEvent`), and
/// whether its metadata was cut.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EventView {
    #[serde(flatten)]
    event: proto::LockEvent,
    metadata_truncated: bool,
    /// The whole metadata's size (its JSON, bytes), when it was cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata_bytes: Option<Int64>,
}

impl From<&ChangelogEvent> for EventView {
    fn from(entry: &ChangelogEvent) -> Self {
        EventView {
            event: entry.event.clone().to_proto(),
            metadata_truncated: entry.metadata_truncated,
            metadata_bytes: entry.metadata_bytes.map(Int64::from),
        }
    }
}

/// `GET /api/v1/changelog?namespace=&prefix=&holder=&event=&limit=&page_token=`:
/// a page of the namespace's lock events that match, newest first.
pub(super) async fn api_changelog(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    Peer(peer): Peer,
    Query(query): Query<ChangelogQuery>,
) -> ApiResult {
    let namespace = readable(&query.namespace, &access)?;
    let prefix = validate::prefix(&query.prefix)?;
    let holder = match query.holder.as_str() {
        "" => String::new(),
        holder => validate::holder(holder)?.into_string(),
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
    let from = validate::changelog_page_token(&query.page_token)?;
    d.changelogs.rate.charge(&access, peer, "changelog reads")?;
    let read = EngineQuery {
        prefix: prefix.clone(),
        holder: holder.clone(),
        event: event.to_owned(),
        limit,
        from,
    };
    let engine = &d.engine;
    let page = d
        .changelogs
        .flights
        .get((namespace.to_string(), read.clone()), || async {
            Ok(Arc::new(engine.walks().changelog(&namespace, &read).await?))
        })
        .await?;
    json_reply(ChangelogView {
        namespace: namespace.into(),
        enabled: page.enabled,
        size: page.size,
        retention_ms: page.retention_ms.into(),
        prefix,
        holder,
        event,
        events: page.events.iter().map(EventView::from).collect(),
        scanned: u32::try_from(page.scanned).unwrap_or(u32::MAX),
        next_page_token: validate::next_changelog_page_token(page.next.as_ref()),
    })
}
