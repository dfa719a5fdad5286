//! `lua/session_*.lua`: a session's record, which lets any replica resume
//! it (open, touch, note a grant, claim, end). Five functions of a few
//! lines each on one small hash, so their twins share this file.

use redis::Value;

use super::Reply;
use crate::store::StoreError;

/// The hash field of one grant in the record.
pub fn grant_field(namespace: &str, name: &str) -> String {
    format!("g:{namespace}\n{name}")
}

/// `session_open`: a new record; answers epoch 1.
pub struct Open<'a> {
    pub owner: &'a str,
    pub digest: &'a str,
    pub ttl_ms: u64,
    pub keep_ms: u64,
}

impl Open<'_> {
    pub fn args(&self) -> Vec<String> {
        vec![
            self.owner.to_owned(),
            self.digest.to_owned(),
            self.ttl_ms.to_string(),
            self.keep_ms.to_string(),
        ]
    }
}

/// `session_touch`: keep the record while `epoch` serves it.
pub fn touch_args(epoch: u64, keep_ms: u64) -> Vec<String> {
    vec![epoch.to_string(), keep_ms.to_string()]
}

/// `session_note`: a grant added (`Some(token)`) or taken off (`None`).
pub fn note_args(epoch: u64, namespace: &str, name: &str, token: Option<u64>) -> Vec<String> {
    vec![
        epoch.to_string(),
        grant_field(namespace, name),
        token.map(|t| t.to_string()).unwrap_or_default(),
    ]
}

/// `session_end`: the record goes if `epoch` still serves it.
pub fn end_args(epoch: u64) -> Vec<String> {
    vec![epoch.to_string()]
}

/// What `session_touch` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// The calling stream still serves the session (kept alive).
    Ours,
    /// Another stream resumed it.
    Moved,
    /// The record is gone (Redis lost its data, or it was cleared).
    Gone,
}

pub fn parse_touch(value: Value) -> Result<Touch, StoreError> {
    match redis::from_redis_value::<i64>(value) {
        Ok(1) => Ok(Touch::Ours),
        Ok(0) => Ok(Touch::Moved),
        Ok(-1) => Ok(Touch::Gone),
        Ok(n) => Err(StoreError::Protocol(format!("session_touch answered {n}"))),
        Err(e) => Err(StoreError::Protocol(format!("session record reply: {e}"))),
    }
}

/// `session_note` and `session_end` answer 1 when the calling stream
/// still serves the session.
pub fn still_ours(value: Value) -> Result<bool, StoreError> {
    match redis::from_redis_value::<i64>(value) {
        Ok(n) => Ok(n == 1),
        Err(e) => Err(StoreError::Protocol(format!("session record reply: {e}"))),
    }
}

/// `session_claim`: resume with the owner's name and the secret's digest
/// (the record's expiry follows from its own TTL).
pub fn claim_args(owner: &str, digest: &str) -> Vec<String> {
    vec![owner.to_owned(), digest.to_owned()]
}

/// What `session_claim` answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The session is over (closed, or its record expired).
    Gone,
    /// Wrong secret or owner; nothing changed.
    Refused,
    /// The stream now serves the session, as `epoch`.
    Claimed {
        epoch: u64,
        ttl_ms: u64,
        /// (namespace, name, fencing token) per grant the record names.
        grants: Vec<(String, String, u64)>,
    },
}

pub fn parse_claim(value: Value) -> Result<Claim, StoreError> {
    let mut reply = Reply::new("session_claim", value)?;
    let epoch: i64 = reply.take()?;
    match epoch {
        0 => return Ok(Claim::Gone),
        -1 => return Ok(Claim::Refused),
        _ => {}
    }
    let ttl_ms: u64 = reply.take()?;
    let mut grants = Vec::new();
    while let Some(field) = reply.take_opt::<String>()? {
        let token: u64 = reply.take()?;
        let (namespace, name) = field
            .strip_prefix("g:")
            .and_then(|rest| rest.split_once('\n'))
            .ok_or_else(|| StoreError::Protocol(format!("session record field {field:?}")))?;
        grants.push((namespace.to_owned(), name.to_owned(), token));
    }
    Ok(Claim::Claimed {
        epoch: epoch as u64,
        ttl_ms,
        grants,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_claim_names_each_grant_by_namespace_and_name() {
        let value = Value::Array(vec![
            Value::Int(3),
            Value::Int(5000),
            bulk("g:team-a\njobs/nightly"),
            bulk("42"),
        ]);
        assert_eq!(
            parse_claim(value).unwrap(),
            Claim::Claimed {
                epoch: 3,
                ttl_ms: 5000,
                grants: vec![("team-a".into(), "jobs/nightly".into(), 42)],
            }
        );
        assert_eq!(
            parse_claim(Value::Array(vec![Value::Int(0)])).unwrap(),
            Claim::Gone
        );
        assert_eq!(
            parse_claim(Value::Array(vec![Value::Int(-1)])).unwrap(),
            Claim::Refused
        );
        let bad = Value::Array(vec![Value::Int(2), Value::Int(1), bulk("x"), bulk("1")]);
        assert!(parse_claim(bad).is_err());
    }
}
