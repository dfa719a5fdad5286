//! `lua/wait_for.lua`: a waiting holder's edge recorded in its
//! namespace's wait-for registry, and the walk that finds whether it
//! closes a cycle (decision 0077), within the registry's budget and the
//! walk's bounds (decision 0081).

use redis::Value;

use super::Reply;
use crate::WaitStep;
use crate::store::StoreError;

/// Holders an edge names per lock, at most (the function keeps no more).
pub const MOST_HOLDERS: usize = 16;

/// One call: the holder, its request, how long its edge lives unless
/// renewed, the registry's budget and the walk's, and per lock it waits
/// for the holders it waits on there (at most [`MOST_HOLDERS`] are sent).
pub struct Call<'a> {
    pub holder: &'a str,
    pub request: &'a str,
    pub live_ms: u64,
    pub budget_bytes: u64,
    pub walk_bytes: u64,
    pub waits: &'a [(String, Vec<String>)],
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            self.holder.to_owned(),
            self.request.to_owned(),
            self.live_ms.max(1).to_string(),
            self.budget_bytes.to_string(),
            self.walk_bytes.to_string(),
        ];
        for (lock, holders) in self.waits {
            args.push(lock.clone());
            let kept = &holders[..holders.len().min(MOST_HOLDERS)];
            args.push(kept.len().to_string());
            args.extend(kept.iter().cloned());
        }
        args
    }
}

/// What the call found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// The edge is recorded and closes no cycle the walk reached.
    Nothing,
    /// A cycle, from the waiting holder round to it again.
    Cycle(Vec<WaitStep>),
    /// Not recorded: the namespace's registry is at its budget, so this
    /// wait goes on unchecked.
    OverBudget,
}

pub fn parse(value: Value) -> Result<Found, StoreError> {
    let mut reply = Reply::new("wait_for", value)?;
    let _now: i64 = reply.take()?;
    match reply.take::<i64>()? {
        0 => Ok(Found::Nothing),
        2 => Ok(Found::OverBudget),
        1 => {
            let mut cycle = Vec::new();
            while let Some(holder) = reply.take_opt::<String>()? {
                cycle.push(WaitStep {
                    holder,
                    lock: reply.take()?,
                    held_by: reply.take()?,
                });
            }
            Ok(Found::Cycle(cycle))
        }
        other => Err(StoreError::Protocol(format!(
            "wait_for answered status {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_count_each_locks_holders_up_to_the_cut() {
        let waits = vec![("x".to_owned(), vec!["b".to_owned(), "c".to_owned()])];
        let call = Call {
            holder: "a",
            request: "r1",
            live_ms: 0,
            budget_bytes: 100,
            walk_bytes: 10,
            waits: &waits,
        };
        assert_eq!(
            call.args(),
            ["a", "r1", "1", "100", "10", "x", "2", "b", "c"]
        );
        let many: Vec<String> = (0..1000).map(|i| format!("h{i}")).collect();
        let waits = vec![("x".to_owned(), many)];
        let args = Call {
            waits: &waits,
            ..call
        }
        .args();
        assert_eq!(args.len(), 7 + MOST_HOLDERS);
        assert_eq!(args[6], MOST_HOLDERS.to_string());
    }

    #[test]
    fn a_found_cycle_reads_in_steps() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let value = Value::Array(vec![
            Value::Int(5),
            Value::Int(1),
            text("a"),
            text("x"),
            text("b"),
            text("b"),
            text("y"),
            text("a"),
        ]);
        let Found::Cycle(cycle) = parse(value).unwrap() else {
            panic!("a cycle")
        };
        assert_eq!(cycle.len(), 2);
        assert_eq!(cycle[1].held_by, "a");
        let status = |n| parse(Value::Array(vec![Value::Int(5), Value::Int(n)])).unwrap();
        assert_eq!(status(0), Found::Nothing);
        assert_eq!(status(2), Found::OverBudget);
    }
}
