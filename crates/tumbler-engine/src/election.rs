//! Elections' one call of their own, Proclaim (`lua/proclaim.lua`); the
//! rest of an election is the lock's own, seen as one (`tumbler-face`'s
//! `election.rs`: campaigns, leaders, [`LeaderTracker`]; decision 0069).

use std::sync::Arc;

pub use tumbler_face::election::*;

use super::calls::Calls;
use super::changelog::Changelog;
use super::counting::Counting;
use super::{EngineError, LockId, ProclaimOutcome, ops};
use crate::errors::OrTrouble;

/// Proclaim's calls.
pub(super) struct Election {
    calls: Arc<Calls>,
    counting: Arc<Counting>,
    changelog: Arc<Changelog>,
}

impl Election {
    pub(super) fn new(
        calls: Arc<Calls>,
        counting: Arc<Counting>,
        changelog: Arc<Changelog>,
    ) -> Self {
        Election {
            calls,
            counting,
            changelog,
        }
    }

    /// Replaces the leader's value, when `candidate` leads with `term`
    /// and `proof` is the digest of its secret.
    pub(super) async fn proclaim(
        &self,
        lock: &LockId,
        candidate: &str,
        term: u64,
        value: &str,
        proof: &str,
    ) -> Result<ProclaimOutcome, EngineError> {
        self.calls.ready().or_trouble()?;
        let keys = self.calls.layout().lock_keys(&lock.namespace, &lock.name);
        let call = ops::proclaim::Call {
            holder: candidate,
            term,
            value,
            watched: self.changelog.emits(&lock.namespace),
            proof,
        };
        let reply = self
            .calls
            .call_lock(|s| &s.proclaim, &keys, &call.args())
            .await
            .or_trouble()?;
        let answer = ops::proclaim::parse(reply).or_trouble()?;
        self.calls.observe(answer.now);
        self.counting
            .noted(&lock.namespace, answer.now, &answer.noted);
        Ok(match answer.outcome {
            ops::proclaim::Outcome::Proclaimed(grant) => {
                ProclaimOutcome::Proclaimed(leadership(grant))
            }
            ops::proclaim::Outcome::NotHeld => ProclaimOutcome::NotLeader,
            ops::proclaim::Outcome::NotYours => return Err(EngineError::NotYours),
        })
    }
}
