//! The connection: endpoint, namespace, bearer token, TLS, retries.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tumbler_proto as proto;
use tumbler_proto::lock_service_client::LockServiceClient;

use crate::error::{Backoff, Error, Result, retryable};
use crate::lock::LockRequest;
use crate::session::SessionBuilder;

/// The generated stub with the client's bearer token on every call: the
/// whole API, for what the helpers do not cover.
pub type Stub = LockServiceClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>` to every call when a token is set.
#[derive(Clone, Debug, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// Sends `token` as `authorization: Bearer <token>` (an empty token:
    /// nothing), for a [`Stub`] over a channel of your own, e.g.
    /// `LockServiceClient::with_interceptor(channel, Bearer::new(token)?)`.
    /// [`ClientBuilder::token`] does this for a [`Client`].
    pub fn new(token: &str) -> Result<Bearer> {
        if token.is_empty() {
            return Ok(Bearer(None));
        }
        format!("Bearer {token}")
            .parse()
            .map(|value| Bearer(Some(value)))
            .map_err(|_| Error::InvalidToken)
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A client of one tumbler endpoint (any replica behind one address), for
/// one namespace. Cheap to clone: clones share the connection.
///
/// ```no_run
/// # async fn run() -> tumbler_client::Result<()> {
/// use std::time::Duration;
/// let client = tumbler_client::Client::builder("https://locks.internal:50051")
///     .namespace("billing")
///     .token(std::env::var("TUMBLER_TOKEN").unwrap_or_default())
///     .tls(tumbler_client::ClientTlsConfig::new().with_native_roots())
///     .timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    stub: Stub,
    namespace: String,
    endpoint: String,
    timeout: Duration,
    backoff: Backoff,
}

/// Settings of a [`Client`] before it connects; made by [`Client::builder`].
#[derive(Debug)]
pub struct ClientBuilder {
    endpoint: String,
    namespace: String,
    token: Option<String>,
    tls: Option<ClientTlsConfig>,
    timeout: Duration,
    backoff: Backoff,
}

impl ClientBuilder {
    /// The namespace of every call (default: `default`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// A bearer token sent with every call; an empty one sends none.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self
    }

    /// TLS to the server (an `https://` endpoint). For a private CA use
    /// [`ClientTlsConfig::ca_certificate`]; for mutual TLS
    /// [`ClientTlsConfig::identity`].
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The deadline of calls that do not wait (inspect, release, extend),
    /// retries included. Default 10 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The retry schedule on UNAVAILABLE (default: 50 ms doubling to 1 s,
    /// full jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    fn endpoint(&self) -> Result<Endpoint> {
        let uri = if self.endpoint.contains("://") {
            self.endpoint.clone()
        } else if self.tls.is_some() {
            format!("https://{}", self.endpoint)
        } else {
            format!("http://{}", self.endpoint)
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|_| Error::InvalidEndpoint(self.endpoint.clone()))?
            .connect_timeout(Duration::from_secs(5))
            // A dead server is noticed within seconds on an idle connection
            // (a session's stream, a watchdog between renewals).
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        Ok(endpoint)
    }

    fn finish(self, channel: Channel) -> Result<Client> {
        let bearer = Bearer::new(self.token.as_deref().unwrap_or_default())?;
        Ok(Client {
            stub: LockServiceClient::with_interceptor(channel, bearer),
            namespace: self.namespace,
            endpoint: self.endpoint,
            timeout: self.timeout,
            backoff: self.backoff,
        })
    }

    /// Connects now: fails when the server cannot be reached.
    pub async fn connect(self) -> Result<Client> {
        let channel = self.endpoint()?.connect().await?;
        self.finish(channel)
    }

    /// Connects at the first call (and again after the server went away):
    /// never fails on an unreachable server.
    pub fn connect_lazy(self) -> Result<Client> {
        let channel = self.endpoint()?.connect_lazy();
        self.finish(channel)
    }
}

/// Default deadline slack: added to an acquire's wait for its call's
/// deadline, so the server's own TIMEOUT answer arrives before it.
pub(crate) const DEADLINE_SLACK: Duration = Duration::from_secs(5);

