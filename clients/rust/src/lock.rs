//! A grant as a guard: [`LockRequest`] (acquire), [`Lock`] (the grant, its
//! watchdog, release on drop).
//!
//! One file on purpose: the request, the guard and its watchdog share the
//! grant's state (`Shared`) and its Extend and Release, which the
//! election's and the multi-lock's guards reuse through [`Lock`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tumbler_proto as proto;

use crate::client::{Client, DEADLINE_SLACK};
use crate::error::{Error, NotAcquiredReason, Result};

/// A holder id made by the client ("rust-" and a random UUID), so that a
/// retried acquire is the same request to the server: a retry of a granted
/// acquire is answered ALREADY_HELD with the same grant, never a second
/// permit.
pub fn new_holder() -> String {
    format!("rust-{}", uuid::Uuid::new_v4().simple())
}

/// The mode of a read/write lock's grant: any number of readers (up to the
/// lock's limit) or one writer, never both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared: with other readers, never with a writer.
    Read,
    /// Exclusive: alone, never with a reader or another writer.
    Write,
}

impl Mode {
    /// The API's enum value.
    pub fn to_proto(self) -> proto::LockMode {
        match self {
            Mode::Read => proto::LockMode::Read,
            Mode::Write => proto::LockMode::Write,
        }
    }

    /// The mode of a read/write lock's grant, `None` for a plain lock's
    /// (unspecified).
    pub fn from_proto(mode: proto::LockMode) -> Option<Mode> {
        match mode {
            proto::LockMode::Read => Some(Mode::Read),
            proto::LockMode::Write => Some(Mode::Write),
            proto::LockMode::Unspecified => None,
        }
    }
}

/// An acquire to configure, then send with [`acquire`](LockRequest::acquire).
/// Made by [`Client::lock`]. Unset options are the server's defaults
/// (limit 1, its default lease, fair queueing), but the wait: try once.
#[derive(Debug, Clone)]
#[must_use = "an acquire does nothing until `.acquire().await`"]
pub struct LockRequest {
    client: Client,
    name: String,
    holder: Option<String>,
    wait: Duration,
    ttl: Option<Duration>,
    limit: Option<u32>,
    kind: String,
    metadata: HashMap<String, String>,
    priority: i32,
    queue_ttl: Option<Duration>,
    fair: Option<bool>,
    mode: Option<Mode>,
    prefer_readers: bool,
    takes_over: String,
    permits: Option<u32>,
    watchdog: bool,
    cancel: Option<CancellationToken>,
}

impl LockRequest {
    pub(crate) fn new(client: Client, name: String) -> Self {
        LockRequest {
            client,
            name,
            holder: None,
            wait: Duration::ZERO,
            ttl: None,
            limit: None,
            kind: String::new(),
            metadata: HashMap::new(),
            priority: 0,
            queue_ttl: None,
            fair: None,
            mode: None,
            prefer_readers: false,
            takes_over: String::new(),
            permits: None,
            watchdog: true,
            cancel: None,
        }
    }

    /// The holder id (default: [`new_holder`]). Pass your own to make an
    /// acquire retried by your code (after a crash, say) the same request.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// Wait in the server's queue up to this long (default: try once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lease. With the watchdog on (the default) it only bounds how long
    /// a crashed holder keeps the lock: the watchdog renews it every third.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Permits of the lock (a semaphore); default 1 (a mutex).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// A short label (`[a-z0-9_.-]`) grouping locks in metrics.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Metadata stored with the grant (shown by inspect and watches).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Queue priority, -1000..1000 (higher first).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// How long a waiting request outlives its server (waiter liveness).
    pub fn queue_ttl(mut self, queue_ttl: Duration) -> Self {
        self.queue_ttl = Some(queue_ttl);
        self
    }

