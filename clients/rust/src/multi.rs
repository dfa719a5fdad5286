//! Multi-locks: [`LockSetRequest`] (acquire several locks, all or none) and
//! [`LockSet`] (the set's guard). The guard is a [`Lock`] whose Extend and
//! Release name the set, so the set shares the lock's watchdog, `lost()`
//! and release on drop.

use std::time::Duration;

use tumbler_proto as proto;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lock::{Lock, LockRequest, cancellable};

impl Client {
    /// An acquire of the locks `names` together (2 to 16 distinct names of
    /// the client's namespace), all or nothing: see [`LockSetRequest`].
    ///
    /// ```no_run
    /// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
    /// use std::time::Duration;
    /// let set = client
    ///     .lock_all(["accounts/1", "accounts/2"])
    ///     .wait(Duration::from_secs(5))
    ///     .ttl(Duration::from_secs(3))
    ///     .acquire()
    ///     .await?;
    /// let from = set.fencing_token("accounts/1").unwrap();
    /// let to = set.fencing_token("accounts/2").unwrap();
    /// // ... move money between the two, each write fenced by its token ...
    /// # let _ = (from, to);
    /// set.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<I, S>(&self, names: I) -> LockSetRequest
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockSetRequest {
            request: LockRequest::new(self.clone(), String::new()),
            names: names.into_iter().map(Into::into).collect(),
        }
    }
}

/// A multi-lock's acquire to configure, then send with
/// [`acquire`](LockSetRequest::acquire). Made by [`Client::lock_all`]. One
/// holder, one lease and one wait for the whole set; each lock grants one
/// permit under the [`limit`](LockSetRequest::limit) (default 1). While it
/// waits it holds nothing: the server tries the whole set again whenever a
/// lock of it frees.
#[derive(Debug, Clone)]
#[must_use = "an acquire does nothing until `.acquire().await`"]
pub struct LockSetRequest {
    request: LockRequest,
    names: Vec<String>,
}

impl LockSetRequest {
    /// The holder id (default: [`new_holder`](crate::new_holder)): a retry
    /// with the same holder gets the same grants back.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.request = self.request.holder(holder);
        self
    }

    /// Wait in the server up to this long for the whole set (default: try
    /// once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.request = self.request.wait(wait);
        self
    }

    /// The lease of every lock of the set; the watchdog (on by default)
    /// renews the set every third of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.request = self.request.ttl(ttl);
        self
    }

    /// Permits of each lock (default 1); the set takes one of each.
    pub fn limit(mut self, limit: u32) -> Self {
        self.request = self.request.limit(limit);
        self
    }

    /// A short label (`[a-z0-9_.-]`) grouping locks in metrics.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.request = self.request.kind(kind);
        self
    }

    /// Metadata stored with each grant.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request = self.request.metadata(key, value);
        self
    }

    /// How long a waiting request outlives its server (waiter liveness).
    pub fn queue_ttl(mut self, queue_ttl: Duration) -> Self {
        self.request = self.request.queue_ttl(queue_ttl);
        self
    }

    /// Whether the [`LockSet`] renews its leases in the background
    /// (default true).
    pub fn watchdog(mut self, on: bool) -> Self {
        self.request = self.request.watchdog(on);
        self
    }

    /// Stop waiting when `token` is cancelled ([`Error::Cancelled`]; the
    /// server stops waiting at once). Dropping the future does the same.
    pub fn cancel_on(mut self, token: crate::CancellationToken) -> Self {
        self.request = self.request.cancel_on(token);
        self
    }

    /// Takes every lock of the set or none, waiting in the server up to the
    /// wait; retried on UNAVAILABLE with the same holder, as
    /// [`LockRequest::acquire`]. Errors: [`Error::NotAcquired`] (busy or
    /// timed out; `name` is the set's names joined by commas),
    /// [`Error::Cancelled`], [`Error::InvalidArgument`] (fewer than 2 or
    /// more than 16 names, a name twice), …
    pub async fn acquire(self) -> Result<LockSet> {
        cancellable(self.request.cancel_token(), self.acquire_inner()).await
    }

    async fn acquire_inner(self) -> Result<LockSet> {
        let (reply, sent) = self.request.send(&self.names).await?;
        let grants = reply.grants;
        // The set's lease is as long as its shortest.
        let first = (grants.iter())
            .min_by_key(|grant| grant.expires_at_ms)
            .cloned()
            .or(reply.grant)
            .unwrap_or_default();
        // Each lock's token, in the order of the names: the set's Extend
        // and Release pin every lock to its own grant (none when the
        // reply names no grant per lock).
        let fencing_tokens = (self.names.iter())
            .map(|name| {
                let grant = grants.iter().find(|grant| grant.name == *name);
                grant.map(|grant| grant.fencing_token)
            })
            .collect::<Option<Vec<u64>>>()
            .unwrap_or_default();
        let lock = Lock::with_names(
            self.request.client().clone(),
            self.names.join(","),
            self.names.clone(),
            fencing_tokens,
            first,
            sent,
            self.request.watchdog_on(),
        );
        Ok(LockSet {
            lock,
            names: self.names,
            grants,
        })
    }
}

/// A multi-lock's grants, one per name, held and given back as one:
/// renewed by a watchdog every third of the lease (one Extend naming the
/// set), released on drop (one Release naming the set, spawned on the
/// current tokio runtime) or with [`release`](LockSet::release).
/// [`lost`](LockSet::lost) resolves when the server answers that any lock
/// of the set is no longer held (the server then releases the rest).
///
/// ```no_run
/// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
/// let set = client.lock_all(["a", "b", "c"]).acquire().await?;
/// for grant in set.grants() {
///     println!("{} token {}", grant.name, grant.fencing_token);
/// }
/// tokio::select! {
///     _ = std::future::pending::<()>() => {}
///     lost = set.lost() => eprintln!("stop: {lost}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LockSet {
    lock: Lock,
    names: Vec<String>,
    grants: Vec<proto::Grant>,
}

impl LockSet {
    /// The names, in the order asked.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The holder id of every grant of the set.
    pub fn holder(&self) -> &str {
        self.lock.holder()
    }

    /// The grants as acquired, one per name in the order asked (each with
    /// its `name` and own fencing token).
    pub fn grants(&self) -> &[proto::Grant] {
        &self.grants
    }

    /// The fencing token of the lock `name` of the set (`None`: not in the
    /// set).
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        (self.grants.iter())
            .find(|grant| grant.name == name)
            .map(|grant| grant.fencing_token)
    }

    /// True once the set is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.lock.is_lost()
    }

    /// Resolves with [`Error::LockLost`] the moment the set is known to be
    /// gone (a renewal answered NOT_HELD, or renewals failed until the
    /// lease ran out). Never resolves while the set is held.
    pub fn lost(&self) -> impl Future<Output = Error> + Send + 'static {
        self.lock.lost()
    }

    /// Sets every lease of the set to `ttl` from now (`None`: the grants'
    /// own lease): the grant whose lease now ends first, or
    /// [`Error::LockLost`] when any lock of the set was gone.
    pub async fn extend(&self, ttl: Option<Duration>) -> Result<proto::Grant> {
        self.lock.extend(ttl).await
    }

    /// Stops the watchdog and gives the set back, each lock pinned to its
    /// fencing token: true when every lock was still held with its token,
    /// false when any was not (the others are released all the same; a
    /// lock its holder took again since is left alone).
    pub async fn release(self) -> Result<bool> {
        self.lock.release().await
    }
}
