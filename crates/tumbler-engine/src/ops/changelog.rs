//! `lua/changelog.lua`: where one shard's part of a changelog page
//! starts (the replica then reads the entries with `LRANGE`).

use redis::Value;

use super::Reply;
use crate::store::StoreError;

/// Where a shard's part of a page starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// At the newest entry before the call's own millisecond.
    Newest,
    /// At the events of millisecond `at_ms` and before, but for the `skip`
    /// newest of `at_ms` itself (`None`: all of them).
    At { at_ms: i64, skip: Option<u32> },
}

/// The function's arguments: where to start.
pub fn args(start: Start) -> Vec<String> {
    let (at, skip) = match start {
        Start::Newest => (String::new(), "0".to_owned()),
        Start::At { at_ms, skip: None } => (at_ms.to_string(), "all".to_owned()),
        Start::At {
            at_ms,
            skip: Some(n),
        } => (at_ms.to_string(), n.to_string()),
    };
    vec![at, skip]
}

/// Where a shard's part of a page starts, as the function found it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seek {
    /// Redis' clock when the function ran.
    pub now: i64,
    /// The list's length then.
    pub length: i64,
    /// The index (from the head) of the page's first entry; `length`
    /// when nothing is left.
    pub start: i64,
    /// That entry's first lines, up to and with its time.
    pub head: String,
}

impl Seek {
    /// The `LRANGE` bounds of at most `window` entries from `start`,
    /// counted from the tail (pushes at the head do not move them); None
    /// when nothing is left.
    pub fn range(&self, window: usize) -> Option<(i64, i64)> {
        if self.start >= self.length || window == 0 {
            return None;
        }
        let first = self.start - self.length;
        Some((first, (first + window as i64 - 1).min(-1)))
    }
}

pub fn parse(value: Value) -> Result<Seek, StoreError> {
    let mut reply = Reply::new("changelog", value)?;
    Ok(Seek {
        now: reply.take()?,
        length: reply.take()?,
        start: reply.take()?,
        head: reply.take()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_become_arguments() {
        assert_eq!(args(Start::Newest), ["", "0"]);
        let all = Start::At {
            at_ms: 1_700_000_000_123,
            skip: None,
        };
        assert_eq!(args(all), ["1700000000123", "all"]);
        let some = Start::At {
            at_ms: 5,
            skip: Some(3),
        };
        assert_eq!(args(some), ["5", "3"]);
    }

    #[test]
    fn ranges_count_from_the_tail_and_stop_there() {
        let seek = |start, length| Seek {
            start,
            length,
            ..Seek::default()
        };
        assert_eq!(seek(0, 10).range(4), Some((-10, -7)));
        assert_eq!(seek(8, 10).range(4), Some((-2, -1)));
        assert_eq!(seek(10, 10).range(4), None);
        assert_eq!(seek(12, 10).range(4), None);
        let reply = Value::Array(vec![
            Value::Int(10),
            Value::Int(3),
            Value::Int(1),
            Value::BulkString(b"ns\nname\nacquired\nh\n1\n9".to_vec()),
        ]);
        let parsed = parse(reply).unwrap();
        assert_eq!((parsed.now, parsed.length, parsed.start), (10, 3, 1));
        assert!(parsed.head.ends_with("\n9"));
        assert!(parse(Value::Int(1)).is_err());
        assert!(parse(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
