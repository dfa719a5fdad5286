//! A session's multi-lock sets (decision 0078): a set taken through a
//! session is a set of session grants that live and end together. Each
//! grant carries its set's id here (`Sessions`) and in the session's
//! record (`record::grant_value`), so a resume keeps the set; a lock of
//! a set that is lost takes the rest with it (released, told lost), and
//! a command may release a set only whole.

use std::collections::{HashMap, HashSet};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::ops::session_record as record;
use super::super::sessions::{LOST_SET_BROKEN, LostGrant};
use super::super::{EngineError, LockId, MultiOutcome, Namespace, ReleaseOutcome, Ttl};
use super::SessionKeeper;

/// The lock names of a set, for messages.
fn listed(locks: &[LockId]) -> String {
    let names: Vec<&str> = locks.iter().map(|lock| lock.name.as_str()).collect();
    names.join(", ")
}

impl SessionKeeper {
    /// The id the grants of a session's multi-lock of `locks` will carry:
    /// a new one, or the set's own when exactly that set is held already
    /// (a retry, answered ALREADY_HELD). A set naming a lock the stream
    /// holds alone or in another set is refused: one lock in two sets
    /// would tie their ends together behind the client's back.
    pub(crate) fn set_for(
        &self,
        session: &str,
        epoch: u64,
        locks: &[LockId],
    ) -> Result<u64, EngineError> {
        let mut same = None;
        for lock in locks {
            let held = match self.sessions().set_of(session, epoch, lock) {
                Some((set, members)) => {
                    let whole = members.len() == locks.len()
                        && members.iter().all(|member| locks.contains(member));
                    if whole && same.is_none_or(|s| s == set) {
                        same = Some(set);
                        continue;
                    }
                    format!("in the set ({})", listed(&members))
                }
                None if self.sessions().holds(session, epoch, lock) => "alone".to_owned(),
                None => continue,
            };
            return Err(EngineError::SetMismatch(format!(
                "names: `{}` is held by this session {held}; a lock belongs to one set at a time (release it first, or ask for that set exactly)",
                lock.name
            )));
        }
        Ok(same.unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0))
    }

    /// After a session's multi-lock: its grants named in the record with
    /// their set (one call) and renewed by this replica, as a set. Not
    /// named (another stream resumed the session, Redis trouble): released
    /// again and refused, as a single grant is (`keep_grant`).
    pub(crate) async fn keep_set(
        &self,
        (session, epoch): (&str, u64),
        (namespace, ttl, set): (&Namespace, Ttl, u64),
        outcome: &MultiOutcome,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<(), EngineError> {
        let MultiOutcome::Acquired { grants, .. } = outcome else {
            return Ok(());
        };
        let granted_at = Instant::now();
        let locks: Vec<(LockId, u64)> = (grants.iter())
            .map(|(name, grant)| {
                let lock = LockId {
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                (lock, grant.fencing_token)
            })
            .collect();
        let values = (locks.iter())
            .map(|(lock, token)| (lock, Some(record::grant_value(*token, Some(set)))));
        let noted = self.note(session, epoch, values).await;
        if !matches!(noted, Ok(true)) {
            for (lock, token) in &locks {
                let _ = (self.locks)
                    .release(lock, session, Some(*token), Some(epoch))
                    .await;
            }
            return Err(noted.err().unwrap_or(EngineError::SessionMoved));
        }
        for (lock, token) in &locks {
            let (ttl, lost) = (ttl.duration(), lost.clone());
            (self.sessions()).add(
                session,
                epoch,
                lock,
                *token,
                ttl,
                granted_at,
                lost,
                Some(set),
            );
        }
        Ok(())
    }

    /// A session's release command of `locks` (one: `name`; several:
    /// `names`, the field a refusal names). Every set a lock belongs to
    /// must be named whole: releasing part of a set would leave the rest
    /// held as a set that is not one. Several locks answer as a
    /// multi-lock's Release: RELEASED when every one was held, NOT_HELD
    /// when any was not, the others released all the same.
    pub(crate) async fn release_named(
        &self,
        session: &str,
        epoch: u64,
        locks: &[LockId],
        field: &str,
    ) -> Result<ReleaseOutcome, EngineError> {
        for lock in locks {
            if let Some((_, members)) = self.sessions().set_of(session, epoch, lock)
                && members.iter().any(|member| !locks.contains(member))
            {
                return Err(EngineError::SetMismatch(format!(
                    "{field}: `{}` is one lock of a set this session holds ({}); release the set whole, with `names`",
                    lock.name,
                    listed(&members)
                )));
            }
        }
        if let [lock] = locks {
            return self.release(session, epoch, lock).await;
        }
        let (mut released, mut not_held, mut failed) = (None, false, None);
        for lock in locks {
            let token = self.sessions().remove(session, epoch, lock);
            match self.locks.release(lock, session, token, Some(epoch)).await {
                Ok(ReleaseOutcome::NotHeld) => not_held = true,
                Ok(outcome) => released = released.or(Some(outcome)),
                Err(err) => failed = failed.or(Some(err)),
            }
        }
        let off = locks.iter().map(|lock| (lock, None));
        if let Err(err) = self.note(session, epoch, off).await {
            tracing::warn!(%session, error = %err, "released grants stay named in the session record");
        }
        match (failed, released) {
            (Some(err), _) => Err(err),
            (None, Some(outcome)) if !not_held => Ok(outcome),
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }

    /// Releases a grant whose set broke (`LOST_SET_BROKEN`: another lock
    /// of it was lost; it is no longer renewed), pinned to its token and
    /// the stream's epoch, and takes it off the record.
    pub(crate) async fn release_broken(&self, session: &str, epoch: u64, lost: &LostGrant) {
        let (lock, token) = (&lost.lock, Some(lost.fencing_token));
        let released = self.locks.release(lock, session, token, Some(epoch)).await;
        if let Err(err) = released {
            tracing::warn!(%session, error = %err, lock = %lock.name, "a lock of a broken set was not released; it expires at its lease");
        }
        let _ = self.note(session, epoch, [(lock, None)]).await;
    }

    /// On resume: a set one lock of which is gone is not kept in part.
    /// Its kept locks are released and move from `kept` to `lost`.
    pub(super) async fn break_sets(
        &self,
        session: &str,
        epoch: u64,
        sets: &HashMap<LockId, u64>,
        kept: &mut Vec<(LockId, u64)>,
        lost: &mut Vec<LostGrant>,
    ) {
        let broken: HashSet<u64> = (lost.iter())
            .filter_map(|grant| sets.get(&grant.lock).copied())
            .collect();
        if broken.is_empty() {
            return;
        }
        let (going, staying): (Vec<_>, Vec<_>) = std::mem::take(kept)
            .into_iter()
            .partition(|(lock, _)| sets.get(lock).is_some_and(|set| broken.contains(set)));
        *kept = staying;
        for (lock, fencing_token) in going {
            self.sessions().remove(session, epoch, &lock);
            let grant = LostGrant {
                lock,
                fencing_token,
                reason: LOST_SET_BROKEN,
            };
            self.release_broken(session, epoch, &grant).await;
            lost.push(grant);
        }
    }
}
