//! The one connection helper of the client subcommands: `--addr` (one
//! endpoint or a comma-separated list, `host:port` with or without a
//! scheme), TLS, the bearer token, and fail-over: a call that cannot
//! connect or is answered UNAVAILABLE goes to the next endpoint.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tumbler_client::{Bearer, Certificate, ClientTlsConfig, Identity, Stub};
use tumbler_proto::lock_service_client::LockServiceClient;

use super::Failure;

/// The port a `host` without one means (`tumbler serve`'s default).
const DEFAULT_PORT: u16 = 50051;

/// Where to send requests.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Connection")]
pub struct Target {
    /// The server's gRPC address: `host:port` (plaintext), `http://…` or
    /// `https://…` (TLS); several, comma-separated, are tried in order
    /// (the next one when a server cannot be reached or answers
    /// UNAVAILABLE).
    #[arg(
        long,
        env = "TUMBLER_ADDR",
        default_value = "127.0.0.1:50051",
        value_name = "ADDR[,ADDR…]"
    )]
    pub addr: String,
    /// With https: trust the CA(s) in this PEM file instead of the
    /// system's roots.
    #[arg(long, env = "TUMBLER_TLS_CA_FILE", value_name = "PATH")]
    pub tls_ca_file: Option<PathBuf>,
    /// With https: present this client certificate (PEM), for servers that
    /// require mutual TLS; needs --tls-key-file.
    #[arg(long, env = "TUMBLER_TLS_CLIENT_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, env = "TUMBLER_TLS_CLIENT_KEY_FILE", value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// With https: the name the server's certificate must carry (also sent
    /// as SNI); default: the host in --addr.
    #[arg(long, env = "TUMBLER_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Bearer token, for a server with authentication on (prefer the
    /// environment variable: arguments show in process lists).
    #[arg(long, env = "TUMBLER_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
}

/// A lock service client that sends the caller's bearer token, if any
/// (`tumbler-client`'s stub and interceptor).
pub type Client = Stub;

/// The endpoints of `--addr`, the one in use, and its client.
pub struct Conn {
    /// `--addr`'s entries, each with a scheme and port.
    names: Vec<String>,
    endpoints: Vec<Endpoint>,
    current: usize,
    client: Option<Client>,
    token: Bearer,
}

impl Conn {
    /// Checks the flags; connects on the first call.
    pub fn new(target: &Target) -> Result<Conn, Failure> {
        let token = Bearer::new(target.auth_token.as_deref().unwrap_or_default().trim())
            .map_err(|_| Failure::usage("--auth-token: not a printable ASCII token"))?;
        let uris = parse_addrs(&target.addr)?;
        let tls_flags = target.tls_ca_file.is_some()
            || target.tls_cert_file.is_some()
            || target.tls_key_file.is_some()
            || target.tls_server_name.is_some();
        let mut endpoints = Vec::new();
        for uri in &uris {
            let mut endpoint = Endpoint::from_shared(uri.clone())
                .map_err(|e| Failure::usage(format!("--addr {uri:?}: {e}")))?
                .connect_timeout(Duration::from_secs(5));
            if uri.starts_with("https://") {
                endpoint = endpoint
                    .tls_config(client_tls(target)?)
                    .map_err(|e| Failure::usage(format!("TLS settings: {e}")))?;
            } else if tls_flags {
                return Err(Failure::usage("the --tls-* flags need an https:// --addr"));
            }
            endpoints.push(endpoint);
        }
        Ok(Conn {
            names: uris,
            endpoints,
            current: 0,
            client: None,
            token,
        })
    }

    /// The endpoint in use, as given.
    pub fn endpoint(&self) -> String {
        self.names[self.current].clone()
    }

    /// Gives up on the endpoint in use: the next call starts at the next.
    pub fn skip(&mut self) {
        self.client = None;
        self.current = (self.current + 1) % self.endpoints.len();
    }

