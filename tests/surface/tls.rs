//! TLS on the gRPC port (and, with `--http-tls`, the HTTP port): CAs and
//! certificates made here with rcgen, a real Redis, the real server on
//! real sockets, tonic and the `tumbler` binary as clients. Covers server
//! verification, plaintext clients, mutual TLS, certificate reload without
//! a restart, the plaintext health port, the CLI's TLS flags and the
//! startup errors for bad TLS flags.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::proto::AcquireStatus;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::server::Listeners;
use tumbler::tls::{TlsFiles, TlsSettings};

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

/// A certificate authority made for one test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, &names[0]);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for localhost and 127.0.0.1.
    fn server(&self) -> Leaf {
        self.leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// The server's TLS files in a temporary directory.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(server: &Leaf, client_ca: Option<&Ca>) -> Files {
        let files = Files {
            dir: tempfile::tempdir().unwrap(),
        };
        files.write("cert.pem", &server.cert);
        files.write("key.pem", &server.key);
        if let Some(ca) = client_ca {
            files.write("client-ca.pem", &ca.pem);
        }
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn path_str(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_owned()
    }

    /// Replaces a file at once (write aside, rename over), as tools do.
    fn write(&self, name: &str, content: &str) {
        let aside = self.path(&format!(".{name}.tmp"));
        std::fs::write(&aside, content).unwrap();
        std::fs::rename(&aside, self.path(name)).unwrap();
    }

    fn tls_files(&self) -> TlsFiles {
        let client_ca = self.path("client-ca.pem");
        TlsFiles {
            cert: self.path("cert.pem"),
            key: self.path("key.pem"),
            client_ca: client_ca.exists().then_some(client_ca),
        }
    }

    fn settings(&self, reload: Option<Duration>) -> TlsSettings {
        TlsSettings::load(self.tls_files(), reload).unwrap()
    }
}

/// The files of a Kubernetes Secret volume: `tls.crt` and `tls.key` are
/// symlinks into `..data`, itself a symlink to a timestamped directory
/// that an update replaces by swapping `..data`.
struct SecretVolume {
    dir: tempfile::TempDir,
    version: u32,
}

impl SecretVolume {
    fn new(server: &Leaf) -> SecretVolume {
        let mut volume = SecretVolume {
            dir: tempfile::tempdir().unwrap(),
            version: 0,
        };
        volume.update(server);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.dir.path().join(name))
                .unwrap();
        }
        volume
    }

    fn update(&mut self, server: &Leaf) {
        self.version += 1;
        let version = format!("..2026_11_22_{}", self.version);
        let dir = self.dir.path().join(&version);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), &server.cert).unwrap();
        std::fs::write(dir.join("tls.key"), &server.key).unwrap();
        let link = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&version, &link).unwrap();
        std::fs::rename(&link, self.dir.path().join("..data")).unwrap();
    }

    fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.dir.path().join("tls.crt"),
            key: self.dir.path().join("tls.key"),
            client_ca: None,
        }
    }
}

/// An in-process server with TLS on its gRPC port and a plaintext health
/// port (which the start waits on).
struct TlsServer {
    server: TestServer,
    http: Option<SocketAddr>,
}

impl TlsServer {
    async fn start(redis_url: &str, tls: TlsSettings) -> TlsServer {
        Self::start_with(redis_url, tls, &service_args()).await
    }

    async fn start_with(redis_url: &str, tls: TlsSettings, args: &ServiceArgs) -> TlsServer {
        let mut config = ServerConfig::new(redis_url.to_owned(), args).unwrap();
        let http = match tls.http {
            true => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            false => None,
        };
        config.tls = Some(tls);
        let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health_addr = health.local_addr().unwrap();
        let http_addr = http.as_ref().map(|http| http.local_addr().unwrap());
        let listeners = Listeners {
            grpc: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            http,
            health: Some(health),
        };
        let server = TestServer::spawn_on(config, listeners);
        wait_for_health(&format!("http://{health_addr}"), ServingStatus::Serving).await;
        TlsServer {
            server,
            http: http_addr,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr
    }
}

/// Client TLS trusting `ca`, presenting `identity` if given, verifying the
/// name `localhost`.
fn client_tls(ca: &Ca, identity: Option<&Leaf>) -> ClientTlsConfig {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    match identity {
        Some(leaf) => tls.identity(Identity::from_pem(&leaf.cert, &leaf.key)),
        None => tls,
    }
}

/// A new TLS connection to `addr`.
async fn connect(addr: SocketAddr, tls: ClientTlsConfig) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// A health check on a new TLS connection. With TLS 1.3 a refused client
/// certificate can surface only at the first request, so both count.
async fn check(addr: SocketAddr, tls: ClientTlsConfig) -> Result<ServingStatus, String> {
    let channel = connect(addr, tls).await?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|reply| reply.into_inner().status())
        .map_err(|status| format!("{status:?}"))
}

