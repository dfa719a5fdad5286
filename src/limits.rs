//! Connection limits on every port (gRPC, HTTP, the health port): how many
//! connections a port holds, how many one client address may hold, and how
//! long a connection may stay open doing nothing.
//!
//! Each port has one [`Gate`]. Its listener ([`GatedListener`]) admits a
//! connection only under the per-address cap; at the port's cap it makes
//! room by closing the connection idle the longest (no request in flight),
//! so a flood of idle or half-open sockets cannot lock out a health probe
//! or a real client, and only when every connection is busy is a new one
//! refused. Refused connections are closed at once, so they cost a file
//! descriptor for an instant only.
//!
//! A connection counts as idle while no request is in flight on it; the
//! servers mark requests with [`ConnState::begin`]. Idle past the idle
//! timeout (or, before its first request, past the header-read timeout: a
//! preface-only or slow-header socket), the connection's I/O fails and the
//! HTTP stack closes it. A long wait (an Acquire of an hour, a Session, a
//! Watch) is a request in flight, so it is never cut.
//!
//! A request is only work once its message is in: until then (the whole
//! body on the HTTP port, the first message of a gRPC call) it waits for
//! the client, which must send it within the body-read timeout
//! ([`WatchedBody`]: 408 on the HTTP port, DEADLINE_EXCEEDED and a reset
//! stream on gRPC). Room at the cap is made by closing, first, the oldest
//! connection that never got a request past authentication
//! ([`ConnState::trust`]), then the connection idle the longest (nothing
//! in flight but requests still waiting for their message); only when
//! every connection is authenticated and working is a new one refused.
//! So tricklers and unauthenticated sockets cannot keep probes and real
//! clients out.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

mod requests;

pub use requests::*;

/// File descriptors kept out of the connection budget: Redis connections,
/// the tokens and TLS files, the listeners themselves.
const FD_RESERVE: u64 = 1024;

/// The limits of one port, from the flags.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// Connections one port holds at once.
    pub max_connections: usize,
    /// Whether the operator chose `max_connections` (a flag), or it is the
    /// default: lowering a choice is a warning, lowering the default a note.
    pub max_connections_chosen: bool,
    /// Connections one client address holds on one port.
    pub max_connections_per_ip: usize,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// How long a new connection has to complete its first request's
    /// headers (HTTP port: every request's headers).
    pub header_read_timeout: Duration,
    /// How long a request has, once its headers are in, to send its body
    /// (HTTP port) or its first message (gRPC).
    pub body_read_timeout: Duration,
    /// HTTP/2 keep-alive pings on the gRPC ports: how often, when the
    /// connection is quiet...
    pub keepalive_interval: Duration,
    /// ...and how long an unanswered ping may take before the connection
    /// is closed (a dead peer's streams are not held).
    pub keepalive_timeout: Duration,
}

impl ConnLimits {
    /// These limits with `max_connections` lowered, if need be, so that
    /// `ports` ports at their caps fit in the process's file descriptors
    /// (a refused accept would otherwise fail with "too many open files"
    /// and take the tokens-file reload and Redis reconnects with it).
    pub fn fitted(&self, ports: usize) -> ConnLimits {
        let mut fitted = self.clone();
        if let Some(fds) = fd_limit() {
            let budget = fds.saturating_sub(FD_RESERVE) / ports.max(1) as u64;
            let budget = usize::try_from(budget).unwrap_or(usize::MAX).max(16);
            if fitted.max_connections > budget {
                if self.max_connections_chosen {
                    tracing::warn!(
                        configured = self.max_connections,
                        used = budget,
                        open_files = fds,
                        "--max-connections lowered to fit the open-files limit"
                    );
                } else {
                    tracing::info!(
                        per_port = budget,
                        open_files = fds,
                        "connections per port: {budget}, what the open-files limit allows (set --max-connections to choose)"
                    );
                }
                fitted.max_connections = budget;
            }
        }
        fitted
    }
}

/// Raises the soft limit on open files to the hard limit (once; cheap), so
/// the connection caps rather than the kernel decide when to refuse.
pub fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
            && soft < hard
        {
            match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open-files limit"),
                Err(e) => tracing::debug!(error = %e, "could not raise the open-files limit"),
            }
        }
    });
}

fn fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// One port's connections (cheap to clone; clones share them).
#[derive(Clone)]
pub struct Gate {
    shared: Arc<GateShared>,
}

