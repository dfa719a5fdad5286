//! `lua/acquire.lua`: take a permit of a lock, or hold a place in its queue.
//! A read/write request (decision 0074) is an acquire with its mode in the
//! flags.

use redis::Value;

use super::{Reply, status};
use crate::AcquireRequest;
use crate::Grant;
use crate::LockMode;
use crate::records::parse_grant;
use crate::store::StoreError;

/// One call of the acquire function.
pub struct Call<'a> {
    pub req: &'a AcquireRequest,
    /// The metadata as the record stores it ('' when there is none).
    pub metadata: &'a str,
    /// Redis ms after which nothing may be granted (the caller was answered).
    pub answer_by: i64,
    /// Some replica watches the namespace: publish events.
    pub watched: super::Emit,
    /// Locks the namespace may have in this shard (0: no limit).
    pub max_locks: u64,
    /// Set when the caller waits: how long it still waits, and how many
    /// requests one lock's queue may hold.
    pub wait: Option<Wait>,
}

/// The waiting part of a call.
pub struct Wait {
    pub left_ms: u64,
    pub max_waiters: u32,
    /// The waiting RPC's own id ('' = none: the place is the holder's,
    /// whichever request asks; finding 6).
    pub request: String,
    /// The Redis ms after which its caller is told no: a freed permit is
    /// handed to it until then (decision 0068). None: it is woken to call
    /// again.
    pub hand_answer_by: Option<i64>,
}

impl Call<'_> {
    /// The function's arguments, in `lua/acquire.lua`'s order. The tail
    /// is sent only as far as it differs from the defaults: a try-once
    /// call for a plain mutex sends three.
    pub fn args(&self) -> Vec<String> {
        let req = self.req;
        let mut flags = String::new();
        // A plain request's flags are what they always were; a read/write
        // one says its mode (decision 0074): 'r', 'w', or 'R' for a reader
        // that barges (prefer_readers). Read/write requests are fair
        // otherwise, so they send no 'f'.
        match req.mode {
            LockMode::Plain if req.fair => flags.push('f'),
            LockMode::Plain => {}
            LockMode::Read if req.prefer_readers => flags.push('R'),
            LockMode::Read => flags.push('r'),
            LockMode::Write => flags.push('w'),
        }
        // A weighted request says its weight (decision 0075); one permit
        // sends nothing more.
        if req.permits > 1 {
            flags.push('p');
            flags.push_str(&req.permits.to_string());
        }
        self.watched.push_flags(&mut flags);
        if let Some(epoch) = req.session_epoch {
            flags.push('s');
            flags.push_str(&epoch.to_string());
        }
        let mut args = vec![
            req.holder.to_string(),
            req.ttl.to_string(),
            self.answer_by.to_string(),
        ];
        // The rest with their defaults (the Lua's): trailing defaults are
        // not sent, except before the waiting arguments.
        let tail = [
            (req.limit.to_string(), "1"),
            (req.kind.to_string(), "default"),
            (self.metadata.to_owned(), ""),
            (flags, ""),
            (req.priority.to_string(), "0"),
            (self.max_locks.to_string(), "0"),
        ];
        let sent = match self.wait {
            Some(_) => tail.len(),
            None => (tail.iter())
                .rposition(|(arg, default)| arg != default)
                .map_or(0, |last| last + 1),
        };
        args.extend(tail.into_iter().take(sent).map(|(arg, _)| arg));
        if let Some(wait) = &self.wait {
            args.extend([
                wait.left_ms.max(1).to_string(),
                req.queue_ttl_ms.to_string(),
                wait.max_waiters.to_string(),
            ]);
            if !wait.request.is_empty() {
                args.extend([
                    wait.request.clone(),
                    super::optional_i64(wait.hand_answer_by),
                ]);
            }
        }
        args
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A grant: new, or (`already`) the one the holder had, or
    /// (`downgraded`) the writer's own grant, now a reader's.
    Granted {
        grant: Grant,
        holders: u32,
        already: bool,
        downgraded: bool,
    },
    /// Tried once; every permit is taken (or someone goes first).
    Busy {
        holders: u32,
        next_expiry: i64,
    },
    /// Waiting at `position` in the queue.
    Queued {
        holders: u32,
        next_expiry: i64,
        position: u32,
    },
    QueueFull,
    NamespaceFull,
    /// The lock is in use with another limit.
    LimitMismatch {
        lock_limit: u32,
    },
    /// The lock is of the other kind (read/write against plain) while
    /// anyone holds or waits: `rw_lock` says what the lock is.
    ModeMismatch {
        rw_lock: bool,
    },
    /// The holder holds a read permit and asked WRITE: nothing changed.
    Upgrade,
    /// Ran past the answer-by time: nothing happened.
    Late,
    /// A newer stream of the caller's session holds the grant: nothing
    /// happened.
    Moved,
}

/// The reply: Redis' clock, the outcome and what it noted.
pub type Answer = super::Answer<Outcome>;

/// True for a grant (what `--min-replicas-acked` waits on).
pub fn is_grant(reply: &Value) -> bool {
    super::status_in(reply, &[status::OK, status::HELD])
}

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("acquire", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let holders = reply.take()?;
    let next_expiry = reply.take()?;
    let extra: i64 = reply.take()?;
    let outcome = match code {
        status::OK | status::HELD => {
            let holder: String = reply.take()?;
            let record: String = reply.take()?;
            Outcome::Granted {
                grant: parse_grant(&holder, &record)?,
                holders,
                already: code == status::HELD,
                downgraded: code == status::OK && extra == 1,
            }
        }
        status::BUSY => Outcome::Busy {
            holders,
            next_expiry,
        },
        status::QUEUED => Outcome::Queued {
            holders,
            next_expiry,
            position: extra as u32,
        },
        status::QUEUE_FULL => Outcome::QueueFull,
        status::NAMESPACE_FULL => Outcome::NamespaceFull,
        status::LIMIT_MISMATCH => Outcome::LimitMismatch {
            lock_limit: extra as u32,
        },
        status::MODE_MISMATCH => Outcome::ModeMismatch {
            rw_lock: extra == 1,
        },
        status::UPGRADE => Outcome::Upgrade,
        status::LATE => Outcome::Late,
        status::MOVED => Outcome::Moved,
        other => return Err(StoreError::Protocol(format!("acquire status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
