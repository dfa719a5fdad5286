//! The election RPCs (Campaign, Proclaim, Leader, Observe, Resign):
//! validate, check the caller's namespace, call the engine, answer. An
//! election is a fair lock of limit 1 (`tumbler-engine`'s `election.rs`),
//! so Campaign is a waiting acquire (with the same waiter quota and token
//! watch as Acquire's) and Observe a Watch of one name.

use super::*;
use crate::engine::election::{self, LeaderTracker};
use crate::engine::{AcquireOutcome, CampaignOutcome, Leadership, ProclaimOutcome};
use crate::proto::{ProclaimStatus, ResignStatus};

/// The stream Observe answers with.
pub type ObserveStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::LeaderChange, Status>> + Send>>;

/// A leader's value: at most as long as a metadata value.
fn value(value: String) -> Result<String, Status> {
    if value.len() > validate::MAX_METADATA_VALUE_BYTES {
        return Err(invalid(engine::Invalid::new(
            "value",
            format!(
                "must be at most {} bytes",
                validate::MAX_METADATA_VALUE_BYTES
            ),
        )));
    }
    Ok(value)
}

/// A candidate id: the holder rules, named as the request names it.
fn candidate(value: String) -> Result<engine::Holder, Status> {
    engine::Holder::parse(value).map_err(|e| invalid(engine::Invalid::new("candidate", e.rule)))
}

/// A secret: required for Proclaim and Resign (decision 0082). Missing is
/// PERMISSION_DENIED, as a wrong one is: the caller has not shown it leads.
fn secret(value: &str, rpc: &str) -> Result<String, Status> {
    if value.is_empty() {
        return Err(Status::permission_denied(format!(
            "secret: missing: {rpc} needs the secret the winning Campaign returned (CampaignResponse.secret; for a session's leadership, the session's resume secret)"
        )));
    }
    Ok(election::proof_of(value))
}

/// A term: required (0 is no term).
fn term(value: u64) -> Result<u64, Status> {
    if value == 0 {
        return Err(invalid(engine::Invalid::new(
            "term",
            "must be set: the term Campaign returned",
        )));
    }
    Ok(value)
}

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

fn leadership(lock: &LockId, l: Leadership) -> proto::Leadership {
    proto::Leadership {
        namespace: lock.namespace.to_string(),
        name: lock.name.to_string(),
        candidate: l.candidate,
        term: l.term,
        value: l.value,
        elected_at_ms: l.elected_at_ms,
        expires_at_ms: l.expires_at_ms,
        ttl_ms: l.ttl_ms,
    }
}

