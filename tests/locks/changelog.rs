//! The changelog on a live server with a real Redis: lock events are kept
//! (by the functions themselves) only for the namespaces named by
//! `--changelog-namespaces`, bounded by `--changelog-size` and expiring
//! after `--changelog-retention-ms`, and read back newest first through
//! `/api/v1/changelog`, filtered by name prefix, holder and event. A
//! namespace without one costs Redis no extra command.

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
struct Server {
    server: TestServer,
}

impl Server {
    async fn start(redis_url: &str, args: ServiceArgs) -> Self {
        let server = TestServer::new()
            .redis(redis_url)
            .args(args)
            .http()
            .start()
            .await;
        Server { server }
    }

    async fn client(&self) -> LockServiceClient<Channel> {
        self.server.client().await
    }

    async fn changelog(&self, query: &str) -> (u16, Value) {
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

fn args(namespaces: &[&str], size: u32, retention_ms: u64, shards: u32) -> ServiceArgs {
    ServiceArgs {
        changelog_namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        changelog_size: size,
        changelog_retention_ms: retention_ms,
        shards,
        ..service_args()
    }
}

fn in_ns(namespace: &str, name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: namespace.into(),
        ..acquire(name, holder)
    }
}

/// Acquire then release `name` in `namespace`; the grant's token.
async fn pair(
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
fn seen(page: &Value) -> Vec<(String, String, String)> {
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

/// Redis' calls per command since the last CONFIG RESETSTAT.
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

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
    assert_eq!(released["fencing_token"], token.to_string());
    assert_eq!(released["actor"], "holder");
    assert_eq!(released["ttl_ms"], 30_000);
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
    // The eight newest of twenty events, whichever shards they are in.
    let newest: Vec<_> = (6..10)
        .rev()
        .flat_map(|i| {
            let name = format!("lock-{i}");
            [ev("released", &name, "h"), ev("acquired", &name, "h")]
        })
        .collect();
    assert_eq!(seen(&page), newest);
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
        bad["error"].as_str().unwrap().starts_with("event:"),
        "{bad}"
    );
    let (status, bad) = server.changelog("limit=0").await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"].as_str().unwrap().starts_with("limit:"),
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
