//! Engine values into their proto messages, for every transport that
//! answers with them (gRPC, Connect, the dashboard's `/api/v1`): one
//! [`ToProto`] per outcome, grant, metrics row and lock event, and one
//! builder per reply that needs more than the outcome (Inspect, Queue,
//! List, Metrics, Extend, Campaign and the election's). The engine and the
//! proto messages are other crates', so the orphan rule allows no `From`
//! between them here: this crate's own trait and functions map them, once
//! each.

use crate::engine::{self, AcquireOutcome, LockId};
use crate::proto::{self, AcquireStatus, NotAcquiredReason};

/// An engine value as its proto message.
pub trait ToProto {
    type Proto;
    fn to_proto(self) -> Self::Proto;
}

impl ToProto for engine::MetricsRow {
    type Proto = proto::MetricsRow;
    fn to_proto(self) -> proto::MetricsRow {
        let row = self;
        let c = row.counters;
        proto::MetricsRow {
            minute_ms: row.minute_ms,
            kind: row.kind,
            acquired: c.acquired,
            denied: c.denied,
            timed_out: c.timed_out,
            released: c.released,
            extended: c.extended,
            expired: c.expired,
            reaped: c.reaped,
            errors: c.errors,
            cleared: c.cleared,
            downgraded: c.downgraded,
        }
    }
}

impl ToProto for &engine::ReleaseOutcome {
    type Proto = proto::ReleaseResponse;
    fn to_proto(self) -> proto::ReleaseResponse {
        let outcome = self;
        let status = match outcome {
            engine::ReleaseOutcome::Released { .. } => proto::ReleaseStatus::Released,
            engine::ReleaseOutcome::NotHeld => proto::ReleaseStatus::NotHeld,
        };
        proto::ReleaseResponse {
            status: status.into(),
        }
    }
}

impl ToProto for engine::ExtendOutcome {
    type Proto = proto::ExtendResponse;
    fn to_proto(self) -> proto::ExtendResponse {
        match self {
            engine::ExtendOutcome::Extended(grant) => proto::ExtendResponse {
                status: proto::ExtendStatus::Extended.into(),
                grant: Some(grant.to_proto()),
            },
            engine::ExtendOutcome::NotHeld => proto::ExtendResponse {
                status: proto::ExtendStatus::NotHeld.into(),
                grant: None,
            },
        }
    }
}

impl ToProto for AcquireOutcome {
    type Proto = proto::AcquireResponse;
    fn to_proto(self) -> proto::AcquireResponse {
        let outcome = self;
        match outcome {
            AcquireOutcome::Acquired { grant, holders } => proto::AcquireResponse {
                status: AcquireStatus::Acquired.into(),
                grant: Some(grant.to_proto()),
                holders,
                ..Default::default()
            },
            AcquireOutcome::AlreadyHeld { grant, holders } => proto::AcquireResponse {
                status: AcquireStatus::AlreadyHeld.into(),
                grant: Some(grant.to_proto()),
                holders,
                ..Default::default()
            },
            AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms,
            } => proto::AcquireResponse {
                status: AcquireStatus::NotAcquired.into(),
                reason: NotAcquiredReason::Busy.into(),
                holders,
                next_expiry_at_ms,
                ..Default::default()
            },
            AcquireOutcome::TimedOut {
                holders,
                next_expiry_at_ms,
                position,
            } => proto::AcquireResponse {
                status: AcquireStatus::NotAcquired.into(),
                reason: NotAcquiredReason::Timeout.into(),
                holders,
                next_expiry_at_ms,
                queue_position: position,
                ..Default::default()
            },
        }
    }
}

