//! The engine's face: the traits of `tumbler-face` (`handles.rs`), one
//! per capability, implemented here by [`LockEngine`], each call handed
//! to the part that serves it. None hands out a part, the store or the
//! layout; parameters are typed (`&Namespace`, `&Holder`, `&Kind`), and a
//! debug line's key names come from [`LockFace::key_names`]. The layout
//! checks that only the server's wiring runs are inherent methods here.

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use changelog::{ChangelogPage, ChangelogQuery, ChangelogSettings};
use locks::GrantRef;
use ops::session_record::Touch;
use resume::{ResumeError, Resumed, SessionEnd, SessionTicket};
use sessions::LostGrant;
use watchers::{Filter, LockEvent};

impl EngineFace for LockEngine {
    fn locks(&self) -> &dyn LockFace {
        self
    }

    fn sets(&self) -> &dyn SetFace {
        self
    }

    fn session_calls(&self) -> &dyn SessionFace {
        self
    }

    fn elections(&self) -> &dyn ElectionFace {
        self
    }

    fn walks(&self) -> &dyn WalkFace {
        self
    }

    fn watch(&self) -> &dyn WatchFace {
        self
    }

    fn health(&self) -> &dyn HealthFace {
        self
    }
}

impl LockEngine {
    /// Records this deployment's layout in Redis, or checks the one already
    /// there (see `calls.rs`); also learns Redis' clock.
    pub async fn verify_layout(&self) -> Result<(), LayoutError> {
        self.calls.verify_layout().await
    }

    /// The health check: Redis answers, holds this deployment's layout
    /// record, and lets the configured user run the lock path. A failure's
    /// reason is kept for the readiness of every request.
    pub async fn check_redis(&self) -> Result<(), LayoutError> {
        self.calls.check_redis().await
    }
}

#[async_trait]
impl LockFace for LockEngine {
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, EngineError> {
        self.calls.ready().or_trouble()?;
        self.counting
            .note_namespace(&req.lock.namespace)
            .await
            .or_trouble()?;
        if let Some(old) = &req.takes_over
            && let Some(outcome) = self.locks.take_over(req, old.as_str()).await?
        {
            return Ok(outcome);
        }
        if req.wait.is_zero() {
            self.locks.acquire_once(req).await
        } else {
            self.waiting.acquire(req).await
        }
    }

    async fn release(
        &self,
        lock: &LockId,
        holder: &Holder,
        fencing_token: Option<u64>,
    ) -> Result<ReleaseOutcome, EngineError> {
        (self.locks)
            .release(lock, holder, fencing_token, None)
            .await
    }

    async fn extend(
        &self,
        (lock, holder): (&LockId, &Holder),
        ttl: Option<Ttl>,
        fencing_token: Option<u64>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        let grant = GrantRef {
            lock,
            holder,
            fencing_token,
        };
        self.locks.extend(grant, ttl, answer_by, None).await
    }

    async fn inspect(&self, lock: &LockId) -> Result<LockState, EngineError> {
        self.locks.inspect(lock).await
    }

    async fn queue(&self, lock: &LockId, most: u32) -> Result<QueueState, EngineError> {
        self.locks.queue(lock, most).await
    }

    fn record_error(&self, namespace: &Namespace, kind: &Kind) {
        self.counting.now(namespace, kind, "errors");
    }

    fn key_names(&self, lock: &LockId) -> keys::LockKeys {
        self.calls.layout().lock_keys(&lock.namespace, &lock.name)
    }
}

#[async_trait]
impl SetFace for LockEngine {
    async fn acquire(&self, req: MultiAcquireRequest) -> Result<MultiOutcome, EngineError> {
        self.calls.ready().or_trouble()?;
        (self.counting.note_namespace(&req.req.lock.namespace).await).or_trouble()?;
        self.multi.acquire(req).await
    }

    async fn release(
        &self,
        locks: &[SetLock],
        holder: &Holder,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.multi.release_set(locks, holder).await
    }

    async fn extend(
        &self,
        (locks, holder): (&[SetLock], &Holder),
        ttl: Option<Ttl>,
        answer_by: Option<Instant>,
    ) -> Result<ExtendOutcome, EngineError> {
        (self.multi).extend_set(locks, holder, ttl, answer_by).await
    }
}

#[async_trait]
impl SessionFace for LockEngine {
    async fn open(&self, owner: &str, ttl: Ttl) -> Result<SessionTicket, EngineError> {
        self.sessions.open(owner, ttl.ms()).await
    }

