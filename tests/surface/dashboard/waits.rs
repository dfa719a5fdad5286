//! The namespace's wait-for chains (decision 0077) on the dashboard:
//! `GET /api/v1/waits` answers the chains of waiting holders that may hold
//! other locks, read access as every endpoint; the overview page's script
//! shows them.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waits_endpoint_answers_the_namespaces_chains() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let mut client = server.client().await;
    // a waits for y (held by b), b waits for z (held by c): one chain.
    for (name, holder) in [("y", "b"), ("z", "c")] {
        let reply = client.acquire(acquire(name, holder)).await.unwrap();
        assert_eq!(reply.into_inner().status(), proto::AcquireStatus::Acquired);
    }
    let mut waiters = Vec::new();
    for (name, holder) in [("y", "a"), ("z", "b")] {
        let mut waiting = server.client().await;
        waiters.push(tokio::spawn(async move {
            waiting
                .acquire(proto::AcquireRequest {
                    wait_ms: 30_000,
                    ..acquire(name, holder)
                })
                .await
        }));
    }
    let chains = common::wait::wait_for("the chain", Duration::from_secs(10), || async {
        let (status, body) = server.get_json("/api/v1/waits").await;
        assert_eq!(status, 200, "{body}");
        let chains = items(&body["chains"]).to_vec();
        (chains.len() == 1 && items(&chains[0]).len() == 2).then_some(chains)
    })
    .await;
    let steps: Vec<(&str, &str, &str)> = items(&chains[0])
        .iter()
        .map(|step| {
            (
                step["holder"].as_str().unwrap(),
                step["lock"].as_str().unwrap(),
                step["heldBy"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(steps, [("a", "y", "b"), ("b", "z", "c")]);

    // Another namespace has none; a bad one is the 400 naming its field.
    let (status, body) = server.get_json("/api/v1/waits?namespace=other").await;
    assert_eq!((status, items(&body["chains"]).len()), (200, 0), "{body}");
    let (status, body) = server.get_json("/api/v1/waits?namespace=a%20b").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("namespace"),
        "{body}"
    );

    // When the waits end, the chains are gone.
    client.release(release("z", "c")).await.unwrap();
    client.release(release("y", "b")).await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    common::wait::wait_until_async("no chains", Duration::from_secs(10), || async {
        let (_, body) = server.get_json("/api/v1/waits").await;
        items(&body["chains"]).is_empty()
    })
    .await;
}
