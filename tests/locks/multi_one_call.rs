//! A held set's Release and Extend as ONE function call (decision 0079):
//! `lua/release_many.lua` and `lua/extend_many.lua` on a real Redis,
//! called directly, so each lock's outcome is seen as the call left it.
//! Extend is all or nothing: one lock lapsed or taken, and no part of
//! the set is extended (what the holder still had is released); Release
//! answers per lock and leaves a lock pinned to another token alone.
//! What a set costs in calls through the server: `multi.rs`.

use crate::model_replay::{keys_of, redis_with_functions};
use std::time::Duration;
use tumbler_engine::scripts::LockScript;

const SHARD: &str = "tumbler:{calls:0}";
/// Reply statuses (lua/shared/numbers.lua).
const OK: i64 = 1;
const LATE: i64 = 7;
const NOT_HELD: i64 = 8;

type Conn = redis::aio::MultiplexedConnection;

/// The keys of `names`, lock after lock.
fn keys(names: &[&str]) -> Vec<String> {
    names.iter().flat_map(|name| keys_of(SHARD, name)).collect()
}

async fn fcall(
    conn: &mut Conn,
    function: &LockScript,
    keys: &[String],
    args: &[&str],
) -> redis::RedisResult<Vec<redis::Value>> {
    redis::cmd("FCALL")
        .arg(&function.function)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await
}

fn int(value: &redis::Value) -> i64 {
    redis::from_redis_value(value.clone()).unwrap()
}

fn text(value: &redis::Value) -> String {
    redis::from_redis_value(value.clone()).unwrap()
}

/// `holder`'s grant record of `name` ('' when it holds none).
async fn record(conn: &mut Conn, name: &str, holder: &str) -> String {
    let record: Option<String> = redis::cmd("HGET")
        .arg(format!("{SHARD}:l:{name}"))
        .arg(format!("h:{holder}"))
        .query_async(conn)
        .await
        .unwrap();
    record.unwrap_or_default()
}

/// A record's lease end (its second field).
fn expiry(record: &str) -> u64 {
    record.split('|').nth(1).unwrap().parse().unwrap()
}

/// A record's fencing token (its third field).
fn token(record: &str) -> String {
    record.split('|').nth(2).unwrap().to_owned()
}

/// `names` taken for `holder` by one acquire_many with a `ttl_ms` lease;
/// the grant records.
async fn take(
    conn: &mut Conn,
    scripts: &tumbler_engine::scripts::Scripts,
    names: &[&str],
    holder: &str,
    ttl_ms: u64,
) -> Vec<String> {
    let ttl = ttl_ms.to_string();
    let args = [
        holder, &ttl, "0", "1", "default", "", "0", "3", "0", &ttl, "", "0",
    ];
    let reply = fcall(conn, &scripts.acquire_many, &keys(names), &args)
        .await
        .unwrap();
    assert_eq!(int(&reply[0]), OK, "{reply:?}");
    let mut records = Vec::new();
    for name in names {
        records.push(record(conn, name, holder).await);
    }
    records
}

#[tokio::test]
async fn extend_many_extends_every_lock_or_none() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    // All held: each lease runs anew, each grant answered in the keys' order.
    let before = take(&mut conn, &scripts, &["a", "b"], "me", 5_000).await;
    let args = ["me", "60000", "0", "0", "3", "", ""];
    let reply = fcall(&mut conn, &scripts.extend_many, &keys(&["a", "b"]), &args)
        .await
        .unwrap();
    assert_eq!((int(&reply[0]), int(&reply[2])), (OK, 2), "{reply:?}");
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let now = record(&mut conn, name, "me").await;
        assert_eq!(int(&reply[3 + 3 * i]), OK);
        assert_eq!(text(&reply[4 + 3 * i]), now);
        assert!(expiry(&now) > expiry(&before[i]) + 50_000, "{name}: {now}");
    }

    // `d` lapsed: NOT_HELD, and `c`, still held, is released, not extended.
    take(&mut conn, &scripts, &["c"], "me", 60_000).await;
    take(&mut conn, &scripts, &["d"], "me", 50).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let reply = fcall(&mut conn, &scripts.extend_many, &keys(&["c", "d"]), &args)
        .await
        .unwrap();
    assert_eq!(int(&reply[0]), NOT_HELD, "{reply:?}");
    assert_eq!(
        (int(&reply[3]), int(&reply[6])),
        (OK, NOT_HELD),
        "{reply:?}"
    );
    assert_eq!(record(&mut conn, "c", "me").await, "");
    assert_eq!(record(&mut conn, "d", "me").await, "");

    // `f` taken by another holder: NOT_HELD, `e` released, `f` untouched.
    take(&mut conn, &scripts, &["e", "f"], "me", 60_000).await;
    let released = fcall(&mut conn, &scripts.release, &keys(&["f"]), &["me"])
        .await
        .unwrap();
    assert_eq!(int(&released[0]), OK);
    let other = take(&mut conn, &scripts, &["f"], "other", 30_000).await;
    let reply = fcall(&mut conn, &scripts.extend_many, &keys(&["e", "f"]), &args)
        .await
        .unwrap();
    assert_eq!(int(&reply[0]), NOT_HELD, "{reply:?}");
    assert_eq!(record(&mut conn, "e", "me").await, "");
    assert_eq!(record(&mut conn, "f", "other").await, other[0]);
    let left: i64 = redis::cmd("EXISTS")
        .arg(format!("{SHARD}:l:e"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "a set's lock nobody holds leaves no key");

    // A token that is not the grant's: nothing of the set is extended.
    let held = take(&mut conn, &scripts, &["g", "h"], "me", 60_000).await;
    let stale = (token(&held[1]).parse::<u64>().unwrap() - 1).to_string();
    let pinned = ["me", "90000", "0", "0", "3", &token(&held[0]), &stale];
    let reply = fcall(&mut conn, &scripts.extend_many, &keys(&["g", "h"]), &pinned)
        .await
        .unwrap();
    assert_eq!(int(&reply[0]), NOT_HELD, "{reply:?}");
    assert_eq!(record(&mut conn, "g", "me").await, "");
    assert_eq!(
        record(&mut conn, "h", "me").await,
        held[1],
        "pinned elsewhere: untouched"
    );
}

