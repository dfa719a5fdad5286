//! One parse per request message: a proto request read once, within the
//! deployment's [`Limits`] and the caller's [`Access`], into the engine's
//! typed request. The caller's namespace is checked as soon as it is read,
//! before the fields after it, so every transport refuses in one order.
//! Each broken rule is INVALID_ARGUMENT naming its field (the rules
//! themselves are [`validate`]'s).

use std::time::Duration;

use tonic::Status;

use super::errors::invalid;
use super::validate::{self, Limits};
use crate::auth::Access;
use crate::engine::{self, LockId, election};
use crate::observe::CallerDeadline;
use crate::proto;

/// How long to wait: the request's wait_ms, cut short so that the reply
/// (NOT_ACQUIRED, TIMEOUT) still reaches the caller before its deadline.
pub fn effective_wait(wait_ms: u64, deadline: Option<Duration>) -> Duration {
    let asked = Duration::from_millis(wait_ms);
    match deadline {
        Some(left) => {
            let margin = (left / 20).max(Duration::from_millis(20));
            asked.min(left.saturating_sub(margin))
        }
        None => asked,
    }
}

/// A wait of `wait_ms` for a caller with `deadline`: zero stays a
/// try-once; a deadline too close to wait at all still waits 1 ms rather
/// than turning into a try-once.
fn wait(wait_ms: u64, deadline: Option<CallerDeadline>) -> Duration {
    if wait_ms == 0 {
        Duration::ZERO
    } else {
        effective_wait(wait_ms, deadline.map(|d| d.left())).max(Duration::from_millis(1))
    }
}

/// A time-ordered holder id for callers that bring none.
pub fn new_holder_id() -> engine::Holder {
    engine::Holder::stored(uuid::Uuid::now_v7().to_string())
}

/// An acquire request for a holder and lease already decided (by the
/// request itself, or by its session). A multi-lock's names are taken out
/// before (the Acquire RPC, a session's acquire: decisions 0076, 0078).
pub fn acquire(
    mut req: proto::AcquireRequest,
    holder: engine::Holder,
    ttl: engine::Ttl,
    deadline: Option<CallerDeadline>,
    limits: &Limits,
) -> Result<engine::AcquireRequest, Status> {
    if !req.names.is_empty() {
        // A request that still has them here is one this path cannot take.
        return Err(invalid(engine::Invalid::new(
            "names",
            "a multi-lock is taken with Acquire or a session's acquire, not here",
        )));
    }
    let wait_ms = validate::wait_ms(req.wait_ms, limits).map_err(invalid)?;
    let (mode, prefer_readers) = validate::mode(req.mode, req.prefer_readers).map_err(invalid)?;
    let limit = validate::limit_for(req.limit, mode, limits).map_err(invalid)?;
    let permits = validate::permits(req.permits, limit, mode).map_err(invalid)?;
    let takes_over =
        validate::takes_over(std::mem::take(&mut req.takes_over), &holder, mode, permits)?;
    Ok(engine::AcquireRequest {
        lock: LockId::parse(
            std::mem::take(&mut req.namespace),
            std::mem::take(&mut req.name),
        )
        .map_err(invalid)?,
        wait: wait(wait_ms, deadline),
        answer_by: deadline.map(|d| d.answered_at.into()),
        queue_ttl_ms: validate::queue_ttl_ms(req.queue_ttl_ms, limits).map_err(invalid)?,
        priority: validate::priority(req.priority).map_err(invalid)?,
        // Read/write requests are fair; prefer_readers makes a reader
        // barge (the engine sends the mode, not `fair`, for them).
        fair: if mode.is_rw() {
            !prefer_readers
        } else {
            req.fair.unwrap_or(true)
        },
        mode,
        prefer_readers,
        limit,
        permits,
        kind: validate::kind(std::mem::take(&mut req.kind)).map_err(invalid)?,
        metadata: validate::metadata(&req.metadata).map_err(invalid)?,
        ttl,
        holder,
        session_epoch: None,
        stop: None,
        holds_nothing: false,
        takes_over,
    })
}

/// A campaign for a candidate and lease already decided (by the request
/// itself, or by its session), as the acquire it is.
pub fn campaign(
    req: proto::CampaignRequest,
    candidate: engine::Holder,
    ttl: engine::Ttl,
    deadline: Option<CallerDeadline>,
    proof: String,
    limits: &Limits,
) -> Result<engine::AcquireRequest, Status> {
    let lock = LockId::parse(req.namespace, req.name).map_err(invalid)?;
    let value = value(req.value)?;
    let wait_ms = match req.wait_ms {
        None => limits.max_wait_ms,
        Some(ms) => validate::wait_ms(ms, limits).map_err(invalid)?,
    };
    let queue_ttl_ms = validate::queue_ttl_ms(req.queue_ttl_ms, limits).map_err(invalid)?;
    let kind = validate::kind(req.kind).map_err(invalid)?;
    Ok(election::campaign(election::Campaign {
        lock,
        candidate,
        value,
        ttl,
        wait: wait(wait_ms, deadline),
        answer_by: deadline.map(|d| d.answered_at.into()),
        queue_ttl_ms,
        kind,
        proof,
    }))
}

