//! A session's driver task: owns the `Session` stream, numbers commands
//! and matches their replies, sends keep-alives, tells lost grants, and
//! resumes the session on its endpoints when the stream breaks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tumbler_proto as proto;
use tumbler_proto::session_request::Command as Wire;
use tumbler_proto::session_response::Event as WireEvent;

use super::{Command, SessionEvent, Shared};
use crate::client::Client;
use crate::error::{Error, Result};

/// One live stream: what the driver sends on and reads from.
pub(super) struct Stream {
    outbound: mpsc::Sender<proto::SessionRequest>,
    inbound: Streaming<proto::SessionResponse>,
}

/// Opens a `Session` stream with `open` as its first message; returns it
/// with the server's `opened`.
pub(super) async fn open_stream(
    client: &Client,
    open: proto::SessionOpen,
) -> Result<(Stream, proto::SessionOpened), tonic::Status> {
    let (outbound, rx) = mpsc::channel(64);
    let first = proto::SessionRequest {
        command: Some(Wire::Open(open)),
    };
    outbound
        .send(first)
        .await
        .map_err(|_| tonic::Status::internal("session stream closed"))?;
    let mut inbound = client
        .stub()
        .session(ReceiverStream::new(rx))
        .await?
        .into_inner();
    match inbound.message().await? {
        Some(proto::SessionResponse {
            event: Some(WireEvent::Opened(opened)),
        }) => Ok((Stream { outbound, inbound }, opened)),
        Some(proto::SessionResponse {
            event: Some(WireEvent::Error(e)),
        }) => Err(tonic::Status::new(tonic::Code::from_i32(e.code), e.message)),
        _ => Err(tonic::Status::unavailable(
            "session stream ended before it opened",
        )),
    }
}

enum Reply {
    Acquire(oneshot::Sender<Result<proto::AcquireResponse>>),
    Release(Option<oneshot::Sender<Result<proto::ReleaseResponse>>>),
}

/// The task that owns the stream: sends commands (numbered), matches
/// replies to them, sends keep-alives, tells lost grants, and resumes the
/// session when the stream breaks.
pub(super) struct Driver {
    shared: Arc<Shared>,
    endpoints: Vec<Client>,
    pending: HashMap<u64, Reply>,
    next_id: u64,
}

impl Driver {
    pub(super) fn new(shared: Arc<Shared>, endpoints: Vec<Client>) -> Self {
        Driver {
            shared,
            endpoints,
            pending: HashMap::new(),
            next_id: 1,
        }
    }

    pub(super) async fn run(
        mut self,
        mut stream: Stream,
        mut inbox: mpsc::UnboundedReceiver<Command>,
    ) {
        let keep_alive = (self.shared.ttl / 3).max(Duration::from_millis(10));
        let mut last_sign = Instant::now();
        loop {
            let broken = loop {
                tokio::select! {
                    command = inbox.recv() => match command {
                        Some(Command::Close(done)) => {
                            self.close(stream, "closed").await;
                            let _ = done.send(());
                            return;
                        }
                        None => return self.close(stream, "dropped").await,
                        Some(command) => {
                            let message = self.command(command);
                            if stream.outbound.send(message).await.is_err() {
                                break "stream closed".to_owned();
                            }
                            last_sign = Instant::now();
                        }
                    },
                    message = stream.inbound.message() => match message {
                        Ok(Some(response)) => self.event(response),
                        Ok(None) => break "stream ended".to_owned(),
                        Err(status) => break format!("{}: {}", status.code(), status.message()),
                    },
                    _ = tokio::time::sleep_until(last_sign + keep_alive) => {
                        let message = proto::SessionRequest { command: Some(Wire::KeepAlive(proto::SessionKeepAlive {})) };
                        if stream.outbound.send(message).await.is_err() {
                            break "stream closed".to_owned();
                        }
                        last_sign = Instant::now();
                    }
                }
            };
            // Commands in flight are answered UNAVAILABLE: sent again after
            // the resume they are the same requests (the holder is the
            // session's).
            for (_, reply) in self.pending.drain() {
                let error = || Error::Unavailable {
                    message: format!("session stream broke: {broken}"),
                };
                match reply {
                    Reply::Acquire(tx) => drop(tx.send(Err(error()))),
                    Reply::Release(Some(tx)) => drop(tx.send(Err(error()))),
                    Reply::Release(None) => {}
                }
            }
            let _ = self.shared.events.send(SessionEvent::Broken {
                reason: broken.clone(),
            });
            match self.resume(last_sign + self.shared.ttl).await {
                Ok(resumed) => {
                    stream = resumed;
                    last_sign = Instant::now();
                }
                Err(reason) => {
                    let grants: Vec<_> = self
                        .shared
                        .grants
                        .lock()
                        .unwrap()
                        .drain()
                        .map(|(_, g)| g)
                        .collect();
                    for grant in grants {
                        let _ = self.shared.events.send(SessionEvent::Lost {
                            grant,
                            reason: reason.clone(),
                        });
                    }
                    self.over(reason);
                    return;
                }
            }
        }
    }

