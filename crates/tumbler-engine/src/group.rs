//! Group commit: operations bound for one shard go to Redis in one
//! function call when more than one is ready (`lua/batch.lua` runs them in
//! order, each with its own reply). Redis is one thread and a call's own
//! overhead (parsing, the reply, the `KEYS`/`ARGV` tables, Lua's garbage,
//! `TIME`, the fencing counter's write) is paid per call, so a batch pays
//! it once for all its operations.
//!
//! Natural batching, no timer: while a call for a slot is in flight, new
//! operations for that slot queue; when it returns, everything queued
//! goes out as one call (up to [`GroupCommit::max_ops`] operations and
//! [`GroupCommit::max_bytes`] of keys and arguments; the rest follows in
//! the next). An operation that finds nothing in flight goes at once as
//! its own function's call, so an idle slot adds no latency and no batch
//! overhead.
//!
//! A slot here is a hash tag: on a Redis Cluster every key of a call must
//! share its slot, so only one tag's operations share a call; on one
//! server (or the master Sentinel names), where slots do not constrain
//! keys, a namespace's shards share one queue (`across_shards`).
//!
//! Failure: an operation that fails in Lua fails alone (its reply is an
//! error); a Redis error or timeout of the call fails every operation in
//! it, each as its own call would have failed. Each operation carries its
//! own answer-by time, which `lua/shared/numbers.lua` `late` checks, so a batch
//! that runs late refuses per operation: no grant after its caller was
//! told no.
//!
//! Why a std `Mutex`: held for a few map and queue steps, never across an
//! `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use redis::Value;
use tokio::sync::oneshot;

use crate::store::{Function, Store, StoreError, convert};

/// Group commit settings (the `--no-group-commit` and
/// `--group-commit-max-*` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupCommit {
    /// Whether operations for one slot may share a call at all.
    pub enabled: bool,
    /// Most operations in one call.
    pub max_ops: usize,
    /// Most bytes of keys and arguments in one call (an operation larger
    /// than this still goes, alone).
    pub max_bytes: usize,
    /// On one server or through Sentinel: a namespace's shards share a
    /// queue (and a call). Never on a Redis Cluster.
    pub across_shards: bool,
    /// Calls a slot may have in flight at once: an operation that finds
    /// fewer goes at once; one that finds this many queues.
    pub in_flight: usize,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            enabled: true,
            max_ops: 64,
            max_bytes: 256 * 1024,
            across_shards: true,
            in_flight: 1,
        }
    }
}

/// The operations that may share a call: the hot path's writes on locks
/// and sessions. (Walks over a shard and reads go alone.)
pub(super) fn groups(operation: &str) -> bool {
    matches!(
        operation,
        "acquire"
            | "release"
            | "extend"
            | "renew"
            | "dequeue"
            | "session_touch"
            | "session_note"
            | "session_end"
    )
}

/// Batch sizes counted per bucket: 1, 2, 3–4, 5–8, …, 65 and more.
pub const SIZE_BUCKETS: [&str; 8] = ["1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65+"];

fn bucket(size: usize) -> usize {
    (usize::BITS - (size.max(1) - 1).leading_zeros()).min(7) as usize
}

/// One operation waiting for the slot's call in flight to return.
struct Queued {
    operation: String,
    keys: Vec<String>,
    args: Vec<String>,
    bytes: usize,
    reply: oneshot::Sender<Result<Value, StoreError>>,
}

/// A slot's state: its calls in flight, and who waits for one.
#[derive(Default)]
struct Slot {
    in_flight: usize,
    pending: VecDeque<Queued>,
}

/// The slots with a call in flight, and the batch function.
pub(super) struct Groups {
    settings: GroupCommit,
    cluster: bool,
    store: Store,
    /// `lua/batch.lua`'s function.
    batch: Function,
    /// The library's function name prefix (`tumbler_<hash>_`).
    prefix: String,
    slots: Mutex<HashMap<String, Slot>>,
    /// Calls sent, per batch size bucket (`SIZE_BUCKETS`).
    sizes: [std::sync::atomic::AtomicU64; 8],
}

impl Groups {
    pub(super) fn new(
        settings: GroupCommit,
        store: Store,
        batch: Function,
        prefix: String,
    ) -> Arc<Self> {
        Arc::new(Groups {
            settings,
            cluster: store.is_cluster(),
            store,
            batch,
            prefix,
            slots: Mutex::default(),
            sizes: Default::default(),
        })
    }

