//! Weighted permits (decision 0075, invariant 14): an Acquire may take `k`
//! of a semaphore's `limit` permits; the permits of live grants never sum
//! past the limit; a grant holds one slot per permit; FIFO keeps a large
//! request at the head from being passed by smaller fair ones, and a
//! barging one (`fair = false`) takes free permits when they are enough;
//! expiry, a crashed replica's waiter, sessions, the hand-over and bad
//! input over gRPC, Connect JSON and the Session stream. Ends with a
//! property test over random acquire(k) / release / expiry sequences.

use crate::{common, queue, read_write};

use std::collections::BTreeSet;
use std::time::Duration;

use common::session::Session;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use proto::AcquireStatus;
use proto::lock_service_client::LockServiceClient;
use queue::{spawn_wait, until_queued};
use read_write::{ask, busy, grant_of, granted, inspected, let_go, waiting};
use tonic::Code;
use tonic::transport::Channel;

/// An acquire of `permits` of a semaphore of `limit`.
fn weighted(name: &str, holder: &str, limit: u32, permits: u32) -> proto::AcquireRequest {
    proto::AcquireRequest {
        limit: Some(limit),
        permits: Some(permits),
        ..acquire(name, holder)
    }
}

/// The same request, barging (`fair = false`).
fn barging(request: proto::AcquireRequest) -> proto::AcquireRequest {
    proto::AcquireRequest {
        fair: Some(false),
        ..request
    }
}