struct GateShared {
    port: &'static str,
    limits: ConnLimits,
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    next_id: u64,
    /// Open connections in the order they came (oldest first).
    open: BTreeMap<u64, Arc<ConnState>>,
    by_peer: HashMap<SocketAddr, Arc<ConnState>>,
    per_ip: HashMap<IpAddr, usize>,
}

/// What a port knows about one of its connections.
pub struct ConnState {
    id: u64,
    peer: SocketAddr,
    /// Requests in flight.
    active: AtomicUsize,
    /// Requests in flight still waiting for their body or first message
    /// (not work yet: see [`ConnState::awaiting_body`]).
    awaiting: AtomicUsize,
    /// Whether a request on this connection got past authentication (any
    /// request of the lock service or the dashboard, when auth is off).
    trusted: AtomicBool,
    /// Whether a request ever started (until then the header-read timeout
    /// applies rather than the idle timeout).
    started: AtomicBool,
    /// Since when nothing has been in flight.
    idle_since: Mutex<Instant>,
    /// Set to close the connection (evicted for a newer one).
    closing: AtomicBool,
    /// The connection task, woken to notice `closing` or a new idle period.
    waker: AtomicWaker,
}

impl ConnState {
    /// Marks a request in flight until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.started.store(true, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Marks a request waiting for its body or first message, until the
    /// returned guard says it arrived or is dropped.
    pub fn awaiting_body(self: &Arc<Self>) -> Awaiting {
        self.awaiting.fetch_add(1, Ordering::AcqRel);
        Awaiting(self.clone())
    }

    /// Records that a request on this connection passed authentication:
    /// from now on it is not closed before idle connections to make room.
    pub fn trust(&self) {
        if !self.trusted.load(Ordering::Relaxed) {
            self.trusted.store(true, Ordering::Relaxed);
        }
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    fn is_idle(&self) -> bool {
        self.active.load(Ordering::Acquire) == 0
    }

    /// Whether a request in flight has its message: the server works on
    /// it (or holds a wait, a Session, a Watch), so the connection is not
    /// closed to make room.
    fn is_working(&self) -> bool {
        self.active.load(Ordering::Acquire) > self.awaiting.load(Ordering::Acquire)
    }

    /// When this connection times out if nothing starts; None while busy.
    fn deadline(&self, limits: &ConnLimits) -> Option<Instant> {
        if !self.is_idle() {
            return None;
        }
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        Some(if self.started.load(Ordering::Relaxed) {
            since + limits.idle_timeout
        } else {
            since + limits.header_read_timeout
        })
    }

    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A request in flight on a connection (see [`ConnState::begin`]).
pub struct InFlight(Arc<ConnState>);

/// A request still waiting for its body or first message (see
/// [`ConnState::awaiting_body`]).
pub struct Awaiting(Arc<ConnState>);

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.0.awaiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            // The connection's I/O arms its idle timer again.
            self.0.waker.wake();
        }
    }
}

impl Gate {
    pub fn new(port: &'static str, limits: ConnLimits) -> Self {
        Gate {
            shared: Arc::new(GateShared {
                port,
                limits,
                state: Mutex::default(),
            }),
        }
    }

    pub fn limits(&self) -> &ConnLimits {
        &self.shared.limits
    }