    /// The queue an operation on `key` joins: its hash tag on a cluster;
    /// elsewhere its tag without the shard number (a namespace's shards
    /// together), when `across_shards`.
    fn slot_of<'a>(&self, key: &'a str) -> &'a str {
        let Some(open) = key.find('{') else {
            return key;
        };
        let Some(close) = key[open..].find('}').map(|c| open + c) else {
            return key;
        };
        let tag = &key[open..=close];
        if self.cluster || !self.settings.across_shards {
            return tag;
        }
        match tag.rfind(':') {
            Some(colon) => &tag[..colon],
            None => tag,
        }
    }

    /// Calls sent so far per batch size bucket ([`SIZE_BUCKETS`]).
    pub(super) fn sizes(&self) -> Vec<u64> {
        self.sizes
            .iter()
            .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    }

    fn count(&self, size: usize) {
        self.sizes[bucket(size)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("tumbler_group_commit_calls_total", "size" => SIZE_BUCKETS[bucket(size)])
            .increment(1);
    }

    /// Runs `script` (an operation that [`groups`]) with `keys` and
    /// `args`: at once as its own call when its slot has nothing in
    /// flight, else in the batch that follows the call in flight.
    pub(super) async fn run(
        self: &Arc<Self>,
        script: &Function,
        operation: &str,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, StoreError> {
        let slot = self.slot_of(keys.first().copied().unwrap_or_default());
        let waiting = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            let state = slots.entry(slot.to_owned()).or_default();
            if state.in_flight >= self.settings.in_flight.max(1) {
                let (tx, rx) = oneshot::channel();
                let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
                let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
                let bytes = keys.iter().chain(&args).map(String::len).sum::<usize>();
                state.pending.push_back(Queued {
                    operation: operation.to_owned(),
                    keys,
                    args,
                    bytes,
                    reply: tx,
                });
                Some(rx)
            } else {
                state.in_flight += 1;
                None
            }
        };
        if let Some(rx) = waiting {
            // Within the command timeout from now, as its own call would
            // be: its answer-by time (no later than that) makes sure a
            // batch that runs later grants it nothing.
            let timeout = self.store.command_timeout();
            return match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(_)) => Err(StoreError::Unavailable(
                    "the batch carrying this call was dropped".into(),
                )),
                Err(_) => Err(StoreError::Unavailable(format!(
                    "redis did not answer within {timeout:?}"
                ))),
            };
        }
        // Nothing in flight: this call goes alone. Whatever queues behind
        // it goes when it returns, or is dropped (its caller gone).
        let flight = Flight {
            groups: self.clone(),
            slot: slot.to_owned(),
        };
        self.count(1);
        let reply = self.store.run_script::<Value>(script, keys, args).await;
        drop(flight);
        reply
    }

    /// Takes the next batch of `slot` (up to the caps) for a call that
    /// just ended, or, when nothing waits, counts that call out of flight.
    fn next_batch(&self, slot: &str) -> Option<Vec<Queued>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let state = slots.get_mut(slot)?;
        if state.pending.is_empty() {
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 {
                slots.remove(slot);
            }
            return None;
        }
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = state.pending.front() {
            if !batch.is_empty()
                && (batch.len() >= self.settings.max_ops.max(1)
                    || bytes + next.bytes > self.settings.max_bytes)
            {
                break;
            }
            bytes += next.bytes;
            batch.extend(state.pending.pop_front());
        }
        Some(batch)
    }

    /// Sends the batches of `slot` one after the other until nothing
    /// waits (a task of its own: its callers wait on their replies).
    async fn drive(self: Arc<Self>, slot: String, mut batch: Vec<Queued>) {
        loop {
            self.send(batch).await;
            match self.next_batch(&slot) {
                Some(next) => batch = next,
                None => return,
            }
        }
    }

    /// One call for `batch`: its own function's for one operation,
    /// `lua/batch.lua` for more; each operation gets its own reply.
    async fn send(&self, batch: Vec<Queued>) {
        self.count(batch.len());
        if let [one] = &batch[..] {
            let function = Function {
                function: format!("{}{}", self.prefix, one.operation),
                library: self.batch.library.clone(),
            };
            let keys: Vec<&str> = one.keys.iter().map(String::as_str).collect();
            let args: Vec<&str> = one.args.iter().map(String::as_str).collect();
            let reply = self
                .store
                .run_script::<Value>(&function, &keys, &args)
                .await;
            if let Some(one) = batch.into_iter().next() {
                let _ = one.reply.send(reply);
            }
            return;
        }
        let mut keys: Vec<&str> = Vec::new();
        let mut args: Vec<String> = Vec::new();
        for op in &batch {
            keys.extend(op.keys.iter().map(String::as_str));
            args.push(op.operation.clone());
            args.push(op.keys.len().to_string());
            args.push(op.args.len().to_string());
            args.extend(op.args.iter().cloned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = self
            .store
            .run_script::<Value>(&self.batch, &keys, &args)
            .await;
        match reply {
            Ok(Value::Array(replies)) if replies.len() == batch.len() => {
                for (op, reply) in batch.into_iter().zip(replies) {
                    let _ = op.reply.send(own_reply(reply));
                }
            }
            Ok(other) => {
                let detail = format!("batch of {} answered {other:?}", batch.len());
                for op in batch {
                    let _ = op.reply.send(Err(StoreError::Protocol(detail.clone())));
                }
            }
            Err(err) => {
                for op in batch {
                    let _ = op.reply.send(Err(same(&err)));
                }
            }
        }
    }
}

/// One operation's reply out of a batch's: a string is its error (see
/// `lua/batch.lua`), read as the error reply its own call would have got.
fn own_reply(reply: Value) -> Result<Value, StoreError> {
    let text = match &reply {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        _ => return convert::<Value>(reply),
    };
    let coded = text
        .split(' ')
        .next()
        .is_some_and(|code| !code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase()));
    let line = if coded {
        format!("-{text}\r\n")
    } else {
        format!("-ERR {text}\r\n")
    };
    match redis::parse_redis_value(line.as_bytes()) {
        Ok(error @ Value::ServerError(_)) => convert::<Value>(error),
        _ => Err(StoreError::Protocol(text)),
    }
}

