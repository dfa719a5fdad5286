//! Changelog reads bounded in time, memory and Redis work, on a live
//! server with a real Redis: a read is a page, and a walk of pages shows
//! every event once, newest first; a page reads at most a stated number
//! of entries per shard (`engine::changelog::window`: at most
//! `WINDOW_MAX`, and `SCAN_PER_READ` in all) and stops there with a cursor however few matched; the same read
//! asked at once is read once; each caller has a rate; and readers of a
//! flooded changelog leave another tenant's acquires alone.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::http::{http, int};
use common::*;
use serde_json::Value;
use tumbler_engine::changelog::{SCAN_PER_READ, WINDOW_MAX, window};

use super::changelog::{Server, args, command_calls, pair, raw_entries};

/// An event as the tests tell them apart: (time, name, event, holder).
type Ident = (i64, String, String, String);

fn ident(event: &Value) -> Ident {
    (
        int(&event["atMs"]),
        event["name"].as_str().unwrap().to_owned(),
        event["event"].as_str().unwrap().to_owned(),
        event["holder"].as_str().unwrap().to_owned(),
    )
}

/// The same of a raw entry ('namespace\nname\nevent\nholder\ntoken\nms…').
fn raw_ident(message: &str) -> Ident {
    let lines: Vec<&str> = message.splitn(7, '\n').collect();
    (
        lines[5].parse().unwrap(),
        lines[1].to_owned(),
        lines[2].to_owned(),
        lines[3].to_owned(),
    )
}

/// A walk of pages: every event shown, in order, and each page's reply.
struct Walk {
    events: Vec<Value>,
    pages: Vec<Value>,
}

/// Reads `query` page after page (at most 1,000) until the walk ends.
async fn walk(server: &Server, query: &str) -> Walk {
    let mut token = String::new();
    let mut walk = Walk {
        events: Vec::new(),
        pages: Vec::new(),
    };
    for _ in 0..1000 {
        let (status, page) = server
            .changelog(&format!("{query}&page_token={token}"))
            .await;
        assert_eq!(status, 200, "{page}");
        walk.events
            .extend(page["events"].as_array().unwrap().iter().cloned());
        token = page["nextPageToken"].as_str().unwrap().to_owned();
        walk.pages.push(page);
        if token.is_empty() {
            return walk;
        }
    }
    panic!("a walk of more than 1,000 pages");
}

/// Asserts the events come newest first, none twice.
fn newest_first_once(events: &[Value]) -> Vec<Ident> {
    let idents: Vec<Ident> = events.iter().map(ident).collect();
    for pair in idents.windows(2) {
        assert!(pair[0].0 >= pair[1].0, "out of order: {pair:?}");
    }
    let unique: HashSet<&Ident> = idents.iter().collect();
    assert_eq!(unique.len(), idents.len(), "an event came twice");
    idents
}

fn sorted(mut idents: Vec<Ident>) -> Vec<Ident> {
    idents.sort();
    idents
}

