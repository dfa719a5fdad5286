//! [`Libraries`]: tumbler's function libraries in Redis, kept and swept.
//!
//! Each build whose Lua changed loads a library of its own
//! (`tumbler_<code hash>`, `scripts.rs`), so that two versions can serve
//! one Redis during a rolling upgrade. Nothing would ever remove the old
//! ones. Every replica therefore records, in the hash
//! `<prefix>:libraries`, its library's name with the Redis time it last
//! said so (a heartbeat, every quarter of the grace period), and sweeps:
//! a tumbler library on any primary that no replica has named for the
//! grace period is deleted (`FUNCTION DELETE`), with its record.
//!
//! A library found without a record (a build from before the records, or
//! a deployment with another key prefix, whose records live elsewhere) is
//! recorded as seen now, and so gets the whole grace period too. What
//! makes a mistake harmless: a replica whose library is gone loads it
//! again with its next call (`tumbler-store`'s `fcall`), which costs that
//! call one more round trip, never an error. The own library is never
//! deleted, and neither is one named within the grace period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::calls::Calls;
use crate::store::StoreError;

/// The prefix of every library tumbler loads (`scripts.rs`).
const LIBRARY_PREFIX: &str = "tumbler_";

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Libraries deleted (no replica named them for the grace period).
    pub deleted: Vec<String>,
    /// Libraries seen for the first time (recorded now; deleted one grace
    /// period from now unless a replica names them).
    pub recorded: Vec<String>,
}

/// This replica's library: named in Redis while it runs; the others
/// swept once they are no longer named.
pub(super) struct Libraries {
    calls: Arc<Calls>,
    own: String,
    grace: Duration,
}

impl Libraries {
    pub(super) fn new(calls: Arc<Calls>, own: String, grace: Duration) -> Self {
        Libraries { calls, own, grace }
    }

    /// Names the own library and sweeps the others, every quarter of the
    /// grace period (at least every 100 ms, at most every minute), until
    /// the task is dropped. Redis trouble waits for the next round.
    pub(super) async fn run(self) {
        let every = (self.grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        // A failure is worth one warning (e.g. a Redis user without
        // `+function|delete`), not one per round.
        let mut warned = false;
        loop {
            match self.round().await {
                Ok(sweep) => {
                    warned = false;
                    for library in &sweep.deleted {
                        tracing::info!(%library, "deleted a function library no replica has used for the grace period");
                    }
                }
                Err(err) if !warned => {
                    warned = true;
                    tracing::warn!(error = %err, "old function libraries not swept (retrying quietly)");
                }
                Err(err) => {
                    tracing::debug!(error = %err, "function libraries not swept this round")
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    /// One heartbeat and one sweep.
    pub(super) async fn round(&self) -> Result<Sweep, StoreError> {
        let now = self.redis_now_ms().await?;
        let key = self.calls.layout().libraries_key();
        let keep_ms = (self.grace.as_millis() as u64).saturating_mul(3).max(1000);
        let mut pipe = redis::pipe();
        pipe.cmd("HSET")
            .arg(&key)
            .arg(&self.own)
            .arg(now)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(keep_ms)
            .ignore()
            .cmd("HGETALL")
            .arg(&key);
        let (seen,): (HashMap<String, i64>,) = self.calls.store().pipeline(pipe).await?;
        let loaded = self.loaded().await?;
        let grace_ms = self.grace.as_millis() as i64;
        let mut sweep = Sweep::default();
        for library in &loaded {
            if *library == self.own {
                continue;
            }
            match seen.get(library) {
                Some(at) if now - at < grace_ms => {}
                Some(_) => {
                    self.delete(library).await?;
                    sweep.deleted.push(library.clone());
                }
                None => sweep.recorded.push(library.clone()),
            }
        }
        let mut pipe = redis::pipe();
        let mut writes = 0;
        for library in &sweep.recorded {
            pipe.cmd("HSETNX").arg(&key).arg(library).arg(now).ignore();
            writes += 1;
        }
        // Records of libraries gone from every primary, past the grace
        // period, go too (a deployment that upgraded often keeps a short
        // hash).
        for (library, at) in &seen {
            let gone = !loaded.contains(library) || sweep.deleted.contains(library);
            if *library != self.own && gone && now - at >= grace_ms {
                pipe.cmd("HDEL").arg(&key).arg(library).ignore();
                writes += 1;
            }
        }
        // An empty pipeline is not a command Redis understands.
        if writes > 0 {
            let () = self.calls.store().pipeline(pipe).await?;
        }
        Ok(sweep)
    }

    /// Redis' clock in milliseconds (`TIME`).
    async fn redis_now_ms(&self) -> Result<i64, StoreError> {
        let (secs, micros): (i64, i64) = self.calls.store().command(redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// The tumbler libraries loaded on any primary.
    async fn loaded(&self) -> Result<Vec<String>, StoreError> {
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST")
            .arg("LIBRARYNAME")
            .arg(format!("{LIBRARY_PREFIX}*"));
        let mut names = Vec::new();
        for reply in self.calls.store().on_every_primary(list).await? {
            for name in library_names(&reply?) {
                if name.starts_with(LIBRARY_PREFIX) && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        Ok(names)
    }

    /// Deletes `library` on every primary. A primary that lacks it (it
    /// never ran a call, or another replica's sweep came first) answers
    /// an error, which is no failure here.
    async fn delete(&self, library: &str) -> Result<(), StoreError> {
        let mut delete = redis::cmd("FUNCTION");
        delete.arg("DELETE").arg(library);
        for reply in self.calls.store().on_every_primary(delete).await? {
            if let Err(err) = reply
                && !err.to_string().contains("Library not found")
            {
                return Err(err);
            }
        }
        Ok(())
    }
}

/// The `library_name` fields of a `FUNCTION LIST` reply (RESP2: an array
/// of flat field/value arrays; RESP3: an array of maps).
fn library_names(reply: &Value) -> Vec<String> {
    let Value::Array(libraries) = reply else {
        return Vec::new();
    };
    libraries
        .iter()
        .filter_map(|library| {
            let fields: Vec<(&Value, &Value)> = match library {
                Value::Array(flat) => flat
                    .chunks(2)
                    .filter_map(|pair| Some((pair.first()?, pair.get(1)?)))
                    .collect(),
                Value::Map(map) => map.iter().map(|(k, v)| (k, v)).collect(),
                _ => return None,
            };
            fields.into_iter().find_map(|(field, value)| {
                let field: String = redis::from_redis_value(field.clone()).ok()?;
                (field == "library_name")
                    .then(|| redis::from_redis_value(value.clone()).ok())
                    .flatten()
            })
        })
        .collect()
}
