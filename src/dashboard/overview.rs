//! The overview's numbers for one namespace: a walk of its locks (List,
//! up to [`OVERVIEW_MAX_LOCKS`]) and its last hour of counters (Metrics).
//! That walk is the dashboard's one costly read (a namespace of 10,000
//! locks is a SCAN of the keyspace and a function call per 100 locks), and
//! every open overview tab asks for it every few seconds; so its result is
//! kept per namespace for [`FRESH_FOR`] after it is made, concurrent
//! requests for the same namespace wait for one walk rather than start
//! their own (single flight), and at most [`PASSES`] walks run at once on
//! a replica, whatever the namespaces. Redis then does at most about one
//! walk per namespace per second for the overview, however many browsers
//! and scripts poll it.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::MINUTE_MS;
use super::api::Int64;
use super::errors::ApiError;
use super::flight::Flights;
use crate::proto;
use crate::service::replies::ToProto;
use crate::service::validate;
use tumbler_engine::wallclock::unix_ms;
use tumbler_engine::{Counters, EngineFace, Namespace};

/// Locks the overview counts at most (10 List calls of 1000); past that it
/// says its counts are partial rather than keep Redis busy.
pub(super) const OVERVIEW_MAX_LOCKS: usize = 10_000;
/// Locks with waiters the overview shows.
const OVERVIEW_TOP: usize = 10;
/// The overview's chart: the last hour, per minute.
pub(super) const CHART_MINUTES: i64 = 60;
/// Rates are averaged over the last few minutes.
const RATE_MINUTES: i64 = 5;
/// How long a namespace's overview is served from memory once made.
pub(super) const FRESH_FOR: Duration = Duration::from_secs(1);
/// Overview walks one replica runs at once, over all namespaces.
pub(super) const PASSES: usize = 2;

/// The overviews of one dashboard: a namespace's latest (or running)
/// walk, shared as [`flight`](super::flight) shares answers.
pub(super) struct Overviews {
    flights: Flights<String, Arc<Rendered>>,
}

/// A walk's JSON, serialized once for all the requests that share it: as
/// a caller without admin rights in the namespace sees it, and as one
/// with them.
pub(super) struct Rendered {
    plain: String,
    admin: String,
}

impl Rendered {
    fn of(mut overview: Overview) -> Self {
        overview.admin = false;
        let plain = to_json(&overview);
        overview.admin = true;
        Rendered {
            plain,
            admin: to_json(&overview),
        }
    }

    /// The body for a caller who may (or may not) use the admin actions.
    pub(super) fn body(&self, admin: bool) -> &str {
        if admin { &self.admin } else { &self.plain }
    }
}

impl Default for Overviews {
    fn default() -> Self {
        Overviews {
            flights: Flights::new(PASSES, FRESH_FOR),
        }
    }
}

impl Overviews {
    /// The overview of `namespace` (the caller checked it may see it):
    /// the last walk's if it is fresh, the running walk's if one runs,
    /// else a new walk's. Errors are kept as long as results, so a
    /// failing Redis is not asked more often either.
    pub(super) async fn get(
        &self,
        engine: &dyn EngineFace,
        namespace: &Namespace,
    ) -> Result<Arc<Rendered>, ApiError> {
        self.flights
            .get(namespace.to_string(), || async {
                walk(engine, namespace)
                    .await
                    .map(|overview| Arc::new(Rendered::of(overview)))
            })
            .await
    }
}

/// The overview's JSON (plain numbers and strings: it always serializes).
fn to_json(overview: &Overview) -> String {
    serde_json::to_string(overview).unwrap_or_default()
}

/// What `GET /api/v1/overview` answers for one namespace (in the proto3
/// JSON mapping, as every `/api/v1` answer: see `api.rs`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Overview {
    namespace: String,
    now_ms: Int64,
    locks: Int64,
    locks_held: Int64,
    holders: Int64,
    waiters: Int64,
    waiting_locks: Int64,
    truncated: bool,
    /// The locks with the most waiters.
    busiest: Vec<proto::LockSummary>,
    rates: Rates,
    /// Every kind together over the last hour (Metrics' `overall`).
    last_hour: proto::MetricsRow,
    denial_ratio: f64,
    series: Vec<Minute>,
    /// Whether the caller may use the admin actions here (see [`Rendered`]).
    admin: bool,
}

