//! The typed twins of tumbler's Redis functions, one file per function
//! (`lua/<operation>.lua`): what it is called with (a typed input turned
//! into its arguments in one place), what it answers (an enum or a
//! struct), and the parse of that answer. The engine's parts call them
//! through `calls.rs` (one lock: `engine/locks.rs`; shard walks:
//! `walks.rs`; multi-locks: `multi.rs` and `multi/held.rs`; sessions:
//! `resume.rs` and `renewer.rs`; the changelog: `changelog.rs`;
//! per-minute counts: `counting.rs`; the wait-for registry:
//! `deadlock.rs`); nothing else knows the functions' argument order or
//! reply shape. (The five functions on a session's record, a few lines
//! each, share `session_record.rs`.)

pub mod acquire;
pub mod acquire_many;
pub mod blockers;
pub mod changelog;
pub mod clear;
pub mod count;
pub mod dequeue;
pub mod extend;
pub mod extend_many;
pub mod inspect;
pub mod list;
pub mod proclaim;
pub mod purge;
pub mod queue;
pub mod reap;
pub mod refresh;
pub mod release;
pub mod release_many;
pub mod renew;
pub mod session_record;
pub mod take_over;
pub mod wait_end;
pub mod wait_for;
pub mod wait_renew;
pub mod waits;

use redis::Value;

use crate::store::StoreError;

/// Reply statuses, as `lua/shared/numbers.lua` names them.
pub mod status {
    pub const BUSY: i64 = 0;
    pub const OK: i64 = 1;
    pub const HELD: i64 = 2;
    pub const QUEUED: i64 = 3;
    pub const QUEUE_FULL: i64 = 4;
    pub const NAMESPACE_FULL: i64 = 5;
    pub const LIMIT_MISMATCH: i64 = 6;
    pub const LATE: i64 = 7;
    pub const NOT_HELD: i64 = 8;
    pub const MOVED: i64 = 9;
    pub const MODE_MISMATCH: i64 = 10;
    pub const UPGRADE: i64 = 11;
    pub const NOT_YOURS: i64 = 12;
    pub const ELECTION: i64 = 13;
}

/// Something a function reports for the per-minute counters: an expired
/// lease, a reaped waiter or grant, a cleared grant or request, with its
/// kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Noted {
    pub event: String,
    pub kind: String,
}

/// What a function that decides something answered: Redis' clock, the
/// outcome, and what it noted for the counters.
#[derive(Debug)]
pub struct Answer<T> {
    pub now: i64,
    pub outcome: T,
    pub noted: Vec<Noted>,
}

/// A function's reply, read element by element.
pub struct Reply {
    what: &'static str,
    items: std::vec::IntoIter<Value>,
}

impl Reply {
    /// `what` names the function in errors.
    pub fn new(what: &'static str, value: Value) -> Result<Self, StoreError> {
        match value {
            Value::Array(items) => Ok(Reply {
                what,
                items: items.into_iter(),
            }),
            other => Err(StoreError::Protocol(format!("{what} answered {other:?}"))),
        }
    }

    fn bad(&self, detail: &str) -> StoreError {
        StoreError::Protocol(format!("{} reply: {detail}", self.what))
    }

    /// The next element, converted.
    pub fn take<T: redis::FromRedisValue>(&mut self) -> Result<T, StoreError> {
        let value = self.items.next().ok_or_else(|| self.bad("too short"))?;
        redis::from_redis_value(value).map_err(|e| self.bad(&e.to_string()))
    }

    /// The next element, or `None` at the end.
    pub fn take_opt<T: redis::FromRedisValue>(&mut self) -> Result<Option<T>, StoreError> {
        match self.items.next() {
            None => Ok(None),
            Some(value) => redis::from_redis_value(value)
                .map(Some)
                .map_err(|e| self.bad(&e.to_string())),
        }
    }

    /// The elements up to an empty-string marker (or the end).
    pub fn until_marker(&mut self) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        while let Some(item) = self.take_opt::<String>()? {
            if item.is_empty() {
                break;
            }
            found.push(item);
        }
        Ok(found)
    }

    /// The rest: (event, kind) pairs for the counters.
    pub fn noted(mut self) -> Result<Vec<Noted>, StoreError> {
        let mut noted = Vec::new();
        while let Some(event) = self.take_opt::<String>()? {
            let kind = self.take()?;
            noted.push(Noted { event, kind });
        }
        Ok(noted)
    }
}

/// True when a reply's status (its first element) is one of `statuses`
/// (what `--min-replicas-acked` waits on for a grant).
pub fn status_in(reply: &Value, statuses: &[i64]) -> bool {
    matches!(reply, Value::Array(items)
        if matches!(items.first(), Some(Value::Int(s)) if statuses.contains(s)))
}

/// An optional number as an argument: '' when absent (the functions read
/// '' as "any token", "the grant's own ttl", "no cutoff").
pub fn optional(n: Option<u64>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

/// An optional signed number as an argument: '' when absent.
pub fn optional_i64(n: Option<i64>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

/// What a lock's events do: published (some replica watches the
/// namespace) and/or recorded in the namespace's changelog.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Emit {
    pub publish: bool,
    /// The changelog's size per shard and retention (ms), when recorded.
    pub record: Option<(u32, u64)>,
}

impl Emit {
    /// Appends the event flags (`lua/shared/lock.lua`'s `events`): 'e' to
    /// publish, `'c<size>:<retention_ms>'` to record.
    pub fn push_flags(&self, flags: &mut String) {
        if self.publish {
            flags.push('e');
        }
        if let Some((size, retention_ms)) = self.record {
            flags.push_str(&format!("c{size}:{retention_ms}"));
        }
    }

    /// The event flags argument of the functions other than acquire: '0'
    /// when the lock's events go nowhere (the default: nothing is built).
    pub fn arg(&self) -> String {
        match (self.publish, self.record) {
            (false, None) => "0".to_owned(),
            (true, None) => "1".to_owned(),
            _ => {
                let mut flags = String::new();
                self.push_flags(&mut flags);
                flags
            }
        }
    }
}

/// A yes/no argument: '1' or '0'.
pub fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_in_order_then_the_noted_pairs() {
        let value = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"x".to_vec()),
            Value::BulkString(b"expired".to_vec()),
            Value::BulkString(b"jobs".to_vec()),
        ]);
        let mut reply = Reply::new("test", value).unwrap();
        assert_eq!(reply.take::<i64>().unwrap(), 1);
        assert_eq!(reply.take::<String>().unwrap(), "x");
        assert_eq!(
            reply.noted().unwrap(),
            vec![Noted {
                event: "expired".into(),
                kind: "jobs".into()
            }]
        );
    }

    #[test]
    fn a_short_or_odd_reply_is_a_protocol_error() {
        let mut reply = Reply::new("test", Value::Array(vec![])).unwrap();
        assert!(reply.take::<i64>().is_err());
        assert!(Reply::new("test", Value::Int(3)).is_err());
        let odd = Value::Array(vec![Value::BulkString(b"expired".to_vec())]);
        assert!(Reply::new("test", odd).unwrap().noted().is_err());
    }
}
