//! The election RPCs (Campaign, Proclaim, Leader, Observe, Resign):
//! validate, check the caller's namespace, call the engine, answer. An
//! election is a fair lock of limit 1 (`tumbler-engine`'s `election.rs`),
//! so Campaign is a waiting acquire (with the same waiter quota and token
//! watch as Acquire's) and Observe a Watch of one name.

use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::locks::grpc_deadline;
use super::{LockApi, WATCH_BUFFER};
use crate::auth::{Access, LiveAccess};
use crate::engine::election::{self, LeaderTracker};
use crate::engine::{self, AcquireOutcome, CampaignOutcome, EngineError, LockId, ProclaimOutcome};
use crate::errors::{self, invalid};
use crate::proto;
use crate::requests::{self, candidate, secret, term};
use crate::{replies, validate, watch};

/// The stream Observe answers with.
pub type ObserveStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::LeaderChange, Status>> + Send>>;

/// A Campaign refused by the lock's rule (a read/write lock, another
/// limit) is told as the election's rule (decision 0082): still
/// FAILED_PRECONDITION, with a message that speaks of elections.
fn election_rule(status: Status) -> Status {
    if status.code() == tonic::Code::FailedPrecondition
        && (status.message().contains("read/write lock") || status.message().contains("limit"))
    {
        return Status::failed_precondition(EngineError::ElectionRule.to_string());
    }
    status
}

impl LockApi {
    pub(super) async fn campaign_rpc(
        &self,
        request: Request<proto::CampaignRequest>,
    ) -> Result<Response<proto::CampaignResponse>, Status> {
        let access = Access::of(&request)?;
        let deadline = grpc_deadline(&request);
        // As a waiting Acquire: a token revoked meanwhile ends the wait.
        let live = match access.token() {
            Some(_) => Some(LiveAccess::of(&request)?),
            None => None,
        };
        let mut req = request.into_inner();
        let holder = if req.candidate.is_empty() {
            requests::new_holder_id()
        } else {
            candidate(req.candidate.clone())?
        };
        validate::not_a_session("candidate", holder.as_str())?;
        let ttl_ms = validate::ttl_ms(req.ttl_ms, &self.limits).map_err(invalid)?;
        // A fresh secret for this campaign; a leader's own, if it sent it.
        let fresh = election::new_secret();
        let sent = std::mem::take(&mut req.secret);
        let value = req.value.clone();
        let proof = election::proof_of(&fresh);
        let acquire = requests::campaign(req, holder, ttl_ms, deadline, proof, &self.limits)?;
        access.act(&acquire.lock.namespace)?;
        let outcome = self
            .acquire_reported("Campaign", &access, &acquire, live)
            .await
            .map_err(election_rule)?;
        let grant = match &outcome {
            AcquireOutcome::Acquired { grant, .. } | AcquireOutcome::AlreadyHeld { grant, .. } => {
                Some(grant.clone())
            }
            _ => None,
        };
        let mut secret = String::new();
        let mut outcome = election::campaign_outcome(outcome);
        if let Some(grant) = grant {
            let lock = &acquire.lock;
            let holder = acquire.holder.as_str();
            if !election::is_leadership(&grant) {
                // The candidate holds the name by a plain Acquire.
                return Err(errors::status_of(
                    EngineError::ElectionRule,
                    Some(errors::LockAt {
                        rpc: "Campaign",
                        lock,
                        holder,
                    }),
                ));
            }
            let proof = grant.proof.as_deref();
            if proof == Some(election::proof_of(&fresh).as_str()) {
                secret = fresh;
            } else if !sent.is_empty() && proof == Some(election::proof_of(&sent).as_str()) {
                // A leader's campaign, proved: a new value is published,
                // the term stays (decision 0082).
                if grant.metadata.get(election::VALUE_KEY) != Some(&value) {
                    let proclaimed = self
                        .engine
                        .elections()
                        .proclaim(
                            (lock, &acquire.holder),
                            grant.fencing_token,
                            &value,
                            proof.unwrap_or_default(),
                        )
                        .await
                        .map_err(|e| self.failed("Campaign", lock, holder, None, e))?;
                    outcome = match proclaimed {
                        ProclaimOutcome::Proclaimed(l) => CampaignOutcome::Elected(l),
                        // The lease lapsed in between.
                        ProclaimOutcome::NotLeader => CampaignOutcome::NotElected { position: 0 },
                    };
                }
                secret = sent;
            } else if grant.metadata.get(election::VALUE_KEY) != Some(&value) {
                // Another value, and no proof: someone else may not change
                // the leader's value by campaigning in its name.
                return Err(errors::status_of(
                    EngineError::NotYours,
                    Some(errors::LockAt {
                        rpc: "Campaign",
                        lock,
                        holder,
                    }),
                ));
            }
            // Same value, no proof: the leadership (readable by Leader
            // anyway), without the secret.
        }
        Ok(Response::new(replies::campaign_response(
            &acquire.lock,
            outcome,
            secret,
        )))
    }

