//! The bodies of the lock operations' handlers (Acquire, Release,
//! Extend), the hot path: read the request (`service::requests`, which
//! checks the caller's namespace), call the engine once, report, answer.
//! Each handler opens its span only when something would read it (see
//! [`handler_spans`]).

use tonic::{Request, Response, Status};

use super::{LockApi, quota};
use crate::auth::{Access, LiveAccess};
use crate::engine::{self, AcquireOutcome, EngineError, LockId};
use crate::errors::{LockAt, invalid, status_of};
use crate::proto;
use crate::replies::ToProto;
use crate::requests::{self, Extend, Release};
use crate::{report, validate, watch};

/// Whether the lock operations' handlers (Acquire, Release, Extend) open
/// their span: when spans are exported, or when debug logging is on (the
/// handlers' debug lines then carry the lock from it). At the default
/// level nothing would read it, and it is the largest cost of tracing on
/// the hot path; the handlers' warnings name their lock themselves.
pub(super) fn handler_spans() -> bool {
    crate::observe::spans_exported() || tracing::enabled!(tracing::Level::DEBUG)
}

/// The caller's gRPC deadline, if it set one (read from `grpc-timeout` by
/// the RPC layer).
pub(super) fn grpc_deadline<T>(request: &Request<T>) -> Option<crate::observe::CallerDeadline> {
    request
        .extensions()
        .get::<crate::observe::CallerDeadline>()
        .copied()
}

/// The lock operations' bodies, run inside their handler's span when it
/// opens one (see [`handler_spans`]).
impl LockApi {
    /// The caller's share of waiters, for an acquire that may wait (None
    /// for a try-once one).
    pub(super) fn waiter_slot(
        &self,
        access: &Access,
        acquire: &engine::AcquireRequest,
    ) -> Result<Option<quota::QuotaSlot>, Status> {
        if acquire.wait.is_zero() {
            return Ok(None);
        }
        self.waiter_quota.take(access, None).map(Some)
    }

    /// Maps a failed lock operation to its status, counting Redis trouble
    /// in the `errors` metric of the lock's namespace and kind. Its log
    /// line names the RPC, the lock and the holder itself: the handler
    /// may have opened no span to carry them (see [`handler_spans`]).
    pub(super) fn failed(
        &self,
        rpc: &'static str,
        lock: &LockId,
        holder: &str,
        kind: Option<&engine::Kind>,
        err: EngineError,
    ) -> Status {
        if matches!(err, EngineError::Store(_)) {
            let kind = kind.cloned().unwrap_or_else(engine::Kind::default_kind);
            self.engine.locks().record_error(&lock.namespace, &kind);
        }
        status_of(err, Some(LockAt { rpc, lock, holder }))
    }

    pub(super) async fn acquire_rpc(
        &self,
        request: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let access = Access::of(&request)?;
        let deadline = grpc_deadline(&request);
        // A waiting acquire of a token keeps watching the token: revoked,
        // or its namespace taken away, the wait ends (and nothing it was
        // granted meanwhile is kept). The hot path (try-once, or auth off)
        // pays nothing for it.
        let live = match access.token() {
            Some(_) if request.get_ref().wait_ms > 0 => Some(LiveAccess::of(&request)?),
            _ => None,
        };
        let mut req = request.into_inner();
        let named = validate::optional_holder(std::mem::take(&mut req.holder)).map_err(invalid)?;
        if let Some(named) = &named {
            validate::not_a_session("holder", named.as_str())?;
        }
        // A holder made up here holds nothing else: its wait skips the
        // deadlock check (decision 0077).
        let holds_nothing = named.is_none();
        let holder = named.unwrap_or_else(requests::new_holder_id);
        let ttl = validate::ttl_ms(req.ttl_ms, &self.limits).map_err(invalid)?;
        if !req.names.is_empty() {
            return self
                .acquire_many_rpc(access, live, req, holder, ttl, deadline)
                .await;
        }
        let mut acquire = requests::acquire(req, holder, ttl, deadline, &self.limits)?;
        acquire.holds_nothing = holds_nothing;
        access.act(&acquire.lock.namespace)?;
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record("namespace", acquire.lock.namespace.as_str());
            span.record("lock_name", acquire.lock.name.as_str());
            span.record("holder", acquire.holder.as_str());
        }

