//! `lua/release_many.lua`: a held set's grants given back in one call
//! (decision 0079), each lock as `release.lua` would, pinned to its token
//! when one is named.

use redis::Value;

use super::{Reply, status};
use crate::Grant;
use crate::records::parse_grant;
use crate::store::StoreError;

/// The set a call acts on (`release_many`, `extend_many`): its holder,
/// where its events go, and per lock its token.
#[derive(Clone, Copy)]
pub struct Set<'a> {
    pub holder: &'a str,
    pub watched: super::Emit,
    /// Keys each lock declares (5, or 6 with live locks counted).
    pub keys_per_lock: usize,
    /// Per lock, in the keys' order: only the grant with this token
    /// (None: any grant of the holder).
    pub tokens: &'a [Option<u64>],
}

impl Set<'_> {
    /// Appends the flags, the keys per lock and the tokens (every set
    /// function's last arguments, in this order).
    pub(super) fn push_args(&self, args: &mut Vec<String>) {
        args.push(self.watched.arg());
        args.push(self.keys_per_lock.to_string());
        args.extend(self.tokens.iter().map(|token| super::optional(*token)));
    }
}

/// One call of the function, for the locks whose keys it declares.
pub struct Call<'a> {
    pub set: Set<'a>,
}

impl Call<'_> {
    /// The arguments, in `lua/release_many.lua`'s order.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![self.set.holder.to_owned()];
        self.set.push_args(&mut args);
        args
    }
}

/// What the function answered: per lock, in the keys' order, the grant it
/// released (None: not the holder's, or not with its token; untouched).
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub released: Vec<Option<Grant>>,
}

impl Outcome {
    /// Every lock was the holder's, and every one is released.
    pub fn all(&self) -> bool {
        self.released.iter().all(Option::is_some)
    }
}

pub type Answer = super::Answer<Outcome>;

pub fn parse(value: Value, holder: &str) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("release_many", value)?;
    let code: i64 = reply.take()?;
    let now = reply.take()?;
    let n: usize = reply.take()?;
    if code != status::OK && code != status::NOT_HELD {
        return Err(StoreError::Protocol(format!("release_many status {code}")));
    }
    let released = lock_grants(&mut reply, n, holder, "release_many", false)?
        .into_iter()
        .map(|(grant, _)| grant)
        .collect();
    Ok(Answer {
        now,
        outcome: Outcome { released },
        noted: reply.noted()?,
    })
}

/// The per-lock part of a set's reply (`release_many`, `extend_many`):
/// per lock its status and grant record ('' when not the holder's), and
/// with `modes` the lock's header letter.
pub(super) fn lock_grants(
    reply: &mut Reply,
    n: usize,
    holder: &str,
    what: &str,
    modes: bool,
) -> Result<Vec<(Option<Grant>, String)>, StoreError> {
    let mut locks = Vec::with_capacity(n);
    for _ in 0..n {
        let lock_status: i64 = reply.take()?;
        let record: String = reply.take()?;
        let mode: String = if modes { reply.take()? } else { String::new() };
        let grant = match lock_status {
            status::OK => Some(parse_grant(holder, &record)?),
            status::NOT_HELD => None,
            other => {
                return Err(StoreError::Protocol(format!("{what} lock status {other}")));
            }
        };
        locks.push((grant, mode));
    }
    Ok(locks)
}
