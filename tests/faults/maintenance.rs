//! List, Reap, Clear and the background reaper, against a real Redis.

use crate::common;

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use common::wait::{wait_for, wait_until_async};
use common::*;
use proto::AcquireStatus;
use proto::lock_service_client::LockServiceClient;
use tonic::Code;
use tonic::transport::Channel;

/// Every lock name a full listing returns, page by page.
async fn list_all(
    client: &mut LockServiceClient<Channel>,
    request: proto::ListRequest,
) -> (Vec<proto::LockSummary>, usize) {
    let pages = list_pages(client, request).await;
    let count = pages.len();
    (
        pages.into_iter().flat_map(|page| page.locks).collect(),
        count,
    )
}

/// Lock keys and indexes of `namespace` (not the per-shard fencing
/// counters and per-minute metrics, which expire on their own schedule).
async fn lock_keys_left(
    conn: &mut redis::aio::MultiplexedConnection,
    namespace: &str,
) -> Vec<String> {
    scan_keys(conn, &format!("tumbler:{{{namespace}:*"))
        .await
        .into_iter()
        .filter(|k| !k.ends_with(":fence") && !k.contains(":m:"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_return_every_lock_at_least_once_while_locks_change() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let stable: BTreeSet<String> = (0..250).map(|i| format!("job-{i:03}")).collect();
    for name in &stable {
        client.acquire(acquire(name, "h")).await.unwrap();
    }
    // Churn other locks while the listing runs.
    let mut churn_client = server.client().await;
    let churn = tokio::spawn(async move {
        for i in 0..400 {
            let name = format!("churn-{}", i % 37);
            churn_client.acquire(acquire(&name, "c")).await.unwrap();
            churn_client.release(release(&name, "c")).await.unwrap();
        }
    });
    let (listed, pages) = list_all(
        &mut client,
        proto::ListRequest {
            page_size: 7,
            ..Default::default()
        },
    )
    .await;
    churn.await.unwrap();

    // SCAN's promise: a lock that exists for the whole listing appears at
    // least once (a rehash while it runs may repeat a few), and a page
    // never holds more than its size.
    let names: Vec<String> = listed.iter().map(|l| l.name.clone()).collect();
    let unique: HashSet<&String> = names.iter().collect();
    assert!(
        names.len() - unique.len() <= 25,
        "{} repeats in {} locks listed",
        names.len() - unique.len(),
        names.len()
    );
    for name in &stable {
        assert!(unique.contains(name), "{name} missing from the listing");
    }
    assert!(pages > 250 / 7, "pages: {pages}");
    let job = listed.iter().find(|l| l.name == "job-007").unwrap();
    assert_eq!((job.holders, job.limit, job.waiters), (1, 1, 0));
    assert!(job.next_expiry_at_ms > 0);

    // The prefix filter.
    let (only_jobs_1, _) = list_all(
        &mut client,
        proto::ListRequest {
            prefix: "job-1".into(),
            ..Default::default()
        },
    )
    .await;
    let mut names: Vec<String> = only_jobs_1.into_iter().map(|l| l.name).collect();
    names.sort();
    let expected: Vec<String> = (100..200).map(|i| format!("job-{i:03}")).collect();
    assert_eq!(names, expected);
}

#[tokio::test]
async fn list_can_show_only_the_queues() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("quiet", "h")).await.unwrap();
    client.acquire(acquire("busy", "h")).await.unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                wait_ms: 30_000,
                ..acquire("busy", "w")
            })
            .await
    });
    let queues = wait_for(
        "a lock with waiters listed",
        Duration::from_secs(10),
        || {
            let mut client = client.clone();
            async move {
                let (queues, _) = list_all(
                    &mut client,
                    proto::ListRequest {
                        only_waiting: true,
                        ..Default::default()
                    },
                )
                .await;
                (!queues.is_empty()).then_some(queues)
            }
        },
    )
    .await;
    assert_eq!(queues.len(), 1);
    assert_eq!(queues[0].name, "busy");
    assert_eq!(queues[0].waiters, 1);
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reap_removes_what_crashed_and_leaves_the_living() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;

    // A lock whose key was lost (evicted, deleted by hand): with no index
    // (layout v3) nothing of it remains for the reaper to see.
    client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(200),
            ..acquire("lost", "gone")
        })
        .await
        .unwrap();
    let lost_keys = scan_keys(&mut conn, "tumbler:{default:*}:l:lost").await;
    assert_eq!(lost_keys.len(), 1);
    let _: i64 = redis::cmd("DEL")
        .arg(&lost_keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A lock whose only holder crashed: its keys outlive the lease by the
    // grace period, so the reaper sees and counts the expiry.
    client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(200),
            ..acquire("crashed", "gone")
        })
        .await
        .unwrap();
    // A semaphore with one crashed holder and one live one.
    for (holder, ttl) in [("gone", 200), ("alive", 60_000)] {
        client
            .acquire(proto::AcquireRequest {
                limit: Some(2),
                ttl_ms: Some(ttl),
                ..acquire("mixed", holder)
            })
            .await
            .unwrap();
    }
    // A live lock.
    client.acquire(acquire("healthy", "alive")).await.unwrap();
    // A waiting request whose replica died.
    let mut doomed = TumblerProcess::start(&redis.url(), &["--reap-interval-ms", "0"]).await;
    let mut remote = doomed.client().await;
    let orphan = tokio::spawn(async move {
        remote
            .acquire(proto::AcquireRequest {
                wait_ms: 60_000,
                queue_ttl_ms: Some(300),
                ..acquire("healthy", "orphan")
            })
            .await
    });
    until_waiters(&mut client, "healthy", 1).await;
    doomed.kill();
    let _ = orphan.await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let counts = client
        .reap(proto::ReapRequest::default())
        .await
        .unwrap()
        .into_inner();
    println!("{counts:?}");
    assert_eq!(
        counts.expired_holders, 2,
        "the crashed mutex and semaphore holders"
    );
    assert_eq!(counts.dead_waiters, 1, "the orphaned request");
    assert_eq!(counts.stale_index_entries, 0, "no index to go stale");
    assert_eq!(counts.locks_visited, 3, "crashed, mixed, healthy");
    assert_eq!((counts.old_grants, counts.old_waiters), (0, 0));

    // The living are untouched; what crashed left nothing behind.
    let (listed, _) = list_all(&mut client, proto::ListRequest::default()).await;
    let mut names: Vec<String> = listed.iter().map(|l| l.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["healthy", "mixed"]);
    let mixed = client.inspect(inspect("mixed")).await.unwrap().into_inner();
    assert_eq!(mixed.holders.len(), 1);
    assert_eq!(mixed.holders[0].grant.as_ref().unwrap().holder, "alive");
    // Only the living keep keys: one lock key each, no index anywhere.
    let mut lock_keys: Vec<String> = scan_keys(&mut conn, "tumbler:{default:*}:l:*")
        .await
        .iter()
        .filter_map(|key| key.split_once("}:l:").map(|(_, name)| name.to_owned()))
        .collect();
    lock_keys.sort();
    assert_eq!(lock_keys, ["healthy", "mixed"]);
    assert!(
        scan_keys(&mut conn, "tumbler:{default:*}:index")
            .await
            .is_empty()
    );
    let again = client
        .reap(proto::ReapRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            again.expired_holders,
            again.dead_waiters,
            again.stale_index_entries
        ),
        (0, 0, 0)
    );
}

