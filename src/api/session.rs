//! The Session stream: glue between a client's commands and the engine's
//! session grants (see `engine::sessions`). A session is one stream on one
//! replica; its grants' holder is the session id and their lease the
//! session TTL, which this replica renews while the stream lives.
//!
//! The session ends, and all its grants are released at once, when the
//! client closes its side, the stream or connection breaks, nothing comes
//! from the client for a whole TTL, or the client stops reading (64
//! messages wait unread for a whole TTL): a client that cannot hear
//! "grant lost" must not keep grants alive.
//!
//! When the server ends a session that the client still hears, the client
//! first gets a `lost` event for every grant released, then a non-OK
//! status saying why: DEADLINE_EXCEEDED (silent for a whole TTL),
//! RESOURCE_EXHAUSTED (a command over the size limit), INVALID_ARGUMENT
//! (a message that does not decode), UNAUTHENTICATED (its token was
//! revoked or expired: checked at every command, every reload of the
//! tokens file and at the token's expiry), UNAVAILABLE (the replica is
//! shutting down; reopen elsewhere). Only a session the client closed
//! ends with OK.
//!
//! Acquire and release commands are charged to the token's request rate
//! like the unary RPCs; a command over it is refused (RESOURCE_EXHAUSTED)
//! and the session goes on.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status, Streaming};
use tracing::Instrument;

use super::quota::QuotaSlot;
use super::{LockApi, StreamSlot, acquire_reply, engine_status, lock_id, validate};
use crate::auth::LiveAccess;
use crate::engine::sessions::{LOST_SESSION_ENDED, LostGrant};
use crate::engine::{LockEngine, LockId};
use crate::proto::session_request::Command;
use crate::proto::session_response::Event;
use crate::proto::{self, SessionResponse};

pub type SessionStream = ReceiverStream<Result<SessionResponse, Status>>;

