//! Old function libraries are deleted: a tumbler library that no running
//! replica has named for the grace period goes from every primary, while
//! the server's own, one another replica still names, and libraries that
//! are not tumbler's stay. On one Redis and on a Redis Cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic::transport::Channel;
use tumbler::config::ServiceArgs;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{AcquireStatus, ReleaseStatus};

use crate::common::topology::{RedisNode, start_cluster};
use crate::common::wait::wait_for;
use crate::common::{TestServer, acquire, release, service_args};

/// A library of an older build, recorded long ago.
const OLD: &str = "tumbler_00000000000000a1";
/// A library another running replica still names.
const NAMED: &str = "tumbler_00000000000000a2";
/// A library nobody ever recorded (a build from before the records).
const UNRECORDED: &str = "tumbler_00000000000000a3";
/// Not tumbler's.
const FOREIGN: &str = "someone_elses";
const RECORD: &str = "tumbler:libraries";
const GRACE_MS: u64 = 2000;

fn load(node: &RedisNode, library: &str) {
    let code = format!(
        "#!lua name={library}\nredis.register_function('{library}_noop', function() return 1 end)"
    );
    let _: String = node.query(redis::cmd("FUNCTION").arg("LOAD").arg(code));
}

fn libraries(node: &RedisNode) -> Vec<String> {
    let listed: Vec<redis::Value> = node.query(redis::cmd("FUNCTION").arg("LIST"));
    listed
        .iter()
        .filter_map(|library| {
            let redis::Value::Array(fields) = library else {
                return None;
            };
            let at = fields.iter().position(|f| {
                redis::from_redis_value::<String>(f.clone()).is_ok_and(|f| f == "library_name")
            })?;
            redis::from_redis_value(fields.get(at + 1)?.clone()).ok()
        })
        .collect()
}

/// Runs a command about `RECORD` on the node that owns its slot (the
/// others answer MOVED).
fn on_record_node<T: redis::FromRedisValue>(nodes: &[RedisNode], cmd: &redis::Cmd) -> T {
    let mut last = None;
    for node in nodes {
        match node.try_query(cmd) {
            Ok(value) => return value,
            Err(err) => last = Some(err),
        }
    }
    panic!("no node took the command: {last:?}")
}

fn redis_now_ms(node: &RedisNode) -> u64 {
    let (secs, micros): (u64, u64) = node.query(&redis::cmd("TIME"));
    secs * 1000 + micros / 1000
}

/// Whether every node has (or no node has) `library`.
fn everywhere(nodes: &[RedisNode], library: &str) -> bool {
    nodes
        .iter()
        .all(|n| libraries(n).iter().any(|l| l == library))
}

/// Waits until no node has `library`.
async fn until_gone(nodes: &Arc<Vec<RedisNode>>, library: &'static str, what: &str) {
    wait_for(what, Duration::from_secs(15), || {
        let nodes = nodes.clone();
        async move {
            let gone = nodes
                .iter()
                .all(|n| !libraries(n).iter().any(|l| l == library));
            gone.then_some(())
        }
    })
    .await
}

/// Acquires `kept` as `h`: the server's functions answer.
async fn acquired(client: &mut LockServiceClient<Channel>) {
    let granted = client
        .acquire(acquire("kept", "h"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.status(), AcquireStatus::Acquired);
}

async fn old_libraries_go_and_used_ones_stay(nodes: Vec<RedisNode>, url: String) {
    let nodes = Arc::new(nodes);
    for node in nodes.iter() {
        for library in [OLD, NAMED, UNRECORDED, FOREIGN] {
            load(node, library);
        }
    }
    let _: () = on_record_node(&nodes, redis::cmd("HSET").arg(RECORD).arg(OLD).arg(1));
    // Another replica, of the build whose library is NAMED, keeps naming it.
    let running = Arc::new(AtomicBool::new(true));
    let heartbeat = {
        let (nodes, running) = (nodes.clone(), running.clone());
        tokio::task::spawn_blocking(move || {
            while running.load(Ordering::Relaxed) {
                let now = redis_now_ms(&nodes[0]);
                let _: () =
                    on_record_node(&nodes, redis::cmd("HSET").arg(RECORD).arg(NAMED).arg(now));
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    let args = ServiceArgs {
        library_grace_ms: GRACE_MS,
        ..service_args()
    };
    let server = TestServer::new().redis(&url).args(args).start().await;
    let mut client = server.client().await;
    acquired(&mut client).await;
    let own: Vec<String> = nodes
        .iter()
        .flat_map(libraries)
        .filter(|l| l.starts_with("tumbler_") && ![OLD, NAMED, UNRECORDED].contains(&l.as_str()))
        .collect();
    assert!(!own.is_empty(), "the server's own library is loaded");
    let own = own[0].clone();

    until_gone(&nodes, OLD, "the old library deleted on every node").await;
    let recorded: Vec<String> = on_record_node(&nodes, redis::cmd("HKEYS").arg(RECORD));
    assert!(
        !recorded.contains(&OLD.to_owned()),
        "its record went too: {recorded:?}"
    );
    assert!(recorded.contains(&UNRECORDED.to_owned()), "{recorded:?}");
    assert!(
        recorded.contains(&own),
        "the server names its own: {recorded:?}"
    );

    until_gone(
        &nodes,
        UNRECORDED,
        "the unrecorded library deleted a grace period later",
    )
    .await;
    assert!(everywhere(&nodes, NAMED), "a library still named stays");
    assert!(everywhere(&nodes, FOREIGN), "a library not tumbler's stays");
    assert!(
        nodes.iter().any(|n| libraries(n).contains(&own)),
        "the server's own library stays"
    );
    let released = client
        .release(release("kept", "h"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), ReleaseStatus::Released);

    // The other replica stops: its library goes one grace period later.
    running.store(false, Ordering::Relaxed);
    heartbeat.await.unwrap();
    until_gone(&nodes, NAMED, "a library no longer named deleted").await;
    assert!(everywhere(&nodes, FOREIGN));
    acquired(&mut client).await;
}

#[tokio::test]
async fn a_library_no_replica_names_for_the_grace_period_is_deleted() {
    let node = RedisNode::start(&[]);
    let url = node.url();
    old_libraries_go_and_used_ones_stay(vec![node], url).await;
}

#[tokio::test]
async fn old_libraries_are_deleted_from_every_cluster_primary() {
    let cluster = start_cluster();
    let url = cluster.url();
    old_libraries_go_and_used_ones_stay(cluster.nodes, url).await;
}
