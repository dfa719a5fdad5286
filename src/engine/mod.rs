//! The lock engine: every lock operation as one Lua script on one shard,
//! with typed inputs and outcomes. The gRPC layer validates requests and
//! maps outcomes to replies; the semantics (who gets a permit, fencing,
//! expiry, cleanup) live here and in `lua/`.

pub mod keys;
pub mod scripts;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::store::{Store, StoreError};
use keys::{LAYOUT_VERSION, Layout};
use scripts::Scripts;

/// A lock, named within a namespace. Both are already validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockId {
    pub namespace: String,
    pub name: String,
}

/// One permit of a lock, as stored in its grant record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub holder: String,
    pub fencing_token: u64,
    pub slot: u32,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
    pub ttl_ms: u64,
    pub kind: String,
    pub metadata: BTreeMap<String, String>,
}

/// A validated acquire request.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub lock: LockId,
    pub holder: String,
    pub limit: u32,
    pub ttl_ms: u64,
    pub kind: String,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// A new grant; `holders` counts live holders including it.
    Acquired { grant: Grant, holders: u32 },
    /// The holder already held a live grant: that grant, unchanged.
    AlreadyHeld { grant: Grant, holders: u32 },
    /// Every permit is taken; the first lease ends at `next_expiry_at_ms`.
    Busy {
        holders: u32,
        next_expiry_at_ms: i64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released,
    NotHeld,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    Extended(Grant),
    NotHeld,
}

/// What Inspect sees of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    pub now_ms: i64,
    pub limit: u32,
    pub waiters: u32,
    /// Live holders, by slot.
    pub holders: Vec<Grant>,
}

/// The lock engine. Shared by all handlers; cheap to use concurrently.
pub struct LockEngine {
    store: Store,
    layout: Layout,
    scripts: Scripts,
    /// Set once the data in Redis is known to use this deployment's layout;
    /// until then every operation answers UNAVAILABLE.
    layout_verified: AtomicBool,
}

/// Why the layout recorded in Redis cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "redis holds tumbler data written with {found}; this server is configured for {expected} (the shard count of a deployment cannot change)"
    )]
    Mismatch { found: String, expected: String },
}

