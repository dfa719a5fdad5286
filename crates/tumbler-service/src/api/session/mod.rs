//! The Session stream: glue between a client's commands and the engine's
//! session grants (`engine::sessions`) and records (`engine::resume`). A
//! session's grants are held by the session id with the session TTL as
//! lease; the replica serving its stream renews them, and the session's
//! record in Redis names them, so a new stream on any replica can resume
//! the session (`SessionOpen.resume`) with all its grants.
//!
//! How a stream ends decides what becomes of the grants:
//! - the client closes its side: released at once, session over;
//! - the stream breaks (the client's process died, its connection reset)
//!   and no stream resumes the session within `RESUME_GRACE`: released as
//!   a dead client's (lock-delay applies), session over;
//! - the server refuses the client (a command over the size limit, a
//!   message that does not decode, a revoked or expired token): released,
//!   the client gets `lost` for each, then RESOURCE_EXHAUSTED,
//!   INVALID_ARGUMENT or UNAUTHENTICATED; session over;
//! - the replica drains (UNAVAILABLE with `tumbler-resume: elsewhere`),
//!   the client was silent for a whole TTL (DEADLINE_EXCEEDED), or another
//!   stream resumed the session (ABORTED): the grants live on for the TTL,
//!   resumable; nothing is reported lost.
//!
//! Only a session the client closed ends with OK. Acquire and release
//! commands are charged to the token's request rate like the unary RPCs;
//! a command over it is refused (RESOURCE_EXHAUSTED) and the session goes
//! on.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status, Streaming};
use tracing::Instrument;

mod commands;

use commands::{Running, refused};

use super::quota::QuotaSlot;
use super::{LockApi, StreamSlot};
use crate::auth::LiveAccess;
use crate::engine::sessions::{
    LOST_MOVED, LOST_NOT_PERMITTED, LOST_SESSION_ENDED, LOST_SESSION_GONE, LOST_SET_BROKEN,
    LostGrant, RESUME_GRACE, ResumeError, SessionEnd, Touch,
};
use crate::engine::{Holder, LockId, StreamCalls};
use crate::errors::{self, invalid};
use crate::proto::session_request::Command;
use crate::proto::session_response::Event;
use crate::proto::{self, SessionResponse};
use crate::{validate, watch};

pub type SessionStream = ReceiverStream<Result<SessionResponse, Status>>;