    pub(super) async fn proclaim_rpc(
        &self,
        request: Request<proto::ProclaimRequest>,
    ) -> Result<Response<proto::ProclaimResponse>, Status> {
        let access = Access::of(&request)?;
        let req = request.into_inner();
        let lock = LockId::parse(req.namespace, req.name).map_err(invalid)?;
        let holder = candidate(req.candidate)?;
        let term = term(req.term)?;
        let value = requests::value(req.value)?;
        access.act(&lock.namespace)?;
        let proof = secret(&req.secret, "Proclaim")?;
        let outcome = self
            .engine
            .elections()
            .proclaim((&lock, &holder), term, &value, &proof)
            .await
            .map_err(|e| self.failed("Proclaim", &lock, &holder, None, e))?;
        Ok(Response::new(replies::proclaim_response(&lock, outcome)))
    }

    pub(super) async fn leader_rpc(
        &self,
        request: Request<proto::LeaderRequest>,
    ) -> Result<Response<proto::LeaderResponse>, Status> {
        let access = Access::of(&request)?;
        let req = request.into_inner();
        let lock = requests::readable_lock(req.namespace, req.name, &access)?;
        let (leader, now_ms) = self
            .engine
            .elections()
            .leader(&lock)
            .await
            .map_err(errors::status)?;
        Ok(Response::new(proto::LeaderResponse {
            leader: leader.map(|l| replies::leadership(&lock, l)),
            now_ms,
        }))
    }

    pub(super) async fn resign_rpc(
        &self,
        request: Request<proto::ResignRequest>,
    ) -> Result<Response<proto::ResignResponse>, Status> {
        let access = Access::of(&request)?;
        let req = request.into_inner();
        let lock = LockId::parse(req.namespace, req.name).map_err(invalid)?;
        let holder = candidate(req.candidate)?;
        let term = term(req.term)?;
        access.act(&lock.namespace)?;
        if validate::is_session_holder(holder.as_str()) {
            return Err(Status::permission_denied(
                "candidate: a session's leadership resigns through its session (SessionRelease of the name)",
            ));
        }
        let proof = secret(&req.secret, "Resign")?;
        let resigned = self
            .engine
            .elections()
            .resign((&lock, &holder), term, &proof)
            .await
            .map_err(|e| self.failed("Resign", &lock, &holder, None, e))?;
        Ok(Response::new(replies::resign_response(resigned)))
    }

    /// A Watch of the election's one name, with its initial state, told as
    /// leader changes ([`LeaderTracker`]).
    pub(super) async fn observe_rpc(
        &self,
        request: Request<proto::LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        use std::sync::atomic::Ordering;
        let mut access = LiveAccess::of(&request)?;
        let req = request.into_inner();
        let lock = LockId::parse(req.namespace, req.name).map_err(invalid)?;
        access.access().act(&lock.namespace)?;
        let filter = engine::watchers::Filter {
            namespace: lock.namespace.clone(),
            name: Some(lock.name.clone()),
            prefix: String::new(),
        };
        let share = self
            .watch_quota
            .take(access.access(), Some(&filter.namespace))?;
        let slot = self.watchers.take()?;
        let watch = self.engine.watch().add(filter.clone(), WATCH_BUFFER);
        (self.engine.watch())
            .announce(&lock.namespace)
            .await
            .map_err(errors::status)?;
        // Read once the watcher is registered and announced: nothing
        // that happens meanwhile is missed (the tracker drops doubles).
        let state = self
            .engine
            .watch()
            .state(&filter)
            .await
            .map_err(errors::status)?;
        let (guard, overflowed, mut events) = (watch.guard, watch.overflowed, watch.events);
        let (out, outbox) = tokio::sync::mpsc::channel(1);
        tokio::spawn(
            async move {
                let _held = (guard, share, slot);
                let mut tracker = LeaderTracker::new();
                let change = |c: engine::LeaderChange| replies::leader_change(&lock, c);
                for event in &state {
                    if let Some(c) = tracker.next(event)
                        && out.send(Ok(change(c))).await.is_err()
                    {
                        return;
                    }
                }
                loop {
                    tokio::select! {
                        event = events.recv() => match event {
                            Some(event) => {
                                if let Some(c) = tracker.next(&event)
                                    && out.send(Ok(change(c))).await.is_err()
                                {
                                    return;
                                }
                            }
                            None => {
                                if overflowed.load(Ordering::Acquire) {
                                    let _ = out.send(Err(Status::resource_exhausted(format!(
                                        "observer dropped: more than {WATCH_BUFFER} events unread"
                                    )))).await;
                                }
                                return;
                            }
                        },
                        status = watch::lost(&mut access, &lock.namespace) => {
                            let _ = out.send(Err(status)).await;
                            return;
                        }
                        () = out.closed() => return,
                    }
                }
            }
            .in_current_span(),
        );
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(outbox),
        )))
    }
}
