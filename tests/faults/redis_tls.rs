//! TLS and ACL credentials between tumbler and Redis: a real
//! `redis-server --tls-port` with certificates made here with rcgen, the
//! real server talking to it over `rediss://`, and the `--redis-*` flags of
//! the `tumbler` binary.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::net::TcpListener;
use tonic_health::pb::health_check_response::ServingStatus;

use common::topology::RedisNode;
use common::wait::wait_until;
use common::{TestServer, acquire, redis_conn, release, service_args};
use tumbler::config::ServerConfig;
use tumbler::dev::RedisServer;
use tumbler::proto::AcquireStatus;
use tumbler::server::Listeners;
use tumbler_store::RedisCredentials;

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

    fn leaf(&self, names: &[&str], usages: Vec<ExtendedKeyUsagePurpose>) -> Leaf {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, &names[0]);
        params.extended_key_usages = usages;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Files in a temporary directory.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        // Write aside and rename, as a Secret update swaps files whole.
        let aside = self.dir.path().join(format!(".{name}.new"));
        std::fs::write(&aside, content).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        path
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// A redis-server with a TLS port (and a plaintext one, for the test's own
/// checks) whose certificate `ca` signed; with `client_ca`, TLS clients
/// must present a certificate it signed. Redis' own cluster and
/// replication links stay plaintext.
struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
    /// The certificates Redis reads (kept until it stops).
    _files: Files,
}