/// How a session's stream ended.
enum Ending {
    /// The client closed its side: grants released, stream ends OK.
    Closed,
    /// The client is gone or cannot be told (broken stream, stopped
    /// reading): unless the session is resumed within a moment, its grants
    /// are handled as those of a dead client.
    Gone(&'static str),
    /// The server refused the client: grants released, `lost` told, then
    /// the status.
    Refused(Status),
    /// The session lives on for its TTL, resumable on any stream: grants
    /// kept, the client told the status.
    Suspended(Status),
    /// The session's record is gone from Redis (its data was lost): the
    /// grants went with it; the client is told `lost` for each, then the
    /// status.
    Vanished(Status),
}

/// How long after its request side ended a stream's response side must
/// stay open for the end to count as the client closing the session (not
/// resetting it): see `Driver::closed_or_reset`.
const RESET_WITHIN: Duration = Duration::from_millis(100);

/// The trailer that tells a client to resume its session on another
/// replica (this one is draining).
pub const RESUME_TRAILER: &str = "tumbler-resume";

/// How long the last messages of a session the server ended may wait for
/// the client to read them.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Messages waiting for the client before the session counts it as gone.
const OUTBOX: usize = 64;
/// How long a new stream may take to send its open message.
const OPEN_WITHIN: Duration = Duration::from_secs(10);

/// Reads the open message, starts (or resumes) the session, and returns
/// its stream.
pub async fn open(
    api: &LockApi,
    access: LiveAccess,
    slot: (QuotaSlot, StreamSlot),
    mut inbound: Streaming<proto::SessionRequest>,
) -> Result<Response<SessionStream>, Status> {
    if api.engine.health().draining().is_cancelled() {
        return Err(draining());
    }
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
    let (lost_tx, lost_rx) = mpsc::channel::<LostGrant>(OUTBOX);
    let owner = access.access().who().to_owned();
    let opened = match open.resume {
        None => {
            let ttl = validate::ttl_ms(open.ttl_ms, &api.limits).map_err(invalid)?;
            let ticket = api
                .engine
                .session_calls()
                .open(&owner, ttl)
                .await
                .map_err(errors::status)?;
            Opened {
                session: ticket.id,
                epoch: ticket.epoch,
                ttl_ms: ttl.ms(),
                reply: proto::SessionOpened {
                    resume_secret: ticket.secret,
                    ..Default::default()
                },
            }
        }
        Some(resume) => {
            // An address that failed to resume too often lately is turned
            // away before anything is looked up.
            api.auth_throttle.check(access.peer())?;
            let session = validate::session_id(&resume.session_id).map_err(invalid)?;
            let secret = validate::resume_secret(&resume.secret).map_err(invalid)?;
            let may_act = |namespace: &str| access.access().act(namespace).is_ok();
            let resumed = api
                .engine
                .session_calls()
                .resume((&owner, &session, &secret), &may_act, &lost_tx)
                .await
                .map_err(|err| match err {
                    // One answer for a session that is over and for one
                    // this caller may not resume (another token's, a wrong
                    // secret): nobody learns whether an id is live.
                    ResumeError::Gone | ResumeError::Refused => {
                        // Counted alike, so the throttle tells nothing of
                        // which ids are live either.
                        api.auth_throttle.failed(access.peer());
                        tracing::info!(%session, token = %owner, reason = %err, "session resume refused");
                        Status::not_found(
                            "resume.session_id: no such session for this token and secret (closed, silent past its ttl, or never this token's)",
                        )
                    }
                    ResumeError::Moved => Status::aborted(format!("resume: {err}")),
                    ResumeError::Engine(err) => errors::status(err),
                })?;
            tracing::info!(%session, kept = resumed.kept.len(), lost = resumed.lost.len(), "session resumed");
            let grants = resumed
                .kept
                .into_iter()
                .map(|(lock, fencing_token)| proto::SessionGrant {
                    namespace: lock.namespace.into(),
                    name: lock.name.into(),
                    fencing_token,
                })
                .collect();
            Opened {
                session,
                epoch: resumed.epoch,
                ttl_ms: resumed.ttl_ms,
                reply: proto::SessionOpened {
                    resume_secret: secret,
                    grants,
                    lost: resumed.lost.into_iter().map(grant_lost).collect(),
                    resumed: true,
                    ..Default::default()
                },
            }
        }
    };
    tracing::Span::current().record("session", &opened.session);

    let proof = crate::engine::election::proof_of(&opened.reply.resume_secret);
    let (out, outbox) = mpsc::channel(OUTBOX);
    let reply = proto::SessionOpened {
        session_id: opened.session.clone(),
        ttl_ms: opened.ttl_ms,
        ..opened.reply
    };
    let _ = out.try_send(Ok(SessionResponse {
        event: Some(Event::Opened(reply)),
    }));
    let driver = Driver {
        api: api.clone(),
        _slot: slot,
        proof,
        session: Holder::stored(opened.session),
        epoch: opened.epoch,
        ttl_ms: opened.ttl_ms,
        out,
    };
    tokio::spawn(
        driver
            .run(access, inbound, lost_tx, lost_rx)
            .in_current_span(),
    );
    Ok(Response::new(ReceiverStream::new(outbox)))
}

/// A session opened or resumed, before its stream starts.
struct Opened {
    session: String,
    epoch: u64,
    ttl_ms: u64,
    reply: proto::SessionOpened,
}

/// UNAVAILABLE for a session on a draining replica: resume elsewhere.
fn draining() -> Status {
    let mut trailers = tonic::metadata::MetadataMap::new();
    trailers.insert(RESUME_TRAILER, "elsewhere".parse().expect("ascii"));
    Status::with_metadata(
        tonic::Code::Unavailable,
        "this replica is shutting down; resume the session on another (SessionOpen.resume)",
        trailers,
    )
}

struct Driver {
    api: LockApi,
    /// This session's place in its token's quota and among the replica's
    /// open sessions.
    _slot: (QuotaSlot, StreamSlot),
    /// The session's id, which holds its grants.
    session: Holder,
    /// The digest of the session's resume secret: what proves a
    /// leadership it wins (decision 0082).
    proof: String,
    /// This stream's epoch in the session's record.
    epoch: u64,
    ttl_ms: u64,
    out: mpsc::Sender<Result<SessionResponse, Status>>,
}

impl Driver {
    /// The engine's calls for this stream of the session.
    fn stream(&self) -> StreamCalls<'_> {
        (self.api.engine.session_calls()).stream(&self.session, self.epoch)
    }