/// Each live grant's holder, permits and slots, by holder; and the
/// lock's permits in use, checked against the grants' sum.
async fn permits_of(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> (u32, Vec<(String, u32, Vec<u32>)>) {
    let state = inspected(client, name).await;
    let mut grants: Vec<(String, u32, Vec<u32>)> = (state.holders.iter())
        .map(|h| {
            let g = h.grant.as_ref().unwrap();
            assert_eq!(g.slots.first(), Some(&g.slot), "{g:?}");
            (g.holder.clone(), g.permits, g.slots.clone())
        })
        .collect();
    grants.sort();
    let sum: u32 = grants.iter().map(|(_, k, _)| k).sum();
    assert_eq!(state.permits_in_use, sum, "{state:?}");
    (state.permits_in_use, grants)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_of_n_permits_are_granted_with_one_slot_each_and_never_more_than_n() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let a = granted(&mut client, weighted("pool", "a", 5, 3)).await;
    assert_eq!((a.permits, a.slots.clone(), a.slot), (3, vec![1, 2, 3], 1));
    let b = granted(&mut client, weighted("pool", "b", 5, 2)).await;
    assert_eq!((b.permits, b.slots.clone()), (2, vec![4, 5]));
    // All five are taken: one more permit is not there.
    busy(&mut client, weighted("pool", "c", 5, 1)).await;
    busy(&mut client, barging(weighted("pool", "c", 5, 1))).await;
    assert_eq!(
        permits_of(&mut client, "pool").await,
        (
            5,
            vec![("a".into(), 3, vec![1, 2, 3]), ("b".into(), 2, vec![4, 5])]
        )
    );
    // The header counts permits, and each slot field names its holder.
    let mut conn = redis_conn(server.redis_url()).await;
    let keys = scan_keys(&mut conn, "*:l:pool").await;
    let header: String = redis::cmd("HGET")
        .arg(&keys[0])
        .arg("_")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(header.starts_with("5|5|"), "{header}");
    let slots: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&keys[0])
        .arg(&["1", "2", "3", "4", "5"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let owners: Vec<String> = slots.into_iter().map(Option::unwrap).collect();
    assert_eq!(owners, ["a", "a", "a", "b", "b"]);
    // A retry is the grant as it is, whatever weight it asks now.
    let again = ask(&mut client, weighted("pool", "b", 5, 1)).await;
    assert_eq!(again.status(), AcquireStatus::AlreadyHeld);
    let again = again.grant.unwrap();
    assert_eq!(
        (again.fencing_token, again.permits, again.slots),
        (b.fencing_token, 2, vec![4, 5])
    );
    // Freed slots are reused, smallest first, one per permit.
    let_go(&mut client, "pool", "a").await;
    let c = granted(&mut client, weighted("pool", "c", 5, 1)).await;
    assert_eq!((c.slots.clone(), c.permits), (vec![1], 1));
    let d = granted(&mut client, weighted("pool", "d", 5, 2)).await;
    assert_eq!(d.slots, vec![2, 3]);
    assert!(d.fencing_token > c.fencing_token && c.fencing_token > b.fencing_token);
    busy(&mut client, weighted("pool", "e", 5, 1)).await;
    assert_eq!(permits_of(&mut client, "pool").await.0, 5);
    // Listing counts permits in use too.
    let listed = client
        .list(proto::ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    let pool = listed.locks.iter().find(|l| l.name == "pool").unwrap();
    assert_eq!((pool.permits_in_use, pool.holders, pool.limit), (5, 5, 5));
    for holder in ["b", "c", "d"] {
        let_go(&mut client, "pool", holder).await;
    }
    // Nothing lingers once the last holder is gone.
    assert!(scan_keys(&mut conn, "*:pool").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_fit_waits_until_a_release_or_an_expiry_frees_enough() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, weighted("pool", "a", 4, 3)).await;
    let big = spawn_wait(
        server.client().await,
        waiting(weighted("pool", "big", 4, 2), 15_000),
    );
    until_queued(&mut client, "pool", 1).await;
    let_go(&mut client, "pool", "a").await;
    let big = grant_of(big).await;
    assert_eq!((big.permits, big.slots.clone()), (2, vec![1, 2]));
    // A short lease that lapses frees its permits for the next one.
    granted(
        &mut client,
        proto::AcquireRequest {
            ttl_ms: Some(300),
            ..weighted("pool", "short", 4, 2)
        },
    )
    .await;
    let next = spawn_wait(
        server.client().await,
        waiting(weighted("pool", "next", 4, 2), 15_000),
    );
    let next = grant_of(next).await;
    assert_eq!(next.slots, vec![3, 4]);
    assert_eq!(
        permits_of(&mut client, "pool").await.1,
        vec![
            ("big".into(), 2, vec![1, 2]),
            ("next".into(), 2, vec![3, 4])
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_head_is_not_passed_by_small_fair_requests_but_barging_ones_pass() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, weighted("pool", "h3", 4, 3)).await;
    granted(&mut client, weighted("pool", "h1", 4, 1)).await;
    let big = spawn_wait(
        server.client().await,
        waiting(weighted("pool", "big", 4, 3), 15_000),
    );
    until_queued(&mut client, "pool", 1).await;
    let small = spawn_wait(
        server.client().await,
        waiting(weighted("pool", "small", 4, 1), 15_000),
    );
    until_queued(&mut client, "pool", 2).await;
    let passer = spawn_wait(
        server.client().await,
        barging(waiting(weighted("pool", "passer", 4, 1), 15_000)),
    );
    until_queued(&mut client, "pool", 3).await;
    // One permit frees: the big head does not fit, the fair one behind it
    // waits, the queued barging one is woken and takes it at once.
    let_go(&mut client, "pool", "h1").await;
    let passer = tokio::time::timeout(Duration::from_secs(5), passer)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(passer.status(), AcquireStatus::Acquired, "{passer:?}");
    assert_eq!(
        until_queued(&mut client, "pool", 2).await,
        ["big".to_owned(), "small".to_owned()]
    );
    // The Queue RPC says what each waits for.
    let queued = client
        .queue(proto::QueueRequest {
            name: "pool".into(),
            max_entries: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let weights: Vec<(String, u32, bool)> = (queued.requests.iter())
        .map(|r| (r.holder.clone(), r.permits, r.fair))
        .collect();
    assert_eq!(
        weights,
        [("big".to_owned(), 3, true), ("small".to_owned(), 1, true)]
    );
    // A fair try-once does not pass the head either; a barging one would,
    // had it room.
    let_go(&mut client, "pool", "passer").await;
    busy(&mut client, weighted("pool", "fair", 4, 1)).await;
    let bargee = granted(&mut client, barging(weighted("pool", "bargee", 4, 1))).await;
    assert_eq!(bargee.slots, vec![4]);
    // The head comes in when three are free, then the small one.
    let_go(&mut client, "pool", "bargee").await;
    let_go(&mut client, "pool", "h3").await;
    let big = grant_of(big).await;
    assert_eq!(big.slots, vec![1, 2, 3]);
    let small = grant_of(small).await;
    assert!(small.fencing_token > big.fencing_token);
    assert_eq!(small.slots, vec![4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_replicas_weighted_waiter_is_skipped_after_its_request_ttl() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    granted(&mut client, weighted("pool", "a", 3, 2)).await;
    let mut replica = TumblerProcess::start(&redis.url(), &[]).await;
    let crashed = spawn_wait(
        replica.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(1_000),
            ..waiting(weighted("pool", "dead", 3, 3), 60_000)
        },
    );
    until_queued(&mut client, "pool", 1).await;
    let live = spawn_wait(
        server.client().await,
        proto::AcquireRequest {
            queue_ttl_ms: Some(1_000),
            ..waiting(weighted("pool", "live", 3, 2), 20_000)
        },
    );
    until_queued(&mut client, "pool", 2).await;
    replica.kill();
    let _ = crashed.await;
    let started = tokio::time::Instant::now();
    let_go(&mut client, "pool", "a").await;
    let live = grant_of(live).await;
    assert_eq!((live.permits, live.slots), (2, vec![1, 2]));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(until_queued(&mut client, "pool", 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_keeps_its_weighted_grant() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, weighted("pool", "other", 4, 1)).await;
    let mut session = Session::open(&mut client, 800).await;
    let reply = session.acquire(1, weighted("pool", "", 4, 3)).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let grant = reply.grant.unwrap();
    assert_eq!((grant.permits, grant.slots.clone()), (3, vec![2, 3, 4]));
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(lost.is_empty(), "{lost:?}");
    let (resumed, opened) = Session::resume(&mut client, &session.id, &session.secret)
        .await
        .expect("resumed within the ttl");
    assert_eq!(opened.grants.len(), 1, "{opened:?}");
    assert_eq!(opened.grants[0].fencing_token, grant.fencing_token);
    resumed.keep_alive().await;
    let (in_use, grants) = permits_of(&mut client, "pool").await;
    assert_eq!(in_use, 4);
    assert!(
        grants.contains(&(grant.holder.clone(), 3, vec![2, 3, 4])),
        "{grants:?}"
    );
    // The stream refuses bad weights as the RPC does.
    use proto::session_request::Command;
    use proto::session_response::Event;
    resumed
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 7,
            acquire: Some(weighted("other", "", 2, 3)),
        }))
        .await;
    let mut resumed = resumed;
    match resumed.next().await {
        Some(Event::Error(error)) => {
            assert_eq!(
                (error.request_id, error.code),
                (7, Code::InvalidArgument as i32)
            );
            assert!(error.message.starts_with("permits"), "{}", error.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(session.commands);
    drop(resumed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hand_over_gives_weighted_heads_their_permits_in_queue_order() {
    let args = tumbler::config::ServiceArgs {
        hand_over: true,
        ..service_args()
    };
    let server = TestServer::new().args(args).start().await;
    let mut client = server.client().await;
    granted(&mut client, weighted("pool", "all", 4, 4)).await;
    let mut tasks = Vec::new();
    for (i, holder) in ["w1", "w2", "w3"].into_iter().enumerate() {
        tasks.push(spawn_wait(
            server.client().await,
            waiting(weighted("pool", holder, 4, 2), 15_000),
        ));
        until_queued(&mut client, "pool", i + 1).await;
    }
    // Four free: the first two heads are handed two each; the third waits.
    let_go(&mut client, "pool", "all").await;
    let mut tasks = tasks.into_iter();
    let w1 = grant_of(tasks.next().unwrap()).await;
    let w2 = grant_of(tasks.next().unwrap()).await;
    assert_eq!(
        (w1.slots.clone(), w2.slots.clone()),
        (vec![1, 2], vec![3, 4])
    );
    assert!(w2.fencing_token > w1.fencing_token);
    assert_eq!(
        until_queued(&mut client, "pool", 1).await,
        ["w3".to_owned()]
    );
    let_go(&mut client, "pool", "w1").await;
    let w3 = grant_of(tasks.next().unwrap()).await;
    assert_eq!(w3.slots, vec![1, 2]);
    assert_eq!(permits_of(&mut client, "pool").await.0, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_permits_are_invalid_arguments_naming_permits_on_grpc_and_connect() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let cases = [
        weighted("doc", "a", 3, 4),
        // Absent limit: 1.
        proto::AcquireRequest {
            permits: Some(2),
            ..acquire("doc", "a")
        },
        proto::AcquireRequest {
            mode: proto::LockMode::Read as i32,
            ..weighted("doc", "a", 3, 2)
        },
        proto::AcquireRequest {
            mode: proto::LockMode::Write as i32,
            ..weighted("doc", "a", 3, 2)
        },
    ];
    for request in cases {
        let refused = client.acquire(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().starts_with("permits"),
            "{}",
            refused.message()
        );
    }
    for body in [
        r#"{"name":"doc","holder":"a","limit":2,"permits":3}"#,
        r#"{"name":"doc","holder":"a","mode":"LOCK_MODE_READ","limit":3,"permits":2}"#,
    ] {
        http::assert_connect_acquire_invalid(&server.endpoint(), body, "permits").await;
    }
    // Nothing was taken; 0 means one permit, and all of the limit is fine.
    assert!(inspected(&mut client, "doc").await.holders.is_empty());
    let one = granted(&mut client, weighted("doc", "a", 3, 0)).await;
    assert_eq!((one.permits, one.slots), (1, vec![1]));
    let addr = server
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let (status, reply) = http::http(
        addr,
        "POST",
        "/tumbler.v1.LockService/Acquire",
        &[("content-type", "application/json")],
        r#"{"name":"doc2","holder":"a","limit":3,"permits":3}"#,
    )
    .await;
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["grant"]["permits"], 3, "{reply}");
    assert_eq!(
        reply["grant"]["slots"],
        serde_json::json!([1, 2, 3]),
        "{reply}"
    );
}

/// One step of the property test, on one semaphore.
#[derive(Clone, Debug)]
enum Step {
    /// A try-once acquire by client `c` of `k` permits; `short`: a lease
    /// that lapses at the next `Pass`.
    Try {
        c: usize,
        k: u32,
        fair: bool,
        short: bool,
    },
    /// A fair waiting acquire of `k` permits by a new holder.
    Wait {
        k: u32,
    },
    Release {
        c: usize,
    },
    /// Time passes: short leases lapse.
    Pass,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..4usize, 1..=4u32, any::<bool>(), any::<bool>())
            .prop_map(|(c, k, fair, short)| Step::Try { c, k, fair, short }),
        3 => (1..=4u32).prop_map(|k| Step::Wait { k }),
        3 => (0..4usize).prop_map(|c| Step::Release { c }),
        1 => Just(Step::Pass),
    ]
}

const SHORT_MS: u64 = 150;

/// Inspect's view is within the rule: the permits of live grants sum to
/// `permits_in_use`, never past the limit, and every slot is in 1..=limit
/// and held once.
async fn within_the_limit(
    client: &mut LockServiceClient<Channel>,
    name: &str,
    limit: u32,
) -> Result<(), TestCaseError> {
    let (in_use, grants) = permits_of(client, name).await;
    prop_assert!(in_use <= limit, "{in_use} > {limit}: {grants:?}");
    let mut seen = BTreeSet::new();
    for (holder, k, slots) in &grants {
        prop_assert_eq!(*k as usize, slots.len(), "{}", holder);
        for slot in slots {
            prop_assert!((1..=limit).contains(slot), "{grants:?}");
            prop_assert!(seen.insert(*slot), "slot {} twice: {:?}", slot, grants);
        }
    }
    Ok(())
}

async fn run_case(
    client: &mut LockServiceClient<Channel>,
    case: usize,
    limit: u32,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let name = format!("prop-{case}");
    let mut waiters = Vec::new();
    for step in steps {
        match *step {
            Step::Try { c, k, fair, short } => {
                let request = proto::AcquireRequest {
                    fair: Some(fair),
                    ttl_ms: Some(if short { SHORT_MS } else { 30_000 }),
                    ..weighted(&name, &format!("c{c}"), limit, k.min(limit))
                };
                let reply = client.acquire(request).await;
                prop_assert!(reply.is_ok(), "{reply:?}");
            }
            Step::Wait { k } => {
                let holder = format!("w{}", waiters.len());
                let before = queue::queue_of(client, &name).await.len();
                let task = spawn_wait(
                    client.clone(),
                    waiting(weighted(&name, &holder, limit, k.min(limit)), 30_000),
                );
                // Queued behind those before it, or granted at once.
                common::wait::wait_until_async(
                    "queued or granted",
                    Duration::from_secs(10),
                    || {
                        let mut client = client.clone();
                        let (name, holder) = (name.clone(), holder.clone());
                        async move {
                            let queued = queue::queue_of(&mut client, &name).await;
                            let held = inspected(&mut client, &name)
                                .await
                                .holders
                                .iter()
                                .any(|h| h.grant.as_ref().unwrap().holder == holder);
                            queued.contains(&holder) || held || queued.len() < before
                        }
                    },
                )
                .await;
                waiters.push((holder, task));
            }
            Step::Release { c } => {
                let reply = client.release(release(&name, &format!("c{c}"))).await;
                prop_assert!(reply.is_ok(), "{reply:?}");
            }
            Step::Pass => tokio::time::sleep(Duration::from_millis(SHORT_MS + 50)).await,
        }
        within_the_limit(client, &name, limit).await?;
    }
    // Everyone else lets go; the fair waiters are granted in queue order.
    for c in 0..4 {
        client
            .release(release(&name, &format!("c{c}")))
            .await
            .unwrap();
    }
    let mut last = 0;
    for (holder, task) in waiters {
        let reply = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("the waiter is granted")
            .unwrap();
        let reply = reply.map_err(|s| TestCaseError::fail(format!("{holder}: {s:?}")))?;
        prop_assert_eq!(
            reply.status(),
            AcquireStatus::Acquired,
            "{}: {:?}",
            holder,
            reply
        );
        let token = reply.grant.unwrap().fencing_token;
        prop_assert!(token > last, "{} granted out of queue order", holder);
        last = token;
        within_the_limit(client, &name, limit).await?;
        client.release(release(&name, &holder)).await.unwrap();
    }
    Ok(())
}

#[test]
fn random_weighted_sequences_never_pass_the_limit_and_keep_fair_waiters_in_order() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, client) = rt.block_on(async {
        let server = TestServer::new().start().await;
        let client = server.client().await;
        (server, client)
    });
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicUsize::new(0);
    let outcome = runner.run(
        &(2..=5u32, proptest::collection::vec(step(), 1..14)),
        |(limit, steps)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut client = client.clone();
            rt.block_on(run_case(&mut client, n, limit, &steps))
        },
    );
    drop(server);
    if let Err(err) = outcome {
        panic!("{err}");
    }
}
