//! Failed logins are throttled per client address, on by default: after
//! `--auth-failures-per-address` (10) unknown tokens from one address
//! within a minute, that address's logins are refused (429, with
//! Retry-After) without the token being checked, while other addresses
//! log in as before. Clients come from several loopback addresses.

use std::net::IpAddr;
use std::time::Instant;

use super::auth::*;
use super::*;

/// A login posted from `from`: status, Retry-After, body.
async fn log_in_from(
    http: SocketAddr,
    from: [u8; 4],
    token: &str,
) -> (u16, Option<String>, String) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .http1_only()
        .local_address(IpAddr::from(from))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let reply = client
        .post(format!("http://{http}/dashboard/login"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("token={}&next=", url_encode(token)))
        .send()
        .await
        .expect("the HTTP port answers");
    let status = reply.status().as_u16();
    let retry_after = (reply.headers().get("retry-after")).map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, reply.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_wrong_logins_from_one_address_are_mostly_refused_unchecked() {
    // Default settings: the throttle is on.
    let setup = AuthSetup::start(false).await;
    let http = setup.server.http;
    let attacker = [127, 0, 0, 2];

    let started = Instant::now();
    let mut statuses = Vec::new();
    for i in 0..200 {
        let (status, retry_after, body) = log_in_from(http, attacker, &format!("guess-{i}")).await;
        if status == 429 {
            let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
            assert!((1..=60).contains(&secs), "Retry-After {secs}");
            assert!(
                body.contains("too many failed authentications from this address"),
                "{body}"
            );
        }
        statuses.push(status);
    }
    let took = started.elapsed();
    let checked = statuses.iter().filter(|s| **s == 401).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    println!(
        "200 wrong logins from one address: {checked} checked (401), {refused} refused (429) in {took:?}"
    );
    assert_eq!(checked, 10, "{statuses:?}");
    assert_eq!(refused, 190, "{statuses:?}");
    assert!(statuses[..10].iter().all(|s| *s == 401), "{statuses:?}");

    // The right token from that address is refused too (not checked:
    // a refusal tells nothing about the token)...
    let (status, _, _) = log_in_from(http, attacker, VIEWER).await;
    assert_eq!(status, 429);
    // ...while another address logs in, and its mistakes count on its own.
    let (status, _, _) = log_in_from(http, [127, 0, 0, 3], VIEWER).await;
    assert_eq!(status, 303);
    let (status, _, _) = log_in_from(http, [127, 0, 0, 3], "nope").await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throttle_can_be_turned_off() {
    let redis = start_redis();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, tokens_file()).unwrap();
    let mut args = service_args();
    args.auth.auth_tokens_file = Some(tokens);
    args.auth_failures_per_address = 0;
    let server = DashServer::launch_with(&redis.url(), false, &args).await;
    for i in 0..30 {
        let (status, _, _) = log_in_from(server.http, [127, 0, 0, 2], &format!("guess-{i}")).await;
        assert_eq!(status, 401, "attempt {i}");
    }
    let (status, _, _) = log_in_from(server.http, [127, 0, 0, 2], VIEWER).await;
    assert_eq!(status, 303);
}
