//! A read/write lock on the dashboard: the lock's JSON says its mode
//! (readers hold it, or its writer) and each holder's and waiter's mode,
//! as Inspect and Queue do; a plain lock's JSON says none; the page's
//! script shows them (the browser test, `dashboard-tests/`, looks at the
//! page itself).

use super::*;

/// A READ or WRITE acquire of the read/write lock `name` (3 readers).
fn rw(name: &str, holder: &str, mode: proto::LockMode) -> proto::AcquireRequest {
    let mut request = proto::AcquireRequest {
        limit: Some(3),
        ..kinded(name, holder, "cache")
    };
    request.set_mode(mode);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_shows_its_mode_and_each_holders_and_waiters() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), false).await;
    let mut client = server.client().await;
    // Two readers hold `catalog`; a writer waits behind them.
    let read = |reader| rw("catalog", reader, proto::LockMode::Read);
    let writer = rw("catalog", "writer-1", proto::LockMode::Write);
    let held = vec![read("reader-1"), read("reader-2")];
    let _writer = holders_and_a_waiter(&server, "catalog", held, writer).await;

    let (status, lock) = server.get_json("/api/v1/locks/catalog").await;
    assert_eq!(status, 200, "{lock}");
    // The lock: readers hold it, up to 3 at once.
    assert_eq!(lock["mode"], "LOCK_MODE_READ", "{lock}");
    assert_eq!(lock["limit"], 3);
    assert_eq!(lock["waiters"], 1);
    // Each holder: a reader.
    let holders: Vec<(&str, &str)> = items(&lock["holders"])
        .iter()
        .map(|h| {
            let grant = &h["grant"];
            (
                grant["holder"].as_str().unwrap(),
                grant["mode"].as_str().unwrap_or("(none)"),
            )
        })
        .collect();
    assert_eq!(
        holders,
        [
            ("reader-1", "LOCK_MODE_READ"),
            ("reader-2", "LOCK_MODE_READ")
        ]
    );
    // The waiter: a writer, first in line.
    let queued = items(&lock["queue"]["requests"]);
    assert_eq!(queued.len(), 1, "{lock}");
    assert_eq!(queued[0]["holder"], "writer-1");
    assert_eq!(queued[0]["mode"], "LOCK_MODE_WRITE");
    assert_eq!(queued[0]["position"], 1);
    // What Inspect and Queue answer over gRPC, in the one JSON dialect.
    let inspect = client
        .inspect(proto::InspectRequest {
            name: "catalog".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inspect.mode(), proto::LockMode::Read);
    let queue = client
        .queue(proto::QueueRequest {
            name: "catalog".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        lock["queue"]["requests"],
        serde_json::to_value(&queue.requests).unwrap()
    );

    // The readers leave: the writer holds it, and the lock says so.
    for reader in ["reader-1", "reader-2"] {
        client.release(release("catalog", reader)).await.unwrap();
    }
    until_waiters(&mut client, "catalog", 0).await;
    let (_, lock) = server.get_json("/api/v1/locks/catalog").await;
    assert_eq!(lock["mode"], "LOCK_MODE_WRITE", "{lock}");
    let holders = items(&lock["holders"]);
    assert_eq!(holders.len(), 1, "{lock}");
    assert_eq!(holders[0]["grant"]["holder"], "writer-1");
    assert_eq!(holders[0]["grant"]["mode"], "LOCK_MODE_WRITE");

    // A plain lock says no mode (proto3 JSON leaves the default out).
    client.acquire(acquire("plain", "p-1")).await.unwrap();
    let (_, plain) = server.get_json("/api/v1/locks/plain").await;
    assert!(plain.get("mode").is_none(), "{plain}");
    assert!(
        plain["holders"][0]["grant"].get("mode").is_none(),
        "{plain}"
    );

    // The lock page's script shows the mode, and each holder's and
    // waiter's, from these fields.
    let (status, js) = server.get("/dashboard/assets/app.js").await;
    assert_eq!(status, 200);
    for needle in [
        "LOCK_MODE_READ",
        "LOCK_MODE_WRITE",
        "modeBadge(g.mode)",
        "modeBadge(r.mode)",
        "rwNote(",
    ] {
        assert!(js.contains(needle), "app.js lacks {needle}");
    }
}