    /// Serves commands until the stream ends, then releases or keeps the
    /// session's grants (see the head of this file).
    async fn run(
        self,
        mut access: LiveAccess,
        mut inbound: Streaming<proto::SessionRequest>,
        lost_tx: mpsc::Sender<LostGrant>,
        mut lost_rx: mpsc::Receiver<LostGrant>,
    ) {
        let mut running = Running::new();
        let quiet_limit = Duration::from_millis(self.ttl_ms);
        let shutting_down = self.api.engine.health().draining();
        // The record is touched every third of the TTL, which also tells
        // this stream when another one resumed the session, and the
        // token's access is looked at again (an expiry, a namespace taken
        // away) for every renewal round.
        let mut touch = tokio::time::interval(quiet_limit / 3);
        touch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        touch.tick().await;
        let mut quiet_until = tokio::time::Instant::now() + quiet_limit;
        let ending = loop {
            // `biased`: when several are ready at once (a reset stream is
            // both unreadable and closed), the first in this order decides,
            // so one event always ends a stream the same way.
            tokio::select! {
                biased;
                () = self.out.closed() => break Ending::Gone("the client went away"),
                message = tokio::time::timeout_at(quiet_until, inbound.message()) => match message {
                    Err(_) => break Ending::Suspended(Status::deadline_exceeded(
                        "session: no message from the client within the session ttl; its grants live on for the ttl (resume it)",
                    )),
                    Ok(Err(status)) => break unreadable(status),
                    Ok(Ok(None)) => break self.closed_or_reset().await,
                    Ok(Ok(Some(request))) => {
                        quiet_until = tokio::time::Instant::now() + quiet_limit;
                        // A revoked or expired token ends the session.
                        if let Err(status) = access.recheck() {
                            break Ending::Refused(status);
                        }
                        if let Some(reply) = self.start(request, &access, &lost_tx, &mut running)
                            && !self.send(reply).await
                        {
                            break Ending::Gone("the client stopped reading");
                        }
                    }
                },
                changed = watch::changed(&mut access) => {
                    if let Err(status) = changed {
                        break Ending::Refused(status);
                    }
                    if !self.drop_unpermitted(&access, &mut running).await {
                        break Ending::Gone("the client stopped reading");
                    }
                }
                Some(lost) = lost_rx.recv() => {
                    if lost.reason == LOST_MOVED {
                        break moved();
                    }
                    if lost.reason == LOST_SET_BROKEN {
                        self.stream().give_up(&lost).await;
                    }
                    if !self.send(lost_event(lost)).await {
                        break Ending::Gone("the client stopped reading");
                    }
                }
                Some(done) = running.tasks.join_next(), if !running.tasks.is_empty() => {
                    let Ok((locks, done)) = done else { continue };
                    running.answered(&locks);
                    if done.moved {
                        // The command is answered (refused), then the stream ends.
                        let _ = self.send(done.event).await;
                        break moved();
                    }
                    let event = self.permitted_outcome(&access, &locks, done.event).await;
                    if !self.send(event).await {
                        break Ending::Gone("the client stopped reading");
                    }
                }
                _ = touch.tick() => {
                    if let Err(status) = access.recheck() {
                        break Ending::Refused(status);
                    }
                    if !self.drop_unpermitted(&access, &mut running).await {
                        break Ending::Gone("the client stopped reading");
                    }
                    match self.stream().touch(self.ttl_ms).await {
                        Ok(Touch::Ours) => {}
                        Ok(Touch::Moved) => break moved(),
                        Ok(Touch::Gone) => break Ending::Vanished(Status::not_found(
                            "session: its record is gone from redis (redis lost its data, or the session was cleared); its grants are lost",
                        )),
                        // The grants' renewals report what Redis trouble costs.
                        Err(err) => tracing::warn!(session = %self.session, error = %err, "session record not touched"),
                    }
                }
                () = shutting_down.cancelled() => break Ending::Suspended(draining()),
            }
        };
        let end = match &ending {
            Ending::Closed | Ending::Refused(_) => SessionEnd::Release,
            Ending::Gone(_) => SessionEnd::Died,
            Ending::Suspended(_) | Ending::Vanished(_) => SessionEnd::Keep,
        };
        // Commands still running finish at a safe point, so none leaves a
        // grant behind that nobody renews or releases. On a draining
        // replica the waits end by themselves, keeping their place in the
        // queue for a resumed session to take back; otherwise they are
        // stopped (and leave the queue).
        running.finish(!shutting_down.is_cancelled()).await;
        if end == SessionEnd::Died {
            // A client whose connection a proxy dropped may resume at
            // once; a dead one will not.
            tokio::time::sleep(RESUME_GRACE).await;
        }
        let (grants, released) = self.stream().end(self.ttl_ms, end).await;
        let why = match &ending {
            Ending::Closed => "closed by the client",
            Ending::Gone(why) => why,
            Ending::Refused(status) | Ending::Suspended(status) | Ending::Vanished(status) => {
                status.message()
            }
        };
        tracing::info!(session = %self.session, grants = grants.len(), released, reason = %why, "session stream ended");
        // Grants found lost while the stream was ending (a renewal that
        // failed meanwhile) are told too, before the ones it ends with.
        let mut told_lost = Vec::new();
        while let Ok(lost) = lost_rx.try_recv() {
            if lost.reason == LOST_SET_BROKEN {
                self.stream().give_up(&lost).await;
            }
            if lost.reason != LOST_MOVED {
                told_lost.push(lost);
            }
        }
        let with = |reason| {
            told_lost
                .into_iter()
                .chain(grants.into_iter().map(|(lock, fencing_token)| LostGrant {
                    lock,
                    fencing_token,
                    reason,
                }))
                .collect()
        };
        match ending {
            Ending::Refused(status) => self.last_words(with(LOST_SESSION_ENDED), status).await,
            Ending::Vanished(status) => self.last_words(with(LOST_SESSION_GONE), status).await,
            Ending::Suspended(status) => self.last_words(Vec::new(), status).await,
            Ending::Closed | Ending::Gone(_) => {}
        }
    }

