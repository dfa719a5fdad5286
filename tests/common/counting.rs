//! Counting Redis' work: a server whose background calls stay out of the
//! count, and Redis' own calls per command.

use tonic::transport::Channel;
use tumbler::config::ServiceArgs;
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;

use super::{TestServer, redis_conn, service_args, start_redis};

/// [`service_args`] with health ticks a minute apart: each tick calls
/// functions, which a test counting Redis' work must not count.
pub fn counting_args() -> ServiceArgs {
    ServiceArgs {
        health_interval_ms: 60_000,
        ..service_args()
    }
}

/// A server with [`counting_args`] on a Redis of the test's own, for
/// counting Redis' work (`command_calls`): the Redis, the server, a client
/// and a connection to that Redis.
pub async fn counting_server() -> (
    RedisServer,
    TestServer,
    LockServiceClient<Channel>,
    redis::aio::MultiplexedConnection,
) {
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .args(counting_args())
        .start()
        .await;
    let client = server.client().await;
    let conn = redis_conn(&redis.url()).await;
    (redis, server, client, conn)
}

/// Redis' calls per command (`INFO commandstats`) since it started or
/// since the last `CONFIG RESETSTAT`.
pub async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}
