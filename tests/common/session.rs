//! A client's side of a Session stream, for the tests: open or resume,
//! send commands, read events, read to the end.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::proto;
use proto::SessionRequest;
use proto::lock_service_client::LockServiceClient;
use proto::session_request::Command;
use proto::session_response::Event;

/// The command sender and the event stream of one session stream.
pub struct Session {
    pub commands: mpsc::Sender<SessionRequest>,
    pub events: tonic::Streaming<proto::SessionResponse>,
    pub id: String,
    pub secret: String,
}

impl Session {
    pub async fn open(client: &mut LockServiceClient<Channel>, ttl_ms: u64) -> Session {
        let open = proto::SessionOpen {
            ttl_ms: Some(ttl_ms),
            ..Default::default()
        };
        let (session, opened) = Session::start(client, open).await.unwrap();
        assert_eq!(opened.ttl_ms, ttl_ms);
        assert!(!opened.resumed);
        session
    }

    /// Resumes a session (id and secret) on a new stream.
    pub async fn resume(
        client: &mut LockServiceClient<Channel>,
        id: &str,
        secret: &str,
    ) -> Result<(Session, proto::SessionOpened), tonic::Status> {
        let open = proto::SessionOpen {
            ttl_ms: None,
            resume: Some(proto::SessionResume {
                session_id: id.to_owned(),
                secret: secret.to_owned(),
            }),
        };
        Session::start(client, open).await
    }

    /// Opens a stream with `open` as its first message; its opened event.
    pub async fn start(
        client: &mut LockServiceClient<Channel>,
        open: proto::SessionOpen,
    ) -> Result<(Session, proto::SessionOpened), tonic::Status> {
        let (commands, outbox) = mpsc::channel(16);
        commands
            .send(SessionRequest {
                command: Some(Command::Open(open)),
            })
            .await
            .unwrap();
        let mut events = client
            .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
            .await?
            .into_inner();
        let first = events.message().await?.expect("an opened event");
        let Some(Event::Opened(opened)) = first.event else {
            panic!("the first event is not opened: {first:?}");
        };
        let session = Session {
            commands,
            events,
            id: opened.session_id.clone(),
            secret: opened.resume_secret.clone(),
        };
        Ok((session, opened))
    }

    pub async fn send(&self, command: Command) {
        self.commands
            .send(SessionRequest {
                command: Some(command),
            })
            .await
            .unwrap();
    }

    pub async fn next(&mut self) -> Option<Event> {
        tokio::time::timeout(Duration::from_secs(10), self.events.message())
            .await
            .expect("an event within 10 s")
            .ok()
            .flatten()
            .and_then(|r| r.event)
    }

    pub async fn acquire(
        &mut self,
        request_id: u64,
        request: proto::AcquireRequest,
    ) -> proto::AcquireResponse {
        self.send(Command::Acquire(proto::SessionAcquire {
            request_id,
            acquire: Some(request),
        }))
        .await;
        match self.next().await {
            Some(Event::Acquired(acquired)) => {
                assert_eq!(acquired.request_id, request_id);
                acquired.response.unwrap()
            }
            other => panic!("expected an acquire reply, got {other:?}"),
        }
    }

    pub async fn keep_alive(&self) {
        self.send(Command::KeepAlive(proto::SessionKeepAlive {}))
            .await;
    }

    /// Reads the stream to its end: the `lost` events on the way, and the
    /// status it ended with (OK for a clean end).
    pub async fn until_ended(&mut self) -> (Vec<proto::GrantLost>, tonic::Status) {
        let mut lost = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), self.events.message())
                .await
                .expect("the session ends within 10 s");
            match next {
                Ok(Some(proto::SessionResponse {
                    event: Some(Event::Lost(grant)),
                })) => lost.push(grant),
                Ok(Some(_)) => {}
                Ok(None) => return (lost, tonic::Status::ok("")),
                Err(status) => return (lost, status),
            }
        }
    }
}

/// The first holder's grant of `default/<name>` (None: nobody holds it).
pub async fn holder_of(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> Option<proto::Grant> {
    let seen = client
        .inspect(super::inspect(name))
        .await
        .unwrap()
        .into_inner();
    seen.holders.into_iter().next().and_then(|h| h.grant)
}
