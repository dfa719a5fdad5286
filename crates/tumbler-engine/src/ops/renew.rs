//! `lua/renew.lua`: keep many session grants of one shard alive.

use redis::Value;

use super::{Reply, status};
use crate::store::StoreError;

/// One grant to renew.
pub struct Item<'a> {
    pub name: &'a str,
    pub holder: &'a str,
    pub token: u64,
    pub ttl_ms: u64,
    /// The epoch of the session's stream that renews (a resume's new
    /// epoch takes the grant over).
    pub epoch: u64,
}

/// One call: the shard's grants due for renewal.
pub struct Call<'a> {
    pub answer_by: i64,
    /// The shard's live locks are counted (a per-namespace lock limit).
    pub live: bool,
    /// Some replica watches the namespace: publish events.
    pub watched: super::Emit,
    pub items: &'a [Item<'a>],
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(3 + 5 * self.items.len());
        args.push(self.answer_by.to_string());
        args.push(super::flag(self.live).to_owned());
        args.push(self.watched.arg());
        for item in self.items {
            args.extend([
                item.name.to_owned(),
                item.holder.to_owned(),
                item.token.to_string(),
                item.ttl_ms.to_string(),
                item.epoch.to_string(),
            ]);
        }
        args
    }
}

/// What the function answered: the 0-based indexes of the items whose
/// grant is gone (`lost`) and of those a newer stream of their session
/// holds (`moved`, left as they were), or Late (nothing renewed).
#[derive(Debug)]
pub enum Outcome {
    Renewed { lost: Vec<usize>, moved: Vec<usize> },
    Late,
}

pub type Answer = super::Answer<Outcome>;

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("renew", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    if code == status::LATE {
        return Ok(Answer {
            now,
            outcome: Outcome::Late,
            noted: Vec::new(),
        });
    }
    if code != status::OK {
        return Err(StoreError::Protocol(format!("renew status {code}")));
    }
    let (mut lost, mut moved) = (Vec::new(), Vec::new());
    for group in reply.until_marker()? {
        // Group numbers are 1-based; a moved one is negated.
        let n: i64 = group
            .parse()
            .map_err(|e| StoreError::Protocol(format!("renew reply {group:?}: {e}")))?;
        let index = (n.unsigned_abs() as usize).saturating_sub(1);
        if n < 0 {
            moved.push(index)
        } else {
            lost.push(index)
        }
    }
    Ok(Answer {
        now,
        outcome: Outcome::Renewed { lost, moved },
        noted: reply.noted()?,
    })
}
