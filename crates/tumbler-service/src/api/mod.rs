//! gRPC handlers of `tumbler.v1.LockService`. Each one validates its
//! request (see [`validate`]), calls the lock engine once, and maps the
//! outcome to a reply; Redis trouble becomes UNAVAILABLE. No lock
//! semantics live here.

mod batch;
mod election;
mod locks;
mod quota;
mod session;

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::auth::{Access, LiveAccess, Throttle};
use crate::engine::{self, EngineFace};
use crate::errors;
use crate::proto::{self, lock_service_server::LockService};
use crate::replies::{self, ToProto};
use crate::validate::Limits;
use crate::{requests, watch};
use locks::handler_spans;

/// The service: the shared engine, the request bounds and the open
/// streams.
#[derive(Clone)]
pub struct LockApi {
    engine: Arc<dyn EngineFace>,
    limits: Limits,
    sessions: Arc<StreamSlots>,
    watchers: Arc<StreamSlots>,
    /// Per-tenant shares of the pools above and of the engine's waiters.
    session_quota: Arc<quota::Quotas>,
    watch_quota: Arc<quota::Quotas>,
    waiter_quota: Arc<quota::Quotas>,
    /// Failed resumes per client address (shared with the dashboard's
    /// login): `check` before a resume, `failed` after a wrong secret.
    auth_throttle: Arc<Throttle>,
}

/// What this replica, and each tenant, may hold open: the server's
/// `--max-sessions`, `--max-watchers` and per-token flags.
#[derive(Clone, Debug)]
pub struct StreamLimits {
    pub max_sessions: usize,
    pub max_watchers: usize,
    pub max_sessions_per_token: usize,
    pub max_watchers_per_token: usize,
    pub max_watchers_per_namespace: usize,
    pub max_waiters_per_token: usize,
}

/// Long-lived streams of one kind that this replica may hold open.
pub struct StreamSlots {
    what: &'static str,
    max: usize,
    open: std::sync::atomic::AtomicUsize,
}

/// One open stream; gives its slot back when dropped.
pub struct StreamSlot(Arc<StreamSlots>);

impl StreamSlots {
    fn new(what: &'static str, max: usize) -> Arc<Self> {
        Arc::new(StreamSlots {
            what,
            max,
            open: Default::default(),
        })
    }

    /// A slot, or RESOURCE_EXHAUSTED when all are taken.
    fn take(self: &Arc<Self>) -> Result<StreamSlot, Status> {
        use std::sync::atomic::Ordering;
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Status::resource_exhausted(format!(
                "this replica already has {} open {} streams; retry later or on another replica",
                self.max, self.what
            )));
        }
        crate::observe::stream_opened(self.what);
        Ok(StreamSlot(self.clone()))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        crate::observe::stream_closed(self.0.what);
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl LockApi {
    pub fn new(
        engine: Arc<dyn EngineFace>,
        limits: Limits,
        transport: &StreamLimits,
        auth_throttle: Arc<Throttle>,
    ) -> Self {
        LockApi {
            engine,
            limits,
            auth_throttle,
            sessions: StreamSlots::new("session", transport.max_sessions),
            watchers: StreamSlots::new("watch", transport.max_watchers),
            session_quota: quota::Quotas::new(
                quota::Held::Sessions,
                transport.max_sessions_per_token,
                None,
            ),
            watch_quota: quota::Quotas::new(
                quota::Held::Watchers,
                transport.max_watchers_per_token,
                Some(transport.max_watchers_per_namespace),
            ),
            waiter_quota: quota::Quotas::new(
                quota::Held::Waiters,
                transport.max_waiters_per_token,
                None,
            ),
        }
    }
}

/// Trailers of an interrupted Clear: what it cleared before it stopped.
pub use crate::proto::metadata::{CLEARED_GRANTS, CLEARED_LOCKS, CLEARED_REQUESTS};

/// The status of a Clear that stopped partway: its error, saying how far
/// it got (in the message, and as numbers in trailers) and that running
/// it again finishes the job.
fn clear_interrupted(status: Status, counts: &engine::ClearCounts) -> Status {
    let message = format!(
        "{}; cleared {} locks ({} grants released, {} requests dropped) before stopping; run Clear again to finish",
        status.message(),
        counts.locks,
        counts.grants,
        counts.requests
    );
    let mut metadata = tonic::metadata::MetadataMap::new();
    for (key, value) in [
        (CLEARED_LOCKS, counts.locks),
        (CLEARED_GRANTS, counts.grants),
        (CLEARED_REQUESTS, counts.requests),
    ] {
        metadata.insert(key, value.into());
    }
    Status::with_metadata(status.code(), message, metadata)
}

/// Runs a hot-path RPC's body (`$body`, a future) inside its handler's
/// span `$name`, whose lock fields the body fills in, when spans are
/// wanted (see [`handler_spans`]); else bare. A macro: a span's name is
/// part of its static metadata.
macro_rules! in_handler_span {
    ($name:literal, $body:expr) => {
        if handler_spans() {
            let span = tracing::info_span!(
                $name,
                namespace = tracing::field::Empty,
                lock_name = tracing::field::Empty,
                holder = tracing::field::Empty,
            );
            $body.instrument(span).await
        } else {
            $body.await
        }
    };
}