#[tokio::test]
async fn extend_many_past_its_answer_by_changes_nothing() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    let held = take(&mut conn, &scripts, &["a", "b"], "me", 60_000).await;
    let args = ["me", "90000", "1", "0", "3", "", ""];
    let reply = fcall(&mut conn, &scripts.extend_many, &keys(&["a", "b"]), &args)
        .await
        .unwrap();
    assert_eq!(int(&reply[0]), LATE, "{reply:?}");
    for (name, was) in ["a", "b"].into_iter().zip(&held) {
        assert_eq!(&record(&mut conn, name, "me").await, was);
    }
}

#[tokio::test]
async fn release_many_answers_per_lock_and_leaves_a_stale_token_alone() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    let held = take(&mut conn, &scripts, &["a", "b", "c"], "me", 60_000).await;
    let stale = (token(&held[1]).parse::<u64>().unwrap() - 1).to_string();
    let args = ["me", "0", "3", &token(&held[0]), &stale, ""];
    let reply = fcall(
        &mut conn,
        &scripts.release_many,
        &keys(&["a", "b", "c"]),
        &args,
    )
    .await
    .unwrap();
    assert_eq!((int(&reply[0]), int(&reply[2])), (NOT_HELD, 3), "{reply:?}");
    let per_lock: Vec<(i64, String)> = (0..3)
        .map(|i| (int(&reply[3 + 2 * i]), text(&reply[4 + 2 * i])))
        .collect();
    assert_eq!(
        per_lock,
        vec![
            (OK, held[0].clone()),
            (NOT_HELD, String::new()),
            (OK, held[2].clone())
        ]
    );
    assert_eq!(record(&mut conn, "a", "me").await, "");
    assert_eq!(record(&mut conn, "b", "me").await, held[1]);
    assert_eq!(record(&mut conn, "c", "me").await, "");
    // The rest of it, with its own token: every lock released, OK.
    let args = ["me", "0", "3", &token(&held[1])];
    let reply = fcall(&mut conn, &scripts.release_many, &keys(&["b"]), &args)
        .await
        .unwrap();
    assert_eq!((int(&reply[0]), int(&reply[3])), (OK, OK), "{reply:?}");
    assert_eq!(record(&mut conn, "b", "me").await, "");
}

#[tokio::test]
async fn a_malformed_set_call_is_refused_and_changes_nothing() {
    let (_redis, mut conn, scripts) = redis_with_functions().await;
    let held = take(&mut conn, &scripts, &["a", "b"], "me", 60_000).await;
    let both = keys(&["a", "b"]);
    let twice: Vec<String> = keys(&["a", "a"]);
    let bad: [(&LockScript, &[String], &[&str]); 6] = [
        (&scripts.release_many, &both, &["me", "0", "3", ""]),
        (&scripts.release_many, &both, &["me", "0", "7", "", ""]),
        (&scripts.release_many, &both, &["me", "0", "3", "", "x1"]),
        (&scripts.release_many, &twice, &["me", "0", "3", "", ""]),
        (
            &scripts.extend_many,
            &both,
            &["me", "ten", "0", "0", "3", "", ""],
        ),
        (
            &scripts.extend_many,
            &both[..5],
            &["me", "", "0", "0", "3", "", ""],
        ),
    ];
    for (function, keys, args) in bad {
        let err = fcall(&mut conn, function, keys, args)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("_many"), "{args:?}: {err}");
    }
    for (name, was) in ["a", "b"].into_iter().zip(&held) {
        assert_eq!(&record(&mut conn, name, "me").await, was, "{name}");
    }
}
