//! The Session stream: glue between a client's commands and the engine's
//! session grants (see `engine::sessions`). A session is one stream on one
//! replica; its grants' holder is the session id and their lease the
//! session TTL, which this replica renews while the stream lives.
//!
//! The session ends, and all its grants are released at once, when the
//! client closes its side, the stream or connection breaks, nothing comes
//! from the client for a whole TTL, or the client stops reading (64
//! messages wait unread for a whole TTL): a client that cannot hear
//! "grant lost" must not keep grants alive. A replica shutting down ends its sessions with
//! UNAVAILABLE (their grants released) so clients reopen elsewhere.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status, Streaming};
use tracing::Instrument;

use super::{LockApi, StreamSlot, acquire_reply, engine_status, lock_id, validate};
use crate::auth::Access;
use crate::engine::LockEngine;
use crate::engine::sessions::LostGrant;
use crate::proto::session_request::Command;
use crate::proto::session_response::Event;
use crate::proto::{self, SessionResponse};

pub type SessionStream = ReceiverStream<Result<SessionResponse, Status>>;

const CLOSED_BY_CLIENT: &str = "closed by the client";
const SHUTTING_DOWN: &str = "the replica is shutting down";

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
    access: Access,
    slot: StreamSlot,
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
        access,
        _slot: slot,
        session,
        ttl_ms,
        out,
    };
    tokio::spawn(driver.run(inbound).in_current_span());
    Ok(Response::new(ReceiverStream::new(outbox)))
}

struct Driver {
    api: LockApi,
    /// What the session's caller may do, checked per command.
    access: Access,
    /// This session's place among the replica's open sessions.
    _slot: StreamSlot,
    session: String,
    ttl_ms: u64,
    out: mpsc::Sender<Result<SessionResponse, Status>>,
}

impl Driver {
    /// Serves commands until the session ends, then releases its grants.
    async fn run(self, mut inbound: Streaming<proto::SessionRequest>) {
        let (lost_tx, mut lost_rx) = mpsc::channel::<LostGrant>(OUTBOX);
        let mut running: JoinSet<Event> = JoinSet::new();
        let quiet_limit = Duration::from_millis(self.ttl_ms);
        let shutting_down = self.api.engine.waiters().shutdown_token().clone();
        let why = loop {
            tokio::select! {
                message = tokio::time::timeout(quiet_limit, inbound.message()) => match message {
                    Err(_) => break "no message from the client within the session ttl",
                    Ok(Err(_)) => break "the stream broke",
                    Ok(Ok(None)) => break CLOSED_BY_CLIENT,
                    Ok(Ok(Some(request))) => {
                        if let Some(reply) = self.start(request, &lost_tx, &mut running)
                            && !self.send(reply).await
                        {
                            break "the client stopped reading";
                        }
                    }
                },
                Some(lost) = lost_rx.recv() => {
                    let event = Event::Lost(proto::GrantLost {
                        namespace: lost.lock.namespace,
                        name: lost.lock.name,
                        fencing_token: lost.fencing_token,
                        reason: lost.reason.into(),
                    });
                    if !self.send(event).await {
                        break "the client stopped reading";
                    }
                }
                Some(done) = running.join_next(), if !running.is_empty() => {
                    if let Ok(event) = done
                        && !self.send(event).await
                    {
                        break "the client stopped reading";
                    }
                }
                () = self.out.closed() => break "the client went away",
                () = shutting_down.cancelled() => {
                    // Tell the client to open a new session elsewhere.
                    let _ = self.out.try_send(Err(Status::unavailable(
                        "this replica is shutting down; open a new session on another",
                    )));
                    break SHUTTING_DOWN;
                }
            }
        };
        // Waiting acquires leave their queues; then every grant goes.
        running.abort_all();
        while running.join_next().await.is_some() {}
        // Closed on purpose (by the client, or by a replica shutting down)
        // releases; anything else means the client died.
        let died = !matches!(why, CLOSED_BY_CLIENT | SHUTTING_DOWN);
        let grants = self.api.engine.end_session(&self.session, died).await;
        tracing::info!(session = %self.session, grants, died, reason = why, "session ended");
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
                let request = match command
                    .acquire
                    .ok_or_else(|| Status::invalid_argument("acquire: missing"))
                    .and_then(|req| {
                        let request = self.api.acquire_request(
                            req,
                            self.session.clone(),
                            self.ttl_ms,
                            None,
                        )?;
                        self.access.namespace(&request.lock.namespace)?;
                        Ok(request)
                    }) {
                    Ok(request) => request,
                    Err(status) => return Some(refused(id, status)),
                };
                let engine: Arc<LockEngine> = self.api.engine.clone();
                let (session, lost) = (self.session.clone(), lost.clone());
                running.spawn(async move {
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
                let lock = match lock_id(&command.namespace, &command.name)
                    .and_then(|lock| self.access.namespace(&lock.namespace).map(|()| lock))
                {
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

/// A refused command, as the session reports it (the session goes on).
fn refused(request_id: u64, status: Status) -> Event {
    Event::Error(proto::SessionError {
        request_id,
        code: status.code() as i32,
        message: status.message().to_owned(),
    })
}