    /// Resumes on each endpoint in turn, with back-off, until `deadline`
    /// (the TTL after the old stream's last sign of life).
    async fn resume(&mut self, deadline: Instant) -> Result<Stream, String> {
        let mut attempt = 0;
        let mut last = String::from("no endpoint");
        while Instant::now() < deadline {
            for client in &self.endpoints {
                let open = proto::SessionOpen {
                    ttl_ms: None,
                    resume: Some(proto::SessionResume {
                        session_id: self.shared.id.id.clone(),
                        secret: self.shared.id.secret.clone(),
                    }),
                };
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(
                    left.max(Duration::from_millis(10)),
                    open_stream(client, open),
                )
                .await
                {
                    Ok(Ok((stream, opened))) => {
                        self.shared.took(&opened);
                        let _ = self.shared.events.send(SessionEvent::Resumed {
                            endpoint: client.endpoint().to_owned(),
                            grants: self
                                .shared
                                .grants
                                .lock()
                                .unwrap()
                                .values()
                                .cloned()
                                .collect(),
                        });
                        return Ok(stream);
                    }
                    Ok(Err(status))
                        if matches!(
                            status.code(),
                            tonic::Code::NotFound
                                | tonic::Code::PermissionDenied
                                | tonic::Code::Unauthenticated
                        ) =>
                    {
                        return Err(format!(
                            "resume refused: {}: {}",
                            status.code(),
                            status.message()
                        ));
                    }
                    Ok(Err(status)) => last = format!("{}: {}", status.code(), status.message()),
                    Err(_) => last = "no answer in time".into(),
                }
            }
            let pause = self.endpoints[0]
                .backoff()
                .delay(attempt)
                .min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
            attempt += 1;
        }
        Err(format!("not resumed within the session TTL ({last})"))
    }

    fn command(&mut self, command: Command) -> proto::SessionRequest {
        let request_id = self.next_id;
        self.next_id += 1;
        let wire = match command {
            Command::Acquire(acquire, reply) => {
                self.pending.insert(request_id, Reply::Acquire(reply));
                Wire::Acquire(proto::SessionAcquire {
                    request_id,
                    acquire: Some(*acquire),
                })
            }
            Command::Release(namespace, mut names, reply) => {
                self.pending.insert(request_id, Reply::Release(reply));
                // One lock by `name`; a multi-lock's set by `names`.
                let name = match names.as_mut_slice() {
                    [one] => std::mem::take(one),
                    _ => String::new(),
                };
                names.retain(|n| !n.is_empty());
                Wire::Release(proto::SessionRelease {
                    request_id,
                    namespace,
                    name,
                    names,
                })
            }
            Command::Close(_) => unreachable!("handled by the driver loop"),
        };
        proto::SessionRequest {
            command: Some(wire),
        }
    }

    fn event(&mut self, response: proto::SessionResponse) {
        match response.event {
            Some(WireEvent::Acquired(acquired)) => {
                if let Some(Reply::Acquire(tx)) = self.pending.remove(&acquired.request_id) {
                    let _ = tx.send(Ok(acquired.response.unwrap_or_default()));
                }
            }
            Some(WireEvent::Released(released)) => {
                if let Some(Reply::Release(Some(tx))) = self.pending.remove(&released.request_id) {
                    let _ = tx.send(Ok(released.response.unwrap_or_default()));
                }
            }
            Some(WireEvent::Error(e)) => {
                let error =
                    Error::from(tonic::Status::new(tonic::Code::from_i32(e.code), e.message));
                match self.pending.remove(&e.request_id) {
                    Some(Reply::Acquire(tx)) => drop(tx.send(Err(error))),
                    Some(Reply::Release(Some(tx))) => drop(tx.send(Err(error))),
                    _ => {}
                }
            }
            Some(WireEvent::Lost(lost)) => self.shared.lost(&lost),
            Some(WireEvent::Opened(_)) | None => {}
        }
    }

    /// Half-closes the stream and reads on until the server ends it (its
    /// grants are then released), for at most 5 s.
    async fn close(&mut self, stream: Stream, why: &str) {
        let Stream {
            outbound,
            mut inbound,
        } = stream;
        drop(outbound);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(response)) = inbound.message().await {
                self.event(response);
            }
        })
        .await;
        self.shared.grants.lock().unwrap().clear();
        self.over(format!("session {why}"));
    }

    fn over(&self, reason: String) {
        *self.shared.over.lock().unwrap() = Some(reason.clone());
        let _ = self.shared.events.send(SessionEvent::Over { reason });
    }
}
