//! A held set's Release and Extend (decision 0076), each lock pinned to
//! its fencing token when the caller names it (decision 0079): a late
//! release of an old set never touches the holder's newer one.

use tokio::time::Instant;

use super::Multi;
use crate::locks::GrantRef;
use crate::{EngineError, ExtendOutcome, Grant, ReleaseOutcome, SetLock};

impl Multi {
    /// Releases each lock of a multi-lock's set the holder holds, each
    /// pinned to its fencing token when it has one (decision 0079): every
    /// one, also when one of them was not held (a broken set is of no use
    /// to its holder). A lock whose grant carries another token is left
    /// alone and counts as not held. Released only when all were held.
    pub(crate) async fn release_set(
        &self,
        locks: &[SetLock],
        holder: &str,
    ) -> Result<ReleaseOutcome, EngineError> {
        let mut outcome = None;
        let mut not_held = false;
        for (lock, token) in locks {
            match self.locks.release(lock, holder, *token, None).await? {
                ReleaseOutcome::NotHeld => not_held = true,
                released => outcome = outcome.or(Some(released)),
            }
        }
        Ok(match outcome {
            Some(released) if !not_held => released,
            _ => ReleaseOutcome::NotHeld,
        })
    }

    /// Extends each lock of a multi-lock's set to `ttl_ms` (or each
    /// grant's own ttl), each pinned to its fencing token when it has one;
    /// answers the grant whose new expiry is the earliest. When one is not
    /// held (or carries another token), the set is released instead, each
    /// lock pinned as it was asked (nothing of a broken set is kept alive,
    /// nothing of a newer one touched), and the answer is NotHeld.
    pub(crate) async fn extend_set(
        &self,
        locks: &[SetLock],
        holder: &str,
        ttl: Option<crate::Ttl>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        let mut earliest: Option<Grant> = None;
        for (lock, fencing_token) in locks {
            let grant = GrantRef {
                lock,
                holder,
                fencing_token: *fencing_token,
            };
            match self.locks.extend(grant, ttl, answer_by, None).await? {
                ExtendOutcome::Extended(grant) => {
                    if earliest
                        .as_ref()
                        .is_none_or(|e| grant.expires_at_ms < e.expires_at_ms)
                    {
                        earliest = Some(grant);
                    }
                }
                ExtendOutcome::NotHeld => {
                    self.release_set(locks, holder).await?;
                    return Ok(ExtendOutcome::NotHeld);
                }
            }
        }
        Ok(earliest.map_or(ExtendOutcome::NotHeld, ExtendOutcome::Extended))
    }
}
