//! A held set's Release and Extend (decision 0076), each lock pinned to
//! its fencing token when the caller names it (decision 0079): a late
//! release of an old set never touches the holder's newer one.
//!
//! Each is one call per slot group, the groups in the acquire's order
//! (`Multi::groups_of`): on one server or Sentinel the whole set in ONE
//! call of `lua/release_many.lua` / `lua/extend_many.lua`, so no other
//! call sees a set half released or half extended. On a Redis Cluster a
//! call per slot: between two groups another call may run (decision 0076
//! admits that window there).

use tokio::time::Instant;

use super::{Group, Multi};
use crate::calls::late;
use crate::errors::{OrTrouble, store_failed};
use crate::{EngineError, ExtendOutcome, Grant, ReleaseOutcome, SetLock, ops};

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
        self.calls.ready().or_trouble()?;
        let groups = self.set_groups(locks);
        let tokens: Vec<Option<u64>> = locks.iter().map(|(_, token)| *token).collect();
        let mut released: Vec<Option<(Grant, i64)>> = vec![None; locks.len()];
        for group in &groups {
            self.release_group(locks, group, holder, &tokens, &mut released)
                .await?;
        }
        if released.iter().any(Option::is_none) {
            return Ok(ReleaseOutcome::NotHeld);
        }
        // The answer names the set's first lock's grant.
        Ok(match released.into_iter().flatten().next() {
            Some((grant, now)) => ReleaseOutcome::Released {
                held_ms: now - grant.acquired_at_ms,
                kind: grant.kind,
            },
            None => ReleaseOutcome::NotHeld,
        })
    }

    /// Extends each lock of a multi-lock's set to `ttl_ms` (or each
    /// grant's own ttl), each pinned to its fencing token when it has one;
    /// answers the grant whose new expiry is the earliest. A group is all
    /// or nothing: when one of its locks is not held (or carries another
    /// token), its call releases the rest of it instead; then the other
    /// groups are released too (those extended already pinned to their
    /// new grants' tokens, the others as asked: nothing of a broken set
    /// is kept alive, nothing of a newer one touched), and the answer is
    /// NotHeld.
    pub(crate) async fn extend_set(
        &self,
        locks: &[SetLock],
        holder: &str,
        ttl: Option<crate::Ttl>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        self.calls.ready().or_trouble()?;
        let groups = self.set_groups(locks);
        let mut tokens: Vec<Option<u64>> = locks.iter().map(|(_, token)| *token).collect();
        let mut earliest: Option<Grant> = None;
        for (i, group) in groups.iter().enumerate() {
            let group_tokens: Vec<Option<u64>> = group.at.iter().map(|&at| tokens[at]).collect();
            let namespace = &locks[group.at[0]].0.namespace;
            let call = ops::extend_many::Call {
                set: self.set_call(holder, namespace, &group_tokens),
                ttl_ms: ttl.map(crate::Ttl::ms),
                answer_by: self.calls.answer_by(answer_by),
            };
            let reply = (self.calls)
                .call_locks(
                    |s| &s.extend_many,
                    &group.keys,
                    &call.args(),
                    ops::extend_many::is_grant,
                )
                .await
                .or_trouble()?;
            let answer = ops::extend_many::parse(reply, holder).or_trouble()?;
            self.calls.observe(answer.now);
            self.counting.noted(namespace, answer.now, &answer.noted);
            match answer.outcome {
                ops::extend_many::Outcome::Extended(grants) => {
                    for (grant, &at) in grants.into_iter().zip(&group.at) {
                        self.counting
                            .at(namespace, answer.now, &grant.kind, "extended");
                        // Released later (a later group broken): only this grant.
                        tokens[at] = Some(grant.fencing_token);
                        if (earliest.as_ref()).is_none_or(|e| grant.expires_at_ms < e.expires_at_ms)
                        {
                            earliest = Some(grant);
                        }
                    }
                }
                ops::extend_many::Outcome::NotHeld { released } => {
                    for grant in released.iter().flatten() {
                        self.counting
                            .at(namespace, answer.now, &grant.kind, "released");
                    }
                    let mut ignored = vec![None; locks.len()];
                    for (_, other) in (groups.iter().enumerate()).filter(|(j, _)| *j != i) {
                        self.release_group(locks, other, holder, &tokens, &mut ignored)
                            .await?;
                    }
                    return Ok(ExtendOutcome::NotHeld);
                }
                ops::extend_many::Outcome::Late => return Err(store_failed(late())),
            }
        }
        Ok(earliest.map_or(ExtendOutcome::NotHeld, ExtendOutcome::Extended))
    }

    /// What a set function's call names: the holder, where the
    /// namespace's events go, per lock its token.
    fn set_call<'a>(
        &self,
        holder: &'a str,
        namespace: &str,
        tokens: &'a [Option<u64>],
    ) -> ops::release_many::Set<'a> {
        ops::release_many::Set {
            holder,
            watched: self.changelog.emits(namespace),
            keys_per_lock: self.keys_per_lock(),
            tokens,
        }
    }

    /// The slot groups of a held set (as its acquire made them).
    fn set_groups(&self, locks: &[SetLock]) -> Vec<Group> {
        self.groups_of(locks.iter().map(|(lock, _)| (&lock.namespace, &lock.name)))
    }

    /// One `release_many` call for a group, each lock pinned to its entry
    /// of `tokens` (the set's order); the grants it released go to their
    /// places in `released` with the Redis time of the release.
    async fn release_group(
        &self,
        locks: &[SetLock],
        group: &Group,
        holder: &str,
        tokens: &[Option<u64>],
        released: &mut [Option<(Grant, i64)>],
    ) -> Result<(), EngineError> {
        let group_tokens: Vec<Option<u64>> = group.at.iter().map(|&at| tokens[at]).collect();
        let namespace = &locks[group.at[0]].0.namespace;
        let call = ops::release_many::Call {
            set: self.set_call(holder, namespace, &group_tokens),
        };
        let reply = (self.calls)
            .call_locks(|s| &s.release_many, &group.keys, &call.args(), |_| false)
            .await
            .or_trouble()?;
        let answer = ops::release_many::parse(reply, holder).or_trouble()?;
        self.calls.observe(answer.now);
        self.counting.noted(namespace, answer.now, &answer.noted);
        for (grant, &at) in answer.outcome.released.into_iter().zip(&group.at) {
            if let Some(grant) = grant {
                self.counting
                    .at(namespace, answer.now, &grant.kind, "released");
                released[at] = Some((grant, answer.now));
            }
        }
        Ok(())
    }
}
