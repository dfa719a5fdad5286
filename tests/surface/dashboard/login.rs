//! Logging in to the dashboard: the cookie is a signed session, not the
//! token; its key file is checked at start; HSTS only over TLS.

use super::auth::*;
use super::*;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_sets_a_locked_down_cookie_that_then_opens_the_dashboard() {
    let setup = AuthSetup::start(false).await;

    // The form, carrying where to go afterwards.
    let (status, form) = setup
        .server
        .get("/dashboard/login?next=%2Fdashboard%2Flocks")
        .await;
    assert_eq!(status, 200);
    assert!(form.contains("action=\"/dashboard/login\""), "{form}");
    assert!(
        form.contains("name=\"next\" value=\"/dashboard/locks\""),
        "{form}"
    );
    assert!(form.contains("type=\"password\""), "{form}");

    // Unknown and expired tokens: refused, no cookie, the same message.
    for token in ["nope", EXPIRED, ""] {
        let reply = setup.log_in(token, "/dashboard/locks").await;
        assert_eq!(reply.status, 401, "{token}: {reply:?}");
        assert_eq!(reply.header("set-cookie"), None);
        assert!(
            reply
                .body
                .contains("That token was not accepted: it is unknown or has expired."),
            "{}",
            reply.body
        );
        assert!(reply.body.contains("aria-invalid=\"true\""));
    }
    // A login posted from another site: refused.
    let reply = setup
        .server
        .post(
            "/dashboard/login",
            &[("Sec-Fetch-Site", "cross-site")],
            &format!("token={VIEWER}"),
        )
        .await;
    assert_eq!(reply.status, 403);
    assert_eq!(reply.header("set-cookie"), None);

    // A good token: the cookie, and on to `next`.
    let reply = setup.log_in(VIEWER, "/dashboard/locks").await;
    assert_eq!(reply.status, 303, "{reply:?}");
    assert_eq!(reply.header("location"), Some("/dashboard/locks"));
    let set = reply.header("set-cookie").unwrap();
    let mut parts = set.split("; ");
    let pair = parts.next().unwrap();
    assert!(pair.starts_with("tumbler_token="), "{set}");
    assert_ne!(pair, "tumbler_token=");
    assert!(!pair.contains(VIEWER), "the cookie is encoded: {set}");
    let mut attributes: Vec<&str> = parts.collect();
    attributes.sort();
    // Plain HTTP here: not Secure (tests/surface/tls.rs checks Secure over TLS).
    assert_eq!(attributes, ["HttpOnly", "Path=/", "SameSite=Strict"]);
    let cookie = pair.to_owned();

    // `next` never leaves the dashboard.
    for next in ["//evil.example/x", "https://evil.example/", "/api/v1/locks"] {
        let reply = setup.log_in(VIEWER, next).await;
        assert_eq!(reply.status, 303);
        assert_eq!(reply.header("location"), Some("/dashboard"), "{next}");
    }

    // The cookie opens pages and endpoints.
    let page = setup
        .server
        .get_with("/dashboard/lock?name=reports", &[("Cookie", &cookie)])
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("Token <strong>viewer</strong>"));
    assert!(page.body.contains("action=\"/dashboard/logout\""));
    let lock = setup
        .server
        .get_with("/api/v1/locks/reports", &[("Cookie", &cookie)])
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
    assert_eq!(lock.json()["holders"][0]["grant"]["holder"], "worker-1");
    // So does a bearer header, for scripts.
    let scripted = setup
        .server
        .get_with(
            "/api/v1/locks/reports",
            &[("Authorization", &bearer(VIEWER))],
        )
        .await;
    assert_eq!(scripted.status, 200);
    assert_eq!(scripted.json()["holders"][0]["grant"]["holder"], "worker-1");

    // Logging out drops the cookie.
    let out = setup
        .server
        .post("/dashboard/logout", &[("Cookie", &cookie)], "")
        .await;
    assert_eq!(out.status, 303);
    assert_eq!(out.header("location"), Some("/dashboard/login"));
    let cleared = out.header("set-cookie").unwrap();
    assert!(cleared.starts_with("tumbler_token=;") && cleared.contains("Max-Age=0"));

    // The token leaves the file: the same authenticator refuses it on
    // the dashboard (cookie and header) and over gRPC, without a restart.
    let mut viewer_grpc = bearer_client(&setup.server.grpc, VIEWER).await;
    viewer_grpc.inspect(inspect("reports")).await.unwrap();
    let without_viewer =
        tokens_file().replace(&token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""), "");
    std::fs::write(&setup.tokens, without_viewer).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = setup
            .server
            .get_with("/api/v1/locks/reports", &[("Cookie", &cookie)])
            .await;
        if reply.status == 401 {
            break;
        }
        assert_eq!(reply.status, 200);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removed token still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let page = setup
        .server
        .get_with("/dashboard", &[("Cookie", &cookie)])
        .await;
    assert_eq!(page.status, 303);
    let header = setup
        .server
        .get_with("/api/v1/namespaces", &[("Authorization", &bearer(VIEWER))])
        .await;
    assert_eq!(header.status, 401);
    assert_eq!(
        viewer_grpc
            .inspect(inspect("reports"))
            .await
            .unwrap_err()
            .code(),
        tonic::Code::Unauthenticated
    );
    // Tokens still in the file keep working.
    assert_eq!(setup.holders("default", "reports").await, ["worker-1"]);
}

