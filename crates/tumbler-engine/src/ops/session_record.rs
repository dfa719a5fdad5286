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

/// A grant's value in the record: its fencing token, and for a lock of a
/// multi-lock set `|<set>` (decision 0078), so a resume keeps the set.
pub fn grant_value(token: u64, set: Option<u64>) -> String {
    match set {
        Some(set) => format!("{token}|{set}"),
        None => token.to_string(),
    }
}

/// `session_note`: grants added (`Some(value)`, [`grant_value`]) or taken
/// off (`None`), (namespace, name, value) each, in one call.
pub fn note_args<'a>(
    epoch: u64,
    grants: impl IntoIterator<Item = (&'a str, &'a str, Option<String>)>,
) -> Vec<String> {
    let mut args = vec![epoch.to_string()];
    for (namespace, name, value) in grants {
        args.push(grant_field(namespace, name));
        args.push(value.unwrap_or_default());
    }
    args
}

/// `session_end`: the record goes if `epoch` still serves it.
pub fn end_args(epoch: u64) -> Vec<String> {
    vec![epoch.to_string()]
}

pub use tumbler_face::sessions::Touch;

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

/// A grant a resumed session's record names.
#[derive(Debug, PartialEq, Eq)]
pub struct ClaimedGrant {
    pub namespace: String,
    pub name: String,
    pub token: u64,
    /// Its multi-lock set (decision 0078); None for a single grant.
    pub set: Option<u64>,
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
        /// Per grant the record names: namespace, name, fencing token,
        /// and the multi-lock set it belongs to.
        grants: Vec<ClaimedGrant>,
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
        let value: String = reply.take()?;
        let bad = || StoreError::Protocol(format!("session record field {field:?}: {value:?}"));
        let (namespace, name) = field
            .strip_prefix("g:")
            .and_then(|rest| rest.split_once('\n'))
            .ok_or_else(bad)?;
        let (token, set) = match value.split_once('|') {
            Some((token, set)) => (token, Some(set.parse().map_err(|_| bad())?)),
            None => (value.as_str(), None),
        };
        grants.push(ClaimedGrant {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            token: token.parse().map_err(|_| bad())?,
            set,
        });
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
            bulk("g:team-a\nacct/1"),
            bulk(&grant_value(43, Some(9))),
        ]);
        let grant = |name: &str, token, set| ClaimedGrant {
            namespace: "team-a".into(),
            name: name.into(),
            token,
            set,
        };
        assert_eq!(
            parse_claim(value).unwrap(),
            Claim::Claimed {
                epoch: 3,
                ttl_ms: 5000,
                grants: vec![
                    grant("jobs/nightly", 42, None),
                    grant("acct/1", 43, Some(9))
                ],
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
