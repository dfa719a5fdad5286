//! `lua/proclaim.lua`: the leader of an election replaces its value.

use redis::Value;

use super::{Reply, status};
use crate::Grant;
use crate::records::parse_grant;
use crate::store::StoreError;

/// One call of the proclaim function.
pub struct Call<'a> {
    pub holder: &'a str,
    /// The term: the grant's fencing token, required.
    pub term: u64,
    pub value: &'a str,
    pub watched: super::Emit,
    /// The digest of the leader's secret (decision 0082).
    pub proof: &'a str,
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        vec![
            self.holder.to_owned(),
            self.term.to_string(),
            self.value.to_owned(),
            self.watched.arg(),
            self.proof.to_owned(),
        ]
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The grant with its new value.
    Proclaimed(Grant),
    /// The holder does not lead with that term: nothing changed.
    NotHeld,
    /// It leads, and the proof is not its secret's: nothing changed.
    NotYours,
}

/// The reply: Redis' clock, the outcome and what it noted.
pub type Answer = super::Answer<Outcome>;

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("proclaim", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let holder: String = reply.take()?;
    let record: String = reply.take()?;
    let outcome = match code {
        status::OK => Outcome::Proclaimed(parse_grant(&holder, &record)?),
        status::NOT_HELD => Outcome::NotHeld,
        status::NOT_YOURS => Outcome::NotYours,
        other => return Err(StoreError::Protocol(format!("proclaim status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
