//! `lua/extend.lua`: reset the remaining lease of a live grant.

use redis::Value;

use super::{Reply, status};
use crate::Grant;
use crate::records::{header_mode, parse_grant};
use crate::store::StoreError;

/// One call of the extend function.
pub struct Call<'a> {
    pub holder: &'a str,
    pub token: Option<u64>,
    /// The new lease (None: the grant's own ttl).
    pub ttl_ms: Option<u64>,
    pub answer_by: i64,
    pub watched: super::Emit,
    /// The epoch of the session's stream that extends (None: not a
    /// session's call).
    pub epoch: Option<u64>,
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            self.holder.to_owned(),
            super::optional(self.token),
            super::optional(self.ttl_ms),
            self.answer_by.to_string(),
            self.watched.arg(),
        ];
        if let Some(epoch) = self.epoch {
            args.push(epoch.to_string());
        }
        args
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Extended(Grant),
    NotHeld,
    /// Ran past the answer-by time: nothing happened.
    Late,
    /// A newer stream of the caller's session holds the grant: nothing
    /// changed.
    Moved,
}

/// The reply: Redis' clock, the outcome and what it noted.
pub type Answer = super::Answer<Outcome>;

/// True for an extension (what `--min-replicas-acked` waits on).
pub fn is_grant(reply: &Value) -> bool {
    super::status_in(reply, &[status::OK])
}

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("extend", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let holder: String = reply.take()?;
    let record: String = reply.take()?;
    let outcome = match code {
        status::OK => {
            // The lock's header letter: a read/write grant's mode.
            let mode: String = reply.take()?;
            let mut grant = parse_grant(&holder, &record)?;
            grant.mode = header_mode(&mode);
            Outcome::Extended(grant)
        }
        status::NOT_HELD => Outcome::NotHeld,
        status::LATE => Outcome::Late,
        status::MOVED => Outcome::Moved,
        other => return Err(StoreError::Protocol(format!("extend status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