/// A leader's value: at most as long as a metadata value.
pub fn value(value: String) -> Result<String, Status> {
    if value.len() > validate::MAX_METADATA_VALUE_BYTES {
        return Err(invalid(engine::Invalid::new(
            "value",
            format!(
                "must be at most {} bytes",
                validate::MAX_METADATA_VALUE_BYTES
            ),
        )));
    }
    Ok(value)
}

/// A candidate id: the holder rules, named as the request names it.
pub fn candidate(value: String) -> Result<engine::Holder, Status> {
    engine::Holder::parse(value).map_err(|e| invalid(engine::Invalid::new("candidate", e.rule)))
}

/// A secret: required for Proclaim and Resign (decision 0082). Missing is
/// PERMISSION_DENIED, as a wrong one is: the caller has not shown it leads.
pub fn secret(value: &str, rpc: &str) -> Result<String, Status> {
    if value.is_empty() {
        return Err(Status::permission_denied(format!(
            "secret: missing: {rpc} needs the secret the winning Campaign returned (CampaignResponse.secret; for a session's leadership, the session's resume secret)"
        )));
    }
    Ok(election::proof_of(value))
}

/// A term: required (0 is no term).
pub fn term(value: u64) -> Result<u64, Status> {
    if value == 0 {
        return Err(invalid(engine::Invalid::new(
            "term",
            "must be set: the term Campaign returned",
        )));
    }
    Ok(value)
}

/// What a Release names: one lock (pinned to its fencing token, or not),
/// or a held set, each lock pinned when `fencing_tokens` pins them.
pub enum Release {
    One {
        lock: LockId,
        holder: engine::Holder,
        token: Option<u64>,
    },
    Set {
        locks: Vec<engine::SetLock>,
        holder: engine::Holder,
    },
}

/// A Release, read.
pub fn release(mut req: proto::ReleaseRequest, access: &Access) -> Result<Release, Status> {
    if !req.names.is_empty() {
        let (locks, holder) = set(
            access,
            std::mem::take(&mut req.namespace),
            &req.name,
            std::mem::take(&mut req.names),
            req.holder,
            req.fencing_token,
            std::mem::take(&mut req.fencing_tokens),
        )?;
        return Ok(Release::Set { locks, holder });
    }
    let (lock, holder) = one(
        access,
        req.namespace,
        req.name,
        req.holder,
        &req.fencing_tokens,
    )?;
    let token = validate::fencing_token(req.fencing_token).map_err(invalid)?;
    Ok(Release::One {
        lock,
        holder,
        token,
    })
}

/// What an Extend names: as a [`Release`], with the new lease (none: each
/// grant's own).
pub enum Extend {
    One {
        lock: LockId,
        holder: engine::Holder,
        ttl: Option<engine::Ttl>,
        token: Option<u64>,
    },
    Set {
        locks: Vec<engine::SetLock>,
        holder: engine::Holder,
        ttl: Option<engine::Ttl>,
    },
}

/// An Extend, read.
pub fn extend(
    mut req: proto::ExtendRequest,
    access: &Access,
    limits: &Limits,
) -> Result<Extend, Status> {
    if !req.names.is_empty() {
        let ttl = validate::optional_ttl_ms(req.ttl_ms, limits).map_err(invalid)?;
        let (locks, holder) = set(
            access,
            std::mem::take(&mut req.namespace),
            &req.name,
            std::mem::take(&mut req.names),
            req.holder,
            req.fencing_token,
            std::mem::take(&mut req.fencing_tokens),
        )?;
        return Ok(Extend::Set { locks, holder, ttl });
    }
    let (lock, holder) = one(
        access,
        req.namespace,
        req.name,
        req.holder,
        &req.fencing_tokens,
    )?;
    let ttl = validate::optional_ttl_ms(req.ttl_ms, limits).map_err(invalid)?;
    let token = validate::fencing_token(req.fencing_token).map_err(invalid)?;
    Ok(Extend::One {
        lock,
        holder,
        ttl,
        token,
    })
}

/// The lock and holder of a single lock's Release or Extend, checked in
/// this order: no set's tokens, the name, the caller's access to the
/// namespace, the holder (not a session's).
fn one(
    access: &Access,
    namespace: String,
    name: String,
    holder: String,
    fencing_tokens: &[u64],
) -> Result<(LockId, engine::Holder), Status> {
    validate::no_set_tokens(fencing_tokens).map_err(invalid)?;
    let lock = LockId::parse(namespace, name).map_err(invalid)?;
    access.act(&lock.namespace)?;
    let holder = validate::holder(holder).map_err(invalid)?;
    validate::not_a_session("holder", holder.as_str())?;
    Ok((lock, holder))
}