    /// `false`: take any free permit at once, whoever waits (barging).
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = Some(fair);
        self
    }

    /// A read permit of a read/write lock: shared with other readers (up
    /// to [`limit`](LockRequest::limit), default the server's maximum),
    /// never with a writer. The same as `.mode(Mode::Read)`.
    pub fn read(self) -> Self {
        self.mode(Mode::Read)
    }

    /// The write permit of a read/write lock: alone, with no reader and no
    /// other writer. A reader that asks it is refused
    /// (FAILED_PRECONDITION, [`Error::Status`]): release, then acquire
    /// write. The same as `.mode(Mode::Write)`.
    pub fn write(self) -> Self {
        self.mode(Mode::Write)
    }

    /// Read or write: makes the lock a read/write lock. While anyone holds
    /// or waits, a plain acquire of a read/write lock (or the reverse) is
    /// FAILED_PRECONDITION.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// With [`read`](LockRequest::read): take a free read permit at once
    /// even when writers wait (readers first; a stream of readers can
    /// then starve a writer). Default false: a reader behind a waiting
    /// writer waits behind it.
    pub fn prefer_readers(mut self, on: bool) -> Self {
        self.prefer_readers = on;
        self
    }

    /// Take over `holder`'s live grant of this lock in the same call
    /// (decision 0083): its permits and slot pass to this request's holder
    /// at once, ahead of waiters, with a new fencing token and this
    /// request's lease; when `holder` holds none, this is an ordinary
    /// acquire. How a job system hands the lock taken when a job was
    /// queued to the run that executes it. A plain lock of one permit only.
    pub fn takes_over(mut self, holder: impl Into<String>) -> Self {
        self.takes_over = holder.into();
        self
    }

    /// Take this many of the [`limit`](LockRequest::limit)'s permits at
    /// once (default 1), like golang's `semaphore.Weighted`: the grant
    /// holds one slot per permit ([`Lock::slots`]). A request that does not
    /// fit waits in line, and a big request at the head is not passed by
    /// small fair ones behind it (`fair(false)` ones pass). More than the
    /// limit, or with a read/write mode, is INVALID_ARGUMENT.
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Whether the [`Lock`] renews its lease in the background (default
    /// true).
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Stop waiting when `token` is cancelled: the acquire returns
    /// [`Error::Cancelled`] and the server drops the request from the queue
    /// at once. Dropping the acquire's future does the same.
    pub fn cancel_on(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Acquires, runs `body` with the lock, and releases it however the
    /// body ends. If the grant is lost meanwhile, the body is dropped at
    /// once (at its next `.await`) and the result is [`Error::LockLost`]:
    /// the twin of the other clients' `with_lock`/`WithLock`.
    ///
    /// ```no_run
    /// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
    /// use std::time::Duration;
    /// let total = client
    ///     .lock("reports")
    ///     .wait(Duration::from_secs(10))
    ///     .ttl(Duration::from_secs(3))
    ///     .run(async |lock| {
    ///         // Long work: the watchdog renews the 3 s lease meanwhile.
    ///         lock.fencing_token()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<T>(self, body: impl AsyncFnOnce(&Lock) -> T) -> Result<T> {
        let lock = self.acquire().await?;
        let lost = lock.lost();
        let out = tokio::select! {
            out = body(&lock) => out,
            lost = lost => return Err(lost),
        };
        if lock.is_lost() {
            return Err(lock.lost().await);
        }
        lock.release().await?;
        Ok(out)
    }

    fn request(&self, holder: &str, wait: Duration) -> proto::AcquireRequest {
        proto::AcquireRequest {
            namespace: self.client.namespace().to_owned(),
            name: self.name.clone(),
            holder: holder.to_owned(),
            limit: self.limit,
            ttl_ms: self.ttl.map(|t| t.as_millis() as u64),
            kind: self.kind.clone(),
            metadata: self.metadata.clone(),
            wait_ms: wait.as_millis() as u64,
            queue_ttl_ms: self.queue_ttl.map(|t| t.as_millis() as u64),
            priority: self.priority,
            fair: self.fair,
            mode: self
                .mode
                .map_or(proto::LockMode::Unspecified, Mode::to_proto) as i32,
            prefer_readers: self.prefer_readers,
            permits: self.permits,
            names: Vec::new(),
            takes_over: self.takes_over.clone(),
        }
    }

    /// Takes a permit, waiting in the server up to the wait. Retried on
    /// UNAVAILABLE (a server restart, a replica switch) with the same holder
    /// until the wait plus 5 s has passed, so a retry never takes a second
    /// permit. Errors: [`Error::NotAcquired`] (busy or timed out),
    /// [`Error::Cancelled`], [`Error::Unavailable`], …
    pub async fn acquire(self) -> Result<Lock> {
        cancellable(self.cancel.clone(), self.acquire_inner()).await
    }

    async fn acquire_inner(self) -> Result<Lock> {
        let (reply, sent) = self.send(&[]).await?;
        let grant = reply.grant.unwrap_or_default();
        let mut lock = Lock::new(self.client, self.name, grant, sent, self.watchdog);
        lock.limit = self.limit;
        Ok(lock)
    }

    /// Sends the acquire (of `names` when not empty: a multi-lock), retried
    /// with the same holder on UNAVAILABLE: the granting answer and when
    /// its try was sent (the lease started no earlier), or the refusal as
    /// [`Error::NotAcquired`] naming `label`.
    pub(crate) async fn send(&self, names: &[String]) -> Result<(proto::AcquireResponse, Instant)> {
        let label = if names.is_empty() {
            self.name.clone()
        } else {
            names.join(",")
        };
        let holder = self.holder.clone().unwrap_or_else(new_holder);
        let started = Instant::now();
        let deadline = started + self.wait + DEADLINE_SLACK;
        let sent = Arc::new(Mutex::new(started));
        let reply = self
            .client
            .retry(
                deadline,
                |mut stub, request| async move { stub.acquire(request).await },
                |left| {
                    *sent.lock().unwrap() = Instant::now();
                    let wait = self
                        .wait
                        .saturating_sub(started.elapsed())
                        .min(left.saturating_sub(Duration::from_millis(50)));
                    let mut request = self.request(&holder, wait);
                    request.names = names.to_vec();
                    request
                },
            )
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                return Err(Error::NotAcquired {
                    name: label,
                    reason: NotAcquiredReason::Timeout,
                    holders: 0,
                    queue_position: 0,
                });
            }
            Err(status) => return Err(status.into()),
        };
        if reply.status == proto::AcquireStatus::NotAcquired as i32 {
            let reason = if reply.reason == proto::NotAcquiredReason::Busy as i32 {
                NotAcquiredReason::Busy
            } else {
                NotAcquiredReason::Timeout
            };
            return Err(Error::NotAcquired {
                name: label,
                reason,
                holders: reply.holders,
                queue_position: reply.queue_position,
            });
        }
        // The lease started no earlier than the last try was sent.
        let sent = *sent.lock().unwrap();
        Ok((reply, sent))
    }

    /// The request's client, for the guard it makes.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Whether the guard it makes runs the watchdog.
    pub(crate) fn watchdog_on(&self) -> bool {
        self.watchdog
    }

    /// The cancellation token, if any.
    pub(crate) fn cancel_token(&self) -> Option<CancellationToken> {
        self.cancel.clone()
    }
}

