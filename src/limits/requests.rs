//! A request's life on a connection: in flight from its headers until its
//! response ends ([`TrackLayer`] on the gRPC ports; the HTTP port marks
//! its own), and, until its message is in, waiting for the client
//! ([`WatchedBody`]: the body-read timeout).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use super::{Awaiting, Gate, InFlight};

/// A tower layer for the gRPC ports that marks each request in flight on
/// its connection (found by the peer address tonic records), until its
/// response body ends.
#[derive(Clone)]
pub struct TrackLayer {
    gate: Gate,
}

impl TrackLayer {
    pub fn new(gate: Gate) -> Self {
        TrackLayer { gate }
    }
}

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Track {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// See [`TrackLayer`].
#[derive(Clone)]
pub struct Track<S> {
    inner: S,
    gate: Gate,
}

fn peer_of<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let extensions = request.extensions();
    match extensions.get::<TcpConnectInfo>() {
        Some(info) => info.remote_addr(),
        None => extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.get_ref().remote_addr()),
    }
}

impl<S, R> tower::Service<http::Request<tonic::body::Body>> for Track<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let conn = peer_of(&request).and_then(|peer| self.gate.connection(&peer));
        let in_flight = conn.as_ref().map(|conn| conn.begin());
        if let Some(conn) = conn {
            // The first message must arrive within the body-read timeout;
            // until it has, the call is not work (see `make_room`).
            if !http_body::Body::is_end_stream(request.body()) {
                let timeout = self.gate.shared.limits.body_read_timeout;
                let awaiting = conn.awaiting_body();
                if is_grpc_web(request.headers()) {
                    // tonic-web turns an error of the body it decodes into
                    // INTERNAL: its body is watched once decoded, further
                    // in ([`GrpcWebWatchLayer`]), so a late message is
                    // DEADLINE_EXCEEDED as over gRPC and Connect.
                    request
                        .extensions_mut()
                        .insert(GrpcWebWatch(Arc::new(std::sync::Mutex::new(Some((
                            awaiting, timeout,
                        ))))));
                } else {
                    request = request.map(|body| {
                        tonic::body::Body::new(WatchedBody::first_message(body, awaiting, timeout))
                    });
                }
            }
            // For the auth interceptor to mark the connection trusted.
            if !conn.is_trusted() {
                request.extensions_mut().insert(conn);
            }
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|inner| Tracked {
                inner,
                _in_flight: in_flight,
            }))
        })
    }
}

fn is_grpc_web(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc-web"))
}

/// A gRPC-Web request's first-message watch, left by [`Track`] for
/// [`GrpcWebWatchLayer`] (taken once).
#[derive(Clone)]
struct GrpcWebWatch(Arc<std::sync::Mutex<Option<(Awaiting, Duration)>>>);

/// A tower layer placed after tonic-web's: wraps a gRPC-Web request's
/// decoded body (gRPC's framing, base64 undone) in a [`WatchedBody`], so
/// its [`BodyTimedOut`] reaches tonic as DEADLINE_EXCEEDED. Other requests
/// pass untouched (one extensions lookup).
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcWebWatchLayer;

impl<S> tower::Layer<S> for GrpcWebWatchLayer {
    type Service = GrpcWebWatched<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcWebWatched { inner }
    }
}

/// See [`GrpcWebWatchLayer`].
#[derive(Clone, Debug)]
pub struct GrpcWebWatched<S> {
    inner: S,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for GrpcWebWatched<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let watch = (request.extensions_mut().remove::<GrpcWebWatch>())
            .and_then(|watch| watch.0.lock().ok()?.take());
        if let Some((awaiting, timeout)) = watch {
            request = request.map(|body| {
                tonic::body::Body::new(WatchedBody::first_message(body, awaiting, timeout))
            });
        }
        self.inner.call(request)
    }
}

/// A request body the client did not finish sending within the
/// body-read timeout (the [`WatchedBody`]'s error).
#[derive(Debug)]
pub struct BodyTimedOut {
    after: Duration,
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request's message did not arrive within --body-read-timeout-ms ({} ms)",
            self.after.as_millis()
        )
    }
}

impl std::error::Error for BodyTimedOut {}

impl From<BodyTimedOut> for tonic::Status {
    /// DEADLINE_EXCEEDED, as a Session's missing open message is: the
    /// client's message did not come in time.
    fn from(timed_out: BodyTimedOut) -> Self {
        tonic::Status::deadline_exceeded(timed_out.to_string())
    }
}

/// What a [`WatchedBody`] waits for.
enum Until {
    /// The first gRPC message: its 5-byte prefix (flag, length), then its
    /// length in bytes.
    FirstMessage {
        prefix: [u8; 5],
        have: usize,
        left: usize,
    },
    /// The end of the body (HTTP/1.1).
    End,
}

