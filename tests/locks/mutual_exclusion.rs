//! Mutual exclusion under load: many concurrent clients try-acquire and
//! release one lock; an independent checker, built only from the holders'
//! own observations, proves at most `limit` of them ever held at once.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use proto::{AcquireStatus, ReleaseStatus};
use tokio::sync::Mutex;

const CLIENTS: usize = 32;
const CYCLES: usize = 200;

/// What one holder saw: when (its own clock) it knew it held the lock, when
/// it stopped relying on it, and the grant's token and slot.
#[derive(Clone, Debug)]
struct Tenure {
    held_from: Instant,
    held_until: Instant,
    token: u64,
    slot: u32,
}

/// The most tenures that overlap at any instant (a sweep over start/end
/// events; an end sorts before a start at the same instant).
fn max_overlap(tenures: &[Tenure]) -> usize {
    let mut events: Vec<(Instant, i32)> = tenures
        .iter()
        .flat_map(|t| [(t.held_from, 1), (t.held_until, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    most as usize
}

async fn hammer(limit: u32) {
    let server = TestServer::new().start().await;
    let name = format!("contended-{limit}");
    let tenures = Arc::new(Mutex::new(Vec::new()));
    // A second, live checker: holders count themselves in and out.
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for worker in 0..CLIENTS {
        let mut client = server.client().await;
        let (name, tenures) = (name.clone(), tenures.clone());
        let (inside, most_inside) = (inside.clone(), most_inside.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("worker-{worker}");
            for _ in 0..CYCLES {
                let reply = client
                    .acquire(proto::AcquireRequest {
                        limit: Some(limit),
                        ..acquire(&name, &holder)
                    })
                    .await
                    .expect("acquire")
                    .into_inner();
                if reply.status() != AcquireStatus::Acquired {
                    assert_eq!(reply.status(), AcquireStatus::NotAcquired);
                    tokio::task::yield_now().await;
                    continue;
                }
                let held_from = Instant::now();
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most_inside.fetch_max(now_inside, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let held_until = Instant::now();
                let grant = reply.grant.unwrap();
                tenures.lock().await.push(Tenure {
                    held_from,
                    held_until,
                    token: grant.fencing_token,
                    slot: grant.slot,
                });
                let released = client
                    .release(release(&name, &holder))
                    .await
                    .expect("release")
                    .into_inner();
                assert_eq!(released.status(), ReleaseStatus::Released);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let mut tenures = tenures.lock().await.clone();
    let limit = limit as usize;
    assert!(
        tenures.len() > CLIENTS,
        "too few grants to judge: {}",
        tenures.len()
    );
    assert!(
        max_overlap(&tenures) <= limit,
        "overlap {} > {limit}",
        max_overlap(&tenures)
    );
    assert!(most_inside.load(Ordering::SeqCst) <= limit);

    // Fencing: every grant has its own token.
    let mut tokens: Vec<u64> = tenures.iter().map(|t| t.token).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        tenures.len(),
        "a fencing token was granted twice"
    );
    // Slots stay within 1..=limit, and overlapping tenures never share one.
    tenures.sort_by_key(|t| t.held_from);
    for (i, a) in tenures.iter().enumerate() {
        assert!((1..=limit as u32).contains(&a.slot));
        for b in tenures[i + 1..]
            .iter()
            .take_while(|b| b.held_from < a.held_until)
        {
            assert_ne!(a.slot, b.slot, "two holders in slot {} at once", a.slot);
        }
    }
    if limit == 1 {
        // One holder at a time: later tenures carry larger tokens.
        assert!(tenures.windows(2).all(|w| w[0].token < w[1].token));
    } else {
        assert!(
            max_overlap(&tenures) > 1,
            "the semaphore never had two holders: the checker saw no concurrency"
        );
    }
    println!(
        "limit {limit}: {} grants over {} attempts, most at once {}",
        tenures.len(),
        CLIENTS * CYCLES,
        max_overlap(&tenures)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mutex_never_has_two_holders() {
    hammer(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_never_has_more_than_its_limit() {
    hammer(4).await;
}

#[test]
fn the_checker_sees_an_overlap() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let tenure = |from, until| Tenure {
        held_from: at(from),
        held_until: at(until),
        token: 1,
        slot: 1,
    };
    assert_eq!(max_overlap(&[tenure(0, 10), tenure(10, 20)]), 1);
    assert_eq!(
        max_overlap(&[tenure(0, 10), tenure(5, 20), tenure(6, 7)]),
        3
    );
}