impl TlsRedis {
    fn start(ca: &Ca, client_ca: Option<&Ca>) -> TlsRedis {
        let files = Files::new();
        let leaf = ca.leaf(
            &["localhost", "127.0.0.1"],
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        files.write("redis.crt", &leaf.cert);
        files.write("redis.key", &leaf.key);
        files.write("redis-ca.pem", &client_ca.unwrap_or(ca).pem);
        let tls_port = tumbler::dev::free_port().unwrap();
        let tls_port_arg = tls_port.to_string();
        let (cert, key, ca_file) = (
            files.path("redis.crt"),
            files.path("redis.key"),
            files.path("redis-ca.pem"),
        );
        let auth_clients = if client_ca.is_some() { "yes" } else { "no" };
        let server = RedisServer::start_with_args(
            "redis-server",
            &[
                "--tls-port",
                &tls_port_arg,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca_file,
                "--tls-auth-clients",
                auth_clients,
            ],
        )
        .expect("redis-server with TLS");
        TlsRedis {
            server,
            tls_port,
            _files: files,
        }
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

/// A `tumbler serve` process with `flags` and `env` (killed by its pid on
/// drop), not yet healthy.
struct Process {
    child: std::process::Child,
    endpoint: String,
    /// Its stderr (the logs).
    log: tempfile::NamedTempFile,
}

impl Process {
    fn spawn(redis_url: &str, flags: &[&str], env: &[(&str, &str)]) -> Process {
        let port = tumbler::dev::free_port().unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
            .args(["serve", "--no-auth", "--http-listen", "off"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--redis-url", redis_url])
            .args(flags)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        Process {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    async fn health(&self) -> Option<ServingStatus> {
        common::health_status(&self.endpoint, "").await.ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server in this process with `credentials`, not yet healthy.
async fn spawn(url: &str, credentials: RedisCredentials) -> TestServer {
    let mut config = ServerConfig::new(url.to_owned(), &service_args()).unwrap();
    config.store.credentials = credentials;
    let listeners = Listeners {
        grpc: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        http: None,
        health: None,
    };
    TestServer::spawn_on(config, listeners)
}

fn tls_credentials(ca: &std::path::Path) -> RedisCredentials {
    RedisCredentials {
        tls_ca_file: Some(ca.to_owned()),
        reload_interval: Some(Duration::from_millis(100)),
        ..Default::default()
    }
}

/// Acquire and release one lock through `server`.
async fn round_trip(server: &TestServer, name: &str) {
    let mut client = server.client().await;
    let reply = client
        .acquire(acquire(name, "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    client.release(release(name, "h1")).await.unwrap();
}

#[tokio::test]
async fn locks_are_served_over_mutual_tls_to_redis() {
    let ca = Ca::new("redis ca");
    let client_ca = Ca::new("client ca");
    let redis = TlsRedis::start(&ca, Some(&client_ca));
    let client = client_ca.leaf(&["tumbler"], vec![ExtendedKeyUsagePurpose::ClientAuth]);
    let files = Files::new();
    let mut credentials = tls_credentials(&files.write("ca.pem", &ca.pem));
    credentials.tls_cert_file = Some(files.write("client.crt", &client.cert));
    credentials.tls_key_file = Some(files.write("client.key", &client.key));

    let server = spawn(&redis.url(), credentials).await;
    server.wait_for_health(ServingStatus::Serving).await;
    round_trip(&server, "over-tls").await;
    // The grant went through the TLS port into the same Redis.
    let mut plain = redis_conn(&redis.server.url()).await;
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut plain)
        .await
        .unwrap();
    assert!(
        stats.contains("total_connections_received"),
        "redis answers on its plaintext port too"
    );
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut plain)
        .await
        .unwrap();
    assert!(
        clients
            .lines()
            .filter(|l| !l.contains("cmd=client"))
            .count()
            >= 1,
        "tumbler keeps a connection open: {clients}"
    );
}

#[tokio::test]
async fn without_its_client_certificate_tumbler_is_not_serving() {
    let ca = Ca::new("redis ca");
    let client_ca = Ca::new("client ca");
    let redis = TlsRedis::start(&ca, Some(&client_ca));
    let files = Files::new();
    let server = spawn(
        &redis.url(),
        tls_credentials(&files.write("ca.pem", &ca.pem)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.health("").await.unwrap(), ServingStatus::NotServing);
    let err = server
        .client()
        .await
        .acquire(acquire("no-cert", "h1"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
}

#[tokio::test]
async fn a_wrong_ca_is_not_serving_until_the_ca_file_is_fixed() {
    let ca = Ca::new("redis ca");
    let other = Ca::new("some other ca");
    let redis = TlsRedis::start(&ca, None);
    let files = Files::new();
    files.write("ca.pem", &other.pem);
    let ca_file = files.path("ca.pem");
    let process = Process::spawn(
        &redis.url(),
        &[
            "--redis-tls-ca-file",
            &ca_file,
            "--redis-reload-interval-ms",
            "100",
        ],
        &[("TUMBLER_LOG_FORMAT", "json")],
    );
    wait_until(
        "the log names the certificate",
        Duration::from_secs(15),
        || {
            let log = process.log();
            log.contains("NOT_SERVING") && log.to_lowercase().contains("certificate")
        },
    );
    assert_eq!(process.health().await, Some(ServingStatus::NotServing));
    let line = process
        .log()
        .lines()
        .find(|l| l.contains("NOT_SERVING"))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("UnknownIssuer") || line.contains("unknown issuer"),
        "the log says why: {line}"
    );
    // So does every RPC, rather than a generic "not ready".
    let mut client =
        tumbler::proto::lock_service_client::LockServiceClient::connect(process.endpoint.clone())
            .await
            .unwrap();
    let err = client.acquire(acquire("early", "h1")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("UnknownIssuer") && err.message().contains("--redis-tls-ca-file"),
        "{err:?}"
    );

    // The right CA arrives (a Secret update): new connections use it.
    files.write("ca.pem", &ca.pem);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while process.health().await != Some(ServingStatus::Serving) {
        assert!(std::time::Instant::now() < deadline, "{}", process.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client =
        tumbler::proto::lock_service_client::LockServiceClient::connect(process.endpoint.clone())
            .await
            .unwrap();
    let reply = client
        .acquire(acquire("fixed-ca", "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

#[tokio::test]
async fn bad_tls_files_and_plaintext_urls_stop_serve_at_start() {
    let files = Files::new();
    files.write("ca.pem", "not a certificate");
    let run = |args: Vec<String>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
            .args(["serve", "--no-auth", "--http-listen", "off"])
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(vec![
        "--redis-url".into(),
        "rediss://127.0.0.1:1".into(),
        "--redis-tls-ca-file".into(),
        files.path("ca.pem"),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--redis-tls-ca-file"), "{stderr}");
    // A settings error, not one of Redis' replies.
    assert!(stderr.contains("redis settings"), "{stderr}");
    assert!(!stderr.contains("reply not understood"), "{stderr}");

    let out = run(vec![
        "--redis-url".into(),
        "redis://127.0.0.1:1".into(),
        "--redis-tls-ca-file".into(),
        files.path("ca.pem"),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rediss://"), "{stderr}");
}

#[tokio::test]
async fn acl_user_and_password_come_from_their_own_variables() {
    let ca = Ca::new("redis ca");
    let redis = TlsRedis::start(&ca, None);
    let mut admin = redis_conn(&redis.server.url()).await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "locker", "on", ">s3cret", "~*", "&*", "+@all"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "resetpass", ">admin-only"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let files = Files::new();
    files.write("ca.pem", &ca.pem);
    files.write("password", "s3cret\n");
    let ca_file = files.path("ca.pem");
    let password_file = files.path("password");

    // Set as a Bitnami-style chart does: host in the URL, the user and the
    // password file from a Secret, in environment variables.
    let process = Process::spawn(
        &redis.url(),
        &[],
        &[
            ("TUMBLER_REDIS_USERNAME", "locker"),
            ("TUMBLER_REDIS_PASSWORD_FILE", &password_file),
            ("TUMBLER_REDIS_TLS_CA_FILE", &ca_file),
        ],
    );
    common::wait_for_health(&process.endpoint, ServingStatus::Serving).await;
    let mut client =
        tumbler::proto::lock_service_client::LockServiceClient::connect(process.endpoint.clone())
            .await
            .unwrap();
    let reply = client
        .acquire(acquire("acl", "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(clients.contains("user=locker"), "{clients}");
    drop(process);

    // A wrong password: Redis refuses, tumbler is NOT_SERVING.
    let process = Process::spawn(
        &redis.url(),
        &["--redis-username", "locker", "--redis-password", "wrong"],
        &[("TUMBLER_REDIS_TLS_CA_FILE", &ca_file)],
    );
    wait_until(
        "the process answers health",
        Duration::from_secs(15),
        || std::net::TcpStream::connect(process.endpoint.trim_start_matches("http://")).is_ok(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        common::health_status(&process.endpoint, "").await.unwrap(),
        ServingStatus::NotServing
    );
}

#[tokio::test]
async fn sentinel_over_tls_finds_the_master_and_serves() {
    let ca = Ca::new("redis ca");
    let files = Files::new();
    let leaf = ca.leaf(
        &["localhost", "127.0.0.1"],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (cert, key, ca_file) = (
        files.write("redis.crt", &leaf.cert).display().to_string(),
        files.write("redis.key", &leaf.key).display().to_string(),
        files.write("ca.pem", &ca.pem).display().to_string(),
    );
    let tls_args = |port: &str| -> Vec<String> {
        [
            "--tls-port",
            port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    // The master answers TLS on a second port; the sentinel watches that
    // port over TLS (`tls-replication`) and answers TLS clients on its own
    // TLS port.
    let master_tls = tumbler::dev::free_port().unwrap();
    let master_args = tls_args(&master_tls.to_string());
    let _master = RedisNode::start(&master_args.iter().map(String::as_str).collect::<Vec<_>>());
    let sentinel_tls = tumbler::dev::free_port().unwrap();
    let mut sentinel_args = tls_args(&sentinel_tls.to_string());
    sentinel_args.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
    let _sentinel = RedisNode::start_sentinel_with(
        "tls-master",
        master_tls,
        &sentinel_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let url = format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/tls-master");
    let server = spawn(&url, tls_credentials(std::path::Path::new(&ca_file))).await;
    server.wait_for_health(ServingStatus::Serving).await;
    round_trip(&server, "via-tls-sentinel").await;
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn free_port_with_bus() -> u16 {
    loop {
        let port = tumbler::dev::free_port().unwrap();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

#[tokio::test]
async fn a_cluster_over_tls_serves_locks_on_every_node() {
    let ca = Ca::new("redis ca");
    let files = Files::new();
    let leaf = ca.leaf(
        &["localhost", "127.0.0.1"],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (cert, key, ca_file) = (
        files.write("redis.crt", &leaf.cert).display().to_string(),
        files.write("redis.key", &leaf.key).display().to_string(),
        files.write("ca.pem", &ca.pem).display().to_string(),
    );
    // Three masters whose cluster bus and client ports are TLS
    // (`tls-cluster`); each keeps a plaintext port for the test's checks.
    let tls_ports: Vec<u16> = (0..3).map(|_| free_port_with_bus()).collect();
    let nodes: Vec<RedisNode> = tls_ports
        .iter()
        .map(|port| {
            let port = port.to_string();
            RedisNode::start(&[
                "--tls-port",
                &port,
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca_file,
                "--tls-auth-clients",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ])
        })
        .collect();
    let mut create = std::process::Command::new("redis-cli");
    create.args(["--tls", "--cacert", &ca_file, "--cluster", "create"]);
    for port in &tls_ports {
        create.arg(format!("127.0.0.1:{port}"));
    }
    let output = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "redis-cli --cluster create: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for node in &nodes {
        wait_until("the cluster is ok", Duration::from_secs(20), || {
            let info: String = node.query(redis::cmd("CLUSTER").arg("INFO"));
            info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
        });
    }
    let url = format!(
        "rediss+cluster://{}",
        tls_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let server = spawn(&url, tls_credentials(std::path::Path::new(&ca_file))).await;
    server.wait_for_health(ServingStatus::Serving).await;
    // Names in many shards, so calls reach every master (the health
    // check already pings each one over TLS).
    for i in 0..24 {
        round_trip(&server, &format!("cluster-tls-{i}")).await;
    }
}
