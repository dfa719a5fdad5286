//! The changelog on a live server with a real Redis: lock events are kept
//! (by the functions themselves) only for the namespaces named by
//! `--changelog-namespaces`, bounded by `--changelog-size` and by bytes,
//! their metadata cut to a stated size, expiring after
//! `--changelog-retention-ms`, and read back newest first through
//! `/api/v1/changelog`, filtered by name prefix, holder and event. A
//! namespace without one costs Redis no extra command. How reads are
//! bounded (pages, single flight, rates) is `changelog_reads.rs`.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::http::http;
use common::*;
use serde_json::Value;
use tonic::transport::Channel;
use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::proto::lock_service_client::LockServiceClient;

/// A server with its HTTP port on.
pub(super) struct Server {
    pub(super) server: TestServer,
}

impl Server {
    pub(super) async fn start(redis_url: &str, args: ServiceArgs) -> Self {
        let server = TestServer::new()
            .redis(redis_url)
            .args(args)
            .http()
            .start()
            .await;
        Server { server }
    }

    pub(super) async fn client(&self) -> LockServiceClient<Channel> {
        self.server.client().await
    }

    pub(super) async fn changelog(&self, query: &str) -> (u16, Value) {
        let (status, body) = http(
            self.server.http(),
            "GET",
            &format!("/api/v1/changelog?{query}"),
            &[],
            "",
        )
        .await;
        let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        (status, json)
    }
}

/// A changelog for `namespaces`; reads not rate-limited in practice (the
/// rate's own test sets one).
pub(super) fn args(namespaces: &[&str], size: u32, retention_ms: u64, shards: u32) -> ServiceArgs {
    ServiceArgs {
        changelog_namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        changelog_size: size,
        changelog_retention_ms: retention_ms,
        changelog_reads_per_second: 100_000,
        shards,
        ..service_args()
    }
}

pub(super) fn in_ns(namespace: &str, name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: namespace.into(),
        ..acquire(name, holder)
    }
}

/// Acquire then release `name` in `namespace`; the grant's token.
pub(super) async fn pair(
    client: &mut LockServiceClient<Channel>,
    namespace: &str,
    name: &str,
    holder: &str,
) -> u64 {
    let granted = client
        .acquire(in_ns(namespace, name, holder))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.status(), proto::AcquireStatus::Acquired);
    let released = client
        .release(proto::ReleaseRequest {
            namespace: namespace.into(),
            ..release(name, holder)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), proto::ReleaseStatus::Released);
    granted.grant.unwrap().fencing_token
}

/// (event, name, holder) of each event, in the reply's order.
pub(super) fn seen(page: &Value) -> Vec<(String, String, String)> {
    page["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {page}"))
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["name"].as_str().unwrap().to_owned(),
                e["holder"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn ev(event: &str, name: &str, holder: &str) -> (String, String, String) {
    (event.into(), name.into(), holder.into())
}

pub(super) use common::command_calls;

#[tokio::test]
async fn events_are_kept_only_for_namespaces_with_a_changelog() {
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["jobs", "team-*"], 1000, 60_000, 4)).await;
    let mut client = server.client().await;
    let token = pair(&mut client, "jobs", "nightly", "worker-1").await;
    pair(&mut client, "team-a", "report", "worker-2").await;
    pair(&mut client, "default", "other", "worker-3").await;

    let (status, page) = server.changelog("namespace=jobs").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["enabled"], true);
    assert_eq!(
        seen(&page),
        vec![
            ev("released", "nightly", "worker-1"),
            ev("acquired", "nightly", "worker-1")
        ]
    );
    let released = &page["events"][0];
    assert_eq!(released["fencingToken"], token.to_string());
    assert_eq!(released["actor"], "holder");
    assert_eq!(released["ttlMs"], "30000");
    let (_, team) = server.changelog("namespace=team-a").await;
    assert_eq!(
        seen(&team),
        vec![
            ev("released", "report", "worker-2"),
            ev("acquired", "report", "worker-2")
        ]
    );

    let (status, off) = server.changelog("namespace=default").await;
    assert_eq!(status, 200, "{off}");
    assert_eq!(off["enabled"], false);
    assert!(seen(&off).is_empty());
    let mut conn = redis_conn(&redis.url()).await;
    assert!(
        scan_keys(&mut conn, "tumbler:{default:*}:c")
            .await
            .is_empty()
    );
    assert_eq!(scan_keys(&mut conn, "tumbler:{jobs:*}:c").await.len(), 1);
}