/// Runs `work` until it ends or `token` (if any) is cancelled
/// ([`Error::Cancelled`]; dropping `work` cancels its call).
pub(crate) async fn cancellable<T>(
    token: Option<CancellationToken>,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    match token {
        Some(token) => tokio::select! {
            result = work => result,
            _ = token.cancelled() => Err(Error::Cancelled),
        },
        None => work.await,
    }
}

/// What a [`Lock`]'s parts share with its watchdog.
#[derive(Debug)]
struct Shared {
    /// The lock's name; a multi-lock's names joined by commas.
    name: String,
    /// A multi-lock's names (empty for a single lock): its Extend and
    /// Release name the set, not one lock nor one fencing token.
    names: Vec<String>,
    /// A multi-lock's fencing tokens, one per name in their order: its
    /// Extend and Release pin each lock to its own, so a late release
    /// never touches a set its holder took again since.
    fencing_tokens: Vec<u64>,
    holder: String,
    state: Mutex<State>,
    /// `Some(reason)` once the grant is known to be gone.
    lost: watch::Sender<Option<String>>,
    /// A leadership's secret (its winning Campaign's): it is given back
    /// with Resign, which needs the secret, not with Release.
    secret: Option<String>,
}

#[derive(Debug)]
struct State {
    grant: proto::Grant,
    /// This process's estimate of the lease's end: when the renewal that
    /// set it was sent, plus the lease.
    lease_end: Instant,
}