    /// The request side ended. A client that closes its session half-closes
    /// and goes on reading for the final status; one that cancels resets
    /// the stream, which the request side also reports as its end (hyper
    /// reads a CANCEL reset as end of body), and the response side closes
    /// right after. So the end counts as a close only when the response
    /// side is still open a moment later: one reading, whatever the order
    /// in which the two sides' news arrives.
    async fn closed_or_reset(&self) -> Ending {
        match tokio::time::timeout(RESET_WITHIN, self.out.closed()).await {
            Ok(()) => Ending::Gone("the client reset the stream"),
            Err(_) => Ending::Closed,
        }
    }

    /// Releases the grants this stream holds in namespaces its token may
    /// no longer act in (and stops its commands there), telling the client
    /// `lost` ("not permitted") for each. False when the client is gone.
    async fn drop_unpermitted(&self, access: &LiveAccess, running: &mut Running) -> bool {
        running.stop_unpermitted(access);
        for (lock, fencing_token) in self.stream().grants() {
            if access.access().act(&lock.namespace).is_ok() {
                continue;
            }
            if let Err(err) = self.stream().release_one(&lock).await {
                tracing::warn!(session = %self.session, error = %err, "a grant of a namespace the token lost was not released; it is no longer renewed");
            }
            tracing::info!(session = %self.session, namespace = %lock.namespace, lock = %lock.name, "session grant released: its token lost the namespace");
            let lost = LostGrant {
                lock,
                fencing_token,
                reason: LOST_NOT_PERMITTED,
            };
            if !self.send(lost_event(lost)).await {
                return false;
            }
        }
        true
    }

    /// A finished command's reply, unless its namespace was taken from the
    /// token meanwhile: then the grants it made (a set's: each) are
    /// released again and the command answered PERMISSION_DENIED.
    async fn permitted_outcome(
        &self,
        access: &LiveAccess,
        locks: &[LockId],
        event: Event,
    ) -> Event {
        let Event::Acquired(acquired) = &event else {
            return event;
        };
        let Err(status) = access.access().act(&locks[0].namespace) else {
            return event;
        };
        if acquired
            .response
            .as_ref()
            .is_some_and(|r| r.grant.is_some())
        {
            for lock in locks {
                let _ = self.stream().release_one(lock).await;
            }
        }
        refused(acquired.request_id, status)
    }

    /// Tells a client whose session the server ended which grants it lost
    /// (and why), then why the session ended.
    async fn last_words(&self, lost: Vec<LostGrant>, status: Status) {
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
}

/// The end of a stream whose session another stream took over: the
/// grants are that stream's now (kept), nothing is reported lost.
fn moved() -> Ending {
    Ending::Suspended(Status::aborted("session: resumed on another stream"))
}

/// How a session whose inbound stream failed ends: a message over the
/// size limit or one that does not decode is the client's error (told);
/// anything else is a broken stream.
fn unreadable(status: Status) -> Ending {
    match status.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
            Ending::Refused(Status::resource_exhausted(format!(
                "session: a command was larger than the server accepts ({})",
                status.message()
            )))
        }
        tonic::Code::Internal if status.message().contains("decode") => {
            Ending::Refused(Status::invalid_argument(format!(
                "session: a message is not a valid SessionRequest ({})",
                status.message()
            )))
        }
        _ => Ending::Gone("the stream broke"),
    }
}

fn lost_event(lost: LostGrant) -> Event {
    Event::Lost(grant_lost(lost))
}

fn grant_lost(lost: LostGrant) -> proto::GrantLost {
    proto::GrantLost {
        namespace: lost.lock.namespace.into(),
        name: lost.lock.name.into(),
        fencing_token: lost.fencing_token,
        reason: lost.reason.into(),
    }
}