/// Per minute, over the last [`RATE_MINUTES`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Rates {
    minutes: u32,
    acquired_per_minute: f64,
    denied_per_minute: f64,
    errors_per_minute: f64,
}

/// One minute of the chart (denied counts timed-out waits too).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Minute {
    minute_ms: Int64,
    acquired: Int64,
    denied: Int64,
    errors: Int64,
}

/// One walk: what `GET /api/v1/overview` shows for `namespace`, but for
/// the caller's own `admin` flag (see [`Rendered`]).
async fn walk(engine: &dyn EngineFace, namespace: &Namespace) -> Result<Overview, ApiError> {
    let (mut locks, mut held, mut holders, mut waiters, mut waiting_locks) = (0u64, 0, 0, 0, 0);
    let mut busiest = Vec::new();
    let mut cursor = None;
    let mut now_ms = 0;
    let mut truncated = false;
    loop {
        let page = (engine.walks())
            .list(namespace, "", (validate::MAX_PAGE_SIZE, cursor), false)
            .await?;
        now_ms = now_ms.max(page.now_ms);
        for lock in page.locks {
            locks += 1;
            held += u64::from(lock.holders > 0);
            holders += u64::from(lock.holders);
            waiters += u64::from(lock.waiters);
            if lock.waiters > 0 {
                waiting_locks += 1;
                busiest.push(lock);
            }
        }
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
        if locks as usize >= OVERVIEW_MAX_LOCKS {
            truncated = true;
            break;
        }
    }
    busiest.sort_by(|a, b| b.waiters.cmp(&a.waiters).then(a.name.cmp(&b.name)));
    busiest.truncate(OVERVIEW_TOP);

    let to_ms = unix_ms();
    let this_minute = to_ms - to_ms.rem_euclid(MINUTE_MS);
    let first = this_minute - (CHART_MINUTES - 1) * MINUTE_MS;
    let report = engine
        .walks()
        .metrics(namespace, (first, to_ms), None)
        .await?;
    // Every kind together, per minute, zero-filled.
    let mut series = vec![Counters::default(); CHART_MINUTES as usize];
    for row in &report.minutes {
        let index = (row.minute_ms - first) / MINUTE_MS;
        if let Some(sum) = usize::try_from(index).ok().and_then(|i| series.get_mut(i)) {
            sum.add(&row.counters);
        }
    }
    // Rates: per minute over the last RATE_MINUTES minutes, this one
    // (still filling) included, so activity shows at once.
    let recent = &series[(CHART_MINUTES - RATE_MINUTES) as usize..];
    let rate =
        |f: fn(&Counters) -> u64| recent.iter().map(f).sum::<u64>() as f64 / RATE_MINUTES as f64;
    let tried = report.overall.counters.acquired
        + report.overall.counters.denied
        + report.overall.counters.timed_out;
    let denied = report.overall.counters.denied + report.overall.counters.timed_out;
    Ok(Overview {
        namespace: namespace.to_string(),
        now_ms: Int64(now_ms),
        locks: locks.into(),
        locks_held: held.into(),
        holders: holders.into(),
        waiters: waiters.into(),
        waiting_locks: waiting_locks.into(),
        truncated,
        busiest: busiest.into_iter().map(ToProto::to_proto).collect(),
        rates: Rates {
            minutes: RATE_MINUTES as u32,
            acquired_per_minute: rate(|c| c.acquired),
            denied_per_minute: rate(|c| c.denied + c.timed_out),
            errors_per_minute: rate(|c| c.errors),
        },
        last_hour: report.overall.to_proto(),
        denial_ratio: if tried == 0 {
            0.0
        } else {
            denied as f64 / tried as f64
        },
        series: series
            .iter()
            .enumerate()
            .map(|(i, c)| Minute {
                minute_ms: Int64(first + i as i64 * MINUTE_MS),
                acquired: c.acquired.into(),
                denied: (c.denied + c.timed_out).into(),
                errors: c.errors.into(),
            })
            .collect(),
        admin: false,
    })
}
