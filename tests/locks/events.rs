//! Lock events that tell the whole story: every change to a grant or a
//! waiting request is one Watch event, whoever made it, with the grant's
//! parts, its hold time and the actor; expiry is told at the lease's end
//! without any call on the lock; a Watch can start with the lock's state.

use crate::common;

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
use tonic::transport::Channel;

const NS: &str = "ev";

/// A Watch stream, read with a bound on every wait.
struct Events(tonic::Streaming<proto::LockEvent>);

impl Events {
    async fn open(client: &mut LockServiceClient<Channel>, request: proto::WatchRequest) -> Self {
        Events(client.watch(request).await.unwrap().into_inner())
    }

    /// The next event, within 5 s.
    async fn next(&mut self) -> proto::LockEvent {
        tokio::time::timeout(Duration::from_secs(5), self.0.message())
            .await
            .expect("an event within 5 s")
            .expect("the stream goes on")
            .expect("the stream goes on")
    }

    /// The next event of `name`, skipping other locks' (probes).
    async fn next_of(&mut self, name: &str) -> proto::LockEvent {
        loop {
            let event = self.next().await;
            if event.name == name {
                return event;
            }
        }
    }

    /// Every event that arrives within `ms`.
    async fn for_a_while(&mut self, ms: u64) -> Vec<proto::LockEvent> {
        let mut seen = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_millis(ms);
        while let Ok(Ok(Some(event))) = tokio::time::timeout_at(until, self.0.message()).await {
            seen.push(event);
        }
        seen
    }

    /// Waits until the watch is live: probes on `probe` until its events
    /// show, then drains them.
    async fn until_live(&mut self, client: &mut LockServiceClient<Channel>, probe: &str) {
        for _ in 0..200 {
            client.acquire(ns_acquire(probe, "probe")).await.unwrap();
            client.release(ns_release(probe, "probe")).await.unwrap();
            if let Ok(Ok(Some(_))) =
                tokio::time::timeout(Duration::from_millis(50), self.0.message()).await
            {
                self.for_a_while(100).await;
                return;
            }
        }
        panic!("the watch never went live");
    }
}

fn ns_acquire(name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: NS.into(),
        ..acquire(name, holder)
    }
}

fn ns_release(name: &str, holder: &str) -> proto::ReleaseRequest {
    proto::ReleaseRequest {
        namespace: NS.into(),
        ..release(name, holder)
    }
}

fn watch_name(name: &str) -> proto::WatchRequest {
    proto::WatchRequest {
        namespace: NS.into(),
        name: name.into(),
        ..Default::default()
    }
}

fn watch_prefix(prefix: &str) -> proto::WatchRequest {
    proto::WatchRequest {
        namespace: NS.into(),
        prefix: prefix.into(),
        ..Default::default()
    }
}