        let outcome = self
            .acquire_reported("Acquire", &access, &acquire, live)
            .await?;
        let reply = outcome.to_proto();
        tracing::debug!(status = ?reply.status(), "acquire answered");
        Ok(Response::new(reply))
    }

    /// A multi-lock's Acquire (decision 0076): its names checked, the rest
    /// as a single lock's, the set taken all or nothing by the engine.
    /// A waiting one of a token that is revoked meanwhile stops, and a
    /// grant that landed is released again.
    async fn acquire_many_rpc(
        &self,
        access: Access,
        mut live: Option<LiveAccess>,
        mut req: proto::AcquireRequest,
        holder: engine::Holder,
        ttl: engine::Ttl,
        deadline: Option<crate::observe::CallerDeadline>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let names =
            validate::multi_names(&req.name, std::mem::take(&mut req.names)).map_err(invalid)?;
        validate::multi_plain(req.mode, req.permits).map_err(invalid)?;
        if !req.takes_over.is_empty() {
            return Err(invalid(engine::Invalid::new(
                "takes_over",
                "takes over one lock's grant: not with names (a multi-lock)",
            )));
        }
        req.name = names[0].to_string();
        let mut acquire = requests::acquire(req, holder, ttl, deadline, &self.limits)?;
        access.act(&acquire.lock.namespace)?;
        let _waiting = self.waiter_slot(&access, &acquire)?;
        let stop = tokio_util::sync::CancellationToken::new();
        acquire.stop = Some(stop.clone());
        let (lock, kind) = (acquire.lock.clone(), acquire.kind.clone());
        let holder = acquire.holder.clone();
        let set = engine::MultiAcquireRequest {
            req: acquire.clone(),
            names,
        };
        let started = std::time::Instant::now();
        let (outcome, denied) = watch::while_permitted(
            live.as_mut(),
            &lock.namespace,
            &stop,
            self.engine.sets().acquire(set),
        )
        .await;
        // A revoked token is the answer, whatever the wait ended with (its
        // stop, most often), as for a single wait.
        if let Some(status) = denied {
            if let Ok(engine::MultiOutcome::Acquired { grants, .. }) = outcome {
                let locks: Vec<engine::SetLock> = (grants.into_iter())
                    .map(|(name, grant)| {
                        let id = LockId {
                            namespace: lock.namespace.clone(),
                            name,
                        };
                        (id, Some(grant.fencing_token))
                    })
                    .collect();
                if let Err(err) = self.engine.sets().release(&locks, &holder).await {
                    tracing::warn!(error = %err, lock = %lock.name, "a multi-lock granted as its token was revoked was not released; it expires at its lease");
                }
            }
            return Err(status);
        }
        let outcome = outcome.map_err(|e| {
            if matches!(e, engine::EngineError::Deadlock(_)) {
                report::refused_as_deadlock(&acquire);
            }
            self.failed("Acquire", &lock, &holder, Some(&kind), e)
        })?;
        report::acquired_set(&acquire, &outcome, started.elapsed());
        Ok(Response::new(outcome.to_proto()))
    }

    /// One acquire as a handler runs it (Acquire, Campaign): the caller's
    /// waiter slot held while it waits, the wait ended by a revoked token
    /// (`live`), the engine's error mapped and the outcome reported.
    pub(super) async fn acquire_reported(
        &self,
        rpc: &'static str,
        access: &Access,
        acquire: &engine::AcquireRequest,
        live: Option<LiveAccess>,
    ) -> Result<AcquireOutcome, Status> {
        let _waiting = self.waiter_slot(access, acquire)?;
        report::acquire_waiting(&*self.engine, acquire);
        let started = std::time::Instant::now();
        let outcome = match live {
            None => self.engine.locks().acquire(acquire).await,
            Some(live) => self.acquire_while_permitted(acquire.clone(), live).await?,
        }
        .map_err(|e| {
            if matches!(e, engine::EngineError::Deadlock(_)) {
                report::refused_as_deadlock(acquire);
            }
            self.failed(rpc, &acquire.lock, &acquire.holder, Some(&acquire.kind), e)
        })?;
        report::acquired(&*self.engine, acquire, &outcome, started.elapsed());
        Ok(outcome)
    }

    /// A waiting acquire that ends when its caller's access does: the
    /// token revoked or expired (UNAUTHENTICATED) or its namespace taken
    /// away (PERMISSION_DENIED). The wait is stopped at a safe point (the
    /// request leaves the queue; a function call in flight still answers),
    /// and a grant that landed meanwhile is released again, so the caller
    /// told no never holds anything.
    async fn acquire_while_permitted(
        &self,
        mut acquire: engine::AcquireRequest,
        mut live: LiveAccess,
    ) -> Result<Result<AcquireOutcome, engine::EngineError>, Status> {
        let stop = tokio_util::sync::CancellationToken::new();
        acquire.stop = Some(stop.clone());
        let (outcome, denied) = watch::while_permitted(
            Some(&mut live),
            &acquire.lock.namespace,
            &stop,
            self.engine.locks().acquire(&acquire),
        )
        .await;
        let Some(status) = denied else {
            return Ok(outcome);
        };
        tracing::info!(namespace = %acquire.lock.namespace, lock = %acquire.lock.name, holder = %acquire.holder, "waiting acquire ended: its token may no longer act here");
        if let Ok(AcquireOutcome::Acquired { grant, .. }) = outcome {
            let released = self
                .engine
                .locks()
                .release(&acquire.lock, &acquire.holder, Some(grant.fencing_token))
                .await;
            if let Err(err) = released {
                tracing::warn!(error = %err, lock = %acquire.lock.name, "a grant made as its token was revoked was not released; it expires at its lease");
            }
        }
        Err(status)
    }

    pub(super) async fn release_rpc(
        &self,
        request: Request<proto::ReleaseRequest>,
    ) -> Result<Response<proto::ReleaseResponse>, Status> {
        let access = Access::of(&request)?;
        match requests::release(request.into_inner(), &access)? {
            Release::Set { locks, holder } => {
                let outcome = (self.engine.sets().release(&locks, &holder).await)
                    .map_err(|e| self.failed("Release", &locks[0].0, &holder, None, e))?;
                report::released_set(&outcome);
                Ok(Response::new((&outcome).to_proto()))
            }
            Release::One {
                lock,
                holder,
                token,
            } => {
                let outcome = (self.engine.locks().release(&lock, &holder, token).await)
                    .map_err(|e| self.failed("Release", &lock, &holder, None, e))?;
                let reply = (&outcome).to_proto();
                report::released(&*self.engine, &lock, &holder, token, outcome);
                Ok(Response::new(reply))
            }
        }
    }

    pub(super) async fn extend_rpc(
        &self,
        request: Request<proto::ExtendRequest>,
    ) -> Result<Response<proto::ExtendResponse>, Status> {
        let access = Access::of(&request)?;
        let answer_by = grpc_deadline(&request).map(|d| d.answered_at.into());
        let outcome = match requests::extend(request.into_inner(), &access, &self.limits)? {
            Extend::Set { locks, holder, ttl } => {
                let outcome = (self.engine.sets())
                    .extend((&locks, &holder), ttl, answer_by)
                    .await
                    .map_err(|e| self.failed("Extend", &locks[0].0, &holder, None, e))?;
                report::extended_set(&outcome);
                outcome
            }
            Extend::One {
                lock,
                holder,
                ttl,
                token,
            } => {
                let outcome = (self.engine.locks())
                    .extend((&lock, &holder), ttl, token, answer_by)
                    .await
                    .map_err(|e| self.failed("Extend", &lock, &holder, None, e))?;
                report::extended(&*self.engine, &lock, &holder, &outcome);
                outcome
            }
        };
        Ok(Response::new(outcome.to_proto()))
    }
}