pub(super) async fn reset_stats(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn pages_walk_every_event_once_newest_first() {
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["*"], 1000, 60_000, 4)).await;
    let mut client = server.client().await;
    for i in 0..120 {
        pair(
            &mut client,
            "default",
            &format!("p-{i}"),
            &format!("h{}", i % 3),
        )
        .await;
    }
    // Past the last event's millisecond, so a first page sees them all.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut conn = redis_conn(&redis.url()).await;
    let all: Vec<Ident> = raw_entries(&mut conn, "default", 4)
        .await
        .iter()
        .flatten()
        .map(|m| raw_ident(m))
        .collect();
    assert_eq!(all.len(), 240);

    // Pages of 7: each event once, newest first, all of them.
    let whole = walk(&server, "limit=7").await;
    let walked = newest_first_once(&whole.events);
    assert_eq!(sorted(walked), sorted(all.clone()));
    assert!(whole.pages.len() >= 240 / 7, "{}", whole.pages.len());
    assert!(
        whole.pages[..whole.pages.len() - 1]
            .iter()
            .all(|p| p["events"].as_array().unwrap().len() <= 7)
    );

    // Events made while a walk goes on are newer than its start: the walk
    // still shows exactly the events it started with.
    let (_, first) = server.changelog("limit=50").await;
    let mut shown: Vec<Value> = first["events"].as_array().unwrap().clone();
    for i in 0..20 {
        pair(&mut client, "default", &format!("late-{i}"), "h0").await;
    }
    let mut token = first["nextPageToken"].as_str().unwrap().to_owned();
    while !token.is_empty() {
        let (status, page) = server
            .changelog(&format!("limit=50&page_token={token}"))
            .await;
        assert_eq!(status, 200, "{page}");
        shown.extend(page["events"].as_array().unwrap().iter().cloned());
        token = page["nextPageToken"].as_str().unwrap().to_owned();
    }
    assert_eq!(sorted(newest_first_once(&shown)), sorted(all.clone()));

    // A filtered walk: exactly the matching events, in order.
    let by_holder = walk(&server, "holder=h1&limit=5").await;
    let expected: Vec<Ident> = all.iter().filter(|e| e.3 == "h1").cloned().collect();
    assert_eq!(
        sorted(newest_first_once(&by_holder.events)),
        sorted(expected)
    );

    // A page token that is not one: 400 naming the field.
    let list_token = URL_SAFE_NO_PAD.encode("0.0.tumbler:{default:0}:l:p-1");
    for bad in [
        "not a token!".to_owned(),
        URL_SAFE_NO_PAD.encode("c.1.2"),
        URL_SAFE_NO_PAD.encode("c.1.99999.0"),
        list_token,
    ] {
        let (status, refused) = server
            .changelog(&format!("page_token={}", urlencode(&bad)))
            .await;
        assert_eq!(status, 400, "{bad}: {refused}");
        let message = refused["message"].as_str().unwrap();
        assert!(message.starts_with("page_token:"), "{refused}");
    }
    // A made-up token of the right form only moves the walk: after the
    // Unix epoch's first millisecond there is nothing.
    let (status, nothing) = server
        .changelog(&format!("page_token={}", URL_SAFE_NO_PAD.encode("c.0.0.0")))
        .await;
    assert_eq!(status, 200, "{nothing}");
    assert!(nothing["events"].as_array().unwrap().is_empty());
    assert_eq!(nothing["nextPageToken"], "");
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn a_read_scans_a_bounded_number_of_entries_and_stops_with_a_cursor() {
    let redis = start_redis();
    let shards = 4;
    // Health ticks rarely: each one proves the lock path with two function
    // calls, which the exact counts below would see.
    let args = tumbler::config::ServiceArgs {
        health_interval_ms: 60_000,
        ..args(&["*"], 1000, 60_000, shards)
    };
    let server = Server::start(&redis.url(), args).await;
    // The oldest events are the needle's, then enough hay that the lists
    // hold more than one read may look at.
    let mut client = server.client().await;
    pair(&mut client, "default", "needle", "needle").await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            for i in 0..80 {
                pair(&mut client, "default", &format!("hay-{worker}-{i}"), "hay").await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut conn = redis_conn(&redis.url()).await;
    let kept: usize = raw_entries(&mut conn, "default", shards)
        .await
        .iter()
        .map(Vec::len)
        .sum();
    // The bound of one filtered read here: WINDOW_MAX per shard (the
    // shards' share of SCAN_PER_READ is more).
    let per_shard = window(shards, 10, true);
    assert_eq!(per_shard, WINDOW_MAX.min(SCAN_PER_READ / shards as usize));
    let bound = per_shard * shards as usize;
    assert!(kept > 2 * bound, "{kept} entries kept");

    // A filtered read: each page looks at `bound` entries at most (one
    // LRANGE of `per_shard` per shard), returns what matched (nothing on
    // the first) and a cursor to go on.
    reset_stats(&mut conn).await;
    let (status, first) = server.changelog("holder=needle&limit=10").await;
    assert_eq!(status, 200, "{first}");
    assert!(first["events"].as_array().unwrap().is_empty(), "{first}");
    let scanned = first["scanned"].as_u64().unwrap() as usize;
    assert!(scanned > 0 && scanned <= bound, "{first}");
    assert_ne!(first["nextPageToken"], "");
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("lrange"), Some(&(shards as u64)), "{calls:?}");
    // One call per shard, beside any flush of the replica's per-minute
    // counts that landed meanwhile (once a second: `count.lua`, one EXISTS
    // each, a command the read's functions never run).
    let flushes = calls.get("exists").copied().unwrap_or(0);
    assert_eq!(
        calls.get("fcall"),
        Some(&(shards as u64 + flushes)),
        "{calls:?}"
    );
    // Finding where a shard's page starts: a few probes, not a scan.
    assert!(
        calls.get("lindex").copied().unwrap_or(0) <= 30 * shards as u64,
        "{calls:?}"
    );

    let needle = walk(&server, "holder=needle&limit=10").await;
    assert!(needle.pages.len() >= 3, "{}", needle.pages.len());
    for page in &needle.pages {
        assert!(
            page["scanned"].as_u64().unwrap() as usize <= bound,
            "{page}"
        );
    }
    let found: Vec<String> = needle
        .events
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(found, ["released", "acquired"]);

    // Unfiltered, a shard gives no more than the page may show.
    reset_stats(&mut conn).await;
    let (_, few) = server.changelog("limit=10").await;
    assert_eq!(few["events"].as_array().unwrap().len(), 10);
    assert!(
        few["scanned"].as_u64().unwrap() <= 10 * shards as u64,
        "{few}"
    );
}

