//! A session's record in Redis: what lets any replica resume a session
//! whose stream ended without the client closing it (a draining or
//! crashed replica, a broken connection), with all its grants.
//!
//! The grants themselves live in their locks, held by the session id with
//! the session TTL as lease; the record (`keys.rs`: `session_key`) names
//! them, with the session's owner (token name), the digest of its resume
//! secret, its TTL and an **epoch**. The stream that serves the session
//! writes the record under its epoch; a resume moves the epoch on and
//! stamps the session's grants with it (`renew.lua`). Every function the
//! old stream may still call on a grant (acquire, release, extend, renew)
//! carries its epoch and is refused there, atomically, once a newer
//! stream stamped the grant: the old stream can neither renew nor release
//! what is no longer its own, and ends (ABORTED) as soon as it tries or
//! its next touch (a third of the TTL) finds the record moved on. Of two
//! concurrent resumes the later claim wins: the earlier one is refused
//! before it is told `opened` when it can tell (its renewals refused, or
//! the record moved on by then), and its commands are refused otherwise.
//!
//! | how the stream ended | grants | record |
//! | --- | --- | --- |
//! | the client closed it | released at once | deleted |
//! | broke, not resumed within [`RESUME_GRACE`] (a dead client) | released | deleted |
//! | the replica drained, crashed, or the client fell silent | live on for the TTL | kept, resumable |
//! | the server refused the client (bad message, revoked token) | released | deleted |
//!
//! `SessionKeeper` is the sessions part of the engine: it writes the
//! records, has a session's grants renewed by this replica (`renewer.rs`,
//! which owns them) and releases them when a session ends, or keeps them
//! for the lock-delay when it died.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::calls::Calls;
use super::locks::{GrantRef, Locks};
use super::ops::session_record::{self as record, Claim, Touch};
use super::renewer::Renewer;
use super::sessions::{LOST_NOT_HELD, LostGrant, Sessions};
use super::{AcquireOutcome, AcquireRequest, EngineError, LockId, ReleaseOutcome, ops};
use crate::errors::OrTrouble;

mod sets;

pub use tumbler_face::sessions::{
    LOST_NOT_PERMITTED, RESUME_GRACE, ResumeError, Resumed, SessionEnd, SessionTicket,
};

fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Sessions: their records in Redis, their grants' ends.
pub(super) struct SessionKeeper {
    /// The session grants this replica renews.
    renewer: Arc<Renewer>,
    /// How long a dead session's grants stay held (None: released at once).
    lock_delay_ms: Option<u64>,
    calls: Arc<Calls>,
    locks: Arc<Locks>,
}

impl SessionKeeper {
    pub(super) fn new(
        renewer: Arc<Renewer>,
        lock_delay_ms: Option<u64>,
        calls: Arc<Calls>,
        locks: Arc<Locks>,
    ) -> Self {
        SessionKeeper {
            renewer,
            lock_delay_ms,
            calls,
            locks,
        }
    }

    /// The session grants this replica renews.
    fn sessions(&self) -> &Sessions {
        self.renewer.sessions()
    }

    /// How long a session's record outlives its last touch: its grants'
    /// lease, twice over.
    fn record_keep_ms(ttl_ms: u64) -> u64 {
        ttl_ms.saturating_mul(2)
    }