impl Client {
    /// Settings for a client of `endpoint` (`host:port`, `http://…` or
    /// `https://…`).
    pub fn builder(endpoint: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            endpoint: endpoint.into(),
            namespace: "default".into(),
            token: None,
            tls: None,
            timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
        }
    }

    /// Connects to `endpoint` in plaintext, namespace `default`, no token.
    ///
    /// ```no_run
    /// # async fn run() -> tumbler_client::Result<()> {
    /// let client = tumbler_client::Client::connect("127.0.0.1:50051").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client> {
        Client::builder(endpoint).connect().await
    }

    /// The same connection for another namespace.
    pub fn with_namespace(&self, namespace: impl Into<String>) -> Client {
        Client {
            namespace: namespace.into(),
            ..self.clone()
        }
    }

    /// The namespace of this client's calls.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The endpoint as given.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The generated stub (with the token): the whole API.
    pub fn stub(&self) -> Stub {
        self.stub.clone()
    }

    /// The deadline of calls that do not wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// An acquire of `name` to configure and send: see [`LockRequest`].
    ///
    /// ```no_run
    /// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
    /// use std::time::Duration;
    /// let lock = client.lock("reports").wait(Duration::from_secs(10)).acquire().await?;
    /// println!("token {}", lock.fencing_token());
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, name: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), name.into())
    }

    /// A session to configure and open: see [`SessionBuilder`].
    pub fn session(&self) -> SessionBuilder {
        SessionBuilder::new(self.clone())
    }

    /// A lock's holders, limit and live waiter count.
    pub async fn inspect(&self, name: &str) -> Result<proto::InspectResponse> {
        let request = proto::InspectRequest {
            namespace: self.namespace.clone(),
            name: name.into(),
        };
        self.call(
            |mut stub, req| async move { stub.inspect(req).await },
            request,
        )
        .await
    }

    /// A lock's waiting requests in grant order.
    pub async fn queue(&self, name: &str) -> Result<proto::QueueResponse> {
        let request = proto::QueueRequest {
            namespace: self.namespace.clone(),
            name: name.into(),
            max_entries: 0,
        };
        self.call(
            |mut stub, req| async move { stub.queue(req).await },
            request,
        )
        .await
    }

    /// Releases `holder`'s grant of `name` (pinned to `fencing_token` when
    /// given): true when it was released, false when it was not held.
    /// [`Lock::release`](crate::Lock::release) is the usual way.
    pub async fn release(
        &self,
        name: &str,
        holder: &str,
        fencing_token: Option<u64>,
    ) -> Result<bool> {
        let request = proto::ReleaseRequest {
            namespace: self.namespace.clone(),
            name: name.into(),
            holder: holder.into(),
            fencing_token,
            names: Vec::new(),
            fencing_tokens: Vec::new(),
        };
        let reply = self
            .call(
                |mut stub, req| async move { stub.release(req).await },
                request,
            )
            .await?;
        Ok(reply.status == proto::ReleaseStatus::Released as i32)
    }

    /// One unary call under the client's timeout, retried on UNAVAILABLE.
    pub(crate) async fn call<Req, Resp, F, Fut>(&self, rpc: F, request: Req) -> Result<Resp>
    where
        Req: Clone,
        F: FnMut(Stub, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let deadline = Instant::now() + self.timeout;
        self.retry(deadline, rpc, |_| request.clone())
            .await
            .map_err(Error::from)
    }

    /// Runs one RPC until it succeeds, fails with something other than
    /// UNAVAILABLE, or `deadline` passes; each try carries the time left as
    /// its gRPC deadline. `make` builds the try's request from the time left.
    pub(crate) async fn retry<Req, Resp, F, Fut>(
        &self,
        deadline: Instant,
        mut rpc: F,
        mut make: impl FnMut(Duration) -> Req,
    ) -> Result<Resp, tonic::Status>
    where
        F: FnMut(Stub, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut attempt = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut request = tonic::Request::new(make(left));
            request.set_timeout(left.max(Duration::from_millis(1)));
            match rpc(self.stub.clone(), request).await {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(status) if retryable(&status) => {
                    let pause = self.backoff.delay(attempt);
                    if Instant::now() + pause >= deadline {
                        return Err(status);
                    }
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                Err(status) => return Err(status),
            }
        }
    }

    pub(crate) fn backoff(&self) -> Backoff {
        self.backoff
    }
}