#[tonic::async_trait]
impl LockService for LockApi {
    async fn acquire(
        &self,
        request: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        in_handler_span!("Acquire", self.acquire_rpc(request))
    }

    async fn release(
        &self,
        request: Request<proto::ReleaseRequest>,
    ) -> Result<Response<proto::ReleaseResponse>, Status> {
        in_handler_span!("Release", self.release_rpc(request))
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendRequest>,
    ) -> Result<Response<proto::ExtendResponse>, Status> {
        in_handler_span!("Extend", self.extend_rpc(request))
    }

    async fn batch(
        &self,
        request: Request<proto::BatchRequest>,
    ) -> Result<Response<proto::BatchResponse>, Status> {
        in_handler_span!("Batch", self.batch_rpc(request))
    }

    #[tracing::instrument(name = "Inspect", skip_all, fields(namespace, lock_name))]
    async fn inspect(
        &self,
        request: Request<proto::InspectRequest>,
    ) -> Result<Response<proto::InspectResponse>, Status> {
        let access = Access::of(&request)?;
        let req = request.into_inner();
        let lock = requests::readable_lock(req.namespace, req.name, &access)?;
        let state = self
            .engine
            .locks()
            .inspect(&lock)
            .await
            .map_err(errors::status)?;
        Ok(Response::new(replies::inspect_response(&lock, state)))
    }

    #[tracing::instrument(name = "Queue", skip_all, fields(namespace, lock_name))]
    async fn queue(
        &self,
        request: Request<proto::QueueRequest>,
    ) -> Result<Response<proto::QueueResponse>, Status> {
        let access = Access::of(&request)?;
        let (lock, most) = requests::queue(request.into_inner(), &access)?;
        let state = self
            .engine
            .locks()
            .queue(&lock, most)
            .await
            .map_err(errors::status)?;
        Ok(Response::new(replies::queue_response(&lock, state)))
    }