#[tokio::test]
async fn the_changelog_is_bounded_and_expires() {
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["*"], 8, 1500, 2)).await;
    let mut client = server.client().await;
    for i in 0..10 {
        pair(&mut client, "default", &format!("lock-{i}"), "h").await;
        // Distinct milliseconds, so the newest-first order is known.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let (_, page) = server.changelog("").await;
    assert_eq!(page["size"], 8);
    // Each shard keeps its newest 8 (or 9): the namespace's eight newest
    // of twenty events come first, whichever shards they are in, and no
    // more than two shards' worth come at all.
    let newest: Vec<_> = (6..10)
        .rev()
        .flat_map(|i| {
            let name = format!("lock-{i}");
            [ev("released", &name, "h"), ev("acquired", &name, "h")]
        })
        .collect();
    let shown = seen(&page);
    assert_eq!(shown[..8], newest[..], "{page}");
    assert!(shown.len() <= 18, "{page}");
    let mut conn = redis_conn(&redis.url()).await;
    let keys = scan_keys(&mut conn, "tumbler:{default:*}:c").await;
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        let len: u64 = redis::cmd("LLEN")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // A list is trimmed back to the size once it is an eighth over.
        assert!((8..=9).contains(&len), "{key}: {len}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 1500, "{key}: {ttl}");
    }
    // After the retention, nothing is left.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert!(
        scan_keys(&mut conn, "tumbler:{default:*}:c")
            .await
            .is_empty()
    );
    let (_, page) = server.changelog("").await;
    assert_eq!(page["enabled"], true);
    assert!(seen(&page).is_empty(), "{page}");
}

#[tokio::test]
async fn filters_pick_events_by_name_prefix_holder_and_event() {
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["*"], 1000, 60_000, 4)).await;
    let mut client = server.client().await;
    pair(&mut client, "default", "a/1", "h1").await;
    pair(&mut client, "default", "a/2", "h2").await;
    pair(&mut client, "default", "b/1", "h2").await;
    // Events of different shards in the same millisecond have no order
    // between them: the last one is made a millisecond apart.
    tokio::time::sleep(Duration::from_millis(3)).await;
    client.acquire(acquire("a/3", "h1")).await.unwrap();

    let names = |page: &Value| {
        let mut names: Vec<String> = seen(page).into_iter().map(|(_, n, _)| n).collect();
        names.sort();
        names
    };
    let (status, by_prefix) = server.changelog("prefix=a%2F").await;
    assert_eq!(status, 200, "{by_prefix}");
    assert_eq!(names(&by_prefix), ["a/1", "a/1", "a/2", "a/2", "a/3"]);
    let (_, by_holder) = server.changelog("holder=h2").await;
    assert_eq!(names(&by_holder), ["a/2", "a/2", "b/1", "b/1"]);
    assert!(seen(&by_holder).iter().all(|(_, _, h)| h == "h2"));
    let (_, by_event) = server.changelog("event=acquired").await;
    assert_eq!(names(&by_event), ["a/1", "a/2", "a/3", "b/1"]);
    let (_, all_three) = server
        .changelog("prefix=a%2F&holder=h1&event=released")
        .await;
    assert_eq!(seen(&all_three), vec![ev("released", "a/1", "h1")]);
    let (_, limited) = server.changelog("limit=2").await;
    assert_eq!(seen(&limited).len(), 2);
    assert_eq!(seen(&limited)[0], ev("acquired", "a/3", "h1"));

    let (status, bad) = server.changelog("event=exploded").await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["message"].as_str().unwrap().starts_with("event:"),
        "{bad}"
    );
    let (status, bad) = server.changelog("limit=0").await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["message"].as_str().unwrap().starts_with("limit:"),
        "{bad}"
    );
    let (status, bad) = server.changelog("namespace=no%20such").await;
    assert_eq!(status, 400, "{bad}");
}

