//! [`Renewer`]: the session grants this replica renews ([`Sessions`])
//! and their renewal: the renewer loop sends one `lua/renew.lua` call per
//! shard for every batch of due grants; a resume renews a session's
//! grants at once. What a renewal finds (renewed, lost, taken over by a
//! newer stream) goes back to the grant's entry, and from there to its
//! stream.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::calls::{Calls, late};
use super::changelog::Changelog;
use super::counting::Counting;
use super::keys::ShardKeys;
use super::sessions::{Renewal, Sessions};
use super::{EngineError, ops};
use crate::errors::{OrTrouble, store_failed};
use crate::store::StoreError;

/// Session grants kept alive by this replica.
pub(super) struct Renewer {
    sessions: Sessions,
    calls: Arc<Calls>,
    counting: Arc<Counting>,
    /// Where a namespace's events go (the flags a renewal passes).
    changelog: Arc<Changelog>,
}

impl Renewer {
    pub(super) fn new(
        calls: Arc<Calls>,
        counting: Arc<Counting>,
        changelog: Arc<Changelog>,
    ) -> Self {
        Renewer {
            sessions: Sessions::new(calls.store().command_timeout()),
            calls,
            counting,
            changelog,
        }
    }

    /// The session grants this replica renews.
    pub(super) fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Keeps this replica's session grants alive: one `renew.lua` call per
    /// shard for every batch of due grants, until the replica shuts down.
    pub(super) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        const BATCH: usize = 250;
        // Renewals in flight, across rounds: a finished one wakes the loop
        // so its grant's next renewal is scheduled at once.
        let mut calls = tokio::task::JoinSet::new();
        loop {
            let now = Instant::now();
            self.sessions.expire_overdue(now);
            let (due, next) = self.sessions.take_due(now);
            let mut by_shard: BTreeMap<(String, u32), Vec<Renewal>> = BTreeMap::new();
            for renewal in due {
                let shard = self
                    .calls
                    .layout()
                    .shard_of(&renewal.key.lock.namespace, &renewal.key.lock.name);
                by_shard
                    .entry((renewal.key.lock.namespace.to_string(), shard))
                    .or_default()
                    .push(renewal);
            }
            for ((namespace, shard), renewals) in by_shard {
                for batch in renewals.chunks(BATCH) {
                    let renewer = self.clone();
                    let keys = self.calls.layout().shard_keys(&namespace, shard);
                    let batch = batch.to_vec();
                    let namespace = namespace.clone();
                    calls.spawn(async move { renewer.renew(&namespace, &keys, &batch).await });
                }
            }
            let wake_at = next.map_or(now + Duration::from_secs(1), |n| {
                n.min(now + Duration::from_secs(1))
            });
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(wake_at) => {}
                () = self.sessions.changed() => {}
                Some(_) = calls.join_next(), if !calls.is_empty() => {}
            }
        }
    }

    /// Renews one batch of session grants of one shard.
    async fn renew(&self, namespace: &str, keys: &ShardKeys, batch: &[Renewal]) {
        let sent_at = Instant::now();
        let items: Vec<ops::renew::Item> = batch
            .iter()
            .map(|r| ops::renew::Item {
                name: &r.key.lock.name,
                holder: &r.key.session,
                token: r.token,
                ttl_ms: r.ttl.as_millis() as u64,
                epoch: r.key.epoch,
            })
            .collect();
        match self.renew_call(namespace, keys, &items).await {
            Ok(ops::renew::Outcome::Renewed { lost, moved }) => {
                for (i, renewal) in batch.iter().enumerate() {
                    if lost.contains(&i) {
                        self.sessions.lost(&renewal.key);
                    } else if moved.contains(&i) {
                        self.sessions.moved(&renewal.key);
                    } else {
                        self.sessions.renewed(&renewal.key, sent_at);
                    }
                }
            }
            Ok(ops::renew::Outcome::Late) => self.renewals_failed(batch, "ran late", true),
            Err(err) => self.renewals_failed(batch, &err.to_string(), false),
        }
    }

    /// Renews grants of one shard now (a resumed session's): the indexes
    /// of those that are gone, and of those a newer stream holds.
    pub(super) async fn renew_now(
        &self,
        namespace: &str,
        shard: u32,
        items: &[ops::renew::Item<'_>],
    ) -> Result<(Vec<usize>, Vec<usize>), EngineError> {
        let keys = self.calls.layout().shard_keys(namespace, shard);
        match self
            .renew_call(namespace, &keys, items)
            .await
            .or_trouble()?
        {
            ops::renew::Outcome::Renewed { lost, moved } => Ok((lost, moved)),
            ops::renew::Outcome::Late => Err(store_failed(late())),
        }
    }

    /// One `renew.lua` call.
    async fn renew_call(
        &self,
        namespace: &str,
        keys: &ShardKeys,
        items: &[ops::renew::Item<'_>],
    ) -> Result<ops::renew::Outcome, StoreError> {
        let call = ops::renew::Call {
            answer_by: self.calls.answer_by(None),
            live: self.calls.counts_live(),
            watched: self.changelog.emits(namespace),
            items,
        };
        let answer = self
            .calls
            .call(|s| &s.renew, &keys.fence, &call.args())
            .await
            .and_then(ops::renew::parse)?;
        self.calls.observe(answer.now);
        self.counting.noted(namespace, answer.now, &answer.noted);
        Ok(answer.outcome)
    }

    fn renewals_failed(&self, batch: &[Renewal], why: &str, answered: bool) {
        tracing::warn!(error = %why, grants = batch.len(), "renewing session grants failed");
        let now = Instant::now();
        for renewal in batch {
            self.sessions.failed(&renewal.key, now, answered);
        }
    }
}