#[tokio::test]
async fn concurrent_reads_of_one_query_are_one_read() {
    let redis = start_redis();
    let shards = 4;
    let server = Arc::new(Server::start(&redis.url(), args(&["*"], 1000, 60_000, shards)).await);
    let mut client = server.client().await;
    for i in 0..20 {
        pair(&mut client, "default", &format!("l-{i}"), "h").await;
    }
    let mut conn = redis_conn(&redis.url()).await;
    reset_stats(&mut conn).await;
    let reads = (0..16).map(|_| {
        let server = server.clone();
        async move { server.changelog("holder=h&limit=25").await }
    });
    let answers = futures::future::join_all(reads).await;
    for (status, page) in &answers {
        assert_eq!(*status, 200, "{page}");
        assert_eq!(page["events"], answers[0].1["events"]);
        assert_eq!(page["events"].as_array().unwrap().len(), 25);
    }
    // One read: one LRANGE per shard, for sixteen requests.
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("lrange"), Some(&(shards as u64)), "{calls:?}");

    // Different reads are read each (the count is of reads, not requests).
    reset_stats(&mut conn).await;
    let reads = (1..=4).map(|limit| {
        let server = server.clone();
        async move { server.changelog(&format!("limit={limit}")).await }
    });
    for (status, page) in futures::future::join_all(reads).await {
        assert_eq!(status, 200, "{page}");
    }
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("lrange"), Some(&(4 * shards as u64)), "{calls:?}");
}

#[tokio::test]
async fn changelog_reads_have_a_rate_per_caller() {
    // Auth off: a rate per client address.
    let redis = start_redis();
    let mut limited = args(&["*"], 1000, 60_000, 2);
    limited.changelog_reads_per_second = 2;
    let server = Server::start(&redis.url(), limited.clone()).await;
    assert_eq!(server.changelog("").await.0, 200);
    assert_eq!(server.changelog("limit=5").await.0, 200);
    let (status, refused) = server.changelog("limit=6").await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["code"], "resource_exhausted");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .starts_with("changelog reads: at most 2 per second"),
        "{refused}"
    );
    // Bad input is still answered as such, and costs nothing.
    let (status, bad) = server.changelog("limit=0").await;
    assert_eq!(status, 400, "{bad}");
    // The budget comes back with time.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(server.changelog("").await.0, 200);

    // Auth on: each token has its own budget.
    let entries = [
        token_entry("reader-a", "tok-a", "client", r#"["*"]"#, ""),
        token_entry("reader-b", "tok-b", "client", r#"["*"]"#, ""),
    ]
    .concat();
    let authed = TestServer::new()
        .redis(&redis.url())
        .args(limited)
        .auth(&entries)
        .http()
        .start()
        .await;
    let read = |token: &'static str| {
        let addr = authed.http();
        async move {
            let auth = format!("Bearer {token}");
            http(
                addr,
                "GET",
                "/api/v1/changelog",
                &[("authorization", &auth)],
                "",
            )
            .await
            .0
        }
    };
    assert_eq!(read("tok-a").await, 200);
    assert_eq!(read("tok-a").await, 200);
    assert_eq!(read("tok-a").await, 429);
    assert_eq!(
        read("tok-b").await,
        200,
        "another token's budget is its own"
    );
}

#[tokio::test]
async fn redis_trouble_is_503() {
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["*"], 1000, 60_000, 2)).await;
    assert_eq!(server.changelog("").await.0, 200);
    drop(redis);
    let (status, page) = server.changelog("limit=3").await;
    assert_eq!(status, 503, "{page}");
    assert_eq!(page["code"], "unavailable");
}

#[tokio::test]
async fn pages_walk_a_changelog_on_a_redis_cluster() {
    // Eight shards' lists spread over three nodes: each seek and LRANGE
    // goes to the node of its list's slot.
    let server = TestServer::new()
        .cluster()
        .args(args(&["*"], 1000, 60_000, 8))
        .http()
        .start()
        .await;
    let mut client = server.client().await;
    for i in 0..60 {
        pair(&mut client, "default", &format!("c-{i}"), "h").await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let server = Server { server };
    let whole = walk(&server, "limit=7").await;
    let walked = newest_first_once(&whole.events);
    assert_eq!(walked.len(), 120);
    let names: HashSet<&str> = walked.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(names.len(), 60);
}
