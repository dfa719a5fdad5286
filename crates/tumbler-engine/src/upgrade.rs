//! The layout upgrade in place, v3 → v4 (decision 0090): `tumbler
//! upgrade-layout`, run once while no replica serves.
//!
//! Layout v4 moved a waiter's record and liveness deadline into the lock's
//! hash; a lock nobody waits for is byte for byte what it was. So held
//! locks, their grants and fencing tokens are kept, and what goes is what
//! only waiters wrote: every `…:q:`, `…:d:` and `…:w:` key. Their requests
//! died with the replicas that served them (a waiting RPC lives on its
//! replica's connection). Then the layout record moves from `v3/<n>` to
//! `v4/<n>` (only if it still says `v3/<n>`), and replicas of v4 serve.
//!
//! Replicas of two layouts never serve one Redis: a replica checks the
//! record on every new connection and every health tick (`readiness.rs`),
//! so a v4 replica refuses a v3 record and a v3 one a v4 record. The
//! upgrade refuses while anything still listens on the wake channel or a
//! library other than its own was named within the last two heartbeats
//! (`libraries.rs`): replicas still run.

use std::collections::HashMap;

use super::keys::{LAYOUT_VERSION, Layout};
use super::readiness::layout_record;
use super::scripts::Scripts;
use crate::errors::LayoutError;
use crate::store::{ScanCursor, Store, StoreError};

/// The layout an upgrade starts from.
const FROM_VERSION: u32 = 3;

/// What [`upgrade`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Upgraded {
    /// The record found, `v3/<n> shards` (or the current one: nothing to do).
    pub from: String,
    /// The record now in force.
    pub to: String,
    /// Keys of the old layout's queues deleted.
    pub queue_keys_deleted: u64,
}

/// Why an upgrade did not run.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "replicas still run against this redis ({0}); stop every replica first, then run the upgrade again (or pass --force when they are gone)"
    )]
    Running(String),
}

/// Upgrades the deployment's data from layout v3 to v4, or does nothing
/// when it is v4 already. `force`: skip the check for running replicas.
/// `store` must be a bare one: an engine's connections refuse v3 data.
pub async fn upgrade_layout(
    store: &Store,
    layout: &Layout,
    force: bool,
) -> Result<Upgraded, UpgradeError> {
    let meta = layout.meta_key();
    let to = layout_record(layout);
    let from = to.replacen(
        &format!("v{LAYOUT_VERSION}/"),
        &format!("v{FROM_VERSION}/"),
        1,
    );
    let found: Option<String> = store
        .command(redis::cmd("HGET").arg(&meta).arg("layout").clone())
        .await?;
    match found {
        Some(found) if found == to => {
            return Ok(Upgraded {
                from: found,
                to,
                queue_keys_deleted: 0,
            });
        }
        Some(found) if found == from => {}
        Some(found) => {
            return Err(LayoutError::Mismatch {
                found,
                expected: from,
            }
            .into());
        }
        // Nothing to upgrade: the first replica claims the new layout.
        None => {
            return Ok(Upgraded {
                from: String::new(),
                to,
                queue_keys_deleted: 0,
            });
        }
    }
    if !force && let Some(running) = still_running(store, layout).await? {
        return Err(UpgradeError::Running(running));
    }
    let mut deleted = 0;
    for kind in ["q", "d", "w"] {
        deleted += delete_queue_keys(store, layout, kind).await?;
    }
    // The record moves only from the old layout (a replica of another
    // shard count, or a second upgrade, finds it moved).
    let swapped: i64 = store
        .command(
            redis::cmd("EVAL")
                .arg(SWAP)
                .arg(1)
                .arg(&meta)
                .arg(&from)
                .arg(&to)
                .clone(),
        )
        .await?;
    if swapped == 0 {
        let found: Option<String> = store
            .command(redis::cmd("HGET").arg(&meta).arg("layout").clone())
            .await?;
        let found = found.unwrap_or_default();
        if found != to {
            return Err(LayoutError::Mismatch {
                found,
                expected: from,
            }
            .into());
        }
    }
    Ok(Upgraded {
        from,
        to,
        queue_keys_deleted: deleted,
    })
}

/// Sets the layout record to ARGV[2] only while it is ARGV[1].
const SWAP: &str = "if redis.call('HGET', KEYS[1], 'layout') == ARGV[1] then \
    redis.call('HSET', KEYS[1], 'layout', ARGV[2]) return 1 end return 0";

/// What says replicas still run: subscribers of the wake channel on any
/// primary (every replica keeps one), or a library other than this
/// build's named within two heartbeats. None when nothing does.
async fn still_running(store: &Store, layout: &Layout) -> Result<Option<String>, StoreError> {
    let numsub = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(layout.wake_channel())
        .clone();
    let mut listening = 0;
    for reply in store.on_every_primary(numsub).await? {
        let counts: HashMap<String, i64> = redis::from_redis_value(reply?)
            .map_err(|e| StoreError::Protocol(format!("PUBSUB NUMSUB: {e}")))?;
        listening += counts.values().sum::<i64>();
    }
    if listening > 0 {
        return Ok(Some(format!(
            "{listening} subscription(s) to {}",
            layout.wake_channel()
        )));
    }
    let seen: HashMap<String, i64> = store
        .command(redis::cmd("HGETALL").arg(layout.libraries_key()).clone())
        .await?;
    let (secs, _): (i64, i64) = store.command(redis::cmd("TIME")).await?;
    let now = secs * 1000;
    let own = Scripts::compile().library_name;
    let recent: Vec<String> = seen
        .into_iter()
        .filter(|(library, at)| *library != own && now - at < HEARTBEAT_WINDOW_MS)
        .map(|(library, at)| format!("{library} named {} s ago", (now - at).max(0) / 1000))
        .collect();
    Ok((!recent.is_empty()).then(|| recent.join(", ")))
}

/// Two heartbeats of a replica with the default grace (a heartbeat every
/// quarter of it, at most a minute apart: `libraries.rs`).
const HEARTBEAT_WINDOW_MS: i64 = 2 * 60 * 1000;

/// Deletes every key of `kind` (`q`, `d`, `w`: `<prefix>:{<ns>:<s>}:<kind>:<name>`)
/// on every primary; returns how many. The pattern's `*` may reach past
/// the tag, so each key found is checked: a namespace holds no brace, so
/// the first `}` closes the tag, and the kind must follow it (a lock
/// named `a}:d:b` is not a queue key).
async fn delete_queue_keys(store: &Store, layout: &Layout, kind: &str) -> Result<u64, StoreError> {
    let pattern = layout.tagged_pattern(kind);
    let prefix = format!("{}:{{", layout.prefix());
    let after_tag = format!("}}:{kind}:");
    let mut cursor = Some(ScanCursor::default());
    let mut deleted = 0;
    while let Some(at) = cursor {
        let (keys, next) = store.scan(at, &pattern, 500).await?;
        for key in keys {
            let Some(rest) = key.strip_prefix(&prefix) else {
                continue;
            };
            if !rest
                .find('}')
                .is_some_and(|close| rest[close..].starts_with(&after_tag))
            {
                continue;
            }
            let gone: i64 = store
                .command(redis::cmd("UNLINK").arg(&key).clone())
                .await?;
            deleted += gone as u64;
        }
        cursor = next;
    }
    Ok(deleted)
}