    async fn client(&mut self) -> Result<Client, Status> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let channel = self.endpoints[self.current].connect().await.map_err(|e| {
            let cause = super::with_causes(&e.to_string(), std::error::Error::source(&e));
            Status::unavailable(format!("cannot connect to {}: {cause}", self.endpoint()))
        })?;
        let client = LockServiceClient::with_interceptor(channel, self.token.clone());
        self.client = Some(client.clone());
        Ok(client)
    }

    /// A plain channel to the first endpoint that connects (for services
    /// other than the lock service, such as grpc.health.v1).
    pub async fn channel(&mut self) -> Result<Channel, Status> {
        let mut failures: Vec<String> = Vec::new();
        for _ in 0..self.endpoints.len() {
            match self.endpoints[self.current].connect().await {
                Ok(channel) => return Ok(channel),
                Err(e) => {
                    let cause = super::with_causes(&e.to_string(), std::error::Error::source(&e));
                    let status = Status::unavailable(format!(
                        "cannot connect to {}: {cause}",
                        self.endpoint()
                    ));
                    if self.endpoints.len() == 1 {
                        return Err(status);
                    }
                    failures.push(status.message().to_owned());
                    self.skip();
                }
            }
        }
        Err(no_server(&failures))
    }

    /// A client of the first endpoint that connects, from the one in use
    /// on (for streams, which cannot be sent twice).
    pub async fn connected(&mut self) -> Result<Client, Status> {
        let mut failures: Vec<String> = Vec::new();
        for _ in 0..self.endpoints.len() {
            match self.client().await {
                Ok(client) => return Ok(client),
                Err(status) if self.endpoints.len() == 1 => return Err(status),
                Err(status) => {
                    failures.push(status.message().to_owned());
                    self.skip();
                }
            }
        }
        Err(no_server(&failures))
    }

    /// Runs `rpc` on the endpoint in use; when it cannot connect or is
    /// answered UNAVAILABLE, on the next, until each was tried once. The
    /// request must be safe to send twice (the caller's holder id makes
    /// an acquire so).
    pub async fn call<T, F, Fut>(&mut self, mut rpc: F) -> Result<T, Status>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut failures: Vec<String> = Vec::new();
        for _ in 0..self.endpoints.len() {
            let outcome = match self.client().await {
                Ok(client) => rpc(client).await,
                Err(status) => Err(status),
            };
            match outcome {
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    if self.endpoints.len() == 1 {
                        self.client = None;
                        return Err(status);
                    }
                    let message = status.message();
                    failures.push(if message.starts_with("cannot connect") {
                        message.to_owned()
                    } else {
                        format!("{}: {message}", self.endpoint())
                    });
                    self.skip();
                }
                // The connection failed under the call (no server's
                // answer): say so if this is tumbler's HTTP port.
                Err(status) if std::error::Error::source(&status).is_some() => {
                    return Err(self.explained(status).await);
                }
                other => return other.map(tonic::Response::into_inner),
            }
        }
        Err(no_server(&failures))
    }

    /// A connection's failure, told as tumbler's HTTP port when the
    /// endpoint answers `GET /healthz` as that port does (a common slip:
    /// `--addr` with the dashboard's port).
    async fn explained(&self, status: Status) -> Status {
        let endpoint = self.endpoint();
        let Some(authority) = endpoint.strip_prefix("http://") else {
            return status;
        };
        let authority = authority.trim_end_matches('/').to_owned();
        let probe = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(&authority).await.ok()?;
            let request =
                format!("GET /healthz HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut answer = Vec::new();
            stream.take(4096).read_to_end(&mut answer).await.ok()?;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            Some(answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\nok\n"))
        };
        match tokio::time::timeout(Duration::from_secs(1), probe).await {
            Ok(Some(true)) => Status::unavailable(format!(
                "{endpoint} looks like tumbler's HTTP port (it answers /healthz), not its gRPC port: \
                 pass the gRPC address to --addr (`tumbler dev` prints it; `tumbler serve` listens on \
                 port 50051 unless --listen says otherwise); the call failed with: {}",
                super::with_causes(status.message(), std::error::Error::source(&status))
            )),
            _ => status,
        }
    }
}