/// A multi-lock's answer (decision 0076): every grant named, in the
/// request's order, `grant` the first; not granted, the first busy lock's
/// holders and the earliest lease end of a busy lock.
impl ToProto for engine::MultiOutcome {
    type Proto = proto::AcquireResponse;
    fn to_proto(self) -> proto::AcquireResponse {
        match self {
            engine::MultiOutcome::Acquired {
                grants,
                holders,
                already,
            } => {
                let grants: Vec<proto::Grant> = (grants.into_iter())
                    .map(|(name, grant)| proto::Grant {
                        name: name.into_string(),
                        ..grant.to_proto()
                    })
                    .collect();
                let status = if already {
                    AcquireStatus::AlreadyHeld
                } else {
                    AcquireStatus::Acquired
                };
                proto::AcquireResponse {
                    status: status.into(),
                    grant: grants.first().cloned(),
                    grants,
                    holders,
                    ..Default::default()
                }
            }
            engine::MultiOutcome::Busy {
                holders,
                next_expiry_at_ms,
                ..
            } => AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms,
            }
            .to_proto(),
            engine::MultiOutcome::TimedOut {
                holders,
                next_expiry_at_ms,
                ..
            } => AcquireOutcome::TimedOut {
                holders,
                next_expiry_at_ms,
                position: 0,
            }
            .to_proto(),
        }
    }
}

/// [`ToProto`] of an engine type whose proto message has the same fields
/// (`collected` ones change collection type, a `BTreeMap` against prost's
/// `HashMap`). A field added to one side only fails to compile here.
macro_rules! same_fields {
    ($engine:ty, $proto:ty; same: [$($f:ident),*]; collected: [$($c:ident),*]) => {
        same_fields!($engine, $proto; same: [$($f),*]; collected: [$($c),*]; modes: []);
    };
    ($engine:ty, $proto:ty; same: [$($f:ident),*]; collected: [$($c:ident),*];
        modes: [$($m:ident),*]) => {
        same_fields!($engine, $proto; same: [$($f),*]; collected: [$($c),*]; modes: [$($m),*];
            unset: []);
    };
    ($engine:ty, $proto:ty; same: [$($f:ident),*]; collected: [$($c:ident),*];
        modes: [$($m:ident),*]; unset: [$($u:ident),*]) => {
        impl ToProto for $engine {
            type Proto = $proto;
            fn to_proto(self) -> $proto {
                type P = $proto;
                let x = self;
                P { $($f: x.$f,)* $($c: x.$c.into_iter().collect(),)* $($m: mode(x.$m).into(),)*
                    $($u: Default::default(),)* }
            }
        }
    };
}

/// A lock mode as its proto enum (plain: unspecified).
pub fn mode(mode: engine::LockMode) -> proto::LockMode {
    match mode {
        engine::LockMode::Plain => proto::LockMode::Unspecified,
        engine::LockMode::Read => proto::LockMode::Read,
        engine::LockMode::Write => proto::LockMode::Write,
    }
}

same_fields!(engine::Grant, proto::Grant;
    same: [holder, fencing_token, slot, acquired_at_ms, expires_at_ms, ttl_ms, kind, permits];
    collected: [metadata, slots]; modes: [mode];
    // A single lock's grant names no lock (a multi-lock's grants do:
    // `multi_acquire_response`).
    unset: [name]);
same_fields!(engine::LockSummary, proto::LockSummary;
    same: [name, holders, limit, waiters, next_expiry_at_ms, permits_in_use];
    collected: []; modes: [mode]);
same_fields!(engine::QueuedRequest, proto::QueuedRequest;
    same: [holder, position, priority, enqueued_at_ms, expires_at_ms, wait_deadline_ms, fair,
        kind, permits];
    collected: []; modes: [mode]);
same_fields!(engine::watchers::LockEvent, proto::LockEvent;
    same: [namespace, name, event, holder, fencing_token, at_ms, slot, kind, ttl_ms,
        expires_at_ms, acquired_at_ms, hold_ms, actor];
    collected: [metadata]; modes: [mode]);

/// The answers of the read RPCs, built once from the engine's values for
/// every transport that shows them (gRPC, Connect and the dashboard's
/// `/api/v1`, which serializes these same messages).
pub fn inspect_response(lock: &LockId, state: engine::LockState) -> proto::InspectResponse {
    let now_ms = state.now_ms;
    proto::InspectResponse {
        namespace: lock.namespace.to_string(),
        name: lock.name.to_string(),
        limit: state.limit,
        waiters: state.waiters,
        now_ms,
        mode: mode(state.mode).into(),
        permits_in_use: state.permits_in_use,
        holders: state
            .holders
            .into_iter()
            .map(|grant| proto::HolderInfo {
                remaining_ms: grant.expires_at_ms - now_ms,
                grant: Some(grant.to_proto()),
            })
            .collect(),
    }
}