impl Shared {
    fn grant(&self) -> proto::Grant {
        self.state.lock().unwrap().grant.clone()
    }

    fn renewed(&self, grant: proto::Grant, sent: Instant) {
        let mut state = self.state.lock().unwrap();
        state.lease_end = sent + Duration::from_millis(grant.ttl_ms);
        state.grant = grant;
    }

    fn mark_lost(&self, reason: String) {
        self.lost.send_if_modified(|lost| {
            if lost.is_some() {
                return false;
            }
            *lost = Some(reason);
            true
        });
    }

    /// The `name` and `fencing_token` an Extend or Release of the grant
    /// carries: a multi-lock's are empty (its `names` and
    /// `fencing_tokens` say the set, each lock pinned to its own token).
    fn target(&self, fencing_token: u64) -> (String, Option<u64>) {
        if self.names.is_empty() {
            (self.name.clone(), Some(fencing_token))
        } else {
            (String::new(), None)
        }
    }

    /// The Release of the grant (of the whole set for a multi-lock).
    fn release_request(&self, client: &Client) -> proto::ReleaseRequest {
        let (name, fencing_token) = self.target(self.grant().fencing_token);
        proto::ReleaseRequest {
            namespace: client.namespace().to_owned(),
            name,
            holder: self.holder.clone(),
            fencing_token,
            names: self.names.clone(),
            fencing_tokens: self.fencing_tokens.clone(),
        }
    }

    fn lost_error(&self, reason: String) -> Error {
        Error::LockLost {
            name: self.name.clone(),
            holder: self.holder.clone(),
            fencing_token: self.grant().fencing_token,
            reason,
        }
    }
}

/// A grant: the fencing token, the slot, the lease, and (by default) a
/// watchdog that extends the lease every third of it. Released when
/// dropped (the release is spawned on the current tokio runtime), or
/// explicitly with [`release`](Lock::release), which says whether it was
/// still held.
///
/// ```no_run
/// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
/// use std::time::Duration;
/// let lock = client.lock("invoices/42").ttl(Duration::from_secs(3)).acquire().await?;
/// tokio::select! {
///     _ = do_work(lock.fencing_token()) => {}
///     lost = lock.lost() => eprintln!("stop: {lost}"),
/// }
/// lock.release().await?;
/// # Ok(()) }
/// # async fn do_work(_token: u64) {}
/// ```
pub struct Lock {
    client: Client,
    shared: Arc<Shared>,
    /// The limit it was acquired with: a downgrade asks the same (another
    /// limit would be refused while the lock is held).
    limit: Option<u32>,
    watchdog: Option<JoinHandle<()>>,
    released: bool,
}

impl Lock {
    pub(crate) fn new(
        client: Client,
        name: String,
        grant: proto::Grant,
        sent: Instant,
        watchdog: bool,
    ) -> Lock {
        Lock::with_names(client, name, Vec::new(), Vec::new(), grant, sent, watchdog)
    }

