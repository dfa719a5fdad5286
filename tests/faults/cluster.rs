//! tumbler on a Redis Cluster of three masters: the lock semantics, fair
//! queues with wake-ups between two servers (the subscription lives on one
//! node, PUBLISH reaches every node), and the shard-walking RPCs (List,
//! Reap, Metrics, Clear) over shards that live on different nodes; no lock
//! key is left behind on any node; and a slot moved to another node
//! (MIGRATE, half-way and after) while its locks are held.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::topology::{TestCluster, start_cluster};
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, ExtendStatus, ReleaseStatus};
use tonic::transport::Channel;

/// Lock keys and indexes of `namespace` on every node (not the per-shard
/// fencing counters and per-minute metrics, which expire on their own).
fn lock_keys_left(cluster: &TestCluster, namespace: &str) -> Vec<String> {
    cluster
        .scan_each(&format!("tumbler:{{{namespace}:*"))
        .into_iter()
        .flatten()
        .filter(|k| !k.ends_with(":fence") && !k.contains(":m:"))
        .collect()
}

fn in_ns(namespace: &str, name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: namespace.into(),
        ..acquire(name, holder)
    }
}

async fn status(
    client: &mut LockServiceClient<Channel>,
    req: proto::AcquireRequest,
) -> AcquireStatus {
    client.acquire(req).await.unwrap().into_inner().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_a_cluster_keep_their_semantics_and_leave_no_keys() {
    let server = TestServer::new().cluster().start().await;
    let cluster = server.cluster();
    let mut client = server.client().await;

    // Acquire, busy, extend, inspect, release.
    let first = client
        .acquire(acquire("report", "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.status(), AcquireStatus::Acquired);
    let token = first.grant.unwrap().fencing_token;
    assert_eq!(
        status(&mut client, acquire("report", "h1")).await,
        AcquireStatus::AlreadyHeld
    );
    assert_eq!(
        status(&mut client, acquire("report", "h2")).await,
        AcquireStatus::NotAcquired
    );
    let extended = client
        .extend(proto::ExtendRequest {
            name: "report".into(),
            holder: "h1".into(),
            ttl_ms: Some(60_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), ExtendStatus::Extended);
    let seen = client
        .inspect(inspect("report"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen.holders.len(), 1);
    assert_eq!(seen.holders[0].grant.as_ref().unwrap().holder, "h1");
    assert_eq!(
        client
            .release(release("report", "h1"))
            .await
            .unwrap()
            .into_inner()
            .status(),
        ReleaseStatus::Released
    );

    // Fencing tokens rise across release and the keys' deletion.
    let mut last = token;
    for i in 0..5 {
        let holder = format!("t{i}");
        let reply = client
            .acquire(acquire("report", &holder))
            .await
            .unwrap()
            .into_inner();
        let next = reply.grant.unwrap().fencing_token;
        assert!(next > last, "token {next} after {last}");
        last = next;
        client.release(release("report", &holder)).await.unwrap();
    }

    // A semaphore of 3: three slots, the fourth is refused.
    let mut slots = BTreeSet::new();
    for holder in ["s1", "s2", "s3"] {
        let reply = client
            .acquire(proto::AcquireRequest {
                limit: Some(3),
                ..acquire("pool", holder)
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        slots.insert(reply.grant.unwrap().slot);
    }
    assert_eq!(slots, BTreeSet::from([1, 2, 3]));
    assert_eq!(
        status(
            &mut client,
            proto::AcquireRequest {
                limit: Some(3),
                ..acquire("pool", "s4")
            }
        )
        .await,
        AcquireStatus::NotAcquired
    );
    for holder in ["s1", "s2", "s3"] {
        client.release(release("pool", holder)).await.unwrap();
    }

    assert_eq!(lock_keys_left(cluster, "default"), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_one_server_are_woken_by_releases_on_another_in_fifo_order() {
    let cluster = start_cluster();
    // The second server's first seed is dead: it connects (and subscribes)
    // through the next one.
    let dead = tumbler::dev::free_port().unwrap();
    let url_b = cluster.url().replace(
        "redis+cluster://",
        &format!("redis+cluster://127.0.0.1:{dead},"),
    );
    let a = TestServer::new().redis(&cluster.url()).start().await;
    let b = TestServer::new().redis(&url_b).start().await;
    let mut on_a = a.client().await;
    let on_b = b.client().await;

    assert_eq!(
        status(&mut on_a, acquire("turn", "holder")).await,
        AcquireStatus::Acquired
    );
    // Three waiters on server B, queued in a known order. Their queue TTL
    // is long, so the refresher (every queue_ttl/3) cannot stand in for a
    // lost wake-up within their wait: only pub/sub can hand the lock over.
    let mut waiting = Vec::new();
    for (i, holder) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let mut client = on_b.clone();
        let request = proto::AcquireRequest {
            wait_ms: 15_000,
            queue_ttl_ms: Some(60_000),
            ..acquire("turn", holder)
        };
        waiting.push(tokio::spawn(async move {
            client.acquire(request).await.map(|r| r.into_inner())
        }));
        until_waiters(&mut on_a, "turn", i as u32 + 1).await;
    }
    // Release on A; each grant goes to the next waiter on B, in order.
    let mut previous = "holder".to_owned();
    for (handle, holder) in waiting.into_iter().zip(["w1", "w2", "w3"]) {
        assert_eq!(
            on_a.release(release("turn", &previous))
                .await
                .unwrap()
                .into_inner()
                .status(),
            ReleaseStatus::Released
        );
        let reply = handle.await.unwrap().unwrap();
        assert_eq!(reply.status(), AcquireStatus::Acquired, "{holder}");
        assert_eq!(reply.grant.unwrap().holder, holder);
        previous = holder.to_owned();
    }
    on_a.release(release("turn", &previous)).await.unwrap();
    assert_eq!(lock_keys_left(&cluster, "default"), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reap_metrics_and_clear_walk_shards_on_every_node() {
    let server = TestServer::new().cluster().start().await;
    let cluster = server.cluster();
    let mut client = server.client().await;
    let ns = "spread";
    let names: BTreeSet<String> = (0..60).map(|i| format!("job-{i:02}")).collect();
    for name in &names {
        assert_eq!(
            status(&mut client, in_ns(ns, name, "h")).await,
            AcquireStatus::Acquired
        );
    }
    // Short leases that pass, for the reaper to find.
    for i in 0..5 {
        let reply = client
            .acquire(proto::AcquireRequest {
                ttl_ms: Some(50),
                ..in_ns(ns, &format!("brief-{i}"), "h")
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), AcquireStatus::Acquired);
    }
    // The namespace's shards really live on several nodes.
    let per_node: Vec<usize> = cluster
        .scan_each(&format!("tumbler:{{{ns}:*}}:l:*"))
        .iter()
        .map(Vec::len)
        .collect();
    assert!(
        per_node.iter().filter(|n| **n > 0).count() >= 2,
        "locks on one node only: {per_node:?}"
    );

    // List: every lock exactly once, page by page, across all shards.
    let mut listed = Vec::new();
    let request = proto::ListRequest {
        namespace: ns.into(),
        prefix: "job-".into(),
        page_size: 7,
        ..Default::default()
    };
    for page in list_pages(&mut client, request).await {
        listed.extend(page.locks.into_iter().map(|l| l.name));
    }
    assert_eq!(listed.len(), names.len(), "each lock once");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), names);

    // Metrics: summed over every shard, so over every node.
    let metrics = client
        .metrics(proto::MetricsRequest {
            namespace: ns.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(metrics.overall.unwrap().acquired, 65);

    // Reap: the passed leases, wherever their shard lives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reaped = client
        .reap(proto::ReapRequest {
            namespace: ns.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reaped.expired_holders, 5);

    // Clear: every lock, and nothing left on any node.
    let cleared = client
        .clear(proto::ClearRequest {
            namespace: ns.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.locks_cleared, 60);
    assert_eq!(cleared.grants_released, 60);
    assert_eq!(lock_keys_left(cluster, ns), Vec::<String>::new());
}

#[tokio::test]
async fn bad_cluster_urls_stop_the_server_with_a_clear_error() {
    for (url, says) in [
        ("redis+cluster://", "empty host"),
        ("redis+cluster://127.0.0.1", "missing port"),
        ("redis+cluster://127.0.0.1:7001/3", "no path"),
        ("redis+sentinel://127.0.0.1:26379", "must name the master"),
    ] {
        let err = tumbler::config::ServerConfig::new(url.into(), &service_args()).unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("--redis-url") && message.contains(says),
            "{url}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cluster_node_is_unavailable_never_a_grant() {
    let mut cluster = start_cluster();
    let server = TestServer::new().redis(&cluster.url()).start().await;
    let client = server.client().await;
    cluster.nodes[0].kill();
    server
        .wait_for_health(tonic_health::pb::health_check_response::ServingStatus::NotServing)
        .await;
    // Locks whose shard lived on the lost node answer UNAVAILABLE; the
    // others may still be granted. Nothing else, and never a false grant.
    let attempts = (0..24).map(|i| {
        let mut client = client.clone();
        async move { client.acquire(acquire(&format!("lost-{i}"), "h")).await }
    });
    let mut unavailable = 0;
    for outcome in futures::future::join_all(attempts).await {
        match outcome {
            Ok(reply) => assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                unavailable += 1;
            }
        }
    }
    assert!(unavailable > 0, "no lock lived on the lost node");
}

/// Moves `keys` of `slot` from `from` to `to` with MIGRATE, as
/// `redis-cli --cluster reshard` does key by key.
fn migrate_keys(cluster: &TestCluster, from: usize, to: usize, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    let mut migrate = redis::cmd("MIGRATE");
    migrate
        .arg("127.0.0.1")
        .arg(cluster.nodes[to].port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(keys);
    let _: () = cluster.nodes[from].query(&migrate);
}

/// The node that owns `key` (the others redirect with MOVED).
fn owner_of(cluster: &TestCluster, key: &str) -> usize {
    let exists = redis::cmd("EXISTS").arg(key).clone();
    (cluster.nodes.iter())
        .position(|node| node.try_query::<i64>(&exists).is_ok())
        .expect("some node owns the key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_keep_holders_and_rising_tokens_while_their_slot_moves_to_another_node() {
    let server = TestServer::new().cluster().start().await;
    let cluster = server.cluster();
    let mut client = server.client().await;
    let layout = tumbler_engine::keys::Layout::new("tumbler", 32);

    // Two locks of one shard, so of one slot: `moving` and a neighbour.
    let shard = layout.shard_of("default", "moving");
    let neighbour = (0..)
        .map(|i| format!("neighbour-{i}"))
        .find(|name| layout.shard_of("default", name) == shard)
        .unwrap();
    let first = client
        .acquire(acquire("moving", "h1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.status(), AcquireStatus::Acquired);
    let first_token = first.grant.unwrap().fencing_token;
    assert_eq!(
        status(&mut client, acquire(&neighbour, "n1")).await,
        AcquireStatus::Acquired
    );

    let moving_keys = layout.lock_keys("default", "moving");
    let from = owner_of(cluster, &moving_keys.lock);
    let to = (from + 1) % cluster.nodes.len();
    let slot: i64 =
        cluster.nodes[from].query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(&moving_keys.lock));
    let id =
        |node: usize| -> String { cluster.nodes[node].query(redis::cmd("CLUSTER").arg("MYID")) };
    let (from_id, to_id) = (id(from), id(to));
    let _: () = cluster.nodes[to].query(
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id),
    );
    let _: () = cluster.nodes[from].query(
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id),
    );
    let in_slot: Vec<String> = cluster.nodes[from].query(
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1000),
    );
    assert!(in_slot.contains(&moving_keys.lock), "{in_slot:?}");

    // Half-way: the keys of `moving` itself are on the new node, the
    // shard's indexes and counter still on the old one. A release sent now
    // spans both; it must not be answered wrongly.
    let (moved, staying): (Vec<String>, Vec<String>) = in_slot
        .iter()
        .cloned()
        .partition(|key| key.ends_with(":moving"));
    migrate_keys(cluster, from, to, &moved);
    let mut releasing_client = client.clone();
    let releasing = tokio::spawn(async move {
        releasing_client
            .release(proto::ReleaseRequest {
                fencing_token: Some(first_token),
                ..release("moving", "h1")
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    migrate_keys(cluster, from, to, &staying);
    for node in &cluster.nodes {
        let _: () = node.query(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&to_id),
        );
    }
    let released = releasing.await.unwrap();
    println!("release during the migration: {released:?}");
    // Either it waited out the split and released, or it said UNAVAILABLE
    // and the lock is still h1's: never anything in between.
    let released_now = match released {
        Ok(reply) => {
            assert_eq!(reply.into_inner().status(), ReleaseStatus::Released);
            true
        }
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            false
        }
    };

    // After the move: every key of the slot lives on the new node, the
    // server follows (MOVED), holders and tokens carried over.
    assert_eq!(owner_of(cluster, &moving_keys.lock), to);
    let left: Vec<String> = cluster.nodes[from].query(
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1000),
    );
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        status(&mut client, acquire(&neighbour, "n2")).await,
        AcquireStatus::NotAcquired,
        "the neighbour's holder was forgotten in the move"
    );
    if !released_now {
        let reply = client.release(release("moving", "h1")).await.unwrap();
        assert_eq!(reply.into_inner().status(), ReleaseStatus::Released);
    }
    let second = client
        .acquire(acquire("moving", "h2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.status(), AcquireStatus::Acquired);
    assert!(second.grant.unwrap().fencing_token > first_token);
    client.release(release("moving", "h2")).await.unwrap();
    client.release(release(&neighbour, "n1")).await.unwrap();
    assert_eq!(lock_keys_left(cluster, "default"), Vec::<String>::new());
}