/// A failure of a batch's call, for each of its operations.
fn same(err: &StoreError) -> StoreError {
    match err {
        StoreError::Unavailable(s) => StoreError::Unavailable(s.clone()),
        StoreError::Denied(s) => StoreError::Denied(s.clone()),
        StoreError::Protocol(s) => StoreError::Protocol(s.clone()),
        StoreError::Config(s) => StoreError::Config(s.clone()),
    }
}

/// A slot's call in flight: when it ends (returned, or dropped with its
/// caller), whatever queued behind it goes out as the next batch, on a
/// task of its own.
struct Flight {
    groups: Arc<Groups>,
    slot: String,
}

impl Drop for Flight {
    fn drop(&mut self) {
        let Some(batch) = self.groups.next_batch(&self.slot) else {
            return;
        };
        let slot = std::mem::take(&mut self.slot);
        let groups = self.groups.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(groups.drive(slot, batch));
            }
            Err(_) => {
                // No runtime (shutting down): nobody can send them.
                drop(batch);
                groups
                    .slots
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_fall_in_power_of_two_buckets() {
        let found: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 1000]
            .into_iter()
            .map(bucket)
            .collect();
        assert_eq!(found, vec![0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]);
    }

    #[test]
    fn a_string_in_a_batch_reply_is_that_operations_error() {
        let busy = own_reply(Value::BulkString(b"BUSYKEY not now".to_vec()));
        assert!(matches!(busy, Err(StoreError::Protocol(_))), "{busy:?}");
        let oom = own_reply(Value::BulkString(b"OOM command not allowed".to_vec()));
        assert!(matches!(oom, Err(StoreError::Unavailable(_))), "{oom:?}");
        let lua = own_reply(Value::BulkString(b"user_function:1: attempt".to_vec()));
        assert!(matches!(lua, Err(StoreError::Protocol(_))), "{lua:?}");
        let fine = own_reply(Value::Array(vec![Value::Int(1)]));
        assert!(matches!(fine, Ok(Value::Array(_))), "{fine:?}");
    }

    #[test]
    fn only_the_hot_path_groups() {
        for op in ["acquire", "release", "extend", "renew", "dequeue"] {
            assert!(groups(op), "{op}");
        }
        for op in ["inspect", "list", "reap", "clear", "batch", "count"] {
            assert!(!groups(op), "{op}");
        }
    }
}
