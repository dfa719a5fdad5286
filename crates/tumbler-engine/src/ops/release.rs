//! `lua/release.lua`: give a grant back.

use redis::Value;

use super::{Reply, status};
use crate::Grant;
use crate::records::parse_grant;
use crate::store::StoreError;

/// One call of the release function.
#[derive(Default)]
pub struct Call<'a> {
    pub holder: &'a str,
    /// Only the grant with this token ('' = any).
    pub token: Option<u64>,
    pub watched: super::Emit,
    /// The epoch of the session's stream that releases (None: not a
    /// session's call).
    pub epoch: Option<u64>,
    /// A grant handed to this request, which is gone: released only while
    /// no other answer claimed it (decision 0068).
    pub handed: Option<&'a str>,
    /// The digest of an election's secret: Resign (decision 0082).
    pub proof: Option<&'a str>,
    /// This replica's part of its request ids, when one of its requests
    /// waits on the lock: a grant handed to it is not provisional
    /// (decision 0090).
    pub alive: Option<&'a str>,
}

impl Call<'_> {
    /// The function's arguments, in `lua/release.lua`'s order; the tail
    /// is sent only as far as it differs from the defaults (any token, no
    /// events, no session), so a plain release sends one.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![self.holder.to_owned()];
        let watched = self.watched.arg();
        let (epoch, handed, proof, alive) = (
            self.epoch.is_some(),
            self.handed.is_some(),
            self.proof.is_some(),
            self.alive.is_some(),
        );
        let proof = proof || alive;
        if self.token.is_some() || watched != "0" || epoch || handed || proof {
            args.push(super::optional(self.token));
        }
        if watched != "0" || epoch || handed || proof {
            args.push(watched);
        }
        if epoch || handed || proof {
            args.push(super::optional(self.epoch));
        }
        if handed || proof {
            args.push(self.handed.unwrap_or_default().to_owned());
        }
        if proof {
            args.push(self.proof.unwrap_or_default().to_owned());
        }
        if let Some(alive) = self.alive {
            args.push(format!("{alive}."));
        }
        args
    }
}

/// What the function answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Released(Grant),
    NotHeld,
    /// A newer stream of the caller's session holds the grant: nothing
    /// changed.
    Moved,
    /// An election's grant, and the call proved neither its secret nor
    /// its session (decision 0082): nothing changed.
    NotYours,
}

/// The reply: Redis' clock, the outcome and what the call noted for the
/// counters.
pub type Answer = super::Answer<Outcome>;

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("release", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let holder: String = reply.take()?;
    let record: String = reply.take()?;
    let released = match code {
        status::OK => Outcome::Released(parse_grant(&holder, &record)?),
        status::NOT_HELD => Outcome::NotHeld,
        status::MOVED => Outcome::Moved,
        status::NOT_YOURS => Outcome::NotYours,
        other => return Err(StoreError::Protocol(format!("release status {other}"))),
    };
    Ok(Answer {
        now,
        outcome: released,
        noted: reply.noted()?,
    })
}
