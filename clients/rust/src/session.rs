//! Sessions: grants that live as long as the client's `Session` stream,
//! renewed by the server, resumed on another replica when the stream breaks.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tumbler_proto as proto;

use crate::client::Client;
use crate::error::{Error, NotAcquiredReason, Result};

mod driver;
use driver::{Driver, open_stream};

/// What resumes a session: its id and secret (keep the secret private: it
/// lets its bearer, with the same token, take over the session's grants).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionId {
    /// `session-<uuid>`, also the holder of every grant of the session.
    pub id: String,
    /// The resume secret, 64 hex digits.
    pub secret: String,
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionId")
            .field("id", &self.id)
            .field("secret", &"…")
            .finish()
    }
}

/// A grant held by a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionGrant {
    /// Its namespace.
    pub namespace: String,
    /// The lock's name.
    pub name: String,
    /// The fencing token (kept across resumes).
    pub fencing_token: u64,
    /// The slot, 1..limit (0 when learnt from a resume, which does not say).
    pub slot: u32,
}

/// What happens to a session, as [`Session::events`] tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEvent {
    /// A grant is gone: stop relying on it.
    Lost {
        /// The grant that is gone.
        grant: SessionGrant,
        /// Why, as the server says it ("not held", "redis unavailable", …).
        reason: String,
    },
    /// The stream broke; the session is being resumed.
    Broken {
        /// The stream's last status.
        reason: String,
    },
    /// The session was resumed on `endpoint` with these grants (same
    /// tokens).
    Resumed {
        /// The endpoint that serves it now.
        endpoint: String,
        /// The grants it still holds.
        grants: Vec<SessionGrant>,
    },
    /// The session is over (closed, or could not be resumed in its TTL).
    Over {
        /// Why.
        reason: String,
    },
}

/// A session to open; made by [`Client::session`].
#[derive(Debug)]
pub struct SessionBuilder {
    client: Client,
    ttl: Option<Duration>,
    fallbacks: Vec<Client>,
    resume: Option<SessionId>,
}

impl SessionBuilder {
    pub(crate) fn new(client: Client) -> Self {
        SessionBuilder {
            client,
            ttl: None,
            fallbacks: Vec::new(),
            resume: None,
        }
    }

    /// The session's lease (default: the server's): how long its grants
    /// outlive a broken stream, and the window to resume it in.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Another endpoint to resume the session on when its stream breaks
    /// (tried in turn with the first one until the TTL runs out).
    pub fn fallback(mut self, client: Client) -> Self {
        self.fallbacks.push(client);
        self
    }

    /// Resume an existing session (after this process restarted, say)
    /// instead of opening a new one.
    pub fn resume(mut self, id: SessionId) -> Self {
        self.resume = Some(id);
        self
    }

    /// Opens (or resumes) the session and starts its driver task.
    pub async fn open(self) -> Result<Session> {
        let open = proto::SessionOpen {
            ttl_ms: self.ttl.map(|t| t.as_millis() as u64),
            resume: self.resume.as_ref().map(|r| proto::SessionResume {
                session_id: r.id.clone(),
                secret: r.secret.clone(),
            }),
        };
        let (stream, opened) = open_stream(&self.client, open).await.map_err(Error::from)?;
        let id = SessionId {
            id: opened.session_id.clone(),
            secret: opened.resume_secret.clone(),
        };
        let (events, _) = broadcast::channel(256);
        let shared = Arc::new(Shared {
            id,
            ttl: Duration::from_millis(opened.ttl_ms),
            grants: Mutex::new(HashMap::new()),
            events,
            over: Mutex::new(None),
        });
        shared.took(&opened);
        let (commands, inbox) = mpsc::unbounded_channel();
        let namespace = self.client.namespace().to_owned();
        let mut endpoints = vec![self.client];
        endpoints.extend(self.fallbacks);
        let driver = Driver::new(shared.clone(), endpoints);
        let task = tokio::spawn(driver.run(stream, inbox));
        Ok(Session {
            shared,
            namespace,
            commands,
            task: Some(task),
        })
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    id: SessionId,
    ttl: Duration,
    /// (namespace, name) → grant, as the server last told.
    grants: Mutex<HashMap<(String, String), SessionGrant>>,
    events: broadcast::Sender<SessionEvent>,
    /// Why the session is over, once it is.
    over: Mutex<Option<String>>,
}

impl Shared {
    fn took(&self, opened: &proto::SessionOpened) {
        let mut grants = self.grants.lock().unwrap();
        grants.clear();
        for g in &opened.grants {
            let grant = SessionGrant {
                namespace: g.namespace.clone(),
                name: g.name.clone(),
                fencing_token: g.fencing_token,
                slot: 0,
            };
            grants.insert((g.namespace.clone(), g.name.clone()), grant);
        }
        drop(grants);
        for lost in &opened.lost {
            self.lost(lost);
        }
    }

