//! One Session stream of `hold --session`: opening or resuming it (with
//! retries over the endpoints), keep-alives and closing; and the id and
//! secret a cut-off session is resumed with.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::retry::{Backoff, OPEN_WITHIN, retryable};
use crate::connect::Conn;
use tumbler_proto as proto;

/// A Session stream: the commands sent on it and the events it brings.
pub(super) struct Stream {
    pub(super) commands: mpsc::Sender<proto::SessionRequest>,
    pub(super) events: tonic::Streaming<proto::SessionResponse>,
}

pub(super) fn session_command(command: proto::session_request::Command) -> proto::SessionRequest {
    proto::SessionRequest {
        command: Some(command),
    }
}

impl Stream {
    /// Opens (or resumes) a session on the endpoint in use.
    async fn open(
        conn: &mut Conn,
        open: proto::SessionOpen,
    ) -> Result<(Stream, proto::SessionOpened), tonic::Status> {
        use proto::session_response::Event;
        let (commands, outbox) = mpsc::channel(16);
        let _ = commands
            .send(session_command(proto::session_request::Command::Open(open)))
            .await;
        let mut events = conn
            .connected()
            .await?
            .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
            .await?
            .into_inner();
        match events.message().await?.and_then(|r| r.event) {
            Some(Event::Opened(opened)) => Ok((Stream { commands, events }, opened)),
            Some(Event::Error(error)) => Err(tonic::Status::new(error.code.into(), error.message)),
            _ => Err(tonic::Status::unavailable(
                "the session ended before it opened",
            )),
        }
    }

    /// Opens (or resumes) a session, on the next endpoint after each
    /// UNAVAILABLE or broken connection, with backoff, until `until`.
    pub(super) async fn open_retrying(
        conn: &mut Conn,
        open: &proto::SessionOpen,
        until: Instant,
    ) -> Result<(Stream, proto::SessionOpened), tonic::Status> {
        let mut backoff = Backoff::new();
        loop {
            let status =
                match tokio::time::timeout(OPEN_WITHIN, Stream::open(conn, open.clone())).await {
                    Ok(Ok(opened)) => return Ok(opened),
                    Ok(Err(status)) if !retryable(&status) => return Err(status),
                    Ok(Err(status)) => status,
                    Err(_) => tonic::Status::unavailable(format!(
                        "{}: no answer within {}",
                        conn.endpoint(),
                        humantime::format_duration(OPEN_WITHIN)
                    )),
                };
            conn.skip();
            let pause = backoff.next();
            if Instant::now() + pause >= until {
                return Err(status);
            }
            tokio::time::sleep(pause).await;
        }
    }

    pub(super) async fn keep_alive(&self) {
        let _ = self
            .commands
            .send(session_command(proto::session_request::Command::KeepAlive(
                proto::SessionKeepAlive {},
            )))
            .await;
    }

    /// Closes the session (releasing its grants) and waits a moment for
    /// the server to end the stream.
    pub(super) async fn close(self) {
        let Stream {
            commands,
            mut events,
        } = self;
        drop(commands);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(_)) = events.message().await {}
        })
        .await;
    }
}

/// The session's id and resume secret.
#[derive(Clone)]
pub(super) struct Resume {
    pub(super) open: proto::SessionOpen,
    pub(super) ttl: Duration,
}

impl Resume {
    pub(super) fn of(opened: &proto::SessionOpened) -> Resume {
        Resume {
            open: proto::SessionOpen {
                resume: Some(proto::SessionResume {
                    session_id: opened.session_id.clone(),
                    secret: opened.resume_secret.clone(),
                }),
                ..Default::default()
            },
            ttl: Duration::from_millis(opened.ttl_ms.max(1)),
        }
    }
}