impl Until {
    /// Takes in `data`; true once what is waited for has all arrived.
    fn feed(&mut self, mut data: &[u8]) -> bool {
        let Until::FirstMessage { prefix, have, left } = self else {
            return false;
        };
        if *have < prefix.len() {
            let take = (prefix.len() - *have).min(data.len());
            prefix[*have..*have + take].copy_from_slice(&data[..take]);
            *have += take;
            data = &data[take..];
            if *have < prefix.len() {
                return false;
            }
            *left = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        }
        *left = left.saturating_sub(data.len());
        *left == 0
    }
}

pin_project_lite::pin_project! {
    /// A request body that must arrive (its first gRPC message, or all of
    /// it) within the body-read timeout: past it, reading fails with
    /// [`BodyTimedOut`] (as the body's own error type). Until then its
    /// request counts as waiting for the client ([`ConnState::awaiting_body`]).
    /// The timer is only armed when the client is behind: a message that
    /// comes with its headers costs none (not even a clock read).
    pub struct WatchedBody<B> {
        #[pin]
        inner: B,
        until: Until,
        // Some until the awaited part arrived (or the time ran out).
        awaiting: Option<Awaiting>,
        after: Duration,
        timer: Option<Pin<Box<Sleep>>>,
        // Set when the time ran out (the HTTP port answers 408).
        timed_out: Option<Arc<AtomicBool>>,
    }
}

impl<B> WatchedBody<B> {
    /// A gRPC call's body: its first message within `timeout`.
    pub fn first_message(inner: B, awaiting: Awaiting, timeout: Duration) -> Self {
        Self::new(
            inner,
            Until::FirstMessage {
                prefix: [0; 5],
                have: 0,
                left: 0,
            },
            awaiting,
            timeout,
            None,
        )
    }

    /// An HTTP request's body: all of it within `timeout`; `timed_out` is
    /// set when it did not come.
    pub fn whole(
        inner: B,
        awaiting: Awaiting,
        timeout: Duration,
        timed_out: Arc<AtomicBool>,
    ) -> Self {
        Self::new(inner, Until::End, awaiting, timeout, Some(timed_out))
    }

    fn new(
        inner: B,
        until: Until,
        awaiting: Awaiting,
        timeout: Duration,
        timed_out: Option<Arc<AtomicBool>>,
    ) -> Self {
        WatchedBody {
            inner,
            until,
            awaiting: Some(awaiting),
            after: timeout,
            timer: None,
            timed_out,
        }
    }
}

impl<B> http_body::Body for WatchedBody<B>
where
    B: http_body::Body<Data = tonic::codegen::Bytes>,
    B::Error: From<BodyTimedOut>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if this.awaiting.is_none() {
            return this.inner.poll_frame(cx);
        }
        let polled = this.inner.as_mut().poll_frame(cx);
        let arrived = match &polled {
            Poll::Ready(Some(Ok(frame))) => match frame.data_ref() {
                Some(data) => this.until.feed(data) || this.inner.is_end_stream(),
                // Trailers: the body is over.
                None => true,
            },
            // The end, or the connection's error: nothing more to wait for.
            Poll::Ready(_) => true,
            Poll::Pending => {
                // The clock starts when the body is first read and found
                // behind: the request's handler reads it at once.
                let after = *this.after;
                let timer = (this.timer).get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *this.awaiting = None;
                *this.timer = None;
                if let Some(flag) = this.timed_out {
                    flag.store(true, Ordering::Release);
                }
                return Poll::Ready(Some(Err(BodyTimedOut { after }.into())));
            }
        };
        if arrived {
            *this.awaiting = None;
            *this.timer = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request in flight until it ends.
    pub struct Tracked<B> {
        #[pin]
        inner: B,
        _in_flight: Option<InFlight>,
    }
}

impl<B: http_body::Body> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::Until;

    fn first_message() -> Until {
        Until::FirstMessage {
            prefix: [0; 5],
            have: 0,
            left: 0,
        }
    }

    #[test]
    fn the_first_grpc_message_is_found_however_its_bytes_are_split() {
        // Flag 0, length 3, then the message.
        let framed = [0u8, 0, 0, 0, 3, b'a', b'b', b'c'];
        for split in 0..framed.len() {
            let mut until = first_message();
            let (a, b) = framed.split_at(split);
            let done_early = until.feed(a);
            assert!(!done_early, "complete after {split} of 8 bytes");
            assert!(until.feed(b), "split at {split}");
        }
        // One byte at a time.
        let mut until = first_message();
        let fed: Vec<bool> = framed.iter().map(|b| until.feed(&[*b])).collect();
        assert_eq!(fed, [false, false, false, false, false, false, false, true]);
        // An empty message is complete with its prefix.
        assert!(first_message().feed(&[0, 0, 0, 0, 0]));
        // The whole body (HTTP) is not a matter of bytes.
        assert!(!Until::End.feed(b"everything"));
    }
}
