//! What keeping session grants alive costs Redis: script calls per second
//! for N grants held through one session, measured with INFO commandstats
//! over a quiet window, against the baseline of renewing each grant on its
//! own (N calls per ttl/3).
//!
//! `cargo bench --bench session_renewal` (under `cargo test` it runs a
//! small smoke version).

pub mod common;

use std::time::Duration;

use tokio::sync::mpsc;
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::session_request::Command;
use tumbler::proto::session_response::Event;
use tumbler::proto::{self, SessionRequest};

fn service_args() -> ServiceArgs {
    ServiceArgs {
        redis_timeout_ms: 5000,
        reap_interval_ms: 0,
        ..ServiceArgs::default()
    }
}

/// Session commands sent before waiting for their answers (a session
/// runs at most 1,000 at once).
const IN_FLIGHT: usize = 500;

/// Holds `grants` locks through one session with `ttl_ms`, then counts the
/// script calls Redis sees during `window`.
async fn measure(
    endpoint: &str,
    redis_url: &str,
    grants: usize,
    ttl_ms: u64,
    window: Duration,
) -> f64 {
    let mut client = LockServiceClient::connect(endpoint.to_owned())
        .await
        .unwrap();
    let (commands, outbox) = mpsc::channel(grants + 16);
    let send = |command| SessionRequest {
        command: Some(command),
    };
    commands
        .send(send(Command::Open(proto::SessionOpen {
            ttl_ms: Some(ttl_ms),
            ..Default::default()
        })))
        .await
        .unwrap();
    let mut events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .unwrap()
        .into_inner();
    // In waves: a session runs at most 1,000 commands at once.
    let mut acquired = 0;
    for wave in (0..grants).collect::<Vec<_>>().chunks(IN_FLIGHT) {
        for &i in wave {
            commands
                .send(send(Command::Acquire(proto::SessionAcquire {
                    request_id: i as u64,
                    acquire: Some(proto::AcquireRequest {
                        name: format!("bench-{grants}-{i}"),
                        ..Default::default()
                    }),
                })))
                .await
                .unwrap();
        }
        while acquired < wave[wave.len() - 1] + 1 {
            match events.message().await.unwrap().and_then(|r| r.event) {
                Some(Event::Acquired(_)) => acquired += 1,
                Some(Event::Opened(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    let mut conn = common::redis_conn(redis_url).await;
    common::reset_command_stats(&mut conn).await;
    let keep_alive = commands.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(ttl_ms / 3)).await;
            if keep_alive
                .send(SessionRequest {
                    command: Some(Command::KeepAlive(proto::SessionKeepAlive {})),
                })
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio::time::sleep(window).await;
    let scripts: u64 = (common::command_stats(&mut conn).await.iter())
        .filter(|stat| stat.name == "fcall")
        .map(|stat| stat.calls)
        .sum();
    ticker.abort();
    drop(commands);
    while let Ok(Some(_)) = events.message().await {}
    scripts as f64 / window.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let config = ServerConfig::new(redis.url(), &service_args()).unwrap();
    let endpoint = common::serve_in_process(config).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let ttl_ms = 3_000;
    let (sizes, window): (&[usize], _) = if benching {
        (&[1_000, 10_000], Duration::from_secs(9))
    } else {
        (&[200], Duration::from_secs(2))
    };
    println!(
        "session renewal: one session, ttl {ttl_ms} ms, 32 shards, {}s window",
        window.as_secs()
    );
    println!("| grants | script calls/s measured | one call per grant per ttl/3 | ratio |");
    println!("| ---: | ---: | ---: | ---: |");
    for &grants in sizes {
        let measured = measure(&endpoint, &redis.url(), grants, ttl_ms, window).await;
        let naive = grants as f64 * 3.0 / (ttl_ms as f64 / 1000.0);
        println!(
            "| {grants} | {measured:.1} | {naive:.0} | {:.4} |",
            measured / naive
        );
    }
}