/// How a session ended.
enum Ending {
    /// The client closed its side: grants released, stream ends OK.
    Closed,
    /// The client is gone or cannot be told (broken stream, stopped
    /// reading): its grants are handled as those of a dead client.
    Gone(&'static str),
    /// The server ended it: grants released, `lost` told, then `status`.
    Ended { status: Status, died: bool },
}

/// How long the last messages of a session the server ended may wait for
/// the client to read them.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Messages waiting for the client before the session counts it as gone.
const OUTBOX: usize = 64;
/// Commands one session may have running at once (waiting acquires
/// included); more are refused with RESOURCE_EXHAUSTED.
const MAX_RUNNING_COMMANDS: usize = 1000;
/// How long a new stream may take to send its open message.
const OPEN_WITHIN: Duration = Duration::from_secs(10);

/// Reads the open message, starts the session, and returns its stream.
pub async fn open(
    api: &LockApi,
    access: LiveAccess,
    slot: (QuotaSlot, StreamSlot),
    mut inbound: Streaming<proto::SessionRequest>,
) -> Result<Response<SessionStream>, Status> {
    let first = tokio::time::timeout(OPEN_WITHIN, inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("session: no open message within 10 s"))??;
    let Some(proto::SessionRequest {
        command: Some(Command::Open(open)),
    }) = first
    else {
        return Err(Status::invalid_argument(
            "command: the first message of a session must be open",
        ));
    };
    let ttl_ms = validate::ttl_ms(open.ttl_ms, &api.limits)?;
    let session = format!("session-{}", uuid::Uuid::now_v7());
    tracing::Span::current().record("session", &session);

    let (out, outbox) = mpsc::channel(OUTBOX);
    let opened = Event::Opened(proto::SessionOpened {
        session_id: session.clone(),
        ttl_ms,
    });
    let _ = out.try_send(Ok(SessionResponse {
        event: Some(opened),
    }));
    let driver = Driver {
        api: api.clone(),
        _slot: slot,
        session,
        ttl_ms,
        out,
    };
    tokio::spawn(driver.run(access, inbound).in_current_span());
    Ok(Response::new(ReceiverStream::new(outbox)))
}

struct Driver {
    api: LockApi,
    /// This session's place in its token's quota and among the replica's
    /// open sessions.
    _slot: (QuotaSlot, StreamSlot),
    session: String,
    ttl_ms: u64,
    out: mpsc::Sender<Result<SessionResponse, Status>>,
}

impl Driver {
    /// Serves commands until the session ends, then releases its grants.
    async fn run(self, mut access: LiveAccess, mut inbound: Streaming<proto::SessionRequest>) {
        let (lost_tx, mut lost_rx) = mpsc::channel::<LostGrant>(OUTBOX);
        let mut running: JoinSet<Event> = JoinSet::new();
        let quiet_limit = Duration::from_millis(self.ttl_ms);
        let shutting_down = self.api.engine.waiters().shutdown_token().clone();
        let ending = loop {
            tokio::select! {
                message = tokio::time::timeout(quiet_limit, inbound.message()) => match message {
                    Err(_) => break Ending::Ended {
                        status: Status::deadline_exceeded(
                            "session: no message from the client within the session ttl",
                        ),
                        died: true,
                    },
                    Ok(Err(status)) => break unreadable(status),
                    Ok(Ok(None)) => break Ending::Closed,
                    Ok(Ok(Some(request))) => {
                        // A revoked or expired token ends the session.
                        if let Err(status) = access.recheck() {
                            break Ending::Ended { status, died: false };
                        }
                        if let Some(reply) = self.start(request, &access, &lost_tx, &mut running)
                            && !self.send(reply).await
                        {
                            break Ending::Gone("the client stopped reading");
                        }
                    }
                },
                () = access.changed() => {
                    if let Err(status) = access.recheck() {
                        break Ending::Ended { status, died: false };
                    }
                }
                Some(lost) = lost_rx.recv() => {
                    if !self.send(lost_event(lost)).await {
                        break Ending::Gone("the client stopped reading");
                    }
                }
                Some(done) = running.join_next(), if !running.is_empty() => {
                    if let Ok(event) = done
                        && !self.send(event).await
                    {
                        break Ending::Gone("the client stopped reading");
                    }
                }
                () = self.out.closed() => break Ending::Gone("the client went away"),
                () = shutting_down.cancelled() => break Ending::Ended {
                    // Tell the client to open a new session elsewhere.
                    status: Status::unavailable(
                        "this replica is shutting down; open a new session on another",
                    ),
                    died: false,
                },
            }
        };
        // Waiting acquires leave their queues; then every grant goes.
        running.abort_all();
        while running.join_next().await.is_some() {}
        // Closed on purpose (by the client, or by the server) releases;
        // a client that vanished counts as dead (lock-delay applies).
        let (died, why) = match &ending {
            Ending::Closed => (false, "closed by the client".to_owned()),
            Ending::Gone(why) => (true, (*why).to_owned()),
            Ending::Ended { status, died } => (*died, status.message().to_owned()),
        };
        let grants = self.api.engine.end_session(&self.session, died).await;
        tracing::info!(session = %self.session, grants = grants.len(), died, reason = %why, "session ended");
        if let Ending::Ended { status, .. } = ending {
            self.last_words(grants, status).await;
        }
    }

    /// Tells a client whose session the server ended which grants it lost
    /// (and any lost before), then why the session ended.
    async fn last_words(&self, grants: Vec<(LockId, u64)>, status: Status) {
        let lost = grants.into_iter().map(|(lock, fencing_token)| LostGrant {
            lock,
            fencing_token,
            reason: LOST_SESSION_ENDED,
        });
        let told = async {
            for lost in lost {
                let event = Ok(SessionResponse {
                    event: Some(lost_event(lost)),
                });
                if self.out.send(event).await.is_err() {
                    return;
                }
            }
            let _ = self.out.send(Err(status)).await;
        };
        // A client that does not read gets no more than a moment.
        let _ = tokio::time::timeout(LAST_WORDS, told).await;
    }

    /// False when the client is gone, or has not read for a whole TTL
    /// while messages waited for it.
    async fn send(&self, event: Event) -> bool {
        let message = Ok(SessionResponse { event: Some(event) });
        let patience = Duration::from_millis(self.ttl_ms);
        matches!(
            tokio::time::timeout(patience, self.out.send(message)).await,
            Ok(Ok(()))
        )
    }

