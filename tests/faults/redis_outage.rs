//! Redis killed under a running server: RPCs answer UNAVAILABLE (never a
//! grant), health goes NOT_SERVING; Redis back: the same server recovers
//! by itself.

use crate::common;

use std::time::Duration;

use common::wait::wait_until_async;
use common::*;
use proto::AcquireStatus;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_while_redis_is_down_and_recovers_after() {
    let mut redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    let before = client
        .acquire(acquire("survivor", "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.status(), AcquireStatus::Acquired);

    redis.kill();

    for attempt in 0..3 {
        let err = client
            .acquire(acquire("outage", &format!("h{attempt}")))
            .await
            .expect_err("no grant while redis is down");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    }
    let err = client.release(release("survivor", "h1")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let err = client.inspect(inspect("survivor")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    server.wait_for_health(ServingStatus::NotServing).await;
    assert_eq!(
        server.health("tumbler.v1.LockService").await.unwrap(),
        ServingStatus::NotServing
    );
    // Liveness does not follow Redis: an outage must not restart replicas.
    assert_eq!(
        server.health("liveness").await.unwrap(),
        ServingStatus::Serving
    );

    redis.restart().unwrap();
    server.wait_for_health(ServingStatus::Serving).await;
    // The restarted Redis kept nothing; the server serves without a restart
    // of its own, on connections it made anew.
    let mut granted = false;
    for _ in 0..50 {
        match client.acquire(acquire("outage", "h-after")).await {
            Ok(reply) => {
                assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
                granted = true;
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(granted, "the server did not recover");
    let after = client
        .acquire(acquire("survivor", "h2"))
        .await
        .unwrap()
        .into_inner();
    // Redis lost the old grant; its new tokens still rise above it.
    assert_eq!(after.status(), AcquireStatus::Acquired);
    assert!(
        after.grant.unwrap().fencing_token > before.grant.unwrap().fencing_token,
        "fencing tokens went backwards after data loss"
    );
}

#[tokio::test]
async fn a_server_started_while_redis_is_down_serves_once_it_is_up() {
    let mut redis = start_redis();
    redis.kill();
    let server = TestServer::new()
        .redis(&redis.url())
        .args(service_args())
        .spawn()
        .await;
    server.wait_for_health(ServingStatus::NotServing).await;
    let mut client = server.client().await;
    let err = client.acquire(acquire("early", "h")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);

    redis.restart().unwrap();
    server.wait_for_health(ServingStatus::Serving).await;
    let reply = client
        .acquire(acquire("early", "h"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

/// A Redis that takes connections and never answers (a hung process, a
/// proxy that black-holes): every call is UNAVAILABLE within a bound set
/// by the command timeout, never a hang and never a grant, and health
/// stays NOT_SERVING; the server still shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_is_unavailable_within_the_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    // Keeps every connection open without reading or writing a byte.
    let accepting = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let server = TestServer::new().redis(&url).spawn().await;
    let mut client = server.client().await;
    for attempt in 0..3 {
        let started = std::time::Instant::now();
        let err = client
            .acquire(acquire("silent", &format!("h{attempt}")))
            .await
            .expect_err("no grant from a Redis that never answers");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        // The command timeout is 1 s (common::service_args).
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "answered after {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        server.health("tumbler.v1.LockService").await.unwrap(),
        ServingStatus::NotServing
    );
    tokio::time::timeout(Duration::from_secs(10), server.shutdown())
        .await
        .expect("shuts down while Redis stays silent")
        .unwrap();
    accepting.abort();
}

/// Until a server has connected, its RPCs answer UNAVAILABLE with the
/// reason the connection failed (as its log and `tumbler health` say it),
/// not a generic "not ready": here a port nothing listens on, and a host
/// name that does not resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_connecting_rpcs_answer_with_the_connection_error() {
    let closed = format!("redis://127.0.0.1:{}", tumbler::dev::free_port().unwrap());
    for (url, says) in [
        (closed.as_str(), "refused the connection"),
        (
            "redis://nonexistent.invalid:6380",
            "cannot resolve the host",
        ),
    ] {
        let server = TestServer::new()
            .redis(url)
            .args(service_args())
            .spawn()
            .await;
        let client = server.client().await;
        wait_until_async(
            "an RPC names the connection error",
            Duration::from_secs(10),
            || {
                let mut client = client.clone();
                async move {
                    let err = client.acquire(acquire("early", "h")).await.unwrap_err();
                    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
                    assert!(!err.message().contains("not verified"), "{err:?}");
                    err.message().contains(says)
                }
            },
        )
        .await;
        // `tumbler health` says the same.
        let endpoint = server.endpoint();
        wait_until_async("tumbler health names it", Duration::from_secs(10), || {
            let endpoint = endpoint.clone();
            async move {
                let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
                    .args(["health", "--addr", &endpoint])
                    .env_remove("TUMBLER_ADDR")
                    .output()
                    .await
                    .unwrap();
                let out = String::from_utf8_lossy(&out.stdout).into_owned();
                out.starts_with("NOT_SERVING: ") && out.contains(says)
            }
        })
        .await;
    }
}