#[tokio::test]
async fn without_a_changelog_lock_calls_write_nothing_more() {
    let redis = start_redis();
    let mut conn = redis_conn(&redis.url()).await;
    let server = Server::start(&redis.url(), args(&["jobs"], 1000, 60_000, 4)).await;
    let mut client = server.client().await;
    pair(&mut client, "default", "warm", "h").await;
    pair(&mut client, "jobs", "warm", "h").await;

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for i in 0..5 {
        pair(&mut client, "default", &format!("plain-{i}"), "h").await;
    }
    let calls = command_calls(&mut conn).await;
    for command in ["lpush", "ltrim", "publish", "lrange"] {
        assert_eq!(calls.get(command), None, "{command}: {calls:?}");
    }
    // The only expiry set is each new lock key's TTL (its first acquire
    // sets it with PEXPIRE); no log list gets one.
    assert_eq!(calls.get("pexpire"), Some(&5), "{calls:?}");
    assert!(calls.get("fcall").copied().unwrap_or(0) >= 10, "{calls:?}");

    // The same calls in a namespace with a changelog: one push and one
    // expiry each event.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for i in 0..5 {
        pair(&mut client, "jobs", &format!("logged-{i}"), "h").await;
    }
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("lpush"), Some(&10), "{calls:?}");
    assert_eq!(calls.get("pexpire"), Some(&10), "{calls:?}");
    // Far below the size (1000): nothing to trim yet.
    assert_eq!(calls.get("ltrim"), None, "{calls:?}");
    assert_eq!(calls.get("publish"), None, "{calls:?}");
    assert!(
        scan_keys(&mut conn, "tumbler:{default:*}:c")
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_bad_changelog_namespace_is_refused_at_start() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        service: ServiceArgs,
    }
    for bad in ["a*b", "no such", "*a"] {
        let parsed = Cli::try_parse_from(["tumbler", "--changelog-namespaces", bad]);
        assert!(parsed.is_err(), "{bad:?} was taken");
    }
    let cli = Cli::try_parse_from(["tumbler", "--changelog-namespaces", "jobs,team-*,*"]).unwrap();
    assert_eq!(cli.service.changelog_namespaces, ["jobs", "team-*", "*"]);
    assert_eq!(cli.service.changelog_size, 1000);
    assert_eq!(cli.service.changelog_retention_ms, 86_400_000);
    // An empty list (TUMBLER_CHANGELOG_NAMESPACES="") names none.
    let cli = Cli::try_parse_from(["tumbler", "--changelog-namespaces", ""]).unwrap();
    let config = ServerConfig::new("redis://127.0.0.1:1".into(), &cli.service).unwrap();
    assert!(config.changelog.namespaces.is_empty());
}

/// Metadata of `entries` entries whose values are `value_bytes` long, in
/// two-byte characters, so a cut at a byte count can land inside one.
pub(super) fn wide_metadata(entries: usize, value_bytes: usize) -> HashMap<String, String> {
    (0..entries)
        .map(|i| (format!("key-{i:02}"), "é".repeat(value_bytes / 2)))
        .collect()
}

/// The raw entries of a changelog's lists, newest first per shard.
pub(super) async fn raw_entries(
    conn: &mut redis::aio::MultiplexedConnection,
    namespace: &str,
    shards: u32,
) -> Vec<Vec<String>> {
    let mut lists = Vec::new();
    for shard in 0..shards {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("tumbler:{{{namespace}:{shard}}}:c"))
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .unwrap();
        lists.push(entries);
    }
    lists
}