// ------------------------------------------------------------ login sessions

/// `value` with the byte at `at` changed to another cookie-safe one.
fn altered(value: &str, at: usize) -> String {
    let mut bytes = value.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// The status of `GET /api/v1/namespaces` with the login cookie `cookie`.
async fn with_cookie(server: &DashServer, cookie: &str) -> u16 {
    server
        .get_with("/api/v1/namespaces", &[("Cookie", cookie)])
        .await
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_cookie_is_a_signed_session_not_the_token() {
    use base64::Engine as _;
    let setup = AuthSetup::start(false).await;
    let cookie = setup.cookie(VIEWER).await;
    let value = cookie.strip_prefix("tumbler_token=").unwrap();

    // The token is nowhere in it, in any encoding; its name is.
    for form in [
        VIEWER.to_owned(),
        base64url(VIEWER),
        base64::engine::general_purpose::STANDARD.encode(VIEWER),
        hex::encode(VIEWER),
        tumbler::auth::token_digest(VIEWER),
    ] {
        assert!(!value.contains(&form), "{form} in {cookie}");
    }
    assert!(value.contains(&base64url("viewer")), "{cookie}");
    assert_eq!(with_cookie(&setup.server, &cookie).await, 200);

    // Tampered: a byte of the signature, of the expiry, of the name; a
    // session naming another token under the viewer's signature; the
    // raw token as an older dashboard stored it. All refused, and a page
    // drops the cookie.
    let session = value.find("s1.").expect("a session value");
    let mut forged: Vec<String> = [0, session + 3, value.len() - 1]
        .iter()
        .map(|&at| format!("tumbler_token={}", altered(value, at)))
        .collect();
    forged.push(cookie.replace(&base64url("viewer"), &base64url("ops")));
    forged.push(format!("tumbler_token={}", base64url(VIEWER)));
    for bad in &forged {
        assert_ne!(bad, &cookie);
        assert_eq!(with_cookie(&setup.server, bad).await, 401, "{bad}");
        let page = setup
            .server
            .get_with("/dashboard", &[("Cookie", bad)])
            .await;
        assert_eq!(page.status, 303, "{bad}");
        assert!(page.header("set-cookie").unwrap().contains("Max-Age=0"));
    }

    // Replicas sharing --dashboard-cookie-key-file accept each other's
    // logins; a replica with its own (random) key does not.
    let key_dir = tempfile::tempdir().unwrap();
    let key_file = key_dir.path().join("cookie.key");
    std::fs::write(&key_file, "k3y-0f-at-least-32-bytes-for-both-replicas\n").unwrap();
    let mut args = service_args();
    args.auth.auth_tokens_file = Some(setup.tokens.clone());
    args.dashboard_cookie_key_file = Some(key_file);
    let (a, b) = (
        DashServer::launch_with(&setup._redis.url(), false, &args).await,
        DashServer::launch_with(&setup._redis.url(), false, &args).await,
    );
    let form = format!("token={}", url_encode(VIEWER));
    let login = a.post("/dashboard/login", &[], &form).await;
    let shared = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(with_cookie(&b, &shared).await, 200, "replica b");
    assert_eq!(with_cookie(&setup.server, &shared).await, 401, "own key");
    assert_eq!(with_cookie(&a, &cookie).await, 401, "another key");

    // A new secret under the same name ends the old secret's sessions
    // (without a restart); the new secret logs in.
    let rotated = tokens_file().replace(
        &token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""),
        &token_entry("viewer", "viewer-new-secret", "client", r#"["*"]"#, ""),
    );
    std::fs::write(&setup.tokens, rotated).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while with_cookie(&setup.server, &cookie).await != 401 || with_cookie(&b, &shared).await != 401
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old secret's session still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let renewed = setup.cookie("viewer-new-secret").await;
    assert_eq!(with_cookie(&setup.server, &renewed).await, 200);

    // The token expires in the file: its session ends with it.
    let expired = tokens_file().replace(
        &token_entry("viewer", VIEWER, "client", r#"["*"]"#, ""),
        &token_entry(
            "viewer",
            "viewer-new-secret",
            "client",
            r#"["*"]"#,
            "expires_at = \"2020-01-01T00:00:00Z\"",
        ),
    );
    std::fs::write(&setup.tokens, expired).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while with_cookie(&setup.server, &renewed).await != 401 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an expired token's session still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Logging out tells the browser to drop the cookie.
    let out = setup
        .server
        .post("/dashboard/logout", &[("Cookie", &renewed)], "")
        .await;
    assert_eq!(out.status, 303);
    let cleared = out.header("set-cookie").unwrap();
    assert!(cleared.starts_with("tumbler_token=;") && cleared.contains("Max-Age=0"));
}

#[test]
fn a_short_cookie_key_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("cookie.key");
    std::fs::write(&key_file, "short\n").unwrap();
    let mut args = service_args();
    args.dashboard_cookie_key_file = Some(key_file);
    let err = ServerConfig::new("redis://127.0.0.1:1".into(), &args)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--dashboard-cookie-key-file") && err.contains("at least 32 bytes"),
        "{err}"
    );
}

// ------------------------------------------------------------ HSTS

/// A CA (PEM) and a certificate and key for `localhost` signed by it.
fn localhost_certificate() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "dashboard test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// `GET path` over TLS (trusting `ca`, verifying `localhost`): the reply's
/// head (status line and headers, names lowercased by the server).
async fn https_head(addr: SocketAddr, ca: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut tls = crate::tls::tls_connect(addr, ca).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // A peer that closes without close_notify ends in an error after the
    // whole response; what was read is kept.
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(head, _)| head.to_owned())
}

