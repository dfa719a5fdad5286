//! TLS for the server's ports, with rustls (ring): the gRPC port, and the
//! HTTP port when `--http-tls` asks for it. Optional mutual TLS (clients
//! must present a certificate signed by `--tls-client-ca-file`).
//!
//! The certificate, key and client CA are re-read every
//! `--tls-reload-interval-ms`; when their content changed (a renewed
//! certificate, a Kubernetes Secret's symlink swap), new connections use
//! the new files, while open connections keep theirs. Files that do not
//! load are logged and the previous configuration stays in use.
//!
//! Handshakes run in their own tasks with a timeout, so a client that
//! connects and says nothing cannot hold up the accept loop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use clap::Args;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tonic::codegen::Bytes;
use tonic::service::Routes;
use tonic::transport::server::Router;
use tower::{Layer, Service};

use crate::limits::{GatedListener, Guarded};

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TLS flags, for `tumbler serve` and `tumbler dev`.
#[derive(Args, Clone, Debug)]
pub struct TlsArgs {
    /// Serve gRPC over TLS with this certificate chain (PEM, leaf first);
    /// needs --tls-key-file.
    #[arg(long, env = "TUMBLER_TLS_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert-file.
    #[arg(long, env = "TUMBLER_TLS_KEY_FILE", value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by a CA in
    /// this PEM file.
    #[arg(long, env = "TUMBLER_TLS_CLIENT_CA_FILE", value_name = "PATH")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// How often the TLS files are checked for new content (new
    /// connections then use it); 0 never reloads them.
    #[arg(long, env = "TUMBLER_TLS_RELOAD_INTERVAL_MS", default_value_t = 10_000)]
    pub tls_reload_interval_ms: u64,
    /// Serve the HTTP port (metrics, dashboard) over TLS too, with the
    /// same certificate (no client certificate asked for).
    #[arg(
        long,
        env = "TUMBLER_HTTP_TLS",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub http_tls: bool,
    /// A second, plaintext port that serves only gRPC health
    /// (grpc.health.v1.Health), for probes that cannot speak TLS, such as
    /// Kubernetes' gRPC probe. Default: none.
    #[arg(long, env = "TUMBLER_HEALTH_LISTEN", value_name = "ADDR")]
    pub health_listen: Option<SocketAddr>,
}

impl TlsArgs {
    /// The TLS settings these flags ask for (None: plaintext), with the
    /// files loaded: a missing partner flag or a file that does not load
    /// is an error naming the flag.
    pub fn settings(&self) -> anyhow::Result<Option<TlsSettings>> {
        let (cert, key) = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (Some(_), None) => anyhow::bail!("--tls-cert-file needs --tls-key-file"),
            (None, Some(_)) => anyhow::bail!("--tls-key-file needs --tls-cert-file"),
            (None, None) => {
                anyhow::ensure!(
                    self.tls_client_ca_file.is_none(),
                    "--tls-client-ca-file needs --tls-cert-file and --tls-key-file"
                );
                anyhow::ensure!(
                    !self.http_tls,
                    "--http-tls needs --tls-cert-file and --tls-key-file"
                );
                return Ok(None);
            }
        };
        let files = TlsFiles {
            cert,
            key,
            client_ca: self.tls_client_ca_file.clone(),
        };
        let reload = (self.tls_reload_interval_ms > 0)
            .then(|| Duration::from_millis(self.tls_reload_interval_ms));
        let mut settings = TlsSettings::load(files, reload)?;
        settings.http = self.http_tls;
        Ok(Some(settings))
    }
}

/// Where the TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key, PEM.
    pub key: PathBuf,
    /// CA(s) client certificates must chain to; None: no client certificates.
    pub client_ca: Option<PathBuf>,
}

/// The server's TLS configuration: the files, and what was last loaded
/// from them (shared by clones, so the gRPC and HTTP ports reload
/// together).
#[derive(Clone)]
pub struct TlsSettings {
    shared: Arc<Shared>,
    /// Whether the HTTP port uses TLS as well.
    pub http: bool,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("files", &self.shared.files)
            .field("reload_interval", &self.shared.reload_interval)
            .field("http", &self.http)
            .finish()
    }
}

struct Shared {
    files: TlsFiles,
    reload_interval: Option<Duration>,
    current: RwLock<Configs>,
    /// The files' content the current configs were made from (or that was
    /// last found broken), to notice changes.
    seen: Mutex<Material>,
    /// The one reload task, while some port uses it.
    watcher: Mutex<Weak<Watcher>>,
}