    /// Starts one command; returns an immediate reply (refusals) if any.
    fn start(
        &self,
        request: proto::SessionRequest,
        access: &LiveAccess,
        lost: &mpsc::Sender<LostGrant>,
        running: &mut JoinSet<Event>,
    ) -> Option<Event> {
        match request.command {
            None => Some(refused(0, Status::invalid_argument("command: missing"))),
            Some(Command::KeepAlive(_)) => None,
            Some(Command::Open(_)) => Some(refused(
                0,
                Status::invalid_argument("command: the session is already open"),
            )),
            Some(Command::Acquire(command)) => {
                let id = command.request_id;
                if running.len() >= MAX_RUNNING_COMMANDS {
                    return Some(refused(id, too_many_running()));
                }
                let started = access.charge().and_then(|()| {
                    let req = command
                        .acquire
                        .ok_or_else(|| Status::invalid_argument("acquire: missing"))?;
                    let request =
                        self.api
                            .acquire_request(req, self.session.clone(), self.ttl_ms, None)?;
                    access.access().act(&request.lock.namespace)?;
                    let waiting = self.api.waiter_slot(access.access(), &request)?;
                    Ok((request, waiting))
                });
                let (request, waiting) = match started {
                    Ok(started) => started,
                    Err(status) => return Some(refused(id, status)),
                };
                let engine: Arc<LockEngine> = self.api.engine.clone();
                let (session, lost) = (self.session.clone(), lost.clone());
                running.spawn(async move {
                    let _waiting = waiting;
                    match engine.session_acquire(&session, &request, &lost).await {
                        Ok(outcome) => Event::Acquired(proto::SessionAcquired {
                            request_id: id,
                            response: Some(acquire_reply(outcome)),
                        }),
                        Err(err) => refused(id, engine_status(err)),
                    }
                });
                None
            }
            Some(Command::Release(command)) => {
                let id = command.request_id;
                if running.len() >= MAX_RUNNING_COMMANDS {
                    return Some(refused(id, too_many_running()));
                }
                let lock = match access.charge().and_then(|()| {
                    let lock = lock_id(&command.namespace, &command.name)?;
                    access.access().act(&lock.namespace)?;
                    Ok(lock)
                }) {
                    Ok(lock) => lock,
                    Err(status) => return Some(refused(id, status)),
                };
                let engine = self.api.engine.clone();
                let session = self.session.clone();
                running.spawn(async move {
                    match engine.session_release(&session, &lock).await {
                        Ok(outcome) => {
                            let status = match outcome {
                                crate::engine::ReleaseOutcome::Released { .. } => {
                                    proto::ReleaseStatus::Released
                                }
                                crate::engine::ReleaseOutcome::NotHeld => {
                                    proto::ReleaseStatus::NotHeld
                                }
                            };
                            Event::Released(proto::SessionReleased {
                                request_id: id,
                                response: Some(proto::ReleaseResponse {
                                    status: status.into(),
                                }),
                            })
                        }
                        Err(err) => refused(id, engine_status(err)),
                    }
                });
                None
            }
        }
    }
}

fn too_many_running() -> Status {
    Status::resource_exhausted(format!(
        "command: this session already runs {MAX_RUNNING_COMMANDS} commands; wait for answers"
    ))
}

/// How a session whose inbound stream failed ends: a message over the
/// size limit or one that does not decode is the client's error (told);
/// anything else is a broken stream.
fn unreadable(status: Status) -> Ending {
    match status.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => Ending::Ended {
            status: Status::resource_exhausted(format!(
                "session: a command was larger than the server accepts ({})",
                status.message()
            )),
            died: false,
        },
        tonic::Code::Internal if status.message().contains("decode") => Ending::Ended {
            status: Status::invalid_argument(format!(
                "session: a message is not a valid SessionRequest ({})",
                status.message()
            )),
            died: false,
        },
        _ => Ending::Gone("the stream broke"),
    }
}

fn lost_event(lost: LostGrant) -> Event {
    Event::Lost(proto::GrantLost {
        namespace: lost.lock.namespace,
        name: lost.lock.name,
        fencing_token: lost.fencing_token,
        reason: lost.reason.into(),
    })
}

/// A refused command, as the session reports it (the session goes on).
fn refused(request_id: u64, status: Status) -> Event {
    Event::Error(proto::SessionError {
        request_id,
        code: status.code() as i32,
        message: status.message().to_owned(),
    })
}