impl LockEngine {
    pub fn new(store: Store, layout: Layout) -> Self {
        LockEngine {
            store,
            layout,
            scripts: Scripts::new(),
            layout_verified: AtomicBool::new(false),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Records this deployment's layout in Redis, or checks the one already
    /// there: the shard count is fixed per deployment, since moving it
    /// would move every lock to another shard.
    pub async fn verify_layout(&self) -> Result<(), LayoutError> {
        let meta = self.layout.meta_key();
        let expected = format!("v{LAYOUT_VERSION}/{} shards", self.layout.shards());
        let mut write = redis::cmd("HSETNX");
        write.arg(&meta).arg("layout").arg(&expected);
        let _: i64 = self.store.command(write).await?;
        let mut read = redis::cmd("HGET");
        read.arg(&meta).arg("layout");
        let found: String = self.store.command(read).await?;
        if found != expected {
            return Err(LayoutError::Mismatch { found, expected });
        }
        self.layout_verified.store(true, Ordering::Release);
        Ok(())
    }

    pub fn is_layout_verified(&self) -> bool {
        self.layout_verified.load(Ordering::Acquire)
    }

    fn ready(&self) -> Result<(), StoreError> {
        if self.is_layout_verified() {
            Ok(())
        } else {
            Err(StoreError::Unavailable(
                "the redis key layout is not verified yet".into(),
            ))
        }
    }

    pub async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&req.lock.namespace, &req.lock.name);
        let metadata = serde_json::to_string(&req.metadata)
            .map_err(|e| StoreError::Protocol(format!("metadata encoding: {e}")))?;
        let (status, record, expires_at, holders, next_expiry): (i64, String, i64, u32, i64) = self
            .store
            .run_script(
                &self.scripts.acquire,
                &[&keys.holders, &keys.info, &keys.index, &keys.fence],
                &[
                    &req.holder,
                    &req.limit.to_string(),
                    &req.ttl_ms.to_string(),
                    &req.kind,
                    &metadata,
                    &req.lock.name,
                ],
            )
            .await?;
        match status {
            1 => Ok(AcquireOutcome::Acquired {
                grant: parse_grant(&req.holder, &record, expires_at)?,
                holders,
            }),
            2 => Ok(AcquireOutcome::AlreadyHeld {
                grant: parse_grant(&req.holder, &record, expires_at)?,
                holders,
            }),
            0 => Ok(AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms: next_expiry,
            }),
            other => Err(StoreError::Protocol(format!("acquire status {other}"))),
        }
    }

    pub async fn release(
        &self,
        lock: &LockId,
        holder: &str,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let released: i64 = self
            .store
            .run_script(
                &self.scripts.release,
                &[&keys.holders, &keys.info, &keys.index],
                &[holder, &token_arg(fencing_token), &lock.name],
            )
            .await?;
        Ok(if released == 1 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Resets the remaining lease to `ttl_ms` (or the grant's own ttl).
    pub async fn extend(
        &self,
        lock: &LockId,
        holder: &str,
        ttl_ms: Option<u64>,
        fencing_token: Option<u64>,
    ) -> Result<ExtendOutcome, StoreError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let ttl = ttl_ms.map(|t| t.to_string()).unwrap_or_default();
        let (extended, record, expires_at): (i64, String, i64) = self
            .store
            .run_script(
                &self.scripts.extend,
                &[&keys.holders, &keys.info, &keys.index],
                &[holder, &token_arg(fencing_token), &ttl, &lock.name],
            )
            .await?;
        if extended == 1 {
            Ok(ExtendOutcome::Extended(parse_grant(
                holder, &record, expires_at,
            )?))
        } else {
            Ok(ExtendOutcome::NotHeld)
        }
    }

    pub async fn inspect(&self, lock: &LockId) -> Result<LockState, StoreError> {
        self.ready()?;
        let keys = self.layout.lock_keys(&lock.namespace, &lock.name);
        let (now_ms, limit, waiters, live): (i64, u32, u32, Vec<(String, i64, String)>) = self
            .store
            .run_script(
                &self.scripts.inspect,
                &[&keys.holders, &keys.info, &keys.queue],
                &[],
            )
            .await?;
        let mut holders = live
            .iter()
            .map(|(holder, expires_at, record)| parse_grant(holder, record, *expires_at))
            .collect::<Result<Vec<_>, _>>()?;
        holders.sort_by_key(|grant| grant.slot);
        Ok(LockState {
            now_ms,
            limit,
            waiters,
            holders,
        })
    }
}

/// The fencing-token argument of release and extend: '' means any token.
fn token_arg(token: Option<u64>) -> String {
    token.map(|t| t.to_string()).unwrap_or_default()
}

/// Decodes a grant record: `token|slot|acquired_at_ms|ttl_ms|kind|metadata`.
fn parse_grant(holder: &str, record: &str, expires_at_ms: i64) -> Result<Grant, StoreError> {
    let bad = || StoreError::Protocol(format!("grant record of {holder:?} not understood"));
    let mut fields = record.splitn(6, '|');
    let mut next = || fields.next().ok_or_else(bad);
    let fencing_token = next()?.parse().map_err(|_| bad())?;
    let slot = next()?.parse().map_err(|_| bad())?;
    let acquired_at_ms = next()?.parse().map_err(|_| bad())?;
    let ttl_ms = next()?.parse().map_err(|_| bad())?;
    let kind = next()?.to_owned();
    let metadata = serde_json::from_str(next()?).map_err(|_| bad())?;
    Ok(Grant {
        holder: holder.to_owned(),
        fencing_token,
        slot,
        acquired_at_ms,
        expires_at_ms,
        ttl_ms,
        kind,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_record_round_trips_metadata_with_separators() {
        let grant = parse_grant(
            "w-1",
            r#"1732230000000001|3|1732230000000|5000|jobs|{"a|b":"c|d"}"#,
            1732230005000,
        )
        .unwrap();
        assert_eq!(grant.fencing_token, 1_732_230_000_000_001);
        assert_eq!(grant.slot, 3);
        assert_eq!(grant.ttl_ms, 5000);
        assert_eq!(grant.kind, "jobs");
        assert_eq!(grant.metadata.get("a|b").map(String::as_str), Some("c|d"));
    }

    #[test]
    fn malformed_grant_record_is_a_protocol_error() {
        assert!(parse_grant("w", "12|x|3|4|k|{}", 0).is_err());
        assert!(parse_grant("w", "12|1|3", 0).is_err());
    }
}