pub fn queue_response(lock: &LockId, state: engine::QueueState) -> proto::QueueResponse {
    proto::QueueResponse {
        namespace: lock.namespace.to_string(),
        name: lock.name.to_string(),
        waiters: state.waiters,
        now_ms: state.now_ms,
        requests: state.requests.into_iter().map(ToProto::to_proto).collect(),
    }
}

pub fn list_response(page: engine::ListPage) -> proto::ListResponse {
    proto::ListResponse {
        locks: page.locks.into_iter().map(ToProto::to_proto).collect(),
        next_page_token: crate::validate::next_page_token(page.next.as_ref()),
        now_ms: page.now_ms,
    }
}

pub fn metrics_response(
    report: engine::MetricsReport,
    from_ms: i64,
    to_ms: i64,
) -> proto::MetricsResponse {
    proto::MetricsResponse {
        minutes: report.minutes.into_iter().map(ToProto::to_proto).collect(),
        totals: report.totals.into_iter().map(ToProto::to_proto).collect(),
        overall: Some(report.overall.to_proto()),
        from_ms,
        to_ms,
    }
}

/// An election's leadership, named by its lock.
pub fn leadership(lock: &LockId, l: engine::Leadership) -> proto::Leadership {
    proto::Leadership {
        namespace: lock.namespace.to_string(),
        name: lock.name.to_string(),
        candidate: l.candidate,
        term: l.term,
        value: l.value,
        elected_at_ms: l.elected_at_ms,
        expires_at_ms: l.expires_at_ms,
        ttl_ms: l.ttl_ms,
    }
}

/// A Campaign's answer: elected, with the leadership and the secret that
/// proves it (decision 0082), or its place in the queue.
pub fn campaign_response(
    lock: &LockId,
    outcome: engine::CampaignOutcome,
    secret: String,
) -> proto::CampaignResponse {
    match outcome {
        engine::CampaignOutcome::Elected(l) => proto::CampaignResponse {
            elected: true,
            leader: Some(leadership(lock, l)),
            queue_position: 0,
            secret,
        },
        engine::CampaignOutcome::NotElected { position } => proto::CampaignResponse {
            elected: false,
            leader: None,
            queue_position: position,
            secret: String::new(),
        },
    }
}

pub fn proclaim_response(
    lock: &LockId,
    outcome: engine::ProclaimOutcome,
) -> proto::ProclaimResponse {
    match outcome {
        engine::ProclaimOutcome::Proclaimed(l) => proto::ProclaimResponse {
            status: proto::ProclaimStatus::Proclaimed.into(),
            leader: Some(leadership(lock, l)),
        },
        engine::ProclaimOutcome::NotLeader => proto::ProclaimResponse {
            status: proto::ProclaimStatus::NotLeader.into(),
            leader: None,
        },
    }
}

pub fn resign_response(resigned: bool) -> proto::ResignResponse {
    proto::ResignResponse {
        status: if resigned {
            proto::ResignStatus::Resigned
        } else {
            proto::ResignStatus::NotLeader
        }
        .into(),
    }
}

/// An Observe stream's message: a change of the election's leader.
pub fn leader_change(lock: &LockId, c: engine::LeaderChange) -> proto::LeaderChange {
    proto::LeaderChange {
        leader: c.leader.map(|l| leadership(lock, l)),
        event: c.event.to_owned(),
        at_ms: c.at_ms,
        ended_term: c.ended_term,
    }
}

/// A Reap's answer: its counts.
pub fn reap_response(counts: &engine::ReapCounts) -> proto::ReapResponse {
    proto::ReapResponse {
        expired_holders: counts.expired_holders,
        dead_waiters: counts.dead_waiters,
        stale_index_entries: counts.stale_index_entries,
        old_grants: counts.old_grants,
        old_waiters: counts.old_waiters,
        locks_visited: counts.locks_visited,
    }
}
