//! Read/write locks (decision 0074) in what the service tells about locks:
//! Watch events and the changelog say the mode of the grant (or of the
//! waiting request) each event is about, a writer's downgrade is its own
//! `downgraded` event, a plain lock's events have no mode, a changelog
//! entry stored before modes existed still reads, and List shows each
//! lock's mode.

use crate::changelog::{Server, args};
use crate::read_write::{granted, let_go, read, waiting, write};
use crate::watch::{until_live, watch};
use crate::{common, queue};

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use proto::LockMode;
use queue::{spawn_wait, until_queued};
use serde_json::Value;

async fn next(events: &mut tonic::Streaming<proto::LockEvent>) -> proto::LockEvent {
    tokio::time::timeout(Duration::from_secs(5), events.message())
        .await
        .expect("an event within 5 s")
        .unwrap()
        .expect("the stream goes on")
}

/// (event, holder, mode, actor) of the next event.
async fn next_of(
    events: &mut tonic::Streaming<proto::LockEvent>,
) -> (String, String, LockMode, String) {
    let event = next(events).await;
    let mode = event.mode();
    (event.event, event.holder, mode, event.actor)
}

fn ev(event: &str, holder: &str, mode: LockMode) -> (String, String, LockMode, String) {
    (event.into(), holder.into(), mode, "holder".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_see_the_mode_of_each_grant_and_request_and_the_downgrade() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut watcher = server.client().await;
    let mut events = watch(
        &mut watcher,
        proto::WatchRequest {
            prefix: "rwe-".into(),
            ..Default::default()
        },
    )
    .await;
    until_live(&mut client, &mut events, "", "rwe-probe").await;

    let writer = granted(&mut client, write("rwe-doc", "w")).await;
    assert_eq!(
        next_of(&mut events).await,
        ev("acquired", "w", LockMode::Write)
    );
    let reader = spawn_wait(
        server.client().await,
        waiting(read("rwe-doc", "r1"), 15_000),
    );
    until_queued(&mut client, "rwe-doc", 1).await;
    assert_eq!(
        next_of(&mut events).await,
        ev("queued", "r1", LockMode::Read)
    );

    // The initial state says the modes too.
    let mut state = watch(
        &mut watcher,
        proto::WatchRequest {
            name: "rwe-doc".into(),
            initial_state: true,
            ..Default::default()
        },
    )
    .await;
    let held = next(&mut state).await;
    assert_eq!(
        (held.event.as_str(), held.holder.as_str(), held.mode()),
        ("held", "w", LockMode::Write)
    );
    let queued = next(&mut state).await;
    assert_eq!(
        (queued.event.as_str(), queued.holder.as_str(), queued.mode()),
        ("waiting", "r1", LockMode::Read)
    );
    assert_eq!(next(&mut state).await.event, "synced");

    // The writer asks READ: downgraded (its grant, same token), then the
    // waiting reader comes in.
    granted(&mut client, read("rwe-doc", "w")).await;
    let downgraded = next(&mut events).await;
    assert_eq!(
        (
            downgraded.event.as_str(),
            downgraded.holder.as_str(),
            downgraded.mode(),
            downgraded.actor.as_str()
        ),
        ("downgraded", "w", LockMode::Read, "holder")
    );
    assert_eq!(downgraded.fencing_token, writer.fencing_token);
    assert_eq!(downgraded.slot, writer.slot);
    assert!(downgraded.expires_at_ms > 0, "{downgraded:?}");
    assert_eq!(
        next_of(&mut events).await,
        ev("acquired", "r1", LockMode::Read)
    );
    crate::read_write::grant_of(reader).await;
    let_go(&mut client, "rwe-doc", "w").await;
    assert_eq!(
        next_of(&mut events).await,
        ev("released", "w", LockMode::Read)
    );
    let_go(&mut client, "rwe-doc", "r1").await;
    assert_eq!(
        next_of(&mut events).await,
        ev("released", "r1", LockMode::Read)
    );

    // A writer's release says WRITE (its lock turns read-held, or goes,
    // as it leaves).
    granted(&mut client, write("rwe-doc", "w2")).await;
    assert_eq!(
        next_of(&mut events).await,
        ev("acquired", "w2", LockMode::Write)
    );
    let_go(&mut client, "rwe-doc", "w2").await;
    assert_eq!(
        next_of(&mut events).await,
        ev("released", "w2", LockMode::Write)
    );

    // A plain lock's events have no mode and the plain actor.
    client.acquire(acquire("rwe-plain", "p")).await.unwrap();
    client.release(release("rwe-plain", "p")).await.unwrap();
    assert_eq!(
        next_of(&mut events).await,
        ev("acquired", "p", LockMode::Unspecified)
    );
    assert_eq!(
        next_of(&mut events).await,
        ev("released", "p", LockMode::Unspecified)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_lease_end_and_a_readers_timeout_say_their_modes() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut watcher = server.client().await;
    let mut events = watch(
        &mut watcher,
        proto::WatchRequest {
            prefix: "rwx-".into(),
            ..Default::default()
        },
    )
    .await;
    until_live(&mut client, &mut events, "", "rwx-probe").await;
    granted(
        &mut client,
        proto::AcquireRequest {
            ttl_ms: Some(1_000),
            ..write("rwx-doc", "w")
        },
    )
    .await;
    assert_eq!(
        next_of(&mut events).await,
        ev("acquired", "w", LockMode::Write)
    );
    // A reader waits less than the lease: it leaves as a reader.
    let reply = crate::read_write::ask(&mut client, waiting(read("rwx-doc", "r"), 200)).await;
    assert_eq!(
        reply.status(),
        proto::AcquireStatus::NotAcquired,
        "{reply:?}"
    );
    assert_eq!(
        next_of(&mut events).await,
        ev("queued", "r", LockMode::Read)
    );
    assert_eq!(
        next_of(&mut events).await,
        ev("dequeued", "r", LockMode::Read)
    );
    // The writer's lease ends: expired, as the writer it was (its lock's
    // letter turns 'r' as the grant goes, in the same call).
    let expired = next(&mut events).await;
    assert_eq!(
        (
            expired.event.as_str(),
            expired.holder.as_str(),
            expired.mode(),
            expired.actor.as_str()
        ),
        ("expired", "w", LockMode::Write, "reaper")
    );
}

/// (event, holder, mode) of each changelog entry, newest first.
fn logged(page: &Value) -> Vec<(String, String, String)> {
    page["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {page}"))
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["holder"].as_str().unwrap().to_owned(),
                e["mode"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn entry(event: &str, holder: &str, mode: &str) -> (String, String, String) {
    (event.into(), holder.into(), mode.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_changelog_keeps_the_modes_and_reads_entries_stored_before_them() {
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["*"], 1000, 60_000, 1)).await;
    let mut client = server.client().await;
    granted(&mut client, write("doc", "w")).await;
    granted(&mut client, read("doc", "w")).await;
    let_go(&mut client, "doc", "w").await;
    client.acquire(acquire("plain", "p")).await.unwrap();

    let (status, page) = server.changelog("").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        logged(&page),
        vec![
            entry("acquired", "p", ""),
            entry("released", "w", "LOCK_MODE_READ"),
            entry("downgraded", "w", "LOCK_MODE_READ"),
            entry("acquired", "w", "LOCK_MODE_WRITE"),
        ]
    );
    assert_eq!(page["events"][1]["actor"], "holder");
    let (_, only) = server.changelog("event=downgraded").await;
    assert_eq!(
        logged(&only),
        vec![entry("downgraded", "w", "LOCK_MODE_READ")]
    );

    // An entry as the format before modes wrote it (a plain lock's is the
    // same bytes today), pushed by hand after the newest: it reads back.
    let newest: i64 = page["events"][0]["atMs"].as_str().unwrap().parse().unwrap();
    let mut conn = redis_conn(&redis.url()).await;
    let keys = scan_keys(&mut conn, "tumbler:{default:*}:c").await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    // As stored: a plain lock's entry is the format before modes (its
    // actor line "holder", 14 lines); a read/write lock's says the mode
    // on that same line.
    let stored: Vec<String> = redis::cmd("LRANGE")
        .arg(&keys[0])
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let actors: Vec<(&str, &str, usize)> = stored
        .iter()
        .map(|entry| {
            let lines: Vec<&str> = entry.split('\n').collect();
            (lines[2], lines[12], lines.len())
        })
        .collect();
    assert_eq!(
        actors,
        vec![
            ("acquired", "holder", 14),
            ("released", "holder:r", 14),
            ("downgraded", "holder:r", 14),
            ("acquired", "holder:w", 14),
        ]
    );
    let at = newest + 1;
    let old = format!(
        "default\nold-lock\nreleased\nold-holder\n7\n{at}\n1\nreport\n30000\n{}\n{}\n250\nholder\n{{\"job\":\"42\"}}",
        at + 30_000,
        at - 250
    );
    let _: i64 = redis::cmd("LPUSH")
        .arg(&keys[0])
        .arg(&old)
        .query_async(&mut conn)
        .await
        .unwrap();
    // (Another query than the first: a read's answer serves the same
    // read for a second.)
    let (status, page) = server.changelog("limit=10").await;
    assert_eq!(status, 200, "{page}");
    let first = &page["events"][0];
    assert_eq!(
        (
            first["event"].as_str(),
            first["name"].as_str(),
            first["holder"].as_str(),
            first["actor"].as_str(),
            first["fencingToken"].as_str(),
            first["holdMs"].as_str(),
            first["kind"].as_str(),
            first["metadata"]["job"].as_str(),
        ),
        (
            Some("released"),
            Some("old-lock"),
            Some("old-holder"),
            Some("holder"),
            Some("7"),
            Some("250"),
            Some("report"),
            Some("42")
        ),
        "{page}"
    );
    assert!(first.get("mode").is_none(), "{first}");
    assert_eq!(logged(&page).len(), 5, "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_each_locks_mode() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    granted(&mut client, write("rwl-writer", "w")).await;
    granted(&mut client, read("rwl-readers", "r1")).await;
    granted(&mut client, read("rwl-readers", "r2")).await;
    client.acquire(acquire("rwl-plain", "p")).await.unwrap();
    // A writer with a reader waiting behind it; then that reader holds.
    granted(&mut client, write("rwl-waited", "w")).await;
    let waiter = spawn_wait(
        server.client().await,
        waiting(read("rwl-waited", "r"), 15_000),
    );
    until_queued(&mut client, "rwl-waited", 1).await;

    let page = client
        .list(proto::ListRequest {
            prefix: "rwl-".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let modes: BTreeMap<String, (LockMode, u32)> = page
        .locks
        .iter()
        .map(|lock| (lock.name.clone(), (lock.mode(), lock.holders)))
        .collect();
    assert_eq!(
        modes,
        BTreeMap::from([
            ("rwl-plain".to_owned(), (LockMode::Unspecified, 1)),
            ("rwl-readers".to_owned(), (LockMode::Read, 2)),
            ("rwl-waited".to_owned(), (LockMode::Write, 1)),
            ("rwl-writer".to_owned(), (LockMode::Write, 1)),
        ])
    );
    let_go(&mut client, "rwl-waited", "w").await;
    crate::read_write::grant_of(waiter).await;
    let page = client
        .list(proto::ListRequest {
            prefix: "rwl-waited".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.locks.len(), 1, "{page:?}");
    assert_eq!(page.locks[0].mode(), LockMode::Read);
}