    #[tracing::instrument(name = "List", skip_all, fields(namespace))]
    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        let access = Access::of(&request)?;
        let list = requests::list(request.into_inner(), &access)?;
        let page = self
            .engine
            .walks()
            .list(
                &list.namespace,
                &list.prefix,
                (list.page_size, list.from),
                list.only_waiting,
            )
            .await
            .map_err(errors::status)?;
        Ok(Response::new(replies::list_response(page)))
    }

    #[tracing::instrument(name = "ListNamespaces", skip_all)]
    async fn list_namespaces(
        &self,
        request: Request<proto::ListNamespacesRequest>,
    ) -> Result<Response<proto::ListNamespacesResponse>, Status> {
        let access = Access::of(&request)?;
        let mut namespaces = self
            .engine
            .walks()
            .namespaces()
            .await
            .map_err(errors::status)?;
        namespaces.retain(|namespace| access.lists(namespace));
        namespaces.sort();
        Ok(Response::new(proto::ListNamespacesResponse { namespaces }))
    }

    #[tracing::instrument(name = "Reap", skip_all, fields(namespace))]
    async fn reap(
        &self,
        request: Request<proto::ReapRequest>,
    ) -> Result<Response<proto::ReapResponse>, Status> {
        let access = Access::of(&request)?;
        let (namespace, older_than) = requests::reap(request.into_inner(), &access)?;
        let counts = self
            .engine
            .walks()
            .reap(&namespace, older_than)
            .await
            .map_err(errors::status)?;
        tracing::info!(
            %namespace,
            by = access.who(),
            expired_holders = counts.expired_holders,
            dead_waiters = counts.dead_waiters,
            stale_index_entries = counts.stale_index_entries,
            old_grants = counts.old_grants,
            old_waiters = counts.old_waiters,
            locks_visited = counts.locks_visited,
            "reaped on request"
        );
        Ok(Response::new(replies::reap_response(&counts)))
    }

    #[tracing::instrument(name = "Clear", skip_all, fields(namespace))]
    async fn clear(
        &self,
        request: Request<proto::ClearRequest>,
    ) -> Result<Response<proto::ClearResponse>, Status> {
        let access = Access::of(&request)?;
        let namespace = requests::clear(request.into_inner(), &access)?;
        let mut counts = engine::ClearCounts::default();
        let result = self.engine.walks().clear(&namespace, &mut counts).await;
        // One log line either way: how far the clear got, and why it
        // stopped when it did not finish.
        let error = result.as_ref().err().map(ToString::to_string);
        tracing::warn!(
            %namespace,
            by = access.who(),
            locks_cleared = counts.locks,
            grants_released = counts.grants,
            requests_dropped = counts.requests,
            error = error.as_deref(),
            "{}",
            if error.is_some() { "namespace clear interrupted" } else { "namespace cleared" }
        );
        result.map_err(|err| clear_interrupted(errors::status(err), &counts))?;
        Ok(Response::new(proto::ClearResponse {
            locks_cleared: counts.locks,
            grants_released: counts.grants,
            requests_dropped: counts.requests,
        }))
    }

    #[tracing::instrument(name = "Metrics", skip_all, fields(namespace))]
    async fn metrics(
        &self,
        request: Request<proto::MetricsRequest>,
    ) -> Result<Response<proto::MetricsResponse>, Status> {
        let access = Access::of(&request)?;
        let now_ms = crate::engine::wallclock::unix_ms();
        let requests::Metrics {
            namespace,
            from_ms,
            to_ms,
            kind,
        } = requests::metrics(request.into_inner(), &access, now_ms)?;
        let report = self
            .engine
            .walks()
            .metrics(&namespace, (from_ms, to_ms), kind.as_ref())
            .await
            .map_err(errors::status)?;
        Ok(Response::new(replies::metrics_response(
            report, from_ms, to_ms,
        )))
    }

    type SessionStream = session::SessionStream;

    #[tracing::instrument(name = "Session", skip_all, fields(session))]
    async fn session(
        &self,
        request: Request<tonic::Streaming<proto::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let access = LiveAccess::of(&request)?;
        let share = self.session_quota.take(access.access(), None)?;
        let slot = self.sessions.take()?;
        session::open(self, access, (share, slot), request.into_inner()).await
    }

    type WatchStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<proto::LockEvent, Status>> + Send>,
    >;

    #[tracing::instrument(name = "Watch", skip_all, fields(namespace))]
    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use std::sync::atomic::Ordering;
        let mut access = LiveAccess::of(&request)?;
        let req = request.into_inner();
        let filter = requests::watch(&req, access.access())?;
        let share = self
            .watch_quota
            .take(access.access(), Some(&filter.namespace))?;
        let slot = self.watchers.take()?;
        let namespace = filter.namespace.clone();
        let state_filter = filter.clone();
        let watch = self.engine.watch().add(filter, WATCH_BUFFER);
        // From now on every replica's calls on this namespace publish its
        // events (an unwatched namespace publishes none).
        (self.engine.watch())
            .announce(&namespace)
            .await
            .map_err(errors::status)?;
        // The state is read once the watcher is registered and announced:
        // whatever changes meanwhile arrives as events after it.
        let state = if req.initial_state {
            (self.engine.watch())
                .state(&state_filter)
                .await
                .map_err(errors::status)?
        } else {
            Vec::new()
        };
        let (guard, overflowed, mut events) = (watch.guard, watch.overflowed, watch.events);
        // The stream's own task: forwards events while the client reads,
        // ends the stream when the token is revoked or expires, and holds
        // the registration and the slots as long as it runs.
        let (out, outbox) = tokio::sync::mpsc::channel(1);
        tokio::spawn(
            async move {
                let _held = (guard, share, slot);
                for event in state {
                    if out.send(Ok(event.to_proto())).await.is_err() {
                        return;
                    }
                }
                loop {
                    tokio::select! {
                        event = events.recv() => match event {
                            Some(event) => {
                                if out.send(Ok(event.to_proto())).await.is_err() {
                                    return;
                                }
                            }
                            None => {
                                if overflowed.load(Ordering::Acquire) {
                                    let _ = out.send(Err(Status::resource_exhausted(format!(
                                        "watcher dropped: more than {WATCH_BUFFER} events unread"
                                    )))).await;
                                }
                                return;
                            }
                        },
                        status = watch::lost(&mut access, &namespace) => {
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

    // Leader election (`election.rs`).

    #[tracing::instrument(name = "Campaign", skip_all)]
    async fn campaign(
        &self,
        request: Request<proto::CampaignRequest>,
    ) -> Result<Response<proto::CampaignResponse>, Status> {
        self.campaign_rpc(request).await
    }

    #[tracing::instrument(name = "Proclaim", skip_all)]
    async fn proclaim(
        &self,
        request: Request<proto::ProclaimRequest>,
    ) -> Result<Response<proto::ProclaimResponse>, Status> {
        self.proclaim_rpc(request).await
    }

    #[tracing::instrument(name = "Leader", skip_all)]
    async fn leader(
        &self,
        request: Request<proto::LeaderRequest>,
    ) -> Result<Response<proto::LeaderResponse>, Status> {
        self.leader_rpc(request).await
    }

    type ObserveStream = election::ObserveStream;

    #[tracing::instrument(name = "Observe", skip_all)]
    async fn observe(
        &self,
        request: Request<proto::LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        self.observe_rpc(request).await
    }

    #[tracing::instrument(name = "Resign", skip_all)]
    async fn resign(
        &self,
        request: Request<proto::ResignRequest>,
    ) -> Result<Response<proto::ResignResponse>, Status> {
        self.resign_rpc(request).await
    }
}

/// Events a watcher may leave unread before it is dropped.
const WATCH_BUFFER: usize = 256;