#[tokio::test]
async fn reap_with_a_cutoff_drops_old_grants_and_requests() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    client.acquire(acquire("old", "early")).await.unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                wait_ms: 30_000,
                ..acquire("old", "early-waiter")
            })
            .await
    });
    until_waiters(&mut client, "old", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.acquire(acquire("new", "late")).await.unwrap();

    let counts = client
        .reap(proto::ReapRequest {
            older_than_ms: Some(200),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counts.old_grants, 1);
    assert_eq!(counts.old_waiters, 1);
    let new = client.inspect(inspect("new")).await.unwrap().into_inner();
    assert_eq!(new.holders.len(), 1, "younger grants stay");
    waiting.abort();
    let err = client
        .reap(proto::ReapRequest {
            older_than_ms: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_of_ten_thousand_locks_leaves_nothing_behind() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut conn = redis_conn(&redis.url()).await;
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            for i in (worker..10_000).step_by(16) {
                let name = format!("churn-{i}");
                let reply = client
                    .acquire(acquire(&name, "w"))
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(reply.status(), AcquireStatus::Acquired);
                client.release(release(&name, "w")).await.unwrap();
            }
        }));
    }
    // And a thousand that are never released, with short leases.
    let mut client = server.client().await;
    for i in 0..1000 {
        client
            .acquire(proto::AcquireRequest {
                ttl_ms: Some(100),
                ..acquire(&format!("forgotten-{i}"), "w")
            })
            .await
            .unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let counts = client
        .reap(proto::ReapRequest::default())
        .await
        .unwrap()
        .into_inner();
    println!("{counts:?}");
    let left = lock_keys_left(&mut conn, "default").await;
    assert!(
        left.is_empty(),
        "left behind: {:?}",
        &left[..left.len().min(10)]
    );
    // Invariant 8: every walk above (reap, the reaper, list, clear) found
    // keys with SCAN; no command of this run was KEYS.
    let page = client
        .list(proto::ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(page.locks.is_empty(), "{page:?}");
    client
        .clear(proto::ClearRequest {
            namespace: "default".into(),
        })
        .await
        .unwrap();
    let calls = command_calls(&mut conn).await;
    assert!(calls.get("scan").is_some_and(|&n| n > 0), "{calls:?}");
    // The churn ran through the functions: one HSET per grant (group
    // commit may have carried many grants in one FCALL).
    assert!(calls.get("hset").is_some_and(|&n| n > 10_000), "{calls:?}");
    assert_eq!(calls.get("keys"), None, "KEYS was sent: {calls:?}");
}

#[tokio::test]
async fn clear_empties_one_namespace_only() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    for i in 0..150 {
        client
            .acquire(proto::AcquireRequest {
                namespace: "doomed".into(),
                limit: Some(2),
                ..acquire(&format!("lock-{i}"), "h")
            })
            .await
            .unwrap();
    }
    client.acquire(acquire("keep-me", "h")).await.unwrap();
    let counts = client
        .clear(proto::ClearRequest {
            namespace: "doomed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counts.locks_cleared, 150);
    assert_eq!(counts.grants_released, 150);
    assert!(lock_keys_left(&mut conn, "doomed").await.is_empty());
    let kept = client
        .inspect(inspect("keep-me"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.holders.len(), 1);
    // The cleared locks are free again.
    let again = client
        .acquire(proto::AcquireRequest {
            namespace: "doomed".into(),
            ..acquire("lock-1", "other")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.status(), AcquireStatus::Acquired);
}

/// The replica holding the reaper lock, read from Redis (no client may
/// look into tumbler-system).
async fn reaper_holder(conn: &mut redis::aio::MultiplexedConnection) -> Option<String> {
    let key = scan_keys(conn, "tumbler:{tumbler-system:*}:l:reaper").await;
    match key.first() {
        Some(key) => grants_in(conn, key).await.into_iter().next(),
        None => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_reaps_at_a_time_and_another_takes_over_when_it_dies() {
    let redis = start_redis();
    // The first reaper is a process, so it can be killed.
    let mut first = TumblerProcess::start(&redis.url(), &["--reap-interval-ms", "100"]).await;
    let mut conn = redis_conn(&redis.url()).await;
    let first_reaper = wait_for(
        "the first replica's reaper lease",
        Duration::from_secs(5),
        || {
            let mut conn = conn.clone();
            async move { reaper_holder(&mut conn).await }
        },
    )
    .await;

    // A second replica joins: the lease stays where it is.
    let mut args = service_args();
    args.reap_interval_ms = 100;
    let second = TestServer::new()
        .redis(&redis.url())
        .args(args)
        .start()
        .await;
    let mut client = second.client().await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(reaper_holder(&mut conn).await.as_ref(), Some(&first_reaper));
    }

    // A holder that crashed, beside a live one.
    for (holder, ttl) in [("crashed", 100), ("alive", 60_000)] {
        client
            .acquire(proto::AcquireRequest {
                limit: Some(2),
                ttl_ms: Some(ttl),
                ..acquire("left-over", holder)
            })
            .await
            .unwrap();
    }
    let lock_key = scan_keys(&mut conn, "tumbler:{default:*}:l:left-over").await;

    // The reaper dies; the second replica takes over after the lease
    // (three intervals) and reaps the crashed holder without a Reap RPC.
    first.kill();
    let took_over = wait_for(
        "a replica taking the reaper lease over",
        Duration::from_secs(10),
        || {
            let (mut conn, first_reaper) = (conn.clone(), first_reaper.clone());
            async move {
                reaper_holder(&mut conn)
                    .await
                    .filter(|holder| *holder != first_reaper)
            }
        },
    )
    .await;
    assert!(took_over.starts_with("replica-"), "{took_over}");
    wait_until_async(
        "the background reaper purges the expired holder",
        Duration::from_secs(10),
        || {
            let (mut conn, key) = (conn.clone(), lock_key[0].clone());
            async move { grants_in(&mut conn, &key).await == ["alive"] }
        },
    )
    .await;

    // A replica that shuts down hands the lease over at once: the lock's
    // keys are gone.
    assert!(
        !scan_keys(&mut conn, "tumbler:{tumbler-system:*}:l:reaper")
            .await
            .is_empty()
    );
    second.shutdown().await.unwrap();
    assert!(
        scan_keys(&mut conn, "tumbler:{tumbler-system:*}:l:reaper")
            .await
            .is_empty()
    );
}

/// Holds `n` locks in `namespace`, a few calls at a time.
async fn hold_locks(client: &LockServiceClient<Channel>, namespace: &str, n: usize) {
    let mut calls = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let mut c = client.clone();
        let namespace = namespace.to_owned();
        calls.spawn(async move {
            for i in (worker..n).step_by(8) {
                c.acquire(proto::AcquireRequest {
                    namespace: namespace.clone(),
                    ..acquire(&format!("lock-{i}"), "h")
                })
                .await
                .unwrap();
            }
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_clear_says_how_far_it_got_and_a_rerun_finishes() {
    const LOCKS: usize = 3000;
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .shards(1)
        .start()
        .await;
    let client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let mut interrupted = None;
    for _attempt in 0..5 {
        hold_locks(&client, "doomed", LOCKS).await;
        // Watching the namespace shows the clear's progress ("cleared").
        let mut events = client
            .clone()
            .watch(proto::WatchRequest {
                namespace: "doomed".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let cli = tokio::task::spawn_blocking({
            let endpoint = server.endpoint();
            move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_tumbler"))
                    .args(["clear", "--yes", "--json", "--namespace", "doomed"])
                    .args(["--addr", &endpoint])
                    .env_remove("TUMBLER_TOKEN")
                    .output()
                    .unwrap()
            }
        });
        // Once the clear is under way, Redis refuses writes (out of
        // memory): the clear stops partway.
        loop {
            let event = events.message().await.unwrap().unwrap();
            if event.event == "cleared" {
                break;
            }
        }
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let output = cli.await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
        if output.status.success() {
            continue; // finished before Redis refused: try again
        }
        interrupted = Some(output);
        break;
    }
    let output = interrupted.expect("one of five clears was interrupted");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("UNAVAILABLE"), "{stderr}");
    assert!(stderr.contains("run Clear again to finish"), "{stderr}");
    let partial: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    // A ClearResponse in the proto3 JSON mapping: uint64 as strings.
    let count = |field: &str| -> u64 {
        partial[field]
            .as_str()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("{field}: {partial}"))
    };
    let cleared = count("locksCleared");
    assert!(cleared > 0 && cleared < LOCKS as u64, "{partial}");
    assert_eq!(count("grantsReleased"), cleared);
    assert!(
        stderr.contains(&format!("cleared {cleared} locks")),
        "{stderr}"
    );
    let left = lock_keys_left(&mut conn, "doomed").await.len();
    assert_eq!(left, LOCKS - cleared as usize);

    // Run again: it finds only what is left and finishes.
    let rest = server
        .client()
        .await
        .clear(proto::ClearRequest {
            namespace: "doomed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.locks_cleared, (LOCKS - cleared as usize) as u64);
    assert!(lock_keys_left(&mut conn, "doomed").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaper_kept_from_its_lock_longer_than_a_lease_logs_and_counts_it() {
    let redis = start_redis();
    let conn = redis_conn(&redis.url()).await;
    // A replica with a much longer reap interval holds the lock with a
    // lease (3 s) far past what the other replica's reaper expects (its
    // own lease: 3 × 100 ms).
    let _holder = TumblerProcess::start(&redis.url(), &["--reap-interval-ms", "1000"]).await;
    wait_for("a reaper lease", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { reaper_holder(&mut conn).await }
    })
    .await;
    let http_port = tumbler::dev::free_port().unwrap();
    let http = format!("127.0.0.1:{http_port}");
    let _kept_out = TumblerProcess::start(
        &redis.url(),
        &["--reap-interval-ms", "100", "--http-listen", &http],
    )
    .await;
    let addr = http.parse().unwrap();
    wait_until_async(
        "the kept-out reaper counted",
        Duration::from_secs(10),
        || async move {
            let page = common::http::scrape(addr).await;
            common::http::sample(&page, "tumbler_reaper_lock_unavailable_total", &[])
                .is_some_and(|n| n >= 1.0)
        },
    )
    .await;
}