const DASHBOARD_PATHS: [&str; 5] = [
    "/dashboard",
    "/dashboard/locks",
    "/api/v1/overview",
    "/dashboard/assets/app.js",
    "/",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsts_is_sent_over_tls_and_not_over_plain_http() {
    let redis = start_redis();
    let (ca, cert, key) = localhost_certificate();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let files = tumbler::tls::TlsFiles {
        cert: cert_file,
        key: key_file,
        client_ca: None,
    };
    let mut tls = tumbler::tls::TlsSettings::load(files, None).unwrap();
    tls.http = true;
    let mut config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    config.tls = Some(tls);
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_addr, health_addr) = (http.local_addr().unwrap(), health.local_addr().unwrap());
    let _server = TestServer::spawn_on(
        config,
        tumbler::server::Listeners {
            grpc: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            http: Some(http),
            health: Some(health),
        },
    );
    wait_for_health(&format!("http://{health_addr}"), ServingStatus::Serving).await;
    for path in DASHBOARD_PATHS {
        let head = https_head(http_addr, &ca, path).await;
        let status = head.lines().next().unwrap_or("");
        assert!(
            status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.1 303"),
            "{path}: {head}"
        );
        assert!(
            head.lines()
                .any(|line| line == "strict-transport-security: max-age=31536000"),
            "{path}: {head}"
        );
    }

    // The same dashboard over plain HTTP: the other headers, no HSTS (a
    // browser ignores it there, and it would pin nothing).
    let plain = DashServer::start(&redis.url(), false).await;
    for path in DASHBOARD_PATHS {
        let reply = plain.get_with(path, &[]).await;
        assert!(matches!(reply.status, 200 | 303), "{path}: {reply:?}");
        assert!(reply.header("content-security-policy").is_some(), "{path}");
        assert_eq!(reply.header("strict-transport-security"), None, "{path}");
    }
}
