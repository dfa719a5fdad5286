//! `lua/acquire_many.lua`: one permit of each of several locks for one
//! holder, all or nothing (a multi-lock, decision 0076); a waiting caller
//! that finds a lock busy leaves a wake-up place in its queue.

use redis::Value;

use super::{Reply, status};
use crate::Grant;
use crate::records::parse_grant;
use crate::store::StoreError;

/// One call of the function, for the locks whose keys it declares.
pub struct Call<'a> {
    pub holder: &'a str,
    /// The grants' ttl (what an extend without one renews to).
    pub ttl_ms: u64,
    /// The lease given now: `ttl_ms`, or a short reservation.
    pub lease_ms: u64,
    /// Redis ms after which nothing may be granted.
    pub answer_by: i64,
    pub limit: u32,
    pub kind: &'a str,
    /// The metadata as the record stores it ('' when there is none).
    pub metadata: &'a str,
    pub watched: super::Emit,
    /// Keys each lock declares (5, or 6 with live locks counted).
    pub keys_per_lock: usize,
    pub max_locks: u64,
    /// Set when the caller waits: its wake-up places' liveness and the
    /// most places one lock's queue may hold.
    pub wait: Option<(u64, u32)>,
}

impl Call<'_> {
    /// The arguments, in `lua/acquire_many.lua`'s order.
    pub fn args(&self) -> Vec<String> {
        let mut flags = String::new();
        self.watched.push_flags(&mut flags);
        let (queue_ttl, max_waiters) = match self.wait {
            Some((ttl, most)) => (ttl.to_string(), most.to_string()),
            None => (String::new(), "0".to_owned()),
        };
        vec![
            self.holder.to_owned(),
            self.ttl_ms.to_string(),
            self.answer_by.to_string(),
            self.limit.to_string(),
            self.kind.to_owned(),
            self.metadata.to_owned(),
            flags,
            self.keys_per_lock.to_string(),
            self.max_locks.to_string(),
            self.lease_ms.to_string(),
            queue_ttl,
            max_waiters,
        ]
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every lock granted (`already`: every one was the holder's before),
    /// its grant and holders, in the call's order.
    Granted {
        grants: Vec<(Grant, u32)>,
        already: bool,
    },
    /// A lock busy (`index`: the first, 0-based): nothing taken; `queued`
    /// when wake-up places were left.
    Busy {
        index: usize,
        holders: u32,
        next_expiry: i64,
        queued: bool,
    },
    QueueFull,
    NamespaceFull,
    LimitMismatch {
        index: usize,
        lock_limit: u32,
    },
    ModeMismatch {
        index: usize,
    },
    Late,
}

pub type Answer = super::Answer<Outcome>;

/// True for a grant (what `--min-replicas-acked` waits on).
pub fn is_grant(reply: &Value) -> bool {
    super::status_in(reply, &[status::OK, status::HELD])
}

pub fn parse(value: Value, holder: &str) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("acquire_many", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let a: usize = reply.take()?;
    let holders = reply.take()?;
    let c: i64 = reply.take()?;
    let index = a.saturating_sub(1);
    let outcome = match code {
        status::OK | status::HELD => {
            let mut grants = Vec::with_capacity(a);
            for _ in 0..a {
                let holders: u32 = reply.take()?;
                let record: String = reply.take()?;
                grants.push((parse_grant(holder, &record)?, holders));
            }
            Outcome::Granted {
                grants,
                already: code == status::HELD,
            }
        }
        status::BUSY | status::QUEUED => Outcome::Busy {
            index,
            holders,
            next_expiry: c,
            queued: code == status::QUEUED,
        },
        status::QUEUE_FULL => Outcome::QueueFull,
        status::NAMESPACE_FULL => Outcome::NamespaceFull,
        status::LIMIT_MISMATCH => Outcome::LimitMismatch {
            index,
            lock_limit: c as u32,
        },
        status::MODE_MISMATCH => Outcome::ModeMismatch { index },
        status::LATE => Outcome::Late,
        other => return Err(StoreError::Protocol(format!("acquire_many status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