    /// A leadership's guard: renewed as a lock's, given back with Resign
    /// and its secret.
    pub(crate) fn leadership(
        client: Client,
        name: String,
        grant: proto::Grant,
        sent: Instant,
        secret: String,
    ) -> Lock {
        Lock::build(
            client,
            (name, Vec::new(), Vec::new()),
            grant,
            sent,
            true,
            Some(secret),
        )
    }

    /// A guard of a multi-lock's set (`names`, each pinned to its token in
    /// `fencing_tokens`; empty: any grant of the holder), renewed and
    /// released as one: `grant` is the one whose lease ends first.
    pub(crate) fn with_names(
        client: Client,
        name: String,
        names: Vec<String>,
        fencing_tokens: Vec<u64>,
        grant: proto::Grant,
        sent: Instant,
        watchdog: bool,
    ) -> Lock {
        Lock::build(
            client,
            (name, names, fencing_tokens),
            grant,
            sent,
            watchdog,
            None,
        )
    }

    fn build(
        client: Client,
        (name, names, fencing_tokens): (String, Vec<String>, Vec<u64>),
        grant: proto::Grant,
        sent: Instant,
        watchdog: bool,
        secret: Option<String>,
    ) -> Lock {
        let (lost, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            name,
            names,
            fencing_tokens,
            holder: grant.holder.clone(),
            state: Mutex::new(State {
                lease_end: sent + Duration::from_millis(grant.ttl_ms),
                grant,
            }),
            lost,
            secret,
        });
        let watchdog = watchdog.then(|| tokio::spawn(keep_alive(client.clone(), shared.clone())));
        Lock {
            client,
            shared,
            limit: None,
            watchdog,
            released: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// A leadership's secret ('' for a lock).
    pub(crate) fn secret(&self) -> &str {
        self.shared.secret.as_deref().unwrap_or_default()
    }

    /// The holder id of the grant.
    pub fn holder(&self) -> &str {
        &self.shared.holder
    }

    /// The fencing token: pass it to the resource you protect, which
    /// refuses writes with a token lower than the highest it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.shared.grant().fencing_token
    }

    /// The slot, 1..limit.
    pub fn slot(&self) -> u32 {
        self.shared.grant().slot
    }

    /// The permits the grant holds (1 unless asked with
    /// [`LockRequest::permits`]).
    pub fn permits(&self) -> u32 {
        self.shared.grant().permits.max(1)
    }

    /// The grant's slots, one per permit (ascending; the first is
    /// [`slot`](Lock::slot)).
    pub fn slots(&self) -> Vec<u32> {
        let grant = self.shared.grant();
        if grant.slots.is_empty() {
            vec![grant.slot]
        } else {
            grant.slots.clone()
        }
    }

    /// Read or write for a grant of a read/write lock (as last renewed or
    /// downgraded); `None` for a plain lock's.
    pub fn mode(&self) -> Option<Mode> {
        Mode::from_proto(self.shared.grant().mode())
    }

    /// Turns a write grant into a read grant at once, keeping its fencing
    /// token, slot and lease (and the watchdog): readers waiting behind it
    /// may then join. On a read grant it changes nothing. The lock being
    /// plain is FAILED_PRECONDITION ([`Error::Status`]); the grant being
    /// gone is [`Error::LockLost`] (and `lost()` resolves).
    ///
    /// ```no_run
    /// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
    /// let lock = client.lock("catalog").write().acquire().await?;
    /// // ... write ...
    /// lock.downgrade().await?;
    /// // ... read on, with other readers, under the same fencing token ...
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn downgrade(&self) -> Result<()> {
        let grant = self.shared.grant();
        let request = proto::AcquireRequest {
            namespace: self.client.namespace().to_owned(),
            name: self.shared.name.clone(),
            holder: self.shared.holder.clone(),
            limit: self.limit,
            ttl_ms: Some(grant.ttl_ms),
            kind: grant.kind.clone(),
            mode: proto::LockMode::Read as i32,
            ..Default::default()
        };
        let sent = Instant::now();
        let reply = self
            .client
            .call(
                |mut stub, req| async move { stub.acquire(req).await },
                request,
            )
            .await?;
        match reply.grant {
            Some(read) if read.fencing_token == grant.fencing_token => {
                self.shared.renewed(read, sent);
                Ok(())
            }
            other => {
                // The write grant was gone: the READ was not a downgrade but
                // a new grant (or none). Give a new one back at once.
                if let Some(new) = other {
                    let _ = self
                        .client
                        .release(&self.shared.name, &new.holder, Some(new.fencing_token))
                        .await;
                }
                Err(self.mark_lost("not held"))
            }
        }
    }

