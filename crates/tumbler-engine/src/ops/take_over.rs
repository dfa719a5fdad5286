//! `lua/take_over.lua`: one holder's live grant passes to another in one
//! step (Acquire's `takes_over`, decision 0083).

use redis::Value;

use super::{Reply, status};
use crate::AcquireRequest;
use crate::Grant;
use crate::records::parse_grant;
use crate::store::StoreError;

/// One call of the take-over function.
pub struct Call<'a> {
    /// The request; its holder takes the grant over.
    pub req: &'a AcquireRequest,
    /// Whose grant passes.
    pub old: &'a str,
    /// The metadata as the record stores it ('' when there is none).
    pub metadata: &'a str,
    /// Redis ms after which nothing may be granted (the caller was answered).
    pub answer_by: i64,
    pub watched: super::Emit,
}

impl Call<'_> {
    /// The function's arguments, in `lua/take_over.lua`'s order (all of
    /// them: a take-over is never the hot path's plain acquire).
    pub fn args(&self) -> Vec<String> {
        let req = self.req;
        vec![
            self.old.to_owned(),
            req.holder.to_string(),
            req.ttl.to_string(),
            self.answer_by.to_string(),
            req.limit.to_string(),
            req.kind.to_string(),
            self.metadata.to_owned(),
            self.watched.arg(),
        ]
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The old holder's grant is the request holder's now, with a new token.
    TookOver { grant: Grant, holders: u32 },
    /// The old holder holds no live grant, or the new one holds one
    /// already: nothing changed (an ordinary acquire decides).
    NotHeld,
    /// The lock is in use with another limit.
    LimitMismatch { lock_limit: u32 },
    /// The old grant is a read/write lock's.
    ModeMismatch,
    /// The old grant is an election's (or a session's): it does not pass.
    NotYours,
    /// Ran past the answer-by time: nothing happened.
    Late,
}

/// The reply: Redis' clock, the outcome and what it noted.
pub type Answer = super::Answer<Outcome>;

/// True for a grant (what `--min-replicas-acked` waits on).
pub fn is_grant(reply: &Value) -> bool {
    super::status_in(reply, &[status::OK])
}

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("take_over", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let holders = reply.take()?;
    let _earliest: i64 = reply.take()?;
    let extra: i64 = reply.take()?;
    let outcome = match code {
        status::OK => {
            let holder: String = reply.take()?;
            let record: String = reply.take()?;
            Outcome::TookOver {
                grant: parse_grant(&holder, &record)?,
                holders,
            }
        }
        status::NOT_HELD => Outcome::NotHeld,
        status::LIMIT_MISMATCH => Outcome::LimitMismatch {
            lock_limit: extra as u32,
        },
        status::MODE_MISMATCH => Outcome::ModeMismatch,
        status::NOT_YOURS => Outcome::NotYours,
        status::LATE => Outcome::Late,
        other => return Err(StoreError::Protocol(format!("take_over status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
