//! `lua/extend_many.lua`: a held set's leases reset in one call, all or
//! nothing (decision 0079): every lock extended, or, when one is not the
//! holder's (with its token), what is left of the set released.

use redis::Value;

use super::release_many::{Set, lock_grants};
use super::{Reply, status};
use crate::Grant;
use crate::records::header_mode;
use crate::store::StoreError;

/// One call of the function, for the locks whose keys it declares.
pub struct Call<'a> {
    pub set: Set<'a>,
    /// The new leases (None: each grant's own ttl).
    pub ttl_ms: Option<u64>,
    /// Redis ms after which nothing may be extended.
    pub answer_by: i64,
}

impl Call<'_> {
    /// The arguments, in `lua/extend_many.lua`'s order.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            self.set.holder.to_owned(),
            super::optional(self.ttl_ms),
            self.answer_by.to_string(),
        ];
        self.set.push_args(&mut args);
        args
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every lock extended: its new grant, in the keys' order.
    Extended(Vec<Grant>),
    /// A lock was not the holder's: per lock the grant released instead
    /// (None: that lock was not the holder's; untouched).
    NotHeld { released: Vec<Option<Grant>> },
    /// Ran past the answer-by time: nothing happened.
    Late,
}

pub type Answer = super::Answer<Outcome>;

/// True for an extension (what `--min-replicas-acked` waits on).
pub fn is_grant(reply: &Value) -> bool {
    super::status_in(reply, &[status::OK])
}

pub fn parse(value: Value, holder: &str) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("extend_many", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let n: usize = reply.take()?;
    let locks = lock_grants(&mut reply, n, holder, "extend_many", true)?;
    let outcome = match code {
        status::OK => {
            let mut grants = Vec::with_capacity(n);
            for (grant, mode) in locks {
                let mut grant = grant.ok_or_else(|| {
                    StoreError::Protocol("extend_many extended a lock it did not hold".into())
                })?;
                grant.mode = header_mode(&mode);
                grants.push(grant);
            }
            Outcome::Extended(grants)
        }
        status::NOT_HELD => Outcome::NotHeld {
            released: locks.into_iter().map(|(grant, _)| grant).collect(),
        },
        status::LATE => Outcome::Late,
        other => return Err(StoreError::Protocol(format!("extend_many status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