    /// The grant as last renewed (expiry in Redis-clock Unix ms).
    pub fn grant(&self) -> proto::Grant {
        self.shared.grant()
    }

    /// Marks the grant gone (something other than the watchdog learned
    /// it, e.g. a Proclaim answered NOT_LEADER): `lost()` resolves.
    pub(crate) fn mark_lost(&self, reason: &str) -> Error {
        self.shared.mark_lost(reason.to_owned());
        self.shared.lost_error(reason.to_owned())
    }

    /// True once the grant is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.borrow().is_some()
    }

    /// Resolves with [`Error::LockLost`] the moment the grant is known to be
    /// gone: a renewal answered NOT_HELD (expired, reaped, cleared,
    /// force-released) or renewals failed until the lease ran out. Never
    /// resolves while the lock is held, nor after a release. Needs the
    /// watchdog (or your own [`extend`](Lock::extend) calls) to find out.
    pub fn lost(&self) -> impl Future<Output = Error> + Send + 'static {
        let shared = self.shared.clone();
        let mut seen = self.shared.lost.subscribe();
        async move {
            let reason = loop {
                let lost = seen.borrow_and_update().clone();
                if let Some(reason) = lost {
                    break reason;
                }
                if seen.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            shared.lost_error(reason)
        }
    }

    /// Sets the lease to `ttl` from now (`None`: the grant's own lease),
    /// pinned to the fencing token. [`Error::LockLost`] when it is gone.
    pub async fn extend(&self, ttl: Option<Duration>) -> Result<proto::Grant> {
        let grant = self.shared.grant();
        let request = extend_request(&self.client, &self.shared, &grant, ttl);
        let sent = Instant::now();
        let reply = self
            .client
            .call(
                |mut stub, req| async move { stub.extend(req).await },
                request,
            )
            .await?;
        renewed(&self.shared, reply, sent)
    }

    /// Stops the watchdog and gives the permit back (pinned to the fencing
    /// token): true when it was released, false when it was no longer held.
    pub async fn release(mut self) -> Result<bool> {
        self.released = true;
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        release(&self.client, &self.shared).await
    }

    /// Keeps the grant past this guard: no release on drop, no watchdog.
    /// Returns the grant (release it later with [`Client::release`]).
    pub fn forget(mut self) -> proto::Grant {
        self.released = true;
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        self.shared.grant()
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let grant = self.shared.grant();
        f.debug_struct("Lock")
            .field("name", &self.shared.name)
            .field("holder", &self.shared.holder)
            .field("fencing_token", &grant.fencing_token)
            .field("slot", &grant.slot)
            .field("mode", &Mode::from_proto(grant.mode()))
            .field("expires_at_ms", &grant.expires_at_ms)
            .field("lost", &*self.shared.lost.borrow())
            .finish()
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        if self.released {
            return;
        }
        // Released in the background: Drop cannot wait. Without a runtime
        // (dropped after it shut down) the lease ends on its own.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (client, shared) = (self.client.clone(), self.shared.clone());
            runtime.spawn(async move {
                let _ = release(&client, &shared).await;
            });
        }
    }
}

