//! Group commit: operations of one shard that are ready together go to
//! Redis as one call (`lua/batch.lua`, `crates/tumbler-engine/src/group.rs`),
//! each with its own result; with `--no-group-commit` every operation is
//! its own call. The batch function is also called directly here, so that
//! what shares one batch is certain.

use std::collections::HashSet;

use redis::Value;
use tumbler_engine::keys::Layout;
use tumbler_engine::scripts::Scripts;

use crate::common::proto::AcquireStatus;
use crate::common::{TestServer, acquire, command_calls, redis_conn, release, service_args};
use crate::model_replay::redis_with_functions;

/// A server on its own Redis with one shard (every lock shares a slot),
/// no background calls of its own during the test (health every minute,
/// no reaper), group commit on or off.
async fn one_shard_server(group_commit: bool) -> TestServer {
    one_shard_server_in_flight(group_commit, 1).await
}

/// A connection to the server's Redis and a client, once the namespace's
/// first call (its registry entry) is made and Redis' command counts are
/// reset: what follows counts only the test's own calls.
async fn counted_from_here(
    server: &TestServer,
) -> (
    redis::aio::MultiplexedConnection,
    tumbler::proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
) {
    let mut conn = redis_conn(server.redis_url()).await;
    let mut client = server.client().await;
    client.acquire(acquire("warm-up", "h")).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    (conn, client)
}

/// [`one_shard_server`] with `in_flight` calls allowed per slot.
async fn one_shard_server_in_flight(group_commit: bool, in_flight: u32) -> TestServer {
    TestServer::new()
        .args(tumbler::config::ServiceArgs {
            shards: 1,
            health_interval_ms: 60_000,
            no_group_commit: !group_commit,
            group_commit_in_flight: in_flight,
            ..service_args()
        })
        .start()
        .await
}

/// 64 acquires sent at once on distinct names; returns their tokens.
async fn acquire_all_at_once(server: &TestServer, prefix: &str) -> Vec<u64> {
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await);
    }
    let calls = (0..64).map(|i| {
        let mut client = clients[i % 8].clone();
        async move {
            let reply = client
                .acquire(acquire(&format!("{prefix}-{i}"), &format!("h{i}")))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired, "{prefix}-{i}");
            reply.grant.unwrap().fencing_token
        }
    });
    futures::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_on_one_shard_share_calls_and_each_keeps_its_grant() {
    let server = one_shard_server(true).await;
    let (mut conn, mut client) = counted_from_here(&server).await;

    let tokens = acquire_all_at_once(&server, "grouped").await;

    let calls = command_calls(&mut conn).await;
    let fcalls = calls.get("fcall").copied().unwrap_or(0);
    assert!(
        (1..64).contains(&fcalls),
        "64 acquires went out as {fcalls} calls: {calls:?}"
    );
    // One TIME per call, not per operation.
    assert_eq!(calls.get("time").copied(), Some(fcalls), "{calls:?}");
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), 64, "tokens repeat: {tokens:?}");
    // The shard's counter holds the highest: the next grant goes above all.
    let next = client
        .acquire(acquire("after", "h"))
        .await
        .unwrap()
        .into_inner();
    let next = next.grant.unwrap().fencing_token;
    assert!(
        tokens.iter().all(|&t| t < next),
        "{next} not above {tokens:?}"
    );
    // And each release finds its own grant.
    for i in 0..64 {
        let reply = client
            .release(release(&format!("grouped-{i}"), &format!("h{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status(),
            tumbler::proto::ReleaseStatus::Released,
            "grouped-{i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_calls_in_flight_operations_still_share_calls() {
    let server = one_shard_server_in_flight(true, 2).await;
    let (mut conn, mut client) = counted_from_here(&server).await;
    let tokens = acquire_all_at_once(&server, "two").await;
    let calls = command_calls(&mut conn).await;
    let fcalls = calls.get("fcall").copied().unwrap_or(0);
    assert!((2..64).contains(&fcalls), "{calls:?}");
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), 64);
    // Nothing is left queued or in flight: the next call goes alone.
    let reply = client
        .acquire(acquire("after", "h"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_group_commit_off_every_operation_is_its_own_call() {
    let server = one_shard_server(false).await;
    let (mut conn, _) = counted_from_here(&server).await;

    let tokens = acquire_all_at_once(&server, "alone").await;

    let calls = command_calls(&mut conn).await;
    // 64 acquires; the replica's counter flusher may add a call a second.
    let fcalls = calls.get("fcall").copied().unwrap_or(0);
    assert!((64..=66).contains(&fcalls), "{calls:?}");
    assert!(calls.get("time").copied().unwrap_or(0) >= 64, "{calls:?}");
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), 64);
}

/// One acquire in a batch: (name, key count, argument count, arguments).
fn acquire_op(layout: &Layout, name: &str, holder: &str, ttl: &str) -> (Vec<String>, Vec<String>) {
    let keys = layout.lock_keys("default", name);
    let keys: Vec<String> = keys
        .declared(false)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut args = vec!["acquire".to_owned(), keys.len().to_string(), "3".to_owned()];
    args.extend([holder.to_owned(), ttl.to_owned(), "0".to_owned()]);
    (keys, args)
}

async fn batch(
    conn: &mut redis::aio::MultiplexedConnection,
    scripts: &Scripts,
    ops: &[(Vec<String>, Vec<String>)],
) -> Vec<Value> {
    let keys: Vec<&String> = ops.iter().flat_map(|(k, _)| k).collect();
    let args: Vec<&String> = ops.iter().flat_map(|(_, a)| a).collect();
    let reply: Value = redis::cmd("FCALL")
        .arg(&scripts.batch.function)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query_async(conn)
        .await
        .unwrap();
    match reply {
        Value::Array(replies) => replies,
        other => panic!("batch answered {other:?}"),
    }
}

fn status(reply: &Value) -> i64 {
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(status)) => *status,
            other => panic!("no status: {other:?}"),
        },
        other => panic!("not a reply: {other:?}"),
    }
}