    fn lost(&self, lost: &proto::GrantLost) {
        let grant = self
            .grants
            .lock()
            .unwrap()
            .remove(&(lost.namespace.clone(), lost.name.clone()))
            .unwrap_or(SessionGrant {
                namespace: lost.namespace.clone(),
                name: lost.name.clone(),
                fencing_token: lost.fencing_token,
                slot: 0,
            });
        let _ = self.events.send(SessionEvent::Lost {
            grant,
            reason: lost.reason.clone(),
        });
    }
}

/// A session: acquire and release on its stream; its grants' holder is the
/// session id and their lease the session's TTL, renewed by the server
/// while the stream lives (no client watchdog). When the stream breaks
/// (a replica drains or crashes, the connection drops) the session resumes
/// on its endpoints with its id and secret, keeping its grants and tokens.
/// Closed by [`close`](Session::close) or when dropped: its grants are then
/// released at once.
///
/// ```no_run
/// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
/// use std::time::Duration;
/// let session = client.session().ttl(Duration::from_secs(10)).open().await?;
/// let grant = session.acquire("reports", Duration::from_secs(5)).await?;
/// println!("token {}", grant.fencing_token);
/// let mut events = session.events();
/// tokio::spawn(async move {
///     while let Ok(event) = events.recv().await {
///         eprintln!("session: {event:?}");
///     }
/// });
/// session.release("reports").await?;
/// session.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Session {
    shared: Arc<Shared>,
    /// The client's namespace: that of [`acquire`](Session::acquire).
    namespace: String,
    commands: mpsc::UnboundedSender<Command>,
    task: Option<JoinHandle<()>>,
}

pub(crate) enum Command {
    Acquire(
        Box<proto::AcquireRequest>,
        oneshot::Sender<Result<proto::AcquireResponse>>,
    ),
    /// A namespace and one lock's name, or a multi-lock's names.
    Release(
        String,
        Vec<String>,
        Option<oneshot::Sender<Result<proto::ReleaseResponse>>>,
    ),
    Close(oneshot::Sender<()>),
}

impl Session {
    /// The session's id and resume secret.
    pub fn id(&self) -> &SessionId {
        &self.shared.id
    }

    /// The session's lease.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The grants the session holds, as last told by the server.
    pub fn grants(&self) -> Vec<SessionGrant> {
        self.shared
            .grants
            .lock()
            .unwrap()
            .values()
            .cloned()
            .collect()
    }

    /// Lost grants, broken streams, resumes and the session's end, from now
    /// on.
    pub fn events(&self) -> broadcast::Receiver<SessionEvent> {
        self.shared.events.subscribe()
    }

    /// Acquires `name` in the client's namespace, waiting up to `wait`.
    /// Dropping the future before it is answered stops the wait (the
    /// session sends a release of the lock, which the server applies to
    /// the waiting acquire).
    pub async fn acquire(&self, name: &str, wait: Duration) -> Result<SessionGrant> {
        let namespace = self.namespace();
        self.acquire_with(proto::AcquireRequest {
            namespace,
            name: name.into(),
            wait_ms: wait.as_millis() as u64,
            ..Default::default()
        })
        .await
    }

    /// Acquires with every option of the Acquire RPC (its `holder` and
    /// `ttl_ms` are the session's).
    pub async fn acquire_with(&self, request: proto::AcquireRequest) -> Result<SessionGrant> {
        let (reply, answer) = oneshot::channel();
        let (namespace, name) = (request.namespace.clone(), request.name.clone());
        self.send(Command::Acquire(Box::new(request), reply))?;
        // Stops the wait if this future is dropped before the answer.
        let mut guard = StopWait {
            commands: &self.commands,
            lock: Some((namespace.clone(), vec![name.clone()])),
        };
        let response = answer.await.map_err(|_| self.over_error())??;
        guard.lock = None;
        not_acquired(&response, &name)?;
        let g = response.grant.unwrap_or_default();
        let grant = SessionGrant {
            namespace: namespace.clone(),
            name: name.clone(),
            fencing_token: g.fencing_token,
            slot: g.slot,
        };
        self.shared
            .grants
            .lock()
            .unwrap()
            .insert((namespace, name), grant.clone());
        Ok(grant)
    }