struct Configs {
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

/// Which port a connection came in on: the gRPC port offers ALPN `h2`
/// then `http/1.1` (Connect and gRPC-Web over HTTP/1.1), with client
/// certificates under mTLS; the HTTP port speaks HTTP/1.1 to anyone.
#[derive(Clone, Copy, Debug)]
enum Port {
    Grpc,
    Http,
}

impl TlsSettings {
    /// Loads the files (an error names the flag of the file at fault);
    /// `reload_interval` None: never re-read them.
    pub fn load(files: TlsFiles, reload_interval: Option<Duration>) -> anyhow::Result<Self> {
        let material = Material::read(&files)?;
        let configs = material.configs()?;
        Ok(TlsSettings {
            shared: Arc::new(Shared {
                files,
                reload_interval,
                current: RwLock::new(configs),
                seen: Mutex::new(material),
                watcher: Mutex::new(Weak::new()),
            }),
            http: false,
        })
    }

    fn config(&self, port: Port) -> Arc<ServerConfig> {
        let current = self
            .shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner());
        match port {
            Port::Grpc => current.grpc.clone(),
            Port::Http => current.http.clone(),
        }
    }

    /// Starts the reload task unless one runs; it stops when the last
    /// holder of the returned guard drops it.
    fn watch(&self) -> Option<Arc<Watcher>> {
        let interval = self.shared.reload_interval?;
        let mut slot = self
            .shared
            .watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(watcher) = slot.upgrade() {
            return Some(watcher);
        }
        let task = tokio::spawn(reload(self.shared.clone(), interval));
        let watcher = Arc::new(Watcher(task.abort_handle()));
        *slot = Arc::downgrade(&watcher);
        Some(watcher)
    }

    /// TLS connections accepted on `listener`, handshakes done.
    fn incoming(&self, listener: GatedListener, port: Port) -> Incoming {
        let (tx, rx) = mpsc::channel(64);
        let accept = tokio::spawn(accept_loop(listener, self.clone(), port, tx));
        Incoming {
            rx,
            _accept: AbortOnDrop(accept.abort_handle()),
            _watcher: self.watch(),
        }
    }

    /// The HTTP port's listener: TLS over `listener`, for `axum::serve`.
    pub fn https_listener(&self, listener: GatedListener) -> std::io::Result<HttpsListener> {
        Ok(HttpsListener {
            addr: listener.local_addr()?,
            incoming: self.incoming(listener, Port::Http),
        })
    }
}

/// Serves `router` on `listener` until `signal` resolves: over TLS when
/// `tls` is given, else plaintext. Request extensions carry tonic's
/// connection info either way (`remote_addr()`, and `peer_certs()` with
/// mutual TLS).
pub async fn serve<L, ResBody>(
    router: Router<L>,
    listener: GatedListener,
    tls: Option<&TlsSettings>,
    signal: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    L: Layer<Routes>,
    L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Error: Into<BoxError> + Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    match tls {
        None => {
            router
                .serve_with_incoming_shutdown(listener.into_stream(), signal)
                .await
        }
        Some(tls) => {
            let incoming = tls.incoming(listener, Port::Grpc);
            router.serve_with_incoming_shutdown(incoming, signal).await
        }
    }
}

/// Accepts TCP connections and hands each to its own handshake task;
/// finished handshakes go to `tx`. Ends when the receiving side is gone.
async fn accept_loop(
    listener: GatedListener,
    tls: TlsSettings,
    port: Port,
    tx: mpsc::Sender<TlsStream<Guarded<TcpStream>>>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        // Caps, TCP_NODELAY and accept errors: see `limits`.
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
            () = tx.closed() => return,
        };
        let acceptor = TlsAcceptor::from(tls.config(port));
        let tx = tx.clone();
        handshakes.spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = tx.send(stream).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, ?port, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, ?port, "TLS handshake timed out"),
            }
        });
    }
}

/// A stream of TLS connections, for tonic's `serve_with_incoming*`.
struct Incoming {
    rx: mpsc::Receiver<TlsStream<Guarded<TcpStream>>>,
    /// The accept loop: stopped (closing the listener) when this is dropped.
    _accept: AbortOnDrop,
    _watcher: Option<Arc<Watcher>>,
}