impl LockApi {
    /// Validates a campaign for a candidate and lease already decided (by
    /// the request itself, or by its session) as the acquire it is.
    pub(super) fn campaign_request(
        &self,
        req: proto::CampaignRequest,
        candidate: engine::Holder,
        ttl: engine::Ttl,
        deadline: Option<crate::observe::CallerDeadline>,
        proof: String,
    ) -> Result<engine::AcquireRequest, Status> {
        let lock = LockId::parse(req.namespace, req.name).map_err(invalid)?;
        let value = value(req.value)?;
        let wait_ms = match req.wait_ms {
            None => self.limits.max_wait_ms,
            Some(ms) => validate::wait_ms(ms, &self.limits).map_err(invalid)?,
        };
        let queue_ttl_ms =
            validate::queue_ttl_ms(req.queue_ttl_ms, &self.limits).map_err(invalid)?;
        let kind = validate::kind(req.kind).map_err(invalid)?;
        Ok(election::campaign(election::Campaign {
            lock,
            candidate,
            value,
            ttl,
            wait: if wait_ms == 0 {
                Duration::ZERO
            } else {
                effective_wait(wait_ms, deadline.map(|d| d.left())).max(Duration::from_millis(1))
            },
            answer_by: deadline.map(|d| d.answered_at.into()),
            queue_ttl_ms,
            kind,
            proof,
        }))
    }

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
            new_holder_id()
        } else {
            candidate(req.candidate.clone())?
        };
        validate::not_a_session("candidate", holder.as_str())?;
        let ttl_ms = validate::ttl_ms(req.ttl_ms, &self.limits).map_err(invalid)?;
        // A fresh secret for this campaign; a leader's own, if it sent it.
        let fresh = election::new_secret();
        let sent = std::mem::take(&mut req.secret);
        let value = req.value.clone();
        let acquire =
            self.campaign_request(req, holder, ttl_ms, deadline, election::proof_of(&fresh))?;
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
                        .proclaim(
                            lock,
                            holder,
                            grant.fencing_token,
                            &value,
                            proof.unwrap_or_default(),
                        )
                        .await
                        .map_err(|e| {
                            self.failed("Campaign", lock, holder, validate::DEFAULT_KIND, e)
                        })?;
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
        Ok(Response::new(match outcome {
            CampaignOutcome::Elected(l) => proto::CampaignResponse {
                elected: true,
                leader: Some(leadership(&acquire.lock, l)),
                queue_position: 0,
                secret,
            },
            CampaignOutcome::NotElected { position } => proto::CampaignResponse {
                elected: false,
                leader: None,
                queue_position: position,
                secret: String::new(),
            },
        }))
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
        let value = value(req.value)?;
        access.act(&lock.namespace)?;
        let proof = secret(&req.secret, "Proclaim")?;
        let outcome = self
            .engine
            .proclaim(&lock, &holder, term, &value, &proof)
            .await
            .map_err(|e| self.failed("Proclaim", &lock, &holder, validate::DEFAULT_KIND, e))?;
        Ok(Response::new(match outcome {
            ProclaimOutcome::Proclaimed(l) => proto::ProclaimResponse {
                status: ProclaimStatus::Proclaimed.into(),
                leader: Some(leadership(&lock, l)),
            },
            ProclaimOutcome::NotLeader => proto::ProclaimResponse {
                status: ProclaimStatus::NotLeader.into(),
                leader: None,
            },
        }))
    }

    pub(super) async fn leader_rpc(
        &self,
        request: Request<proto::LeaderRequest>,
    ) -> Result<Response<proto::LeaderResponse>, Status> {
        let access = Access::of(&request)?;
        let req = request.into_inner();
        let lock = LockId::parse(req.namespace, req.name).map_err(invalid)?;
        access.read(&lock.namespace)?;
        let (leader, now_ms) = self.engine.leader(&lock).await.map_err(errors::status)?;
        Ok(Response::new(proto::LeaderResponse {
            leader: leader.map(|l| leadership(&lock, l)),
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
            .resign(&lock, &holder, term, &proof)
            .await
            .map_err(|e| self.failed("Resign", &lock, &holder, validate::DEFAULT_KIND, e))?;
        Ok(Response::new(proto::ResignResponse {
            status: if resigned {
                ResignStatus::Resigned
            } else {
                ResignStatus::NotLeader
            }
            .into(),
        }))
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
        let watch = self.engine.watchers().add(filter.clone(), WATCH_BUFFER);
        self.engine
            .announce_watch(&lock.namespace)
            .await
            .map_err(|e| errors::status(EngineError::from(e)))?;
        // Read once the watcher is registered and announced: nothing
        // that happens meanwhile is missed (the tracker drops doubles).
        let state = self
            .engine
            .watch_state(&filter)
            .await
            .map_err(errors::status)?;
        let (guard, overflowed, mut events) = (watch.guard, watch.overflowed, watch.events);
        let (out, outbox) = tokio::sync::mpsc::channel(1);
        tokio::spawn(
            async move {
                let _held = (guard, share, slot);
                let mut tracker = LeaderTracker::new();
                let change = |c: engine::LeaderChange| proto::LeaderChange {
                    leader: c.leader.map(|l| leadership(&lock, l)),
                    event: c.event.to_owned(),
                    at_ms: c.at_ms,
                    ended_term: c.ended_term,
                };
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
                        () = access.changed() => {
                            let still = access
                                .recheck()
                                .and_then(|()| access.access().act(&lock.namespace));
                            if let Err(status) = still {
                                let _ = out.send(Err(status)).await;
                                return;
                            }
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