/// The locks and holder of a multi-lock's Release or Extend: the names
/// checked as an Acquire's, each paired with its fencing token when
/// `fencing_tokens` pins them (decision 0079), the caller's access to the
/// namespace.
fn set(
    access: &Access,
    namespace: String,
    name: &str,
    names: Vec<String>,
    holder: String,
    fencing_token: Option<u64>,
    fencing_tokens: Vec<u64>,
) -> Result<(Vec<engine::SetLock>, engine::Holder), Status> {
    let namespace = validate::namespace(namespace).map_err(invalid)?;
    let names = validate::multi_set(name, names, fencing_token).map_err(invalid)?;
    let pinned = validate::set_tokens(names, fencing_tokens).map_err(invalid)?;
    access.act(&namespace)?;
    let holder = validate::holder(holder).map_err(invalid)?;
    validate::not_a_session("holder", holder.as_str())?;
    let locks = (pinned.into_iter())
        .map(|(name, token)| {
            let lock = LockId {
                namespace: namespace.clone(),
                name,
            };
            (lock, token)
        })
        .collect();
    Ok((locks, holder))
}

/// An Inspect's or Leader's lock, readable by the caller.
pub fn readable_lock(namespace: String, name: String, access: &Access) -> Result<LockId, Status> {
    let lock = LockId::parse(namespace, name).map_err(invalid)?;
    access.read(&lock.namespace)?;
    Ok(lock)
}

/// A Queue's lock, readable by the caller, and how many entries to show.
pub fn queue(req: proto::QueueRequest, access: &Access) -> Result<(LockId, u32), Status> {
    let lock = readable_lock(req.namespace, req.name, access)?;
    let most = validate::max_entries(req.max_entries).map_err(invalid)?;
    Ok((lock, most))
}

/// A List page's request.
pub struct List {
    pub namespace: engine::Namespace,
    pub prefix: String,
    pub page_size: u32,
    pub from: Option<engine::ListCursor>,
    pub only_waiting: bool,
}

/// A List, read.
pub fn list(req: proto::ListRequest, access: &Access) -> Result<List, Status> {
    let namespace = validate::namespace(&req.namespace).map_err(invalid)?;
    access.read(&namespace)?;
    Ok(List {
        namespace,
        prefix: validate::prefix(&req.prefix).map_err(invalid)?,
        page_size: validate::page_size(req.page_size).map_err(invalid)?,
        from: validate::page_token(&req.page_token).map_err(invalid)?,
        only_waiting: req.only_waiting,
    })
}

/// A Reap's namespace and cutoff. Cleaning up what is already dead is
/// anyone's business; taking live grants and requests away (a cutoff) is
/// an admin's.
pub fn reap(
    req: proto::ReapRequest,
    access: &Access,
) -> Result<(engine::Namespace, Option<u64>), Status> {
    let namespace = validate::namespace(&req.namespace).map_err(invalid)?;
    let older_than = validate::older_than_ms(req.older_than_ms).map_err(invalid)?;
    if older_than.is_some() {
        access.admin(&namespace)?;
    } else {
        access.act(&namespace)?;
    }
    Ok((namespace, older_than))
}

/// A Clear's namespace: an admin's.
pub fn clear(req: proto::ClearRequest, access: &Access) -> Result<engine::Namespace, Status> {
    let namespace = validate::namespace(&req.namespace).map_err(invalid)?;
    access.admin(&namespace)?;
    Ok(namespace)
}

/// A Metrics request: the namespace, the range (0s: the last hour up to
/// `now_ms`) and the kind, if one.
pub struct Metrics {
    pub namespace: engine::Namespace,
    pub from_ms: i64,
    pub to_ms: i64,
    pub kind: Option<engine::Kind>,
}

/// A Metrics request, read.
pub fn metrics(
    req: proto::MetricsRequest,
    access: &Access,
    now_ms: i64,
) -> Result<Metrics, Status> {
    let namespace = validate::namespace(&req.namespace).map_err(invalid)?;
    access.act(&namespace)?;
    let (from_ms, to_ms) =
        validate::metrics_range(req.from_ms, req.to_ms, now_ms).map_err(invalid)?;
    let kind = if req.kind.is_empty() {
        None
    } else {
        Some(validate::kind(&req.kind).map_err(invalid)?)
    };
    Ok(Metrics {
        namespace,
        from_ms,
        to_ms,
        kind,
    })
}

/// A Watch's filter, its namespace one the caller may act on.
pub fn watch(
    req: &proto::WatchRequest,
    access: &Access,
) -> Result<engine::watchers::Filter, Status> {
    let namespace = validate::namespace(&req.namespace).map_err(invalid)?;
    access.act(&namespace)?;
    Ok(engine::watchers::Filter {
        namespace,
        name: if req.name.is_empty() {
            None
        } else {
            Some(validate::name(&req.name).map_err(invalid)?)
        },
        prefix: validate::prefix(&req.prefix).map_err(invalid)?,
    })
}
