//! The Watch stream: lock events as they happen, on any replica, and a
//! slow watcher dropped without slowing the service.

use crate::common;

use std::time::Duration;

use common::*;
use proto::lock_service_client::LockServiceClient;
use tonic::transport::Channel;

pub(super) async fn watch(
    client: &mut LockServiceClient<Channel>,
    request: proto::WatchRequest,
) -> tonic::Streaming<proto::LockEvent> {
    client.watch(request).await.unwrap().into_inner()
}

/// Waits until the watch is live: probe events on `probe` until one shows.
pub(super) async fn until_live(
    client: &mut LockServiceClient<Channel>,
    events: &mut tonic::Streaming<proto::LockEvent>,
    namespace: &str,
    probe: &str,
) {
    for _ in 0..200 {
        client
            .acquire(proto::AcquireRequest {
                namespace: namespace.into(),
                ..acquire(probe, "probe")
            })
            .await
            .unwrap();
        client
            .release(proto::ReleaseRequest {
                namespace: namespace.into(),
                ..release(probe, "probe")
            })
            .await
            .unwrap();
        if let Ok(Some(Ok(_))) =
            tokio::time::timeout(Duration::from_millis(50), futures::StreamExt::next(events)).await
        {
            // Drain the rest of the probe's events.
            while let Ok(Some(Ok(_))) =
                tokio::time::timeout(Duration::from_millis(50), futures::StreamExt::next(events))
                    .await
            {}
            return;
        }
    }
    panic!("the watch never went live");
}

async fn next_event(events: &mut tonic::Streaming<proto::LockEvent>) -> (String, String, String) {
    let event = tokio::time::timeout(Duration::from_secs(5), events.message())
        .await
        .expect("an event within 5 s")
        .unwrap()
        .expect("the stream goes on");
    (event.name, event.event, event.holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_delivers_the_events_of_a_scripted_scenario_from_another_replica() {
    let redis = start_redis();
    let watching = TestServer::new().redis(&redis.url()).start().await;
    let acting = TestServer::new().redis(&redis.url()).start().await;
    let mut watcher = watching.client().await;
    let mut client = acting.client().await;
    let mut events = watch(
        &mut watcher,
        proto::WatchRequest {
            prefix: "w-".into(),
            ..Default::default()
        },
    )
    .await;
    until_live(&mut client, &mut events, "", "w-probe").await;

    let granted = client
        .acquire(acquire("w-1", "a"))
        .await
        .unwrap()
        .into_inner();
    let token_a = granted.grant.unwrap().fencing_token;
    client.acquire(acquire("x-1", "other")).await.unwrap(); // not watched
    let mut waiter = acting.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                wait_ms: 5_000,
                ttl_ms: Some(300),
                ..acquire("w-1", "c")
            })
            .await
    });
    assert_eq!(
        next_event(&mut events).await,
        ("w-1".into(), "acquired".into(), "a".into())
    );
    assert_eq!(
        next_event(&mut events).await,
        ("w-1".into(), "queued".into(), "c".into())
    );
    client.release(release("w-1", "a")).await.unwrap();
    waiting.await.unwrap().unwrap();
    let released = tokio::time::timeout(Duration::from_secs(5), events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (released.event.as_str(), released.holder.as_str()),
        ("released", "a")
    );
    assert_eq!(released.fencing_token, token_a);
    assert!(released.at_ms > 0);
    assert_eq!(
        next_event(&mut events).await,
        ("w-1".into(), "acquired".into(), "c".into())
    );

    // A wait that ends leaves the queue: queued, then dequeued.
    let timed_out = client
        .acquire(proto::AcquireRequest {
            wait_ms: 200,
            ..acquire("w-1", "d")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(timed_out.reason(), proto::NotAcquiredReason::Timeout);
    assert_eq!(
        next_event(&mut events).await,
        ("w-1".into(), "queued".into(), "d".into())
    );
    assert_eq!(
        next_event(&mut events).await,
        ("w-1".into(), "dequeued".into(), "d".into())
    );

    // c's short lease passes; the next script that looks purges it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    client.reap(proto::ReapRequest::default()).await.unwrap();
    assert_eq!(
        next_event(&mut events).await,
        ("w-1".into(), "expired".into(), "c".into())
    );

    // One lock by name: other names stay out.
    let mut one = watch(
        &mut watcher,
        proto::WatchRequest {
            name: "w-2".into(),
            ..Default::default()
        },
    )
    .await;
    until_live(&mut client, &mut one, "", "w-2").await;
    client.acquire(acquire("w-3", "e")).await.unwrap();
    client.acquire(acquire("w-2", "f")).await.unwrap();
    assert_eq!(
        next_event(&mut one).await,
        ("w-2".into(), "acquired".into(), "f".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_dropped_and_the_service_stays_fast() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    // A client that reads nothing holds little in flight: a small HTTP/2
    // window, so the server's side fills up as a stuck client's would.
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .unwrap()
        .initial_stream_window_size(Some(64 * 1024))
        .initial_connection_window_size(Some(64 * 1024))
        .http2_adaptive_window(false)
        .connect()
        .await
        .unwrap();
    let mut watcher = LockServiceClient::new(channel);
    let mut slow = watch(
        &mut watcher,
        proto::WatchRequest {
            namespace: "flood".into(),
            ..Default::default()
        },
    )
    .await;
    until_live(&mut client, &mut slow, "flood", "probe").await;

    // Never read while thousands of events happen; every RPC still completes.
    // (Long names: an HTTP/2 client counts many tiny DATA frames it has not
    // read as a flood and gives up on the connection by itself.)
    let long = "x".repeat(300);
    for i in 0..3_000 {
        let name = format!("f-{}-{long}", i % 50);
        let request = proto::AcquireRequest {
            namespace: "flood".into(),
            ..acquire(&name, "h")
        };
        client.acquire(request).await.unwrap();
        client
            .release(proto::ReleaseRequest {
                namespace: "flood".into(),
                ..release(&name, "h")
            })
            .await
            .unwrap();
    }
    let mut delivered = 0;
    let ending = loop {
        match tokio::time::timeout(Duration::from_secs(5), slow.message()).await {
            Ok(Ok(Some(_))) => delivered += 1,
            Ok(other) => break other,
            Err(_) => panic!("the slow watcher was not dropped ({delivered} events delivered)"),
        }
    };
    let status = ending.expect_err("the stream ends with a status");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("watcher dropped"), "{status:?}");
    assert!(delivered < 6_000, "it got everything: {delivered}");
    println!("slow watcher got {delivered} of 6000 events, then {status:?}");
}
