//! What the clients of the capacity benchmark do, through gRPC only, each
//! client repeating its unit until told to stop and counting the units it
//! finished while the window is open, per replica it talks to:
//! - **pairs**: try-once Acquire + Release, each client on its own 16
//!   names in turn (many locks, spread over every shard);
//! - **hot**: Acquire waiting server-side on one lock, then Release at
//!   once (a unit is one grant);
//! - **sessions**: open a Session, acquire two locks through it, send a
//!   keep-alive, close it (the server releases both);
//! - **held**: sessions that only stay open holding grants, kept alive by
//!   the client; the server renews the grants every ttl/3 (a unit is one
//!   grant held for one second).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tumbler_proto::lock_service_client::LockServiceClient;
use tumbler_proto::session_request::Command;
use tumbler_proto::session_response::Event;
use tumbler_proto::{self as proto, AcquireStatus, ReleaseStatus, SessionRequest};

pub const CLIENTS_PER_CHANNEL: usize = 8;
pub const TOKEN: &str = "capacity-bench-token";
/// The held sessions' TTL: grants renewed every 500 ms.
pub const HELD_TTL_MS: u64 = 1_500;
const TTL_MS: u64 = 30_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Pairs,
    Hot,
    Sessions,
    /// `grants` per session.
    Held {
        grants: usize,
    },
}

/// A request with the bench's bearer token.
fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    request
}

/// Clients running: the counting switch, the stop switch, the units
/// counted per target (an index into the endpoints they were given).
pub struct Load {
    pub counting: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    pub counts: Arc<Vec<AtomicU64>>,
    tasks: JoinSet<()>,
}