    /// Records a new session (owner: the token's name, '' without auth).
    pub(super) async fn open(
        &self,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<SessionTicket, EngineError> {
        self.calls.ready().or_trouble()?;
        let id = format!("session-{}", uuid::Uuid::now_v7());
        let secret = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let call = record::Open {
            owner,
            digest: &digest(&secret),
            ttl_ms,
            keep_ms: Self::record_keep_ms(ttl_ms),
        };
        let key = self.calls.layout().session_key(&id);
        self.calls
            .call(|s| &s.session_open, &key, &call.args())
            .await
            .or_trouble()?;
        Ok(SessionTicket {
            id,
            secret,
            epoch: 1,
        })
    }

    /// Takes a session back for a new stream: the owner and secret must
    /// match. Its grants are renewed at once; those still held are kept
    /// (and renewed by this replica from now on), the others reported
    /// lost. `may_act` says whether the owner may still act in a namespace.
    pub(super) async fn resume(
        &self,
        owner: &str,
        session: &str,
        secret: &str,
        may_act: impl Fn(&str) -> bool,
        lost_tx: &mpsc::Sender<LostGrant>,
    ) -> Result<Resumed, ResumeError> {
        self.calls.ready().or_trouble()?;
        let key = self.calls.layout().session_key(session);
        let args = record::claim_args(owner, &digest(secret));
        let reply = self
            .calls
            .call(|s| &s.session_claim, &key, &args)
            .await
            .or_trouble()?;
        let (epoch, ttl_ms, grants) = match record::parse_claim(reply).or_trouble()? {
            Claim::Gone => return Err(ResumeError::Gone),
            Claim::Refused => return Err(ResumeError::Refused),
            Claim::Claimed {
                epoch,
                ttl_ms,
                grants,
            } => (epoch, ttl_ms, grants),
        };
        let ttl = Duration::from_millis(ttl_ms);
        let mut lost = Vec::new();
        let mut by_shard: BTreeMap<(String, u32), Vec<(LockId, u64)>> = BTreeMap::new();
        let mut sets: HashMap<LockId, u64> = HashMap::new();
        for grant in grants {
            let lock = LockId::stored(grant.namespace, grant.name);
            if let Some(set) = grant.set {
                sets.insert(lock.clone(), set);
            }
            if !may_act(&lock.namespace) {
                lost.push(LostGrant {
                    lock,
                    fencing_token: grant.token,
                    reason: LOST_NOT_PERMITTED,
                });
                continue;
            }
            let shard = self.calls.layout().shard_of(&lock.namespace, &lock.name);
            by_shard
                .entry((lock.namespace.to_string(), shard))
                .or_default()
                .push((lock, grant.token));
        }
        let mut kept = Vec::new();
        for ((namespace, shard), grants) in by_shard {
            let sent_at = Instant::now();
            let items: Vec<ops::renew::Item> = grants
                .iter()
                .map(|(lock, token)| ops::renew::Item {
                    name: &lock.name,
                    holder: session,
                    token: *token,
                    ttl_ms,
                    epoch,
                })
                .collect();
            let (gone, moved) = match self.renewer.renew_now(&namespace, shard, &items).await {
                Ok(found) => found,
                Err(err) => {
                    self.sessions().end(session, epoch);
                    return Err(err.into());
                }
            };
            if !moved.is_empty() {
                // A later claim stamped these grants first: that stream
                // serves the session, this one never does.
                self.sessions().end(session, epoch);
                return Err(ResumeError::Moved);
            }
            for (i, (lock, token)) in grants.into_iter().enumerate() {
                if gone.contains(&i) {
                    lost.push(LostGrant {
                        lock,
                        fencing_token: token,
                        reason: LOST_NOT_HELD,
                    });
                } else {
                    let set = sets.get(&lock).copied();
                    self.sessions().add(
                        session,
                        epoch,
                        &lock,
                        token,
                        ttl,
                        sent_at,
                        lost_tx.clone(),
                        set,
                    );
                    kept.push((lock, token));
                }
            }
        }
        // A set one lock of which is gone is not kept in part.
        self.break_sets(session, epoch, &sets, &mut kept, &mut lost)
            .await;
        let gone = lost.iter().map(|grant| (&grant.lock, None));
        let _ = self.note(session, epoch, gone).await;
        // Still this stream's? A claim that came later has moved the epoch
        // on: refuse before the client is told `opened`.
        match self.touch(session, epoch, ttl_ms).await {
            Ok(Touch::Ours) => {}
            Ok(Touch::Moved) => {
                self.sessions().end(session, epoch);
                return Err(ResumeError::Moved);
            }
            Ok(Touch::Gone) => {
                self.sessions().end(session, epoch);
                return Err(ResumeError::Gone);
            }
            Err(err) => {
                self.sessions().end(session, epoch);
                return Err(err.into());
            }
        }
        Ok(Resumed {
            epoch,
            ttl_ms,
            kept,
            lost,
        })
    }

    /// Keeps the record of a session this stream serves alive (and notes
    /// that it lives now: a resume within the TTL from now finds it); or
    /// learns that another stream resumed it, or that it is gone.
    pub(super) async fn touch(
        &self,
        session: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<Touch, EngineError> {
        let key = self.calls.layout().session_key(session);
        let args = record::touch_args(epoch, Self::record_keep_ms(ttl_ms));
        let reply = self
            .calls
            .call(|s| &s.session_touch, &key, &args)
            .await
            .or_trouble()?;
        record::parse_touch(reply).or_trouble()
    }

    /// Adds grants to (value: `record::grant_value`) or, with none, takes
    /// them off the record, in one call; false when another stream
    /// resumed the session.
    async fn note<'a>(
        &self,
        session: &str,
        epoch: u64,
        grants: impl IntoIterator<Item = (&'a LockId, Option<String>)>,
    ) -> Result<bool, EngineError> {
        let key = self.calls.layout().session_key(session);
        let grants = grants
            .into_iter()
            .map(|(lock, value)| (lock.namespace.as_str(), lock.name.as_str(), value));
        let args = record::note_args(epoch, grants);
        let reply = self
            .calls
            .call(|s| &s.session_note, &key, &args)
            .await
            .or_trouble()?;
        record::still_ours(reply).or_trouble()
    }

    /// The stream that serves a session stops: its grants are released
    /// (`Release`, `Died`: the record goes first, so nobody resumes a
    /// session whose grants are being released; a session resumed
    /// elsewhere meanwhile keeps them) or left to live on for the TTL
    /// (`Keep`). Returns the grants the stream had and whether they were
    /// released.
    pub(super) async fn end(
        &self,
        session: &str,
        epoch: u64,
        ttl_ms: u64,
        end: SessionEnd,
    ) -> (Vec<(LockId, u64)>, bool) {
        let grants = self.sessions().end(session, epoch);
        if end == SessionEnd::Keep {
            // The TTL within which it may be resumed runs from now.
            if let Err(err) = self.touch(session, epoch, ttl_ms).await {
                tracing::warn!(%session, error = %err, "session record not touched at the stream's end");
            }
            return (grants, false);
        }
        // A renewal sent just before the end must not land after it.
        self.sessions().settled(session, epoch).await;
        let key = self.calls.layout().session_key(session);
        let ended = self
            .calls
            .call(|s| &s.session_end, &key, &record::end_args(epoch))
            .await
            .and_then(record::still_ours)
            .or_trouble();
        match ended {
            Ok(false) => {
                tracing::info!(%session, "session resumed elsewhere; its grants stay");
                return (grants, false);
            }
            Ok(true) => {}
            // Releasing is still right: a resume needs this Redis too.
            Err(err) => tracing::warn!(%session, error = %err, "session record not ended"),
        }
        self.release_grants(session, epoch, &grants, end == SessionEnd::Died)
            .await;
        (grants, true)
    }

    /// After a session's acquire: a grant is named in the session's
    /// record (so any replica can resume it) and renewed by this replica
    /// from now on (lost grants are reported on `lost`). A grant that
    /// cannot be named in the record is released again and the call
    /// fails: the client is never told of a grant its session could not
    /// take along. Refused (MOVED) when a newer stream took the grant over
    /// meanwhile: then it is that stream's to keep.
    pub(super) async fn keep_grant(
        &self,
        session: &str,
        epoch: u64,
        req: &AcquireRequest,
        outcome: &AcquireOutcome,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<(), EngineError> {
        let (AcquireOutcome::Acquired { grant, .. } | AcquireOutcome::AlreadyHeld { grant, .. }) =
            outcome
        else {
            return Ok(());
        };
        let token = grant.fencing_token;
        // The lease started no later than now: renewing from now on is
        // safe (early, never late).
        let granted_at = Instant::now();
        // A lock of a set taken again alone stays in its set.
        let set = (self.sessions().set_of(session, epoch, &req.lock)).map(|(set, _)| set);
        let value = record::grant_value(token, set);
        let noted = self.note(session, epoch, [(&req.lock, Some(value))]).await;
        if !matches!(noted, Ok(true)) {
            let _ = self
                .locks
                .release(&req.lock, session, Some(token), Some(epoch))
                .await;
            return Err(match noted {
                Err(err) => err,
                _ => EngineError::SessionMoved,
            });
        }
        self.sessions().add(
            session,
            epoch,
            &req.lock,
            token,
            req.ttl.duration(),
            granted_at,
            lost.clone(),
            set,
        );
        Ok(())
    }

    /// Releases one grant of a session, stops renewing it and takes it off
    /// the session's record.
    pub(super) async fn release(
        &self,
        session: &str,
        epoch: u64,
        lock: &LockId,
    ) -> Result<ReleaseOutcome, EngineError> {
        let token = self.sessions().remove(session, epoch, lock);
        let outcome = self
            .locks
            .release(lock, session, token, Some(epoch))
            .await?;
        if let Err(err) = self.note(session, epoch, [(lock, None)]).await {
            // A resume would find the grant gone and report it lost.
            tracing::warn!(%session, error = %err, "a released grant stays named in the session record");
        }
        Ok(outcome)
    }

    /// Releases the grants of a session that is over, at once (and so
    /// wakes their waiters). With a lock-delay, a session that died
    /// (rather than being closed) leaves its grants held for that delay
    /// instead, so a partitioned old holder cannot overlap with the next
    /// one. Grants that cannot be released now (Redis trouble) expire at
    /// their short lease.
    async fn release_grants(
        &self,
        session: &str,
        epoch: u64,
        grants: &[(LockId, u64)],
        died: bool,
    ) {
        let delay = self.lock_delay_ms.filter(|_| died);
        let endings = grants.iter().map(|(lock, token)| async move {
            let grant = GrantRef {
                lock,
                holder: session,
                fencing_token: Some(*token),
            };
            match delay {
                Some(delay_ms) => self
                    .locks
                    .extend(grant, Some(crate::Ttl::stored(delay_ms)), None, Some(epoch))
                    .await
                    .map(|_| ()),
                None => self
                    .locks
                    .release(lock, session, Some(*token), Some(epoch))
                    .await
                    .map(|_| ()),
            }
        });
        for outcome in futures::future::join_all(endings).await {
            if let Err(err) = outcome {
                tracing::warn!(%session, error = %err, "a session grant could not be released; it expires at its lease");
            }
        }
    }
}