impl tokio_stream::Stream for Incoming {
    type Item = Result<TlsStream<Guarded<TcpStream>>, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|stream| stream.map(Ok))
    }
}

/// The HTTP port's TLS listener (see [`TlsSettings::https_listener`]).
pub struct HttpsListener {
    addr: SocketAddr,
    incoming: Incoming,
}

impl HttpsListener {
    /// The next connection with its handshake done; pending forever once
    /// the accept loop has ended.
    pub async fn accept(&mut self) -> TlsStream<Guarded<TcpStream>> {
        match self.incoming.rx.recv().await {
            Some(stream) => stream,
            None => std::future::pending().await,
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The reload task's handle; the task stops when the last one is dropped.
struct Watcher(tokio::task::AbortHandle);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every `interval`, re-reads the files; new content that loads replaces
/// the configs, new content that does not is logged (once) and ignored.
async fn reload(shared: Arc<Shared>, interval: Duration) {
    let mut last_read_error = None;
    loop {
        tokio::time::sleep(interval).await;
        let files = shared.files.clone();
        let read = match tokio::task::spawn_blocking(move || Material::read(&files)).await {
            Ok(read) => read,
            Err(_) => continue,
        };
        let material = match read {
            Ok(material) => {
                last_read_error = None;
                material
            }
            Err(e) => {
                // Mid-swap, a file can be missing for a moment.
                let message = format!("{e:#}");
                if last_read_error.as_ref() != Some(&message) {
                    tracing::error!(error = %message, "cannot read the TLS files; keeping the current certificate");
                    last_read_error = Some(message);
                }
                continue;
            }
        };
        {
            let mut seen = shared.seen.lock().unwrap_or_else(|e| e.into_inner());
            if *seen == material {
                continue;
            }
            *seen = material.clone();
        }
        match material.configs() {
            Ok(configs) => {
                *shared.current.write().unwrap_or_else(|e| e.into_inner()) = configs;
                tracing::info!(cert = %shared.files.cert.display(), "TLS files changed: new connections use the new certificate");
            }
            Err(e) => tracing::error!(
                error = format!("{e:#}"),
                "TLS files changed but do not load; keeping the current certificate"
            ),
        }
    }
}

/// The files' bytes.
#[derive(Clone, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Material {
    fn read(files: &TlsFiles) -> anyhow::Result<Self> {
        fn read(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
            std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read {flag} {}: {e}", path.display()))
        }
        Ok(Material {
            cert: read(&files.cert, "--tls-cert-file")?,
            key: read(&files.key, "--tls-key-file")?,
            client_ca: match &files.client_ca {
                Some(path) => Some(read(path, "--tls-client-ca-file")?),
                None => None,
            },
        })
    }

    /// The rustls configs for both ports; errors name the flag at fault.
    fn configs(&self) -> anyhow::Result<Configs> {
        let provider = Arc::new(ring::default_provider());
        let chain = certificates(&self.cert, "--tls-cert-file")?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| anyhow::anyhow!("--tls-key-file: no usable PEM private key: {e}"))?;

        let builder = |provider: &Arc<CryptoProvider>| {
            ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| anyhow::anyhow!("TLS setup: {e}"))
        };
        let grpc = builder(&provider)?;
        let grpc = match &self.client_ca {
            Some(pem) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(pem, "--tls-client-ca-file")? {
                    roots.add(cert).map_err(|e| {
                        anyhow::anyhow!("--tls-client-ca-file: not a usable CA certificate: {e}")
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| anyhow::anyhow!("--tls-client-ca-file: {e}"))?;
                grpc.with_client_cert_verifier(verifier)
            }
            None => grpc.with_no_client_auth(),
        };
        let key_error = |e| {
            anyhow::anyhow!(
                "--tls-key-file does not fit the certificate in --tls-cert-file (or is not a key): {e}"
            )
        };
        let mut grpc = grpc
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(key_error)?;
        // h2 first (gRPC); http/1.1 for Connect and gRPC-Web clients that
        // speak only HTTP/1.1 (curl --http1.1, browsers' fetch through some
        // proxies, most HTTP libraries).
        grpc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let mut http = builder(&provider)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(key_error)?;
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Configs {
            grpc: Arc::new(grpc),
            http: Arc::new(http),
        })
    }
}

fn certificates(pem: &[u8], flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{flag}: invalid PEM: {e}"))?;
    anyhow::ensure!(!certs.is_empty(), "{flag}: no PEM certificate found");
    Ok(certs)
}