impl Load {
    /// Stops every client after its current unit and waits for them.
    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        while let Some(done) = self.tasks.join_next().await {
            done.unwrap();
        }
    }

    pub fn counted(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// Starts `clients` clients of `kind`, `CLIENTS_PER_CHANNEL` to an HTTP/2
/// connection, the connections spread over `endpoints` in turn.
pub async fn start(kind: Kind, endpoints: &[String], clients: usize, tag: &str) -> Load {
    let mut channels = Vec::new();
    for c in 0..clients.div_ceil(CLIENTS_PER_CHANNEL) {
        let target = c % endpoints.len();
        let channel = Channel::from_shared(endpoints[target].clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        channels.push((target, channel));
    }
    let mut load = Load {
        counting: Arc::new(AtomicBool::new(false)),
        stop: Arc::new(AtomicBool::new(false)),
        counts: Arc::new(endpoints.iter().map(|_| AtomicU64::new(0)).collect()),
        tasks: JoinSet::new(),
    };
    for i in 0..clients {
        let (target, channel) = channels[i / CLIENTS_PER_CHANNEL].clone();
        let client = Client {
            rpc: LockServiceClient::new(channel),
            id: format!("{tag}-{i}"),
            target,
            counting: load.counting.clone(),
            stop: load.stop.clone(),
            counts: load.counts.clone(),
        };
        let hot_name = format!("{tag}-hot");
        load.tasks.spawn(async move {
            match kind {
                Kind::Pairs => client.pairs().await,
                Kind::Hot => client.hot(&hot_name).await,
                Kind::Sessions => client.sessions().await,
                Kind::Held { grants } => client.held(grants).await,
            }
        });
    }
    load
}

/// Takes (`true`) or gives back (`false`) the lock `name` as the holder
/// `probe`, try-once.
pub async fn hold(endpoint: &str, name: &str, take: bool) {
    let mut rpc = LockServiceClient::connect(endpoint.to_owned())
        .await
        .unwrap();
    if take {
        let reply = rpc
            .acquire(authed(proto::AcquireRequest {
                name: name.into(),
                holder: "probe".into(),
                ttl_ms: Some(10_000),
                ..Default::default()
            }))
            .await
            .expect("Acquire")
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "{name}");
    } else {
        rpc.release(authed(proto::ReleaseRequest {
            name: name.into(),
            holder: "probe".into(),
            ..Default::default()
        }))
        .await
        .expect("Release");
    }
}

struct Client {
    rpc: LockServiceClient<Channel>,
    id: String,
    target: usize,
    counting: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    counts: Arc<Vec<AtomicU64>>,
}

impl Client {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn count(&self, units: u64) {
        if self.counting.load(Ordering::Relaxed) {
            self.counts[self.target].fetch_add(units, Ordering::Relaxed);
        }
    }

    async fn acquire(&mut self, name: &str, wait_ms: u64) {
        let reply = self
            .rpc
            .acquire(authed(proto::AcquireRequest {
                name: name.into(),
                holder: self.id.clone(),
                ttl_ms: Some(TTL_MS),
                wait_ms,
                ..Default::default()
            }))
            .await
            .expect("Acquire")
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "{name}: {reply:?}");
    }

    async fn release(&mut self, name: &str) {
        let reply = self
            .rpc
            .release(authed(proto::ReleaseRequest {
                name: name.into(),
                holder: self.id.clone(),
                ..Default::default()
            }))
            .await
            .expect("Release")
            .into_inner();
        assert_eq!(reply.status(), ReleaseStatus::Released, "{name}");
    }

    async fn pairs(mut self) {
        let mut k = 0usize;
        while !self.stopped() {
            let name = format!("{}-{}", self.id, k % 16);
            k += 1;
            self.acquire(&name, 0).await;
            self.release(&name).await;
            self.count(1);
        }
    }

    async fn hot(mut self, name: &str) {
        while !self.stopped() {
            self.acquire(name, TTL_MS).await;
            self.release(name).await;
            self.count(1);
        }
    }

    /// Opens a session with `ttl_ms` and waits for it to open.
    async fn open(
        &mut self,
        ttl_ms: u64,
    ) -> (
        mpsc::Sender<SessionRequest>,
        tonic::Streaming<proto::SessionResponse>,
    ) {
        let (commands, outbox) = mpsc::channel(16);
        send(
            &commands,
            Command::Open(proto::SessionOpen {
                ttl_ms: Some(ttl_ms),
                ..Default::default()
            }),
        )
        .await;
        let mut events = self
            .rpc
            .session(authed(ReceiverStream::new(outbox)))
            .await
            .expect("Session")
            .into_inner();
        match events
            .message()
            .await
            .expect("session")
            .and_then(|r| r.event)
        {
            Some(Event::Opened(_)) => {}
            other => panic!("expected opened, got {other:?}"),
        }
        (commands, events)
    }

    /// Acquires `names` through the session, all sent before any answer
    /// is read.
    async fn session_acquire(
        commands: &mpsc::Sender<SessionRequest>,
        events: &mut tonic::Streaming<proto::SessionResponse>,
        names: &[String],
    ) {
        for (i, name) in names.iter().enumerate() {
            send(
                commands,
                Command::Acquire(proto::SessionAcquire {
                    request_id: i as u64,
                    acquire: Some(proto::AcquireRequest {
                        name: name.clone(),
                        ..Default::default()
                    }),
                }),
            )
            .await;
        }
        for _ in names {
            match events
                .message()
                .await
                .expect("session")
                .and_then(|r| r.event)
            {
                Some(Event::Acquired(acquired)) => assert_eq!(
                    acquired.response.map(|r| r.status()),
                    Some(AcquireStatus::Acquired)
                ),
                other => panic!("expected acquired, got {other:?}"),
            }
        }
    }

    async fn sessions(mut self) {
        let mut closing = JoinSet::new();
        let mut k = 0usize;
        while !self.stopped() {
            let (commands, mut events) = self.open(10_000).await;
            let names: Vec<String> = (0..2).map(|j| format!("{}-{k}-{j}", self.id)).collect();
            k += 1;
            Self::session_acquire(&commands, &mut events, &names).await;
            send(&commands, Command::KeepAlive(proto::SessionKeepAlive {})).await;
            // Closing: the client ends its side and reads to the end (the
            // server tells a close from a reset after a moment, then
            // releases the grants), meanwhile the next session starts.
            drop(commands);
            let (counting, counts, target) =
                (self.counting.clone(), self.counts.clone(), self.target);
            closing.spawn(async move {
                // Whatever comes before the end, the end must be OK.
                while events.message().await.expect("session end").is_some() {}
                if counting.load(Ordering::Relaxed) {
                    counts[target].fetch_add(1, Ordering::Relaxed);
                }
            });
            while let Some(done) = closing.try_join_next() {
                done.unwrap();
            }
        }
        while let Some(done) = closing.join_next().await {
            done.unwrap();
        }
    }

    async fn held(mut self, grants: usize) {
        let (commands, mut events) = self.open(HELD_TTL_MS).await;
        let names: Vec<String> = (0..grants).map(|j| format!("{}-{j}", self.id)).collect();
        Self::session_acquire(&commands, &mut events, &names).await;
        let mut last = tokio::time::Instant::now();
        while !self.stopped() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if last.elapsed() >= Duration::from_millis(HELD_TTL_MS / 3) {
                send(&commands, Command::KeepAlive(proto::SessionKeepAlive {})).await;
                last = tokio::time::Instant::now();
            }
        }
        drop(commands);
        while let Some(event) = events.message().await.expect("session end") {
            if let Some(Event::Lost(lost)) = event.event {
                panic!("grant lost while held: {lost:?}");
            }
        }
    }
}

async fn send(commands: &mpsc::Sender<SessionRequest>, command: Command) {
    commands
        .send(SessionRequest {
            command: Some(command),
        })
        .await
        .expect("session open");
}