#[tokio::test]
async fn metadata_is_cut_in_the_changelog_and_the_cut_is_marked() {
    use tumbler_engine::changelog::LOG_METADATA_BYTES;
    let redis = start_redis();
    let server = Server::start(&redis.url(), args(&["jobs"], 1000, 60_000, 1)).await;
    let mut client = server.client().await;
    // 8 KB of metadata, about as much as a request may carry (the defect
    // report's case): two short values first (by key), then long ones.
    let mut metadata = wide_metadata(32, 250);
    metadata.insert("key-00".into(), "é".repeat(30));
    metadata.insert("key-01".into(), "é".repeat(30));
    let json = serde_json::to_string(
        &metadata
            .iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
    )
    .unwrap();
    assert!(json.len() > 8000, "{}", json.len());
    let mut request = in_ns("jobs", "big", "h1");
    request.metadata = metadata.clone();
    let granted = client.acquire(request).await.unwrap().into_inner();
    assert_eq!(granted.status(), proto::AcquireStatus::Acquired);
    // The grant keeps all of it; only the changelog's copy is cut.
    assert_eq!(granted.grant.unwrap().metadata.len(), 32);
    let mut small = in_ns("jobs", "small", "h2");
    small.metadata = HashMap::from([("job".to_owned(), "42".to_owned())]);
    client.acquire(small).await.unwrap();

    let (status, page) = server.changelog("namespace=jobs").await;
    assert_eq!(status, 200, "{page}");
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{page}");
    let (small, big) = (&events[0], &events[1]);
    assert_eq!(small["metadata"]["job"], "42");
    assert_eq!(small["metadataTruncated"], false);
    assert!(small.get("metadataBytes").is_none(), "{small}");
    assert_eq!(big["name"], "big");
    assert_eq!(big["metadataTruncated"], true, "{big}");
    assert_eq!(big["metadataBytes"], json.len().to_string());
    // The entries that fit whole in the cut, each as it was.
    let kept = big["metadata"].as_object().unwrap();
    assert!(!kept.is_empty() && kept.len() < 32, "{big}");
    for (key, value) in kept {
        assert_eq!(metadata[key], value.as_str().unwrap(), "{key}");
    }
    // In Redis, the entry holds at most the cut of the metadata: the rest
    // of the event (namespace, name, holder, numbers) and the marker.
    let mut conn = redis_conn(&redis.url()).await;
    let lists = raw_entries(&mut conn, "jobs", 1).await;
    let longest = lists[0].iter().map(String::len).max().unwrap();
    assert!(longest <= LOG_METADATA_BYTES + 120, "{longest}");
}

#[tokio::test]
async fn each_shard_of_a_changelog_keeps_to_a_byte_budget() {
    use tumbler_engine::changelog::LOG_BYTES_PER_EVENT;
    let redis = start_redis();
    let size = 200;
    let server = Server::start(&redis.url(), args(&["big", "small"], size, 60_000, 1)).await;
    let budget = u64::from(size) * LOG_BYTES_PER_EVENT;
    let metadata = wide_metadata(32, 250);
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let mut client = server.client().await;
        let metadata = metadata.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                let name = format!("w{worker}-{i}");
                let mut big = in_ns("big", &name, "h");
                big.metadata = metadata.clone();
                client.acquire(big).await.unwrap();
                client
                    .release(proto::ReleaseRequest {
                        namespace: "big".into(),
                        ..release(&name, "h")
                    })
                    .await
                    .unwrap();
                pair(&mut client, "small", &name, "h").await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let conn = redis_conn(&redis.url()).await;
    let usage = |key: &'static str| {
        let mut conn = conn.clone();
        async move {
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .unwrap();
            let len: u64 = redis::cmd("LLEN")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            (bytes, len)
        }
    };
    // 800 events of ~400 bytes each: the byte budget, not the size,
    // bounds the list (checked every eighth push: at most eight entries
    // over, each under 600 bytes).
    let (bytes, len) = usage("tumbler:{big:0}:c").await;
    assert!(bytes <= budget + 8 * 600, "{bytes} bytes over {budget}");
    assert!(len < u64::from(size), "{len} entries: the size ruled");
    assert!(len >= u64::from(size) / 3, "{len} entries: trimmed too far");
    // Small events: the size rules (200..=225 entries) within the budget.
    let (bytes, len) = usage("tumbler:{small:0}:c").await;
    assert!((200..=225).contains(&len), "{len}");
    assert!(bytes <= budget, "{bytes} bytes over {budget}");
}