fn no_server(failures: &[String]) -> Status {
    Status::unavailable(format!("no server answered: {}", failures.join("; ")))
}

/// `--addr`'s list: each entry with a scheme (`http://`, `https://`), or
/// `host[:port]` for plaintext (port 50051 when absent).
fn parse_addrs(addr: &str) -> Result<Vec<String>, Failure> {
    let mut uris = Vec::new();
    for entry in addr.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(Failure::usage(format!(
                "--addr {addr:?}: an empty address in the list"
            )));
        }
        let uri = match entry.split_once("://") {
            Some(("http" | "https", _)) => entry.to_owned(),
            Some((scheme, _)) => {
                return Err(Failure::usage(format!(
                    "--addr {entry:?}: unknown scheme {scheme:?} (use host:port, http:// or https://)"
                )));
            }
            None => format!("http://{entry}"),
        };
        let parsed: http::Uri = uri
            .parse()
            .map_err(|e| Failure::usage(format!("--addr {entry:?}: {e}")))?;
        let Some(host) = parsed.host().filter(|host| !host.is_empty()) else {
            return Err(Failure::usage(format!("--addr {entry:?}: no host")));
        };
        let authority = parsed.authority().map_or("", |a| a.as_str());
        let port_text = parsed.port().map(|port| port.as_str().to_owned());
        let expected = match &port_text {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        if authority != expected || port_text.is_some_and(|p| p.parse::<u16>().is_err()) {
            return Err(Failure::usage(format!(
                "--addr {entry:?}: expected host or host:port, the port a number up to 65535"
            )));
        }
        if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
            return Err(Failure::usage(format!(
                "--addr {entry:?}: expected host:port, not a path"
            )));
        }
        let uri = match (entry.contains("://"), parsed.port_u16()) {
            (false, None) => format!("http://{host}:{DEFAULT_PORT}"),
            _ => uri,
        };
        uris.push(uri);
    }
    Ok(uris)
}

/// The client side of TLS, from the `--tls-*` flags.
fn client_tls(target: &Target) -> Result<ClientTlsConfig, Failure> {
    fn read(path: &Path, flag: &str) -> Result<Vec<u8>, Failure> {
        std::fs::read(path)
            .map_err(|e| Failure::usage(format!("cannot read {flag} {}: {e}", path.display())))
    }
    let mut tls = ClientTlsConfig::new();
    tls = match &target.tls_ca_file {
        Some(path) => tls.ca_certificate(Certificate::from_pem(read(path, "--tls-ca-file")?)),
        None => tls.with_native_roots(),
    };
    match (&target.tls_cert_file, &target.tls_key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read(cert, "--tls-cert-file")?,
                read(key, "--tls-key-file")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Failure::usage(
                "--tls-cert-file and --tls-key-file go together",
            ));
        }
    }
    if let Some(name) = &target.tls_server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(addr: &str) -> Vec<String> {
        parse_addrs(addr).unwrap_or_else(|e| panic!("{addr}: {e:?}"))
    }

    #[test]
    fn addresses_with_and_without_a_scheme() {
        assert_eq!(ok("127.0.0.1:50051"), ["http://127.0.0.1:50051"]);
        assert_eq!(ok("localhost"), ["http://localhost:50051"]);
        assert_eq!(ok("[::1]:7000"), ["http://[::1]:7000"]);
        assert_eq!(ok("https://locks.example"), ["https://locks.example"]);
        assert_eq!(
            ok("a:1, http://b:2,https://c:3"),
            ["http://a:1", "http://b:2", "https://c:3"]
        );
    }

    #[test]
    fn bad_addresses_name_the_flag() {
        for bad in [
            "",
            "a:1,",
            "grpc://a:1",
            "a:notaport",
            "http://a:1/path",
            "://x",
        ] {
            let Err(failure) = parse_addrs(bad) else {
                panic!("{bad:?} was accepted");
            };
            assert!(
                failure.message().starts_with("--addr"),
                "{bad:?}: {failure:?}"
            );
        }
    }
}