fn token(reply: &Value) -> u64 {
    let Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    let record: String = redis::from_redis_value(items[6].clone()).unwrap();
    record.split('|').nth(2).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_batch_runs_its_operations_in_order_each_with_its_own_reply() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    let layout = Layout::new("tumbler", 1);
    // Two acquires of one lock in one batch: exactly one is granted.
    let replies = batch(
        &mut conn,
        &scripts,
        &[
            acquire_op(&layout, "same", "a", "30000"),
            acquire_op(&layout, "same", "b", "30000"),
            acquire_op(&layout, "other", "c", "30000"),
        ],
    )
    .await;
    let statuses: Vec<i64> = replies.iter().map(status).collect();
    assert_eq!(statuses, vec![1, 0, 1], "{replies:?}"); // OK, BUSY, OK
    // Tokens rise in the batch's order, and the shard's counter holds the
    // highest (one write per batch).
    let (first, third) = (token(&replies[0]), token(&replies[2]));
    assert!(first < third, "{first} {third}");
    let fence: String = redis::cmd("GET")
        .arg(layout.lock_keys("default", "same").fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fence, third.to_string());
}

#[tokio::test]
async fn an_operation_that_fails_in_a_batch_fails_alone() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    let layout = Layout::new("tumbler", 1);
    let mut unknown = acquire_op(&layout, "x", "h", "30000");
    unknown.1[0] = "no_such_operation".into();
    let replies = batch(
        &mut conn,
        &scripts,
        &[
            acquire_op(&layout, "first", "a", "30000"),
            // A lease that is not a number fails inside acquire.
            acquire_op(&layout, "broken", "b", "not-a-number"),
            unknown,
            acquire_op(&layout, "last", "c", "30000"),
        ],
    )
    .await;
    assert_eq!(replies.len(), 4, "{replies:?}");
    assert_eq!(status(&replies[0]), 1, "{replies:?}");
    // A failed operation's reply is its error, as text.
    assert!(matches!(replies[1], Value::BulkString(_)), "{replies:?}");
    assert!(matches!(replies[2], Value::BulkString(_)), "{replies:?}");
    assert_eq!(status(&replies[3]), 1, "{replies:?}");
    // The failed acquire holds nothing.
    let held: bool = redis::cmd("EXISTS")
        .arg(layout.lock_keys("default", "broken").lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!held);
    // A function called on its own after the batch reads its own TIME
    // (nothing of the batch's state is left behind): its grant is
    // stamped later.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let (keys, args) = acquire_op(&layout, "later", "d", "30000");
    let after: Value = redis::cmd("FCALL")
        .arg(&scripts.acquire.function)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args[3..])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(token(&after) > token(&replies[3]) + 1_000, "{after:?}");
}

#[tokio::test]
async fn a_malformed_batch_leaves_nothing_behind_for_later_calls() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    let layout = Layout::new("tumbler", 1);
    let (keys, mut args) = acquire_op(&layout, "first", "a", "30000");
    // One operation granted, then arguments that say nothing sensible.
    args.extend(["acquire".to_owned(), "many".to_owned()]);
    let failed: redis::RedisResult<Value> = redis::cmd("FCALL")
        .arg(&scripts.batch.function)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query_async(&mut conn)
        .await;
    assert!(failed.is_err(), "{failed:?}");
    // The batch's clock is gone: a later call stamps its grant later.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let first: String = redis::cmd("HGET")
        .arg(layout.lock_keys("default", "first").lock)
        .arg("h:a")
        .query_async(&mut conn)
        .await
        .unwrap();
    let first: u64 = first.split('|').nth(2).unwrap().parse().unwrap();
    let (keys, args) = acquire_op(&layout, "later", "b", "30000");
    let after: Value = redis::cmd("FCALL")
        .arg(&scripts.acquire.function)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args[3..])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(token(&after) > first + 1_000, "{after:?}");
}