/// Waits (up to 15 s) until new connections trusting `ca` succeed.
async fn until_trusted_by(addr: SocketAddr, ca: &Ca) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let seen = check(addr, client_tls(ca, None)).await;
        if seen == Ok(ServingStatus::Serving) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never presented a certificate from the new CA; last: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_client_trusting_the_servers_ca_gets_served() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let files = Files::new(&ca.server(), None);
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;

    let channel = connect(server.addr(), client_tls(&ca, None)).await.unwrap();
    let mut client = LockServiceClient::new(channel);
    let reply = client
        .acquire(acquire("tls-lock", "worker-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let seen = client
        .inspect(inspect("tls-lock"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");

    // The certificate's IP address entry verifies too, without a name.
    let by_ip = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.pem));
    assert_eq!(
        check(server.addr(), by_ip).await,
        Ok(ServingStatus::Serving)
    );
}

#[tokio::test]
async fn a_client_trusting_another_ca_is_refused() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let other = Ca::new("unrelated CA");
    let files = Files::new(&ca.server(), None);
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;

    let refused = check(server.addr(), client_tls(&other, None)).await;
    assert!(refused.is_err(), "{refused:?}");
    // The server still serves clients that trust it.
    assert_eq!(
        check(server.addr(), client_tls(&ca, None)).await,
        Ok(ServingStatus::Serving)
    );
}

#[tokio::test]
async fn a_plaintext_client_cannot_talk_to_the_tls_port() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let files = Files::new(&ca.server(), None);
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;

    let plaintext = health_status(&format!("http://{}", server.addr()), "").await;
    assert!(plaintext.is_err(), "{plaintext:?}");
    assert_eq!(
        check(server.addr(), client_tls(&ca, None)).await,
        Ok(ServingStatus::Serving)
    );
}

#[tokio::test]
async fn mutual_tls_serves_only_clients_with_a_certificate_from_the_client_ca() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let client_ca = Ca::new("client CA");
    let other = Ca::new("unrelated CA");
    let files = Files::new(&ca.server(), Some(&client_ca));
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;

    let with_cert = client_tls(&ca, Some(&client_ca.client("worker-1")));
    assert_eq!(
        check(server.addr(), with_cert.clone()).await,
        Ok(ServingStatus::Serving)
    );
    let channel = connect(server.addr(), with_cert).await.unwrap();
    let reply = LockServiceClient::new(channel)
        .acquire(acquire("mtls-lock", "worker-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");

    let without = check(server.addr(), client_tls(&ca, None)).await;
    assert!(without.is_err(), "no client certificate: {without:?}");
    let foreign = check(
        server.addr(),
        client_tls(&ca, Some(&other.client("intruder"))),
    )
    .await;
    assert!(foreign.is_err(), "certificate from another CA: {foreign:?}");
}

