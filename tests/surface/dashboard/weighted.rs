//! Weighted permits on the dashboard (decision 0075): a semaphore's JSON
//! says its permits in use, each holder's permits and slots and each
//! waiter's permits, as Inspect and Queue do; the locks list says the
//! permits in use; a plain lock's JSON says one permit per holder. The
//! page's script shows them (the browser test, `dashboard-tests/`, looks
//! at the page itself).

use super::*;

/// An acquire of `permits` of the semaphore `pool` (limit 5).
fn weighted(holder: &str, permits: u32) -> proto::AcquireRequest {
    proto::AcquireRequest {
        limit: Some(5),
        permits: Some(permits),
        ..kinded("pool", holder, "batch")
    }
}

/// Each holder of a lock's JSON: holder, permits, slots.
fn holders_of(lock: &Value) -> Vec<(String, i64, Vec<i64>)> {
    items(&lock["holders"])
        .iter()
        .map(|h| {
            let grant = &h["grant"];
            (
                grant["holder"].as_str().unwrap().to_owned(),
                int(&grant["permits"]),
                items(&grant["slots"]).iter().map(int).collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_shows_its_permits_in_use_and_each_holders_and_waiters() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let mut client = server.client().await;
    // big-job holds 3 of 5 permits, small-job 1; pair-job waits for 2.
    let held = vec![weighted("big-job", 3), weighted("small-job", 1)];
    let pair_job = holders_and_a_waiter(&server, "pool", held, weighted("pair-job", 2)).await;

    let (status, lock) = server.get_json("/api/v1/locks/pool").await;
    assert_eq!(status, 200, "{lock}");
    // The lock: 4 of its 5 permits in use, by two holders.
    assert_eq!(lock["permitsInUse"], 4, "{lock}");
    assert_eq!(lock["limit"], 5);
    assert_eq!(lock["waiters"], 1);
    assert_eq!(
        holders_of(&lock),
        [
            ("big-job".to_owned(), 3, vec![1, 2, 3]),
            ("small-job".to_owned(), 1, vec![4]),
        ]
    );
    // The waiter asks 2, first in line.
    let queued = items(&lock["queue"]["requests"]);
    assert_eq!(queued.len(), 1, "{lock}");
    assert_eq!(queued[0]["holder"], "pair-job");
    assert_eq!(queued[0]["permits"], 2);
    assert_eq!(queued[0]["position"], 1);
    // What Inspect and Queue answer over gRPC, in the one JSON dialect.
    let inspect = client.inspect(inspect("pool")).await.unwrap().into_inner();
    assert_eq!(inspect.permits_in_use, 4);
    let grants: Vec<Value> = (inspect.holders.iter())
        .map(|h| serde_json::to_value(h.grant.as_ref().unwrap()).unwrap())
        .collect();
    let shown: Vec<&Value> = items(&lock["holders"])
        .iter()
        .map(|h| &h["grant"])
        .collect();
    assert_eq!(shown, grants.iter().collect::<Vec<_>>());
    let queue = client
        .queue(proto::QueueRequest {
            name: "pool".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        lock["queue"]["requests"],
        serde_json::to_value(&queue.requests).unwrap()
    );

    // The locks list: the permits in use (List's holders count them too).
    client.acquire(acquire("plain", "p-1")).await.unwrap();
    let (status, page) = server.get_json("/api/v1/locks").await;
    assert_eq!(status, 200, "{page}");
    let rows: Vec<(&str, i64, i64, i64)> = items(&page["locks"])
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap(),
                int(&l["permitsInUse"]),
                int(&l["holders"]),
                int(&l["limit"]),
            )
        })
        .collect();
    assert_eq!(rows, [("plain", 1, 1, 1), ("pool", 4, 4, 5)]);

    // big-job leaves: pair-job gets 2 permits, the two smallest free slots.
    client.release(release("pool", "big-job")).await.unwrap();
    let granted = pair_job.await.unwrap();
    assert_eq!(granted.status(), proto::AcquireStatus::Acquired);
    let (_, lock) = server.get_json("/api/v1/locks/pool").await;
    assert_eq!(lock["permitsInUse"], 3, "{lock}");
    assert_eq!(
        holders_of(&lock),
        [
            ("pair-job".to_owned(), 2, vec![1, 2]),
            ("small-job".to_owned(), 1, vec![4]),
        ]
    );
    assert!(items(&lock["queue"]["requests"]).is_empty(), "{lock}");

    // A plain lock: one permit, one slot, for its one holder.
    let (_, plain) = server.get_json("/api/v1/locks/plain").await;
    assert_eq!(plain["permitsInUse"], 1, "{plain}");
    assert_eq!(holders_of(&plain), [("p-1".to_owned(), 1, vec![1])]);

    // The pages' script shows them from these fields: the lists' column,
    // the lock page's card and each holder's and waiter's permits.
    let (status, js) = server.get("/dashboard/assets/app.js").await;
    assert_eq!(status, 200);
    for needle in [
        "l.permitsInUse",
        "d.permitsInUse",
        "\"Permits in use\"",
        "list(g.slots)",
        "int(g.permits)",
        "int(r.permits)",
    ] {
        assert!(js.contains(needle), "app.js lacks {needle}");
    }
}