    /// Connections open on this port.
    pub fn open(&self) -> usize {
        self.state().open.len()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `tcp` in under the caps, or None (and it is closed when
    /// dropped) when its address is at its cap, or the port is at its cap
    /// with no idle connection to close for it.
    pub fn admit<S>(&self, io: S, peer: SocketAddr) -> Option<Guarded<S>> {
        let limits = &self.shared.limits;
        let mut state = self.state();
        let from_ip = state.per_ip.get(&peer.ip()).copied().unwrap_or(0);
        if from_ip >= limits.max_connections_per_ip {
            drop(state);
            tracing::debug!(port = self.shared.port, %peer, "connection refused: its address is at --max-connections-per-ip");
            return None;
        }
        if state.open.len() >= limits.max_connections {
            let Some(victim) = state.make_room() else {
                drop(state);
                tracing::warn!(port = self.shared.port, %peer, "connection refused: the port is at --max-connections and every connection is busy");
                return None;
            };
            state.forget(&victim);
            victim.close();
        }
        state.next_id += 1;
        let conn = Arc::new(ConnState {
            id: state.next_id,
            peer,
            active: AtomicUsize::new(0),
            awaiting: AtomicUsize::new(0),
            trusted: AtomicBool::new(false),
            started: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            closing: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        state.open.insert(conn.id, conn.clone());
        state.by_peer.insert(peer, conn.clone());
        *state.per_ip.entry(peer.ip()).or_default() += 1;
        Some(Guarded {
            inner: io,
            conn,
            gate: self.clone(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
        })
    }

    /// The open connection from `peer`, to mark its requests.
    pub fn connection(&self, peer: &SocketAddr) -> Option<Arc<ConnState>> {
        self.state().by_peer.get(peer).cloned()
    }
}

impl GateState {
    /// The connection to close for a new one: the oldest that never got a
    /// request past authentication, else the one idle the longest (no
    /// request in flight that has its message); None when every
    /// connection is authenticated and working.
    fn make_room(&self) -> Option<Arc<ConnState>> {
        // `open` is in arrival order: the first untrusted one is the oldest.
        if let Some(untrusted) = self.open.values().find(|conn| !conn.is_trusted()) {
            return Some(untrusted.clone());
        }
        (self.open.values())
            .filter(|conn| !conn.is_working())
            .min_by_key(|conn| *conn.idle_since.lock().unwrap_or_else(|e| e.into_inner()))
            .cloned()
    }

    fn forget(&mut self, conn: &ConnState) {
        if self.open.remove(&conn.id).is_none() {
            return;
        }
        if self
            .by_peer
            .get(&conn.peer)
            .is_some_and(|c| c.id == conn.id)
        {
            self.by_peer.remove(&conn.peer);
        }
        if let Some(n) = self.per_ip.get_mut(&conn.peer.ip()) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&conn.peer.ip());
            }
        }
    }
}

/// A connection admitted by a [`Gate`]: its I/O fails once it is closed
/// for a newer one or has been idle past its timeout; dropping it gives
/// its place back.
pub struct Guarded<S> {
    inner: S,
    conn: Arc<ConnState>,
    gate: Gate,
    timer: Pin<Box<Sleep>>,
}

impl<S> Guarded<S> {
    pub fn state(&self) -> &Arc<ConnState> {
        &self.conn
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.conn.peer
    }

    /// Err once the connection must close: evicted, or idle too long.
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        self.conn.waker.register(cx.waker());
        loop {
            if self.conn.closing.load(Ordering::Acquire) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "closed to make room for a new connection",
                ));
            }
            let Some(deadline) = self.conn.deadline(&self.gate.shared.limits) else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                self.conn.closing.store(true, Ordering::Release);
                tracing::debug!(port = self.gate.shared.port, peer = %self.conn.peer, "closing an idle connection");
                continue;
            }
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
        }
    }
}

impl<S> Drop for Guarded<S> {
    fn drop(&mut self) {
        self.gate.state().forget(&self.conn);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.conn.closing.load(Ordering::Acquire) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.conn.closing.load(Ordering::Acquire) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Guarded<TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// A listener whose connections pass a [`Gate`] (TCP_NODELAY set: gRPC
/// multiplexes small messages, which Nagle's algorithm would hold back for
/// a delayed ACK).
pub struct GatedListener {
    listener: TcpListener,
    gate: Gate,
}

impl GatedListener {
    pub fn new(listener: TcpListener, gate: Gate) -> Self {
        GatedListener { listener, gate }
    }

    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next admitted connection. Accept errors of one connection are
    /// skipped; running out of file descriptors waits a little rather than
    /// spin.
    pub async fn accept(&self) -> (Guarded<TcpStream>, SocketAddr) {
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, port = self.gate.shared.port, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            if let Some(io) = self.gate.admit(tcp, peer) {
                return (io, peer);
            }
        }
    }

    /// The admitted connections as a stream, for tonic's
    /// `serve_with_incoming*`.
    pub fn into_stream(
        self,
    ) -> impl futures::Stream<Item = std::io::Result<Guarded<TcpStream>>> + Send + 'static {
        futures::stream::unfold(self, |listener| async move {
            let (io, _) = listener.accept().await;
            Some((Ok(io), listener))
        })
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | BrokenPipe | Interrupted | WouldBlock | TimedOut
    )
}
