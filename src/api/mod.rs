//! gRPC handlers of `tumbler.v1.LockService`. Each one validates its
//! request (see [`validate`]), calls the lock engine once, and maps the
//! outcome to a reply; Redis trouble becomes UNAVAILABLE. No lock
//! semantics live here.

pub mod validate;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::engine::{self, AcquireOutcome, ExtendOutcome, LockEngine, LockId, ReleaseOutcome};
use crate::proto::{
    self, AcquireStatus, ExtendStatus, NotAcquiredReason, ReleaseStatus,
    lock_service_server::LockService,
};
use crate::store::StoreError;
use validate::Limits;

/// The service: the shared engine and the request bounds.
pub struct LockApi {
    engine: Arc<LockEngine>,
    limits: Limits,
}

impl LockApi {
    pub fn new(engine: Arc<LockEngine>, limits: Limits) -> Self {
        LockApi { engine, limits }
    }
}

/// Redis trouble is UNAVAILABLE (retry elsewhere or later; nothing was
/// granted); a reply the engine cannot read is INTERNAL.
fn store_status(err: StoreError) -> Status {
    match err {
        StoreError::Unavailable(detail) => {
            tracing::warn!(%detail, "redis unavailable");
            Status::unavailable(format!("lock store unavailable: {detail}"))
        }
        StoreError::Protocol(detail) => {
            tracing::error!(%detail, "unexpected redis reply");
            Status::internal("lock store answered unexpectedly")
        }
    }
}

fn lock_id(namespace: &str, name: &str) -> Result<LockId, Status> {
    Ok(LockId {
        namespace: validate::namespace(namespace)?,
        name: validate::name(name)?,
    })
}

fn grant_reply(grant: engine::Grant) -> proto::Grant {
    proto::Grant {
        holder: grant.holder,
        fencing_token: grant.fencing_token,
        slot: grant.slot,
        acquired_at_ms: grant.acquired_at_ms,
        expires_at_ms: grant.expires_at_ms,
        ttl_ms: grant.ttl_ms,
        kind: grant.kind,
        metadata: grant.metadata.into_iter().collect(),
    }
}

/// A time-ordered holder id for callers that bring none.
fn new_holder_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[tonic::async_trait]
impl LockService for LockApi {
    #[tracing::instrument(name = "Acquire", skip_all, fields(namespace, name, holder))]
    async fn acquire(
        &self,
        request: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let req = request.into_inner();
        let lock = lock_id(&req.namespace, &req.name)?;
        let holder = validate::optional_holder(&req.holder)?.unwrap_or_else(new_holder_id);
        let acquire = engine::AcquireRequest {
            limit: validate::limit(req.limit, &self.limits)?,
            ttl_ms: validate::ttl_ms(req.ttl_ms, &self.limits)?,
            kind: validate::kind(&req.kind)?,
            metadata: validate::metadata(&req.metadata)?,
            holder,
            lock,
        };
        let span = tracing::Span::current();
        span.record("namespace", &acquire.lock.namespace);
        span.record("name", &acquire.lock.name);
        span.record("holder", &acquire.holder);

        let reply = match self.engine.acquire(&acquire).await.map_err(store_status)? {
            AcquireOutcome::Acquired { grant, holders } => proto::AcquireResponse {
                status: AcquireStatus::Acquired.into(),
                grant: Some(grant_reply(grant)),
                holders,
                ..Default::default()
            },
            AcquireOutcome::AlreadyHeld { grant, holders } => proto::AcquireResponse {
                status: AcquireStatus::AlreadyHeld.into(),
                grant: Some(grant_reply(grant)),
                holders,
                ..Default::default()
            },
            AcquireOutcome::Busy {
                holders,
                next_expiry_at_ms,
            } => proto::AcquireResponse {
                status: AcquireStatus::NotAcquired.into(),
                reason: NotAcquiredReason::Busy.into(),
                holders,
                next_expiry_at_ms,
                ..Default::default()
            },
        };
        tracing::debug!(status = ?reply.status(), "acquire answered");
        Ok(Response::new(reply))
    }

    #[tracing::instrument(name = "Release", skip_all, fields(namespace, name, holder))]
    async fn release(
        &self,
        request: Request<proto::ReleaseRequest>,
    ) -> Result<Response<proto::ReleaseResponse>, Status> {
        let req = request.into_inner();
        let lock = lock_id(&req.namespace, &req.name)?;
        let holder = validate::holder(&req.holder)?;
        let token = validate::fencing_token(req.fencing_token)?;
        let status = match self
            .engine
            .release(&lock, &holder, token)
            .await
            .map_err(store_status)?
        {
            ReleaseOutcome::Released => ReleaseStatus::Released,
            ReleaseOutcome::NotHeld => ReleaseStatus::NotHeld,
        };
        Ok(Response::new(proto::ReleaseResponse {
            status: status.into(),
        }))
    }

    #[tracing::instrument(name = "Extend", skip_all, fields(namespace, name, holder))]
    async fn extend(
        &self,
        request: Request<proto::ExtendRequest>,
    ) -> Result<Response<proto::ExtendResponse>, Status> {
        let req = request.into_inner();
        let lock = lock_id(&req.namespace, &req.name)?;
        let holder = validate::holder(&req.holder)?;
        let ttl = validate::optional_ttl_ms(req.ttl_ms, &self.limits)?;
        let token = validate::fencing_token(req.fencing_token)?;
        let reply = match self
            .engine
            .extend(&lock, &holder, ttl, token)
            .await
            .map_err(store_status)?
        {
            ExtendOutcome::Extended(grant) => proto::ExtendResponse {
                status: ExtendStatus::Extended.into(),
                grant: Some(grant_reply(grant)),
            },
            ExtendOutcome::NotHeld => proto::ExtendResponse {
                status: ExtendStatus::NotHeld.into(),
                grant: None,
            },
        };
        Ok(Response::new(reply))
    }

    #[tracing::instrument(name = "Inspect", skip_all, fields(namespace, name))]
    async fn inspect(
        &self,
        request: Request<proto::InspectRequest>,
    ) -> Result<Response<proto::InspectResponse>, Status> {
        let req = request.into_inner();
        let lock = lock_id(&req.namespace, &req.name)?;
        let state = self.engine.inspect(&lock).await.map_err(store_status)?;
        let now_ms = state.now_ms;
        Ok(Response::new(proto::InspectResponse {
            namespace: lock.namespace,
            name: lock.name,
            limit: state.limit,
            waiters: state.waiters,
            now_ms,
            holders: state
                .holders
                .into_iter()
                .map(|grant| proto::HolderInfo {
                    remaining_ms: grant.expires_at_ms - now_ms,
                    grant: Some(grant_reply(grant)),
                })
                .collect(),
        }))
    }
}
