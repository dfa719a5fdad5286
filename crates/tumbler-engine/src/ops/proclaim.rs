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
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        vec![
            self.holder.to_owned(),
            self.term.to_string(),
            self.value.to_owned(),
            self.watched.arg(),
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
        other => return Err(StoreError::Protocol(format!("proclaim status {other}"))),
    };
    Ok(Answer {
        now,
        outcome,
        noted: reply.noted()?,
    })
}
