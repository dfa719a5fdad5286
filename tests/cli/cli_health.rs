//! `tumbler health`: the gRPC health check as a command, for `helm test`
//! and scripts: exit 0 while the server is SERVING, 69 when it is not
//! (Redis unreachable) or when nothing answers.

use crate::common;

use common::*;
use tonic_health::pb::health_check_response::ServingStatus;

/// Runs `tumbler health` with `args` and returns (exit code, stdout).
async fn health(args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
        .arg("health")
        .args(args)
        .env_remove("TUMBLER_ADDR")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_exits_0_while_serving_and_69_when_redis_or_the_server_is_gone() {
    let mut redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let addr = server.endpoint();

    let (code, out) = health(&["--addr", &addr]).await;
    assert_eq!((code, out.trim()), (0, "SERVING"));
    let (code, out) = health(&["--addr", &addr, "-o", "json"]).await;
    assert_eq!(code, 0);
    let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reply["status"], "SERVING");

    // Redis gone: the server answers, NOT_SERVING.
    redis.kill();
    server.wait_for_health(ServingStatus::NotServing).await;
    let (code, out) = health(&["--addr", &addr]).await;
    assert_eq!(code, 69, "{out}");
    // It says why (the connection broke, or Redis refused a new one).
    assert!(out.starts_with("NOT_SERVING: redis unavailable"), "{out}");
    // The liveness service does not depend on Redis.
    let (code, _) = health(&["--addr", &addr, "--service", "liveness"]).await;
    assert_eq!(code, 0);

    // Nothing listening at all.
    server.shutdown().await.unwrap();
    let (code, _) = health(&["--addr", &addr]).await;
    assert_eq!(code, 69);
}