#[tokio::test]
async fn new_connections_get_a_renewed_certificate_while_open_ones_keep_going() {
    let redis = start_redis();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let mut volume = SecretVolume::new(&old_ca.server());
    let tls = TlsSettings::load(volume.tls_files(), Some(Duration::from_millis(50))).unwrap();
    let server = TlsServer::start(&redis.url(), tls).await;

    let channel = connect(server.addr(), client_tls(&old_ca, None))
        .await
        .unwrap();
    let mut open = LockServiceClient::new(channel);
    let reply = open
        .acquire(acquire("renewal", "before"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");

    // The Secret is updated the way the kubelet does it: a symlink swap.
    volume.update(&new_ca.server());
    until_trusted_by(server.addr(), &new_ca).await;
    let old = check(server.addr(), client_tls(&old_ca, None)).await;
    assert!(old.is_err(), "old CA after the renewal: {old:?}");

    // The connection made before the renewal is still the same one (a new
    // connection would fail against the old CA) and still served.
    let seen = open.inspect(inspect("renewal")).await.unwrap().into_inner();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
}

#[tokio::test]
async fn broken_files_on_reload_keep_the_current_certificate() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let new_ca = Ca::new("new CA");
    let files = Files::new(&ca.server(), None);
    let server = TlsServer::start(
        &redis.url(),
        files.settings(Some(Duration::from_millis(20))),
    )
    .await;

    // Many reload intervals with a broken certificate file, then with a
    // certificate whose key has not been written yet: every new connection
    // still gets the certificate that worked.
    let renewed = new_ca.server();
    for broken in ["-----BEGIN CERTIFICATE-----\nnot base64\n", &renewed.cert] {
        files.write("cert.pem", broken);
        for _ in 0..10 {
            assert_eq!(
                check(server.addr(), client_tls(&ca, None)).await,
                Ok(ServingStatus::Serving)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // Once the pair is whole it is picked up: reloading went on.
    files.write("key.pem", &renewed.key);
    until_trusted_by(server.addr(), &new_ca).await;
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_holds_up_nobody() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let files = Files::new(&ca.server(), None);
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;

    // Connects and says nothing.
    let silent = TcpStream::connect(server.addr()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    assert_eq!(
        check(server.addr(), client_tls(&ca, None)).await,
        Ok(ServingStatus::Serving)
    );
    // The silent connection is still waiting for its handshake: the one
    // above did not queue behind it.
    let mut buf = [0u8; 1];
    match silent.try_read(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the silent connection should still be open: {other:?}"),
    }
}

#[tokio::test]
async fn the_health_port_answers_plaintext_probes_while_grpc_is_tls() {
    let mut redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let files = Files::new(&ca.server(), None);
    let health_port = tumbler::dev::free_port().unwrap();
    let health = format!("http://127.0.0.1:{health_port}");
    let process = TumblerProcess::spawn(
        &redis.url(),
        &[
            "--tls-cert-file",
            &files.path_str("cert.pem"),
            "--tls-key-file",
            &files.path_str("key.pem"),
            "--health-listen",
            &format!("127.0.0.1:{health_port}"),
        ],
    );
    wait_for_health(&health, ServingStatus::Serving).await;
    for service in ["", "tumbler.v1.LockService", "liveness"] {
        assert_eq!(
            health_status(&health, service).await.unwrap(),
            ServingStatus::Serving,
            "{service:?}"
        );
    }

    // The gRPC port itself speaks TLS only.
    let grpc: SocketAddr = process
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    assert!(health_status(&process.endpoint, "").await.is_err());
    assert_eq!(
        check(grpc, client_tls(&ca, None)).await,
        Ok(ServingStatus::Serving)
    );

    // The health port serves health and nothing else.
    let mut plain = LockServiceClient::connect(health.clone()).await.unwrap();
    let refused = plain.inspect(inspect("x")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");

    // Its statuses are the server's: readiness follows Redis, liveness stays.
    redis.stop();
    wait_for_health(&health, ServingStatus::NotServing).await;
    assert_eq!(
        health_status(&health, "tumbler.v1.LockService")
            .await
            .unwrap(),
        ServingStatus::NotServing
    );
    assert_eq!(
        health_status(&health, "liveness").await.unwrap(),
        ServingStatus::Serving
    );
}

#[tokio::test]
async fn the_http_port_serves_over_tls_with_the_same_certificate() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let client_ca = Ca::new("client CA");
    // Mutual TLS on gRPC; the HTTP port asks for no client certificate.
    let files = Files::new(&ca.server(), Some(&client_ca));
    let mut tls = files.settings(None);
    tls.http = true;
    let server = TlsServer::start(&redis.url(), tls).await;
    let http = server.http.unwrap();

    let (status, body) = https_get(http, &ca, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert!(body.contains("tumbler_"), "{body}");

    // Plain HTTP gets no answer.
    let mut plain = TcpStream::connect(http).await.unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(
        !answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test]
async fn the_dashboard_login_cookie_is_secure_over_tls() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let files = Files::new(&ca.server(), None);
    files.write(
        "tokens.toml",
        &token_entry("ops", "ops-secret", "admin", r#"["*"]"#, ""),
    );
    let mut tls = files.settings(None);
    tls.http = true;
    let mut args = service_args();
    args.auth.auth_tokens_file = Some(files.path("tokens.toml"));
    let server = TlsServer::start_with(&redis.url(), tls, &args).await;
    let http = server.http.unwrap();

    let (head, body) =
        https_request(http, &ca, "POST", "/dashboard/login", "token=ops-secret").await;
    assert!(head.starts_with("HTTP/1.1 303"), "{head}\n{body}");
    let cookie = head
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no cookie: {head}"));
    let mut attributes: Vec<&str> = cookie.split("; ").skip(1).collect();
    attributes.sort();
    assert_eq!(
        attributes,
        ["HttpOnly", "Path=/", "SameSite=Strict", "Secure"]
    );
    // The dashboard needs the login over TLS too; /metrics does not.
    let (status, _) = https_get(http, &ca, "/api/v1/namespaces").await;
    assert_eq!(status, "HTTP/1.1 401 Unauthorized");
    let (status, _) = https_get(http, &ca, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
}

/// GET over TLS (trusting `ca`, verifying `localhost`): status line, body.
async fn https_get(addr: SocketAddr, ca: &Ca, path: &str) -> (String, String) {
    let (head, body) = https_request(addr, ca, "GET", path, "").await;
    (head.lines().next().unwrap_or("").to_owned(), body)
}

/// A TLS connection to `addr`, trusting only `ca_pem` and verifying the
/// name `localhost`.
pub(crate) async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto::ring};

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// A request over TLS (a form body, if any): the reply's head (status
/// line and headers) and body.
async fn https_request(
    addr: SocketAddr,
    ca: &Ca,
    method: &str,
    path: &str,
    form: &str,
) -> (String, String) {
    let mut tls = tls_connect(addr, &ca.pem).await;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
        form.len()
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // A peer that closes without close_notify ends in an error after the
    // whole response; what was read is kept.
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.to_owned(), body.to_owned())
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the `tumbler` binary with `args` (and `env`) to completion, with
/// no TUMBLER_* settings from the test's own environment.
async fn tumbler(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::new(TUMBLER);
    command.args(args).kill_on_drop(true);
    for (name, _) in std::env::vars() {
        if name.starts_with("TUMBLER_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("tumbler should exit")
        .unwrap();
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

#[tokio::test]
async fn the_cli_connects_over_tls_and_mutual_tls() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let client_ca = Ca::new("client CA");
    let other = Ca::new("unrelated CA");
    let files = Files::new(&ca.server(), Some(&client_ca));
    let client = client_ca.client("cli");
    files.write("ca.pem", &ca.pem);
    files.write("other-ca.pem", &other.pem);
    files.write("client.pem", &client.cert);
    files.write("client-key.pem", &client.key);
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;
    let addr = format!("https://127.0.0.1:{}", server.addr().port());
    let channel = connect(server.addr(), client_tls(&ca, Some(&client)))
        .await
        .unwrap();
    LockServiceClient::new(channel)
        .acquire(acquire("cli-tls", "worker-7"))
        .await
        .unwrap();

    let (ca_file, other_ca_file) = (files.path_str("ca.pem"), files.path_str("other-ca.pem"));
    let (cert_file, key_file) = (
        files.path_str("client.pem"),
        files.path_str("client-key.pem"),
    );
    let identity = ["--tls-cert-file", &cert_file, "--tls-key-file", &key_file];
    let inspect_with = |extra: &[&str]| {
        let mut args = vec!["inspect", "cli-tls", "--addr", &addr];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, env: Vec<(&'static str, String)>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        tumbler(&args, &env).await
    };

    let mut with_ca = vec!["--tls-ca-file", ca_file.as_str()];
    with_ca.extend_from_slice(&identity);
    let ok = run(inspect_with(&with_ca), vec![]).await;
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("worker-7"), "{}", ok.stdout);

    // The same from environment variables, with the name to verify given.
    let from_env = run(
        inspect_with(&["--tls-server-name", "localhost"]),
        vec![
            ("TUMBLER_TLS_CA_FILE", ca_file.clone()),
            ("TUMBLER_TLS_CLIENT_CERT_FILE", cert_file.clone()),
            ("TUMBLER_TLS_CLIENT_KEY_FILE", key_file.clone()),
        ],
    )
    .await;
    assert_eq!(from_env.code, 0, "{}{}", from_env.stdout, from_env.stderr);
    assert!(from_env.stdout.contains("worker-7"), "{}", from_env.stdout);

    // A name the certificate does not carry, another CA, no client
    // certificate: errors (exit 69: no server reachable). (Without a
    // client certificate, TLS 1.3
    // lets the client finish its handshake; the refusal reaches it as an
    // alert or as a closed connection, whichever comes first.)
    let mut wrong_name = with_ca.clone();
    wrong_name.extend_from_slice(&["--tls-server-name", "elsewhere.example"]);
    let mut wrong_ca = vec!["--tls-ca-file", other_ca_file.as_str()];
    wrong_ca.extend_from_slice(&identity);
    for extra in [
        wrong_name,
        wrong_ca,
        vec!["--tls-ca-file", ca_file.as_str()],
    ] {
        let refused = run(inspect_with(&extra), vec![]).await;
        assert_eq!(
            refused.code, 69,
            "{extra:?}: {}{}",
            refused.stdout, refused.stderr
        );
        assert!(refused.stderr.starts_with("error: "), "{}", refused.stderr);
    }

    // TLS flags with a plaintext address are a mistake, said so.
    let plain_addr = format!("http://127.0.0.1:{}", server.addr().port());
    let mixed = run(
        vec![
            "inspect".into(),
            "cli-tls".into(),
            "--addr".into(),
            plain_addr,
            "--tls-ca-file".into(),
            ca_file.clone(),
        ],
        vec![],
    )
    .await;
    assert_eq!(mixed.code, 64, "{}", mixed.stderr);
    assert!(mixed.stderr.contains("https://"), "{}", mixed.stderr);
}

#[tokio::test]
async fn bad_tls_flags_stop_serve_with_an_error_naming_the_flag() {
    let ca = Ca::new("tumbler test CA");
    let server = ca.server();
    let files = Files::new(&server, None);
    files.write("other-key.pem", &ca.server().key);
    files.write("garbage.pem", "this is not PEM\n");
    let (cert, key) = (files.path_str("cert.pem"), files.path_str("key.pem"));
    let (garbage, other_key) = (
        files.path_str("garbage.pem"),
        files.path_str("other-key.pem"),
    );
    let missing = files.path_str("missing.pem");

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--tls-cert-file", &cert],
            "--tls-cert-file needs --tls-key-file",
        ),
        (
            vec!["--tls-key-file", &key],
            "--tls-key-file needs --tls-cert-file",
        ),
        (
            vec!["--tls-client-ca-file", &cert],
            "--tls-client-ca-file needs --tls-cert-file",
        ),
        (vec!["--http-tls"], "--http-tls needs --tls-cert-file"),
        (
            vec!["--tls-cert-file", &missing, "--tls-key-file", &key],
            "cannot read --tls-cert-file",
        ),
        (
            vec!["--tls-cert-file", &garbage, "--tls-key-file", &key],
            "--tls-cert-file: no PEM certificate found",
        ),
        (
            vec!["--tls-cert-file", &cert, "--tls-key-file", &garbage],
            "--tls-key-file",
        ),
        (
            vec!["--tls-cert-file", &cert, "--tls-key-file", &other_key],
            "--tls-key-file does not fit the certificate in --tls-cert-file",
        ),
        (
            vec![
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-client-ca-file",
                &garbage,
            ],
            "--tls-client-ca-file",
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "off",
            "--no-auth",
            // Never reached: the flags are checked first.
            "--redis-url",
            "redis://127.0.0.1:1",
        ];
        args.extend_from_slice(&flags);
        let run = tumbler(&args, &[]).await;
        assert_ne!(run.code, 0, "{flags:?} started");
        assert!(
            run.stderr.contains(expected),
            "{flags:?}: expected {expected:?} in: {}",
            run.stderr
        );
    }
}

/// Connect over TLS on the gRPC port: ALPN offers `http/1.1` after `h2`,
/// so an HTTP/1.1-only client (curl --http1.1) is served, and curl's
/// default (h2) still is.
#[tokio::test]
async fn connect_over_tls_is_served_on_http1_and_h2() {
    let redis = start_redis();
    let ca = Ca::new("tumbler test CA");
    let files = Files::new(&ca.server(), None);
    let server = TlsServer::start(&redis.url(), files.settings(None)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let url = format!(
        "https://localhost:{}/tumbler.v1.LockService/Inspect",
        server.addr().port()
    );
    for version in ["--http1.1", "--http2"] {
        let output = tokio::process::Command::new("curl")
            .args(["-sS", "-w", "\n%{http_version}", version, "--cacert"])
            .arg(&ca_file)
            .args([
                "--resolve",
                &format!("localhost:{}:127.0.0.1", server.addr().port()),
            ])
            .args([
                "-H",
                "content-type: application/json",
                "-d",
                r#"{"name":"t"}"#,
            ])
            .arg(&url)
            .output()
            .await
            .unwrap();
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(out.contains(r#""name":"t""#), "{version}: {out}");
        let expected = if version == "--http1.1" { "1.1" } else { "2" };
        assert!(out.ends_with(expected), "{version}: {out}");
    }
}