fn what(event: &proto::LockEvent) -> (&str, &str, &str) {
    (
        event.event.as_str(),
        event.holder.as_str(),
        event.actor.as_str(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_events_carry_slot_kind_metadata_lease_hold_time_and_actor() {
    let redis = start_redis();
    let watching = TestServer::new().redis(&redis.url()).start().await;
    let acting = TestServer::new().redis(&redis.url()).start().await;
    let mut watcher = watching.client().await;
    let mut client = acting.client().await;
    let mut events = Events::open(&mut watcher, watch_prefix("g-")).await;
    events.until_live(&mut client, "g-probe").await;

    // Two holders of a semaphore: slots 1 and 2, with kind and metadata.
    for holder in ["a", "b"] {
        client
            .acquire(proto::AcquireRequest {
                limit: Some(2),
                ttl_ms: Some(30_000),
                kind: "report".into(),
                metadata: [("job".to_owned(), format!("job-{holder}"))].into(),
                ..ns_acquire("g-sem", holder)
            })
            .await
            .unwrap();
    }
    let a = events.next_of("g-sem").await;
    assert_eq!(what(&a), ("acquired", "a", "holder"));
    assert_eq!((a.slot, a.kind.as_str(), a.ttl_ms), (1, "report", 30_000));
    assert_eq!(a.metadata.get("job").map(String::as_str), Some("job-a"));
    assert!(a.fencing_token > 0);
    assert_eq!(a.acquired_at_ms, a.at_ms);
    assert_eq!(a.expires_at_ms, a.acquired_at_ms + 30_000);
    assert_eq!(a.hold_ms, 0, "nothing ended yet");
    let b = events.next_of("g-sem").await;
    assert_eq!(what(&b), ("acquired", "b", "holder"));
    assert_eq!(b.slot, 2);
    assert!(b.fencing_token > a.fencing_token);

    // An extension: the new lease and its end.
    client
        .extend(proto::ExtendRequest {
            namespace: NS.into(),
            name: "g-sem".into(),
            holder: "a".into(),
            ttl_ms: Some(45_000),
            ..Default::default()
        })
        .await
        .unwrap();
    let extended = events.next_of("g-sem").await;
    assert_eq!(what(&extended), ("extended", "a", "holder"));
    assert_eq!(extended.ttl_ms, 45_000);
    assert_eq!(extended.expires_at_ms, extended.at_ms + 45_000);
    assert_eq!(extended.fencing_token, a.fencing_token);
    assert_eq!((extended.slot, extended.kind.as_str()), (1, "report"));

    // A release after a while: how long it was held.
    tokio::time::sleep(Duration::from_millis(150)).await;
    client.release(ns_release("g-sem", "b")).await.unwrap();
    let released = events.next_of("g-sem").await;
    assert_eq!(what(&released), ("released", "b", "holder"));
    assert_eq!(released.fencing_token, b.fencing_token);
    assert_eq!(released.slot, 2);
    assert_eq!(released.hold_ms as i64, released.at_ms - b.acquired_at_ms);
    assert!(released.hold_ms >= 150, "{released:?}");
    assert_eq!(
        released.metadata.get("job").map(String::as_str),
        Some("job-b")
    );

    // One event per change: nothing else happened to the lock.
    let rest: Vec<_> = events
        .for_a_while(300)
        .await
        .into_iter()
        .filter(|e| e.name == "g-sem")
        .collect();
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_queued_then_dequeued_or_acquired() {
    let server = TestServer::new().start().await;
    let mut watcher = server.client().await;
    let mut client = server.client().await;
    let mut events = Events::open(&mut watcher, watch_name("q")).await;
    events.until_live(&mut client, "q").await;

    client.acquire(ns_acquire("q", "owner")).await.unwrap();
    let timed_out = client
        .acquire(proto::AcquireRequest {
            wait_ms: 200,
            kind: "batch".into(),
            ..ns_acquire("q", "patient")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(timed_out.reason(), proto::NotAcquiredReason::Timeout);
    let seen: Vec<_> = events.for_a_while(300).await;
    let seen: Vec<_> = seen.iter().map(|e| (what(e), e.kind.as_str())).collect();
    assert_eq!(
        seen,
        vec![
            (("acquired", "owner", "holder"), "default"),
            (("queued", "patient", "holder"), "batch"),
            (("dequeued", "patient", "holder"), "batch"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_told_at_the_lease_end_once_without_any_call_on_the_lock() {
    let redis = start_redis();
    let first = TestServer::new().redis(&redis.url()).start().await;
    let second = TestServer::new().redis(&redis.url()).start().await;
    let acting = TestServer::new().redis(&redis.url()).start().await;
    let mut client = acting.client().await;
    // Two replicas watch the lock: both would purge it; one expiry is told.
    let mut watcher_1 = first.client().await;
    let mut watcher_2 = second.client().await;
    let mut events_1 = Events::open(&mut watcher_1, watch_name("lease")).await;
    let mut events_2 = Events::open(&mut watcher_2, watch_name("lease")).await;
    events_1.until_live(&mut client, "lease").await;
    events_2.until_live(&mut client, "lease").await;
    events_1.for_a_while(100).await;

    let granted = client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(400),
            ..ns_acquire("lease", "short")
        })
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    // No call touches the lock from here on.
    let acquired = events_1.next().await;
    assert_eq!(what(&acquired), ("acquired", "short", "holder"));
    let expired = events_1.next().await;
    assert_eq!(what(&expired), ("expired", "short", "reaper"));
    assert_eq!(expired.fencing_token, granted.fencing_token);
    assert_eq!(expired.expires_at_ms, acquired.expires_at_ms);
    assert_eq!(expired.hold_ms, 400, "held for the whole lease");
    let late = expired.at_ms - expired.expires_at_ms;
    println!("expired told {late} ms after the lease ended");
    assert!(
        (0..=150).contains(&late),
        "told {late} ms after the lease ended"
    );

    // Exactly once on each stream, though both replicas purge.
    let mut on_2 = vec![events_2.next().await];
    on_2.extend(events_2.for_a_while(500).await);
    let rest_1 = events_1.for_a_while(100).await;
    let expiries = |list: &[proto::LockEvent]| list.iter().filter(|e| e.event == "expired").count();
    assert_eq!(expiries(&on_2), 1, "{on_2:?}");
    assert_eq!(expiries(&rest_1), 0, "{rest_1:?}");
    assert_eq!(on_2.last().unwrap(), &expired);

    // The holder's heartbeat then learns it lost the lock.
    let extended = client
        .extend(proto::ExtendRequest {
            namespace: NS.into(),
            name: "lease".into(),
            holder: "short".into(),
            fencing_token: Some(granted.fencing_token),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), proto::ExtendStatus::NotHeld);
    let lost = events_1.next().await;
    assert_eq!(what(&lost), ("lost", "short", "holder"));
    assert_eq!(lost.fencing_token, granted.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reap_and_clear_tell_each_grant_and_request_with_their_actor() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut watcher = server.client().await;
    let mut client = server.client().await;
    let mut events = Events::open(&mut watcher, watch_prefix("m-")).await;
    events.until_live(&mut client, "m-probe").await;

    // Reap with a cutoff: a live but old grant goes, told by the reaper.
    client
        .acquire(proto::AcquireRequest {
            kind: "nightly".into(),
            ..ns_acquire("m-old", "stuck")
        })
        .await
        .unwrap();
    assert_eq!(events.next_of("m-old").await.event, "acquired");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reaped = client
        .reap(proto::ReapRequest {
            namespace: NS.into(),
            older_than_ms: Some(100),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reaped.old_grants, 1);
    let event = events.next_of("m-old").await;
    assert_eq!(what(&event), ("reaped", "stuck", "reaper"));
    assert_eq!(event.kind, "nightly");
    assert!(event.hold_ms >= 200, "{event:?}");

    // A waiting request whose replica died is skipped by the reaper.
    client.acquire(ns_acquire("m-held", "owner")).await.unwrap();
    assert_eq!(events.next_of("m-held").await.event, "acquired");
    let mut doomed = TumblerProcess::start(&redis.url(), &["--reap-interval-ms", "0"]).await;
    let mut remote = doomed.client().await;
    let orphan = tokio::spawn(async move {
        remote
            .acquire(proto::AcquireRequest {
                wait_ms: 60_000,
                queue_ttl_ms: Some(300),
                kind: "orphans".into(),
                ..ns_acquire("m-held", "orphan")
            })
            .await
    });
    let queued = events.next_of("m-held").await;
    assert_eq!(what(&queued), ("queued", "orphan", "holder"));
    doomed.kill();
    let _ = orphan.await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let counts = client
        .reap(proto::ReapRequest {
            namespace: NS.into(),
            older_than_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counts.dead_waiters, 1);
    let skipped = events.next_of("m-held").await;
    assert_eq!(what(&skipped), ("skipped", "orphan", "reaper"));
    assert_eq!(skipped.kind, "orphans");

    // Clear: every grant and every waiting request, told as the admin's.
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                wait_ms: 1_000,
                kind: "queued".into(),
                ..ns_acquire("m-held", "next")
            })
            .await
    });
    assert_eq!(
        what(&events.next_of("m-held").await),
        ("queued", "next", "holder")
    );
    let cleared = client
        .clear(proto::ClearRequest {
            namespace: NS.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((cleared.grants_released, cleared.requests_dropped), (1, 1));
    let mut told = vec![events.next_of("m-held").await];
    told.push(events.next_of("m-held").await);
    told.sort_by(|a, b| a.holder.cmp(&b.holder));
    assert_eq!(what(&told[0]), ("cleared", "next", "admin"));
    assert_eq!(told[0].kind, "queued");
    assert_eq!(what(&told[1]), ("cleared", "owner", "admin"));
    assert!(
        told[1].fencing_token > 0 && told[1].hold_ms > 0,
        "{:?}",
        told[1]
    );
    let _ = waiting.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_can_start_with_the_current_holders_and_queue() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    for holder in ["one", "two"] {
        client
            .acquire(proto::AcquireRequest {
                limit: Some(2),
                kind: "pool".into(),
                metadata: [("who".to_owned(), holder.to_owned())].into(),
                ..ns_acquire("s-sem", holder)
            })
            .await
            .unwrap();
    }
    // A short lease the watcher never saw acquired: it is still told at
    // its end, from the initial state.
    client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(1_500),
            ..ns_acquire("s-mutex", "brief")
        })
        .await
        .unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                limit: Some(2),
                wait_ms: 10_000,
                ..ns_acquire("s-sem", "third")
            })
            .await
    });
    until_waiters_in(&mut client, "s-sem", 1).await;
    // Unwatched locks stay out.
    client.acquire(ns_acquire("other", "x")).await.unwrap();

    let mut watcher = server.client().await;
    let mut events = Events::open(
        &mut watcher,
        proto::WatchRequest {
            initial_state: true,
            ..watch_prefix("s-")
        },
    )
    .await;
    let mut state = Vec::new();
    loop {
        let event = events.next().await;
        if event.event == "synced" {
            assert!(event.name.is_empty());
            break;
        }
        state.push(event);
    }
    state.sort_by(|a, b| (&a.name, &a.event, a.slot).cmp(&(&b.name, &b.event, b.slot)));
    let summary: Vec<_> = state
        .iter()
        .map(|e| (e.name.as_str(), e.event.as_str(), e.holder.as_str(), e.slot))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("s-mutex", "held", "brief", 1),
            ("s-sem", "held", "one", 1),
            ("s-sem", "held", "two", 2),
            ("s-sem", "waiting", "third", 0),
        ]
    );
    assert_eq!(state[1].kind, "pool");
    assert_eq!(
        state[1].metadata.get("who").map(String::as_str),
        Some("one")
    );
    assert!(state[1].fencing_token > 0 && state[1].expires_at_ms > state[1].at_ms);

    // Then the changes, among them the brief lease's end.
    let expired = events.next_of("s-mutex").await;
    assert_eq!(what(&expired), ("expired", "brief", "reaper"));
    assert!(expired.at_ms - expired.expires_at_ms <= 150, "{expired:?}");
    client.release(ns_release("s-sem", "one")).await.unwrap();
    let released = events.next_of("s-sem").await;
    assert_eq!(what(&released), ("released", "one", "holder"));
    let granted = events.next_of("s-sem").await;
    assert_eq!(what(&granted), ("acquired", "third", "holder"));
    waiting.await.unwrap().unwrap();
}

// The Session messages may gain fields: the struct updates keep this test
// building when they do.
#[allow(clippy::needless_update)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_renewals_are_extensions_and_a_renewal_that_finds_its_grant_gone_is_lost() {
    use proto::session_request::Command;
    use proto::session_response::Event;
    let server = TestServer::new().start().await;
    let mut watcher = server.client().await;
    let mut client = server.client().await;
    let mut events = Events::open(&mut watcher, watch_name("sess")).await;
    events.until_live(&mut client, "sess").await;

    let (commands, outbox) = tokio::sync::mpsc::channel(4);
    let open = proto::SessionRequest {
        command: Some(Command::Open(proto::SessionOpen {
            ttl_ms: Some(600),
            ..Default::default()
        })),
    };
    let acquire = proto::SessionRequest {
        command: Some(Command::Acquire(proto::SessionAcquire {
            request_id: 1,
            acquire: Some(ns_acquire("sess", "")),
            ..Default::default()
        })),
    };
    commands.send(open).await.unwrap();
    commands.send(acquire).await.unwrap();
    let mut session = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .unwrap()
        .into_inner();
    let acquired = events.next_of("sess").await;
    assert_eq!(
        what(&acquired),
        ("acquired", acquired.holder.as_str(), "holder")
    );
    assert_eq!(acquired.ttl_ms, 600);

    // The server renews the grant every ttl/3: each renewal moves the lease.
    let renewed = events.next_of("sess").await;
    assert_eq!(
        what(&renewed),
        ("extended", acquired.holder.as_str(), "holder")
    );
    assert_eq!(renewed.fencing_token, acquired.fencing_token);
    assert!(
        renewed.expires_at_ms > acquired.expires_at_ms,
        "{renewed:?}"
    );

    // An admin clears the lock; the next renewal finds the grant gone.
    client
        .clear(proto::ClearRequest {
            namespace: NS.into(),
        })
        .await
        .unwrap();
    let mut after = Vec::new();
    while !after.iter().any(|e: &proto::LockEvent| e.event == "lost") {
        after.push(events.next_of("sess").await);
    }
    let kinds: Vec<_> = after.iter().map(what).collect();
    let holder = acquired.holder.as_str();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k != ("extended", holder, "holder"))
            .collect::<Vec<_>>(),
        vec![&("cleared", holder, "admin"), &("lost", holder, "holder")],
        "{after:?}"
    );
    assert_eq!(after.last().unwrap().fencing_token, acquired.fencing_token);
    // The session's client hears it too.
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), session.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(Event::Lost(lost)) = message.event {
            assert_eq!(lost.fencing_token, acquired.fencing_token);
            break;
        }
    }
}

/// Waits until a lock of the namespace has `n` waiters.
async fn until_waiters_in(client: &mut LockServiceClient<Channel>, name: &str, n: u32) {
    for _ in 0..200 {
        let state = client
            .inspect(proto::InspectRequest {
                namespace: NS.into(),
                ..inspect(name)
            })
            .await
            .unwrap()
            .into_inner();
        if state.waiters >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name} never had {n} waiters");
}
