//! `lua/wait_for.lua`: a waiting holder's edges recorded in its
//! namespace's wait-for registry, and the walk that finds whether they
//! close a cycle (decision 0077).

use redis::Value;

use super::Reply;
use crate::WaitStep;
use crate::store::StoreError;

/// One call: the holder, its request, how long it still waits, and per
/// lock it waits for the holders it waits on there.
pub struct Call<'a> {
    pub holder: &'a str,
    pub request: &'a str,
    pub left_ms: u64,
    pub waits: &'a [(String, Vec<String>)],
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            self.holder.to_owned(),
            self.request.to_owned(),
            self.left_ms.max(1).to_string(),
        ];
        for (lock, holders) in self.waits {
            args.push(lock.clone());
            args.push(holders.len().to_string());
            args.extend(holders.iter().cloned());
        }
        args
    }
}

/// The cycle the walk found (empty: none), from the waiting holder round
/// to it again.
pub fn parse(value: Value) -> Result<Vec<WaitStep>, StoreError> {
    let mut reply = Reply::new("wait_for", value)?;
    let _now: i64 = reply.take()?;
    let found: i64 = reply.take()?;
    let mut cycle = Vec::new();
    if found == 1 {
        while let Some(holder) = reply.take_opt::<String>()? {
            cycle.push(WaitStep {
                holder,
                lock: reply.take()?,
                held_by: reply.take()?,
            });
        }
    }
    Ok(cycle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_count_each_locks_holders() {
        let waits = vec![("x".to_owned(), vec!["b".to_owned(), "c".to_owned()])];
        let call = Call {
            holder: "a",
            request: "r1",
            left_ms: 0,
            waits: &waits,
        };
        assert_eq!(call.args(), ["a", "r1", "1", "x", "2", "b", "c"]);
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
        let cycle = parse(value).unwrap();
        assert_eq!(cycle.len(), 2);
        assert_eq!(cycle[1].held_by, "a");
        assert!(
            parse(Value::Array(vec![Value::Int(5), Value::Int(0)]))
                .unwrap()
                .is_empty()
        );
    }
}