    /// Takes every lock of `names` (2 to 16, client's namespace) for the
    /// session, all or nothing, waiting up to `wait` while holding
    /// nothing (a multi-lock, decision 0078): the grants in the order of
    /// `names`, each with its own fencing token. The set lives and ends
    /// together: a lock of it lost takes the rest with it (each told
    /// [`SessionEvent::Lost`], "set broken"), and it is released whole
    /// with [`release_all`](Session::release_all). Dropping the future
    /// before it is answered stops the wait (and releases the set if it
    /// was granted meanwhile).
    pub async fn lock_all(&self, names: &[&str], wait: Duration) -> Result<Vec<SessionGrant>> {
        let namespace = self.namespace();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let request = proto::AcquireRequest {
            namespace: namespace.clone(),
            names: names.clone(),
            wait_ms: wait.as_millis() as u64,
            ..Default::default()
        };
        let (reply, answer) = oneshot::channel();
        self.send(Command::Acquire(Box::new(request), reply))?;
        let mut guard = StopWait {
            commands: &self.commands,
            lock: Some((namespace.clone(), names.clone())),
        };
        let response = answer.await.map_err(|_| self.over_error())??;
        guard.lock = None;
        not_acquired(&response, &names.join(","))?;
        let grants: Vec<SessionGrant> = (response.grants.into_iter())
            .map(|g| SessionGrant {
                namespace: namespace.clone(),
                name: g.name,
                fencing_token: g.fencing_token,
                slot: g.slot,
            })
            .collect();
        let mut held = self.shared.grants.lock().unwrap();
        for grant in &grants {
            held.insert((namespace.clone(), grant.name.clone()), grant.clone());
        }
        Ok(grants)
    }

    /// Releases the session's grant of `name` (client's namespace): true
    /// when released, false when it was not held. A lock of a set taken
    /// with [`lock_all`](Session::lock_all) is refused: release the set
    /// with [`release_all`](Session::release_all).
    pub async fn release(&self, name: &str) -> Result<bool> {
        self.release_names(vec![name.to_owned()]).await
    }

    /// Releases a set taken with [`lock_all`](Session::lock_all), naming
    /// every lock of it: true when every one was held and released, false
    /// when any was not (the others are released all the same).
    pub async fn release_all(&self, names: &[&str]) -> Result<bool> {
        self.release_names(names.iter().map(|n| (*n).to_owned()).collect())
            .await
    }

    async fn release_names(&self, names: Vec<String>) -> Result<bool> {
        let namespace = self.namespace();
        let (reply, answer) = oneshot::channel();
        let command = Command::Release(namespace.clone(), names.clone(), Some(reply));
        self.send(command)?;
        let response = answer.await.map_err(|_| self.over_error())??;
        let mut held = self.shared.grants.lock().unwrap();
        for name in names {
            held.remove(&(namespace.clone(), name));
        }
        Ok(response.status == proto::ReleaseStatus::Released as i32)
    }

    /// Ends the session: its grants are released at once. Waits for the
    /// server's answer.
    pub async fn close(mut self) -> Result<()> {
        let (done, closed) = oneshot::channel();
        if self.commands.send(Command::Close(done)).is_ok() {
            let _ = closed.await;
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        Ok(())
    }

    /// Stops serving the session without closing it, as a crash would: its
    /// grants stay for the TTL, resumable elsewhere with [`Session::id`].
    pub fn abandon(mut self) -> SessionId {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.shared.id.clone()
    }

    fn namespace(&self) -> String {
        self.namespace.clone()
    }

    fn send(&self, command: Command) -> Result<()> {
        self.commands.send(command).map_err(|_| self.over_error())
    }

    fn over_error(&self) -> Error {
        let reason = self.shared.over.lock().unwrap().clone();
        Error::SessionOver {
            reason: reason.unwrap_or_else(|| "session closed".into()),
        }
    }
}

/// A reply of NOT_ACQUIRED as the error it is (`name`: what was asked).
fn not_acquired(response: &proto::AcquireResponse, name: &str) -> Result<()> {
    if response.status != proto::AcquireStatus::NotAcquired as i32 {
        return Ok(());
    }
    let reason = if response.reason == proto::NotAcquiredReason::Busy as i32 {
        NotAcquiredReason::Busy
    } else {
        NotAcquiredReason::Timeout
    };
    Err(Error::NotAcquired {
        name: name.to_owned(),
        reason,
        holders: response.holders,
        queue_position: response.queue_position,
    })
}

/// Sends a release of the lock (or set) whose acquire's future was
/// dropped unanswered.
struct StopWait<'a> {
    commands: &'a mpsc::UnboundedSender<Command>,
    lock: Option<(String, Vec<String>)>,
}

impl Drop for StopWait<'_> {
    fn drop(&mut self) {
        if let Some((namespace, names)) = self.lock.take() {
            let _ = self.commands.send(Command::Release(namespace, names, None));
        }
    }
}