    async fn resume(
        &self,
        (owner, session, secret): (&str, &str, &str),
        may_act: &(dyn for<'n> Fn(&'n str) -> bool + Send + Sync),
        lost_tx: &mpsc::Sender<LostGrant>,
    ) -> Result<Resumed, ResumeError> {
        (self.sessions)
            .resume(owner, session, secret, may_act, lost_tx)
            .await
    }

    fn renewed_grants(&self) -> usize {
        self.renewer.sessions().len()
    }

    async fn touch(&self, (session, epoch): Stream<'_>, ttl_ms: u64) -> Result<Touch, EngineError> {
        self.sessions.touch(session, epoch, ttl_ms).await
    }

    async fn end(
        &self,
        (session, epoch): Stream<'_>,
        ttl_ms: u64,
        end: SessionEnd,
    ) -> (Vec<(LockId, u64)>, bool) {
        self.sessions.end(session, epoch, ttl_ms, end).await
    }

    fn grants(&self, (session, epoch): Stream<'_>) -> Vec<(LockId, u64)> {
        self.renewer.sessions().grants_of(session, epoch)
    }

    async fn acquire(
        &self,
        (session, epoch): Stream<'_>,
        req: &AcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<AcquireOutcome, EngineError> {
        debug_assert_eq!(req.session_epoch, Some(epoch), "the stream's epoch");
        let outcome = LockFace::acquire(self, req).await?;
        (self.sessions)
            .keep_grant(session, epoch, req, &outcome, lost)
            .await?;
        Ok(outcome)
    }

    async fn acquire_set(
        &self,
        (session, epoch): Stream<'_>,
        req: MultiAcquireRequest,
        lost: &mpsc::Sender<LostGrant>,
    ) -> Result<MultiOutcome, EngineError> {
        let session = session.as_str();
        let namespace = req.req.lock.namespace.clone();
        let locks: Vec<LockId> = (req.names.iter())
            .map(|name| LockId {
                namespace: namespace.clone(),
                name: name.clone(),
            })
            .collect();
        let set = self.sessions.set_for(session, epoch, &locks)?;
        let ttl = req.req.ttl;
        let outcome = SetFace::acquire(self, req).await?;
        (self.sessions)
            .keep_set((session, epoch), (&namespace, ttl, set), &outcome, lost)
            .await?;
        Ok(outcome)
    }

    async fn release(
        &self,
        (session, epoch): Stream<'_>,
        locks: &[LockId],
        field: &'static str,
    ) -> Result<ReleaseOutcome, EngineError> {
        (self.sessions)
            .release_named(session, epoch, locks, field)
            .await
    }

    async fn give_up(&self, (session, epoch): Stream<'_>, lost: &LostGrant) {
        self.sessions.release_broken(session, epoch, lost).await
    }

    async fn release_one(
        &self,
        (session, epoch): Stream<'_>,
        lock: &LockId,
    ) -> Result<ReleaseOutcome, EngineError> {
        self.sessions.release(session, epoch, lock).await
    }
}

#[async_trait]
impl ElectionFace for LockEngine {
    async fn proclaim(
        &self,
        (lock, candidate): (&LockId, &Holder),
        term: u64,
        value: &str,
        proof: &str,
    ) -> Result<ProclaimOutcome, EngineError> {
        (self.election)
            .proclaim(lock, candidate, term, value, proof)
            .await
    }

    async fn leader(&self, lock: &LockId) -> Result<(Option<Leadership>, i64), EngineError> {
        let state = self.locks.inspect(lock).await?;
        let now_ms = state.now_ms;
        Ok((election::leader_of(state), now_ms))
    }

    async fn resign(
        &self,
        (lock, candidate): (&LockId, &Holder),
        term: u64,
        proof: &str,
    ) -> Result<bool, EngineError> {
        let outcome = (self.locks)
            .release_proved(lock, candidate, term, proof)
            .await?;
        Ok(matches!(outcome, ReleaseOutcome::Released { .. }))
    }
}

#[async_trait]
impl WalkFace for LockEngine {
    async fn namespaces(&self) -> Result<Vec<String>, EngineError> {
        self.walks.namespaces().await
    }

    async fn list(
        &self,
        namespace: &Namespace,
        prefix: &str,
        (page_size, from): (u32, Option<ListCursor>),
        only_waiting: bool,
    ) -> Result<ListPage, EngineError> {
        (self.walks)
            .list(namespace, prefix, page_size, from, only_waiting)
            .await
    }

    async fn reap(
        &self,
        namespace: &Namespace,
        older_than_ms: Option<u64>,
    ) -> Result<ReapCounts, EngineError> {
        self.walks.reap(namespace, older_than_ms).await
    }

    async fn clear(
        &self,
        namespace: &Namespace,
        done: &mut ClearCounts,
    ) -> Result<(), EngineError> {
        self.walks.clear(namespace, done).await
    }

    async fn metrics(
        &self,
        namespace: &Namespace,
        (from_ms, to_ms): (i64, i64),
        kind: Option<&Kind>,
    ) -> Result<MetricsReport, EngineError> {
        let kind = kind.map(Kind::as_str);
        self.walks.metrics(namespace, from_ms, to_ms, kind).await
    }

    fn changelog_settings(&self) -> &ChangelogSettings {
        self.changelog.settings()
    }

    async fn changelog(
        &self,
        namespace: &Namespace,
        query: &ChangelogQuery,
    ) -> Result<ChangelogPage, EngineError> {
        self.changelog.page(namespace, query).await
    }

    async fn wait_chains(
        &self,
        namespace: &Namespace,
        page: Option<u64>,
    ) -> Result<WaitChainsPage, EngineError> {
        self.waiting.wait_chains(namespace, page).await
    }
}

#[async_trait]
impl WatchFace for LockEngine {
    async fn announce(&self, namespace: &Namespace) -> Result<(), EngineError> {
        self.watching.announce(namespace).await.or_trouble()
    }

    fn add(&self, filter: Filter, buffer: usize) -> watchers::WatchHandle {
        self.watchers().add(filter, buffer)
    }

    async fn state(&self, filter: &Filter) -> Result<Vec<LockEvent>, EngineError> {
        self.watching.watch_state(filter).await
    }
}

impl HealthFace for LockEngine {
    fn batch_sizes(&self) -> Vec<u64> {
        self.calls.batch_sizes()
    }

    fn waiting(&self) -> usize {
        self.waiters().len()
    }

    fn draining(&self) -> CancellationToken {
        self.shutdown_token()
    }
}
