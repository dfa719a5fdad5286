//! `tumbler upgrade-layout` (decision 0090): data of key layout 3 upgraded
//! to layout 4 in place, with real processes. A v4 replica refuses v3 data
//! before the upgrade; the upgrade refuses while a replica still listens or
//! another version's library was just named; it deletes the old layout's
//! queue keys and nothing else, keeps held locks and their fencing tokens,
//! and moves the record only from v3.

use crate::common;

use std::process::{Command, Output};

use common::*;
use proto::{AcquireStatus, ReleaseStatus};

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

/// `tumbler upgrade-layout` against `redis_url`, with `flags`.
fn upgrade(redis_url: &str, flags: &[&str]) -> Output {
    Command::new(TUMBLER)
        .args(["upgrade-layout", "--redis-url", redis_url])
        .args(flags)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn scan(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .query_async(conn)
            .await
            .unwrap();
        keys.extend(found);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_3_data_is_upgraded_in_place_keeping_held_locks() {
    let redis = start_redis();
    let url = redis.url();
    let mut conn = redis_conn(&url).await;

    // A deployment's held locks, as v3 wrote them (a lock nobody waits for
    // is the same in both layouts): one of them named like a queue key.
    let (token, hostile_key) = {
        let server = TumblerProcess::start(&url, &[]).await;
        let mut client = server.client().await;
        let held = client
            .acquire(proto::AcquireRequest {
                ttl_ms: Some(120_000),
                ..acquire("kept", "owner")
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(held.status(), AcquireStatus::Acquired);
        let odd = client.acquire(acquire("a}:d:b", "owner")).await.unwrap();
        assert_eq!(odd.into_inner().status(), AcquireStatus::Acquired);
        let hostile = scan(&mut conn, "tumbler:*:l:a}:d:b").await;
        assert_eq!(hostile.len(), 1, "{hostile:?}");
        (held.grant.unwrap().fencing_token, hostile[0].clone())
    };
    // v3's record, and the queue keys a v3 replica's waiters left behind.
    let _: () = redis::cmd("HSET")
        .arg("tumbler:meta")
        .arg("layout")
        .arg("v3/32 shards")
        .query_async(&mut conn)
        .await
        .unwrap();
    for (kind, command, value) in [
        ("q", "ZADD", "1"),
        ("d", "ZADD", "2"),
        ("w", "HSET", "0|1|2|1|"),
    ] {
        let key = format!("tumbler:{{default:3}}:{kind}:waited");
        let cmd = redis::cmd(command).arg(&key).clone();
        let cmd = if command == "ZADD" {
            cmd.clone().arg(value).arg("gone").clone()
        } else {
            cmd.clone().arg("gone").arg(value).clone()
        };
        let () = cmd.query_async(&mut conn).await.unwrap();
    }

    // A v4 replica refuses v3 data, saying what it found.
    let refused = Command::new(TUMBLER)
        .args([
            "serve",
            "--no-auth",
            "--redis-url",
            &url,
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("v3/32 shards"),
        "{}",
        text(&refused)
    );

    // Something still listens on the wake channel (a replica runs): refused.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut listener = client.get_async_pubsub().await.unwrap();
    listener.subscribe("tumbler:wake").await.unwrap();
    let out = upgrade(&url, &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("replicas still run"), "{}", text(&out));
    drop(listener);

    // Another version's library named a moment ago: refused too.
    let (now, _): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg("tumbler:libraries")
        .arg("tumbler_0ld")
        .arg(now * 1000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let listening = |out: &Output| text(out).contains("subscription");
    let mut out = upgrade(&url, &[]);
    // (The dropped subscription may take a moment to leave.)
    for _ in 0..50 {
        if !listening(&out) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        out = upgrade(&url, &[]);
    }
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("tumbler_0ld"), "{}", text(&out));
    assert_eq!(
        scan(&mut conn, "tumbler:*:[qdw]:waited").await.len(),
        3,
        "a refused upgrade changes nothing"
    );

    // Its replicas are gone: --force goes on. The queue keys go, nothing
    // else does, and the record moves on.
    let out = upgrade(&url, &["--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("upgraded v3/32 shards to v4/32 shards: 3 queue key(s)"),
        "{}",
        text(&out)
    );
    assert!(scan(&mut conn, "tumbler:*:[qdw]:waited").await.is_empty());
    assert_eq!(scan(&mut conn, &hostile_key).await, vec![hostile_key]);
    let record: String = redis::cmd("HGET")
        .arg("tumbler:meta")
        .arg("layout")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(record, "v4/32 shards");

    // v4 serves: the held lock is still held, with its token; its owner
    // releases it pinned to that token; the next grant's token is higher.
    let server = TumblerProcess::start(&url, &[]).await;
    let mut client = server.client().await;
    let busy = client.acquire(acquire("kept", "other")).await.unwrap();
    assert_eq!(busy.into_inner().status(), AcquireStatus::NotAcquired);
    let released = client
        .release(proto::ReleaseRequest {
            fencing_token: Some(token),
            ..release("kept", "owner")
        })
        .await
        .unwrap();
    assert_eq!(released.into_inner().status(), ReleaseStatus::Released);
    let next = client
        .acquire(acquire("kept", "other"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.status(), AcquireStatus::Acquired);
    assert!(next.grant.unwrap().fencing_token > token);

    // Once is enough: a second run changes nothing.
    let again = upgrade(&url, &[]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("nothing to upgrade"),
        "{}",
        text(&again)
    );
}
