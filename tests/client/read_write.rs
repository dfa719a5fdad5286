//! Read/write locks through the Rust client: readers share, a writer
//! waits for them and gets a higher token, an upgrade and a plain acquire
//! of the held lock are FAILED_PRECONDITION, a downgrade keeps the grant
//! and its token, and a reader with `prefer_readers` passes a waiting
//! writer. Weighted permits: a grant of k permits keeps its k slots
//! across the watchdog's renewals, and a request that does not fit waits.

use std::time::Duration;

use super::{client_of, holders, queued};
use crate::common::wait::wait_until_async;
use crate::common::{TestServer, proto};
use tumbler_client::Mode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_writer_waits_and_a_downgrade_keeps_the_token() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let ttl = Duration::from_secs(30);

    let reader_a = client
        .lock("rw")
        .holder("a")
        .read()
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let reader_b = client
        .lock("rw")
        .mode(Mode::Read)
        .holder("b")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    assert_eq!(reader_a.mode(), Some(Mode::Read));
    assert_eq!(reader_b.mode(), Some(Mode::Read));
    assert_eq!(holders(&client, "rw").await.len(), 2, "two readers at once");

    // An upgrade is refused: two upgraders would wait for each other.
    let upgrade = client
        .lock("rw")
        .holder("a")
        .write()
        .acquire()
        .await
        .unwrap_err();
    assert_eq!(
        upgrade.code(),
        Some(tonic::Code::FailedPrecondition),
        "{upgrade:?}"
    );
    // So is a plain acquire of the held read/write lock.
    let plain = client.lock("rw").holder("p").acquire().await.unwrap_err();
    assert_eq!(
        plain.code(),
        Some(tonic::Code::FailedPrecondition),
        "{plain:?}"
    );

    let writer = tokio::spawn(
        client
            .lock("rw")
            .holder("w")
            .write()
            .ttl(ttl)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    wait_until_async("the writer queued", Duration::from_secs(5), || async {
        queued(&client, "rw").await == ["w"]
    })
    .await;
    let queue = client.queue("rw").await.unwrap();
    assert_eq!(queue.requests[0].mode(), proto::LockMode::Write);
    // A reader behind a waiting writer waits behind it.
    let late = client
        .lock("rw")
        .holder("c")
        .read()
        .acquire()
        .await
        .unwrap_err();
    assert!(late.is_busy(), "{late:?}");

    let highest = reader_a.fencing_token().max(reader_b.fencing_token());
    assert!(reader_a.release().await.unwrap());
    assert_eq!(
        queued(&client, "rw").await,
        ["w"],
        "the writer waits while a reader holds"
    );
    assert!(reader_b.release().await.unwrap());
    let writer = writer.await.unwrap().unwrap();
    assert_eq!(writer.mode(), Some(Mode::Write));
    assert!(writer.fencing_token() > highest);
    let info = client.inspect("rw").await.unwrap();
    assert_eq!(info.mode(), proto::LockMode::Write);

    // Downgraded: the same grant, now a reader; other readers join it.
    let token = writer.fencing_token();
    writer.downgrade().await.unwrap();
    assert_eq!(writer.mode(), Some(Mode::Read));
    assert_eq!(writer.fencing_token(), token);
    assert_eq!(
        client.inspect("rw").await.unwrap().mode(),
        proto::LockMode::Read
    );
    let joined = client
        .lock("rw")
        .holder("d")
        .read()
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    assert_eq!(holders(&client, "rw").await.len(), 2);
    assert!(joined.release().await.unwrap());
    assert!(writer.release().await.unwrap());
    assert!(holders(&client, "rw").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_prefers_readers_passes_a_waiting_writer() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let ttl = Duration::from_secs(30);
    let first = client
        .lock("rwp")
        .holder("a")
        .read()
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let writer = tokio::spawn(
        client
            .lock("rwp")
            .holder("w")
            .write()
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    wait_until_async("the writer queued", Duration::from_secs(5), || async {
        queued(&client, "rwp").await == ["w"]
    })
    .await;
    let barging = client
        .lock("rwp")
        .holder("b")
        .read()
        .prefer_readers(true)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    assert_eq!(barging.mode(), Some(Mode::Read));
    assert!(barging.release().await.unwrap());
    assert!(first.release().await.unwrap());
    let writer = writer.await.unwrap().unwrap();
    assert!(writer.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_grant_keeps_its_slots_across_renewals_and_a_big_request_waits() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let big = client
        .lock("pool")
        .holder("big")
        .limit(4)
        .permits(3)
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    assert_eq!(big.permits(), 3);
    assert_eq!(big.slots(), vec![1, 2, 3]);
    // The watchdog renews the 600 ms lease; the grant keeps its permits.
    let token = big.fencing_token();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!big.is_lost(), "renewed by the watchdog");
    let info = client.inspect("pool").await.unwrap();
    assert_eq!(info.permits_in_use, 3, "{info:?}");
    assert_eq!(
        holders(&client, "pool").await,
        vec![("big".to_owned(), token)]
    );

    // Two more do not fit in the one left: the request waits in line.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("pool")
                .holder("pair")
                .limit(4)
                .permits(2)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    wait_until_async("the pair queued", Duration::from_secs(10), || async {
        queued(&client, "pool").await == vec!["pair".to_owned()]
    })
    .await;
    big.release().await.unwrap();
    let pair = waiting.await.unwrap().unwrap();
    assert_eq!(pair.permits(), 2);
    assert_eq!(pair.slots(), vec![1, 2]);
    assert!(pair.fencing_token() > token);
    let refused = client.lock("pool").limit(4).permits(5).acquire().await;
    assert!(
        matches!(&refused, Err(tumbler_client::Error::InvalidArgument { message })
            if message.starts_with("permits:")),
        "{refused:?}"
    );
    pair.release().await.unwrap();
}
