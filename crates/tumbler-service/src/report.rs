//! What the lock service reports of each lock operation's outcome, one
//! lock or a set, whichever transport asked: the per-kind metrics
//! (outcomes, wait and hold times), span attributes and debug lines (with
//! the key names the engine gives). It sits in the service, where
//! engine outcomes and observation meet, so `observe` itself knows nothing
//! of the engine.

use std::time::Duration;

use crate::engine::{
    AcquireOutcome, AcquireRequest, EngineFace, ExtendOutcome, LockId, MultiOutcome, ReleaseOutcome,
};
use crate::observe::{kind_metrics, record_lock, recording, rpc_spans, span_attribute};

/// Before a waiting Acquire goes to the engine: the request joins the
/// lock's queue unless a permit is free for it at once.
pub fn acquire_waiting(engine: &dyn EngineFace, req: &AcquireRequest) {
    if req.wait.is_zero() || !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let keys = engine.locks().key_names(&req.lock);
    tracing::debug!(
        lock_key = %keys.queue,
        acq_id = %req.holder,
        queue_ttl = req.queue_ttl_ms,
        wait_ms = req.wait.as_millis() as u64,
        priority = req.priority,
        fair = req.fair,
        "lock request waiting (enqueued unless a permit is free)"
    );
}

/// A waiting Acquire (or a session's, or a Campaign) refused because it
/// would have closed a wait-for cycle (decision 0077): the outcome
/// `deadlock` of its kind.
pub fn refused_as_deadlock(req: &AcquireRequest) {
    if recording() {
        kind_metrics(&req.kind).outcome(4, "deadlock").increment(1);
    }
}

/// An Acquire answered by the engine after `elapsed`.
pub fn acquired(
    engine: &dyn EngineFace,
    req: &AcquireRequest,
    outcome: &AcquireOutcome,
    elapsed: Duration,
) {
    let (index, label, grant) = match outcome {
        AcquireOutcome::Acquired { grant, .. } => (0, "acquired", Some(grant)),
        AcquireOutcome::AlreadyHeld { grant, .. } => (1, "already_held", Some(grant)),
        AcquireOutcome::Busy { .. } => (2, "busy", None),
        AcquireOutcome::TimedOut { .. } => (3, "timeout", None),
    };
    counted(req, index, label, elapsed);
    if rpc_spans()
        && let Some(grant) = grant
    {
        span_attribute("tumbler.fencing_token", grant.fencing_token as i64);
    }

    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let lock_key = engine.locks().key_names(&req.lock).lock;
    // Milliseconds, to the microsecond.
    let acq_time = elapsed.as_micros() as f64 / 1000.0;
    match outcome {
        AcquireOutcome::Acquired { grant, holders }
        | AcquireOutcome::AlreadyHeld { grant, holders } => {
            tracing::debug!(
                %lock_key,
                acq_id = %grant.holder,
                token = grant.fencing_token,
                slot = grant.slot,
                ttl = grant.ttl_ms,
                holders,
                kind = %grant.kind,
                acq_time,
                "{}",
                if label == "acquired" { "lock obtained" } else { "lock already held by this holder" }
            );
        }
        AcquireOutcome::Busy { holders, .. } => tracing::debug!(
            %lock_key,
            acq_id = %req.holder,
            holders,
            "lock busy (tried once)"
        ),
        AcquireOutcome::TimedOut {
            holders, position, ..
        } => tracing::debug!(
            %lock_key,
            acq_id = %req.holder,
            queue_ttl = req.queue_ttl_ms,
            position,
            holders,
            acq_time,
            "lock request timed out"
        ),
    }
}

/// An Acquire's outcome (`index`, `label`) counted under its kind, its
/// wait timed, and both told to the span.
fn counted(req: &AcquireRequest, index: usize, label: &'static str, elapsed: Duration) {
    let kind = kind_metrics(&req.kind);
    if recording() {
        kind.outcome(index, label).increment(1);
        if !req.wait.is_zero() {
            kind.wait().record(elapsed.as_secs_f64());
        }
    }
    if rpc_spans() {
        span_attribute("tumbler.kind", req.kind.to_string());
        span_attribute("tumbler.status", label);
        span_attribute("tumbler.wait_ms", elapsed.as_millis() as i64);
    }
}

/// A set's Acquire (decision 0076) answered by the engine after
/// `elapsed`: counted under its kind as a single lock's is.
pub fn acquired_set(req: &AcquireRequest, outcome: &MultiOutcome, elapsed: Duration) {
    let (index, label) = match outcome {
        MultiOutcome::Acquired { already: false, .. } => (0, "acquired"),
        MultiOutcome::Acquired { already: true, .. } => (1, "already_held"),
        MultiOutcome::Busy { .. } => (2, "busy"),
        MultiOutcome::TimedOut { .. } => (3, "timeout"),
    };
    counted(req, index, label, elapsed);
}

/// A set's Release answered by the engine: its hold time under its kind,
/// as a single lock's.
pub fn released_set(outcome: &ReleaseOutcome) {
    let label = match outcome {
        ReleaseOutcome::Released { kind, held_ms } => {
            if recording() {
                kind_metrics(kind).hold().record(*held_ms as f64 / 1000.0);
            }
            "released"
        }
        ReleaseOutcome::NotHeld => "not_held",
    };
    span_attribute("tumbler.status", label);
}

/// A set's Extend answered by the engine.
pub fn extended_set(outcome: &ExtendOutcome) {
    span_attribute(
        "tumbler.status",
        match outcome {
            ExtendOutcome::Extended(_) => "extended",
            ExtendOutcome::NotHeld => "not_held",
        },
    );
}

/// A Release answered by the engine.
pub fn released(
    engine: &dyn EngineFace,
    lock: &LockId,
    holder: &str,
    token: Option<u64>,
    outcome: ReleaseOutcome,
) {
    let label = match &outcome {
        ReleaseOutcome::Released { kind, held_ms } => {
            let kind = kind_metrics(kind);
            if recording() {
                kind.hold().record(*held_ms as f64 / 1000.0);
            }
            "released"
        }
        ReleaseOutcome::NotHeld => "not_held",
    };
    record_lock(&lock.namespace, &lock.name, holder);
    span_attribute("tumbler.status", label);
    if tracing::enabled!(tracing::Level::DEBUG) {
        let lock_key = engine.locks().key_names(lock).lock;
        tracing::debug!(%lock_key, acq_id = %holder, token, "{}", match outcome {
            ReleaseOutcome::Released { .. } => "lock released",
            ReleaseOutcome::NotHeld => "release of a lock not held",
        });
    }
}

/// An Extend answered by the engine.
pub fn extended(engine: &dyn EngineFace, lock: &LockId, holder: &str, outcome: &ExtendOutcome) {
    let label = match outcome {
        ExtendOutcome::Extended(_) => "extended",
        ExtendOutcome::NotHeld => "not_held",
    };
    record_lock(&lock.namespace, &lock.name, holder);
    span_attribute("tumbler.status", label);
    if tracing::enabled!(tracing::Level::DEBUG) {
        let lock_key = engine.locks().key_names(lock).lock;
        match outcome {
            ExtendOutcome::Extended(grant) => tracing::debug!(
                %lock_key,
                acq_id = %holder,
                token = grant.fencing_token,
                slot = grant.slot,
                ttl = grant.ttl_ms,
                expires_at_ms = grant.expires_at_ms,
                "lock extended"
            ),
            ExtendOutcome::NotHeld => {
                tracing::debug!(%lock_key, acq_id = %holder, "extend of a lock not held")
            }
        }
    }
}