/// Gives the grant back (the whole set for a multi-lock): true when it was
/// released, false when it (or any lock of the set) was no longer held.
async fn release(client: &Client, shared: &Shared) -> Result<bool> {
    if let Some(secret) = &shared.secret {
        // A leadership: Resign, pinned to the term, proved by the secret.
        let grant = shared.grant();
        let request = proto::ResignRequest {
            namespace: client.namespace().to_owned(),
            name: shared.name.clone(),
            candidate: shared.holder.clone(),
            term: grant.fencing_token,
            secret: secret.clone(),
        };
        let reply = client
            .call(
                |mut stub, req| async move { stub.resign(req).await },
                request,
            )
            .await?;
        return Ok(reply.status == proto::ResignStatus::Resigned as i32);
    }
    let reply = client
        .call(
            |mut stub, req| async move { stub.release(req).await },
            shared.release_request(client),
        )
        .await?;
    Ok(reply.status == proto::ReleaseStatus::Released as i32)
}

/// The Extend of the grant, pinned to its fencing token; a multi-lock's
/// names the set, each lock pinned to its own token.
fn extend_request(
    client: &Client,
    shared: &Shared,
    grant: &proto::Grant,
    ttl: Option<Duration>,
) -> proto::ExtendRequest {
    let (name, fencing_token) = shared.target(grant.fencing_token);
    proto::ExtendRequest {
        namespace: client.namespace().to_owned(),
        name,
        holder: shared.holder.clone(),
        ttl_ms: ttl.map(|t| t.as_millis() as u64),
        fencing_token,
        names: shared.names.clone(),
        fencing_tokens: shared.fencing_tokens.clone(),
    }
}

fn renewed(shared: &Shared, reply: proto::ExtendResponse, sent: Instant) -> Result<proto::Grant> {
    match reply.grant {
        Some(grant) if reply.status == proto::ExtendStatus::Extended as i32 => {
            shared.renewed(grant.clone(), sent);
            Ok(grant)
        }
        _ => {
            shared.mark_lost("not held".into());
            Err(shared.lost_error("not held".into()))
        }
    }
}

/// The watchdog: extends the lease every third of it, pinned to the fencing
/// token. A failed renewal (server restarting, replica switch, Redis down)
/// is retried with back-off until the lease would have run out; NOT_HELD,
/// or running out, marks the lock lost at once.
async fn keep_alive(client: Client, shared: Arc<Shared>) {
    let ttl = Duration::from_millis(shared.grant().ttl_ms.max(3));
    let interval = ttl / 3;
    let mut next = Instant::now() + interval;
    let mut attempt = 0;
    loop {
        tokio::time::sleep_until(next).await;
        let lease_end = shared.state.lock().unwrap().lease_end;
        let grant = shared.grant();
        let mut request = tonic::Request::new(extend_request(&client, &shared, &grant, Some(ttl)));
        // An answer is useful as long as it comes before the lease ends: a
        // slow server (a busy machine) still renews it; a dead one fails fast.
        let timeout = lease_end
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50));
        request.set_timeout(timeout);
        let sent = Instant::now();
        let reply = tokio::time::timeout(timeout, client.stub().extend(request)).await;
        match reply {
            Ok(Ok(reply)) => {
                if renewed(&shared, reply.into_inner(), sent).is_err() {
                    return;
                }
                next = sent + interval;
                attempt = 0;
            }
            failed => {
                let why = match failed {
                    Ok(Err(status)) => format!("{}: {}", status.code(), status.message()),
                    _ => "no answer in time".to_owned(),
                };
                if Instant::now() >= lease_end {
                    shared.mark_lost(format!("renewals failed until the lease ran out ({why})"));
                    return;
                }
                next = (Instant::now() + client.backoff().delay(attempt)).min(lease_end);
                attempt += 1;
            }
        }
    }
}
