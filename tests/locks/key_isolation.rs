//! Lua safety and key isolation. Request values reach the scripts only as
//! keys and arguments, never inside script text: Redis holds no code but
//! tumbler's one function library, however hostile the input. And a lock name cannot leave
//! its shard or namespace, whatever braces, colons, key-suffix look-alikes
//! or unicode it holds: every key carries the hash tag
//! `{<namespace>:<shard>}` the layout computes for it, and locks of one
//! namespace never show up in, or change, another.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::*;
use tonic::Code;
use tonic::transport::Channel;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler_engine::keys::Layout;
use tumbler_engine::scripts::Scripts;

const SHARDS: u32 = 4;
const PREFIX: &str = "tumbler";

/// Names that look like keys, key suffixes, hash tags or Lua.
fn hostile_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "x",
        "x}:h:y",
        "x}:l:y",
        "{b:0}",
        "{a:0}",
        "{a:1}:h:x",
        "{a:1}:l:x",
        "{b:2}:i:x",
        ":index",
        "index",
        "fence",
        "names",
        "h:",
        "i:",
        "h:x",
        "i:x",
        "l:",
        "l:x",
        "q:x",
        "d:x",
        "m:0",
        "}",
        "{",
        "{}",
        "}{",
        "tumbler:{a:0}:h:x",
        "tumbler:{a:0}:l:x",
        "tumbler:{b:0}:index",
        "tumbler:meta",
        "tumbler:libraries",
        "größe",
        "🔒:{ü}",
        "a|b|c|d|e|{}",
        "%s%d",
        "x\u{2028}y",
        "\u{202e}reversed",
        "' or 1 --",
        "]]..redis.call('FLUSHALL')..[[",
        "\"); redis.call('FLUSHALL') --",
        "*",
        " ",
    ]
    .map(str::to_owned)
    .to_vec();
    names.push("{b:3}".repeat(512 / 5)); // 510 bytes of hash tags
    names
}

/// Names the validation refuses: nothing of them may reach Redis.
const REFUSED: &[&str] = &["x\0y", "\0", "a\nb", "{b:0}\r", "\u{1b}[31m"];

fn holder_of(namespace: &str) -> String {
    format!("holder-{namespace}")
}

async fn acquire_in(
    client: &mut LockServiceClient<Channel>,
    namespace: &str,
    name: &str,
) -> proto::AcquireResponse {
    client
        .acquire(proto::AcquireRequest {
            namespace: namespace.into(),
            metadata: HashMap::from([
                ("namespace".to_owned(), namespace.to_owned()),
                ("name".to_owned(), name.to_owned()),
            ]),
            ..acquire(name, &holder_of(namespace))
        })
        .await
        .unwrap()
        .into_inner()
}

async fn list_all(client: &mut LockServiceClient<Channel>, namespace: &str) -> Vec<String> {
    let request = proto::ListRequest {
        namespace: namespace.into(),
        page_size: 9,
        ..Default::default()
    };
    (list_pages(client, request).await.into_iter())
        .flat_map(|page| page.locks.into_iter().map(|l| l.name))
        .collect()
}

/// Releases every lock `ns` holds (`names` and `only-<ns>`); its waiter on
/// `{b:0}` is then granted, and released too.
async fn release_namespace(
    client: &mut LockServiceClient<Channel>,
    ns: &str,
    names: &[String],
    waiter: tokio::task::JoinHandle<proto::AcquireResponse>,
) {
    for name in names.iter().chain([&format!("only-{ns}")]) {
        let reply = client
            .release(proto::ReleaseRequest {
                namespace: ns.into(),
                ..release(name, &holder_of(ns))
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status(),
            proto::ReleaseStatus::Released,
            "{ns}/{name}"
        );
    }
    let granted = waiter.await.unwrap();
    assert_eq!(granted.status(), proto::AcquireStatus::Acquired);
    client
        .release(proto::ReleaseRequest {
            namespace: ns.into(),
            ..release("{b:0}", &format!("waiter-{ns}"))
        })
        .await
        .unwrap();
}

async fn inspect_in(
    client: &mut LockServiceClient<Channel>,
    namespace: &str,
    name: &str,
) -> proto::InspectResponse {
    client
        .inspect(proto::InspectRequest {
            namespace: namespace.into(),
            name: name.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The hash tag Redis Cluster hashes: between the first `{` and the first
/// `}` after it, when not empty; otherwise the whole key.
fn cluster_hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// What one key of the layout is.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum KeyKind {
    /// h, i, q or d of a lock.
    Lock {
        namespace: String,
        shard: u32,
        kind: char,
        name: String,
    },
    /// index, names, fence or m:<minute> of a shard.
    Shard {
        namespace: String,
        shard: u32,
        what: String,
    },
    /// meta, namespaces or libraries.
    Deployment(String),
    /// A namespace's wait-for registry (decision 0077), `{<namespace>:waits}`.
    Waits(String),
}

/// Reads a key back the way the layout wrote it, checking that its hash
/// tag is `{<namespace>:<shard>}` and that a lock key is exactly the key
/// `Layout::lock_keys` gives for its name.
fn classify(layout: &Layout, key: &str) -> KeyKind {
    let rest = key
        .strip_prefix(PREFIX)
        .and_then(|r| r.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{key:?} outside the prefix"));
    if !rest.starts_with('{') {
        assert!(
            ["meta", "namespaces", "libraries"].contains(&rest),
            "unexpected untagged key {key:?}"
        );
        return KeyKind::Deployment(rest.to_owned());
    }
    let tag = cluster_hash_tag(key);
    if let Some(namespace) = tag.strip_suffix(":waits") {
        assert_eq!(rest, format!("{{{tag}}}"), "{key:?}");
        assert_eq!(layout.waits_key(namespace), key);
        return KeyKind::Waits(namespace.to_owned());
    }
    let (namespace, shard) = tag.split_once(':').expect("tag is namespace:shard");
    let shard: u32 = shard.parse().expect("shard number");
    assert!(shard < SHARDS, "{key:?}");
    let after = rest
        .strip_prefix(&format!("{{{tag}}}:"))
        .unwrap_or_else(|| panic!("{key:?}: the tag must come first"));
    if let Some((kind, name)) = after.split_once(':')
        && ["l", "q"].contains(&kind)
    {
        assert_eq!(
            layout.shard_of(namespace, name),
            shard,
            "{key:?} in the wrong shard"
        );
        let keys = layout.lock_keys(namespace, name);
        assert!(
            [&keys.lock, &keys.queue].contains(&&key.to_owned()),
            "{key:?} is not a key the layout gives {name:?}"
        );
        return KeyKind::Lock {
            namespace: namespace.to_owned(),
            shard,
            kind: kind.chars().next().unwrap(),
            name: name.to_owned(),
        };
    }
    let is_metrics = after
        .strip_prefix("m:")
        .is_some_and(|m| m.parse::<i64>().is_ok());
    assert!(
        ["index", "names", "fence"].contains(&after) || is_metrics,
        "unexpected shard key {key:?}"
    );
    KeyKind::Shard {
        namespace: namespace.to_owned(),
        shard,
        what: after.to_owned(),
    }
}

async fn all_keys(redis_url: &str, layout: &Layout) -> Vec<KeyKind> {
    let mut conn = redis_conn(redis_url).await;
    let mut keys: Vec<KeyKind> = scan_keys(&mut conn, "*")
        .await
        .iter()
        .map(|key| classify(layout, key))
        .collect();
    keys.sort();
    keys
}

/// The lock keys (l, q, d) of a namespace, as (kind, name).
fn lock_keys_of(keys: &[KeyKind], ns: &str) -> BTreeSet<(char, String)> {
    keys.iter()
        .filter_map(|k| match k {
            KeyKind::Lock {
                namespace,
                kind,
                name,
                ..
            } if namespace == ns => Some((*kind, name.clone())),
            _ => None,
        })
        .collect()
}

async fn info_field(conn: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO memory has no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// The code Redis holds, checked against tumbler's own: no EVAL script
/// at all, and no function library but tumbler's one, with exactly its
/// functions (one per operation). Returns how many libraries are loaded.
async fn loaded_code(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let cached = info_field(conn, "number_of_cached_scripts").await;
    assert_eq!(cached, 0, "Redis caches {cached} EVAL scripts");
    let stats: redis::Value = redis::cmd("FUNCTION")
        .arg("STATS")
        .query_async(conn)
        .await
        .unwrap();
    let count = |name: &str| counter_after(&stats, name).unwrap_or(0);
    let (libraries, functions) = (count("libraries_count"), count("functions_count"));
    if libraries > 0 {
        let ours: Vec<redis::Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(Scripts::compile().library_name)
            .query_async(conn)
            .await
            .unwrap();
        assert_eq!(
            (libraries, functions, ours.len()),
            (1, Scripts::operations() as i64, 1),
            "Redis holds {libraries} libraries with {functions} functions; tumbler's is {} of them: code depends on input",
            ours.len()
        );
    }
    libraries
}

/// The integer that follows the string `name` anywhere in a reply.
fn counter_after(value: &redis::Value, name: &str) -> Option<i64> {
    let items: Vec<&redis::Value> = match value {
        redis::Value::Array(items) => items.iter().collect(),
        redis::Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return None,
    };
    for (i, item) in items.iter().enumerate() {
        let is_name = match item {
            redis::Value::BulkString(bytes) => bytes == name.as_bytes(),
            redis::Value::SimpleString(text) => text == name,
            _ => false,
        };
        if is_name && let Some(redis::Value::Int(n)) = items.get(i + 1) {
            return Some(*n);
        }
        if let Some(found) = counter_after(item, name) {
            return Some(found);
        }
    }
    None
}

/// Every kind of request, with hostile values everywhere a string goes.
async fn every_rpc(client: &mut LockServiceClient<Channel>, namespace: &str, name: &str) {
    // Holders are at most 256 bytes; metadata keys at most 64.
    let short: String = name.chars().take(60).collect();
    let holder = format!("{short}\u{2028}{{h}}");
    let reply = client
        .acquire(proto::AcquireRequest {
            namespace: namespace.into(),
            kind: "k.x-1".into(),
            metadata: HashMap::from([(short.clone(), name.to_owned())]),
            ..acquire(name, &holder)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired, "{name:?}");
    // A waiter (queue scripts) that times out (dequeue script).
    let waited = client
        .acquire(proto::AcquireRequest {
            namespace: namespace.into(),
            wait_ms: 30,
            ..acquire(name, &short)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(waited.reason(), proto::NotAcquiredReason::Timeout);
    client
        .extend(proto::ExtendRequest {
            namespace: namespace.into(),
            name: name.into(),
            holder: holder.clone(),
            ttl_ms: Some(20_000),
            fencing_token: None,
            names: Vec::new(),
            fencing_tokens: Vec::new(),
        })
        .await
        .unwrap();
    inspect_in(client, namespace, name).await;
    client
        .queue(proto::QueueRequest {
            namespace: namespace.into(),
            name: name.into(),
            max_entries: 5,
        })
        .await
        .unwrap();
    client
        .list(proto::ListRequest {
            namespace: namespace.into(),
            prefix: name.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .release(proto::ReleaseRequest {
            namespace: namespace.into(),
            name: name.into(),
            holder,
            fencing_token: None,
            names: Vec::new(),
            fencing_tokens: Vec::new(),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_never_depend_on_input() {
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .shards(SHARDS)
        .start()
        .await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(loaded_code(&mut conn).await, 0);

    let names = hostile_names();
    let (first, second) = names.split_at(names.len() / 2);
    for name in first {
        every_rpc(&mut client, "a", name).await;
    }
    for ns in ["a", "b"] {
        client
            .reap(proto::ReapRequest {
                namespace: ns.into(),
                older_than_ms: Some(1),
            })
            .await
            .unwrap();
        client
            .clear(proto::ClearRequest {
                namespace: ns.into(),
            })
            .await
            .unwrap();
    }
    assert_eq!(loaded_code(&mut conn).await, 1);

    // Other hostile values: not one more library or function.
    for name in second {
        every_rpc(&mut client, "b", name).await;
    }
    client
        .reap(proto::ReapRequest {
            namespace: "b".into(),
            older_than_ms: Some(1),
        })
        .await
        .unwrap();
    client
        .clear(proto::ClearRequest {
            namespace: "b".into(),
        })
        .await
        .unwrap();
    assert_eq!(loaded_code(&mut conn).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_stay_in_their_shard_and_namespace() {
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .shards(SHARDS)
        .start()
        .await;
    let layout = Layout::new(PREFIX, SHARDS);
    let mut client = server.client().await;
    let names = hostile_names();

    // Refused names write nothing.
    for name in REFUSED {
        let status = client
            .acquire(proto::AcquireRequest {
                namespace: "a".into(),
                ..acquire(name, "h")
            })
            .await
            .expect_err("control characters are refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("name:"), "{status:?}");
    }
    let mut written = all_keys(&redis.url(), &layout).await;
    written.retain(|k| *k != KeyKind::Deployment("libraries".into()));
    assert_eq!(written, [KeyKind::Deployment("meta".into())]);

    // Every hostile name, held in both namespaces, plus one lock of each's own.
    for ns in ["a", "b"] {
        for name in names.iter().chain([&format!("only-{ns}")]) {
            let reply = acquire_in(&mut client, ns, name).await;
            assert_eq!(
                reply.status(),
                proto::AcquireStatus::Acquired,
                "{ns}/{name}"
            );
        }
    }
    // And a waiter on one of them in each namespace (queue keys exist).
    let mut waiters = Vec::new();
    for ns in ["a", "b"] {
        let mut client = client.clone();
        waiters.push(tokio::spawn(async move {
            client
                .acquire(proto::AcquireRequest {
                    namespace: ns.into(),
                    wait_ms: 10_000,
                    ..acquire("{b:0}", &format!("waiter-{ns}"))
                })
                .await
                .unwrap()
                .into_inner()
        }));
    }
    for ns in ["a", "b"] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while inspect_in(&mut client, ns, "{b:0}").await.waiters != 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "waiter never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    // Every key is where the layout puts it (checked in `classify`), and the
    // lock keys are exactly: the lock hash of every lock and the queue of
    // the waited one (layout v4: its waiter's record is in the lock hash).
    let keys = all_keys(&redis.url(), &layout).await;
    for ns in ["a", "b"] {
        let mut expected: BTreeSet<(char, String)> = names
            .iter()
            .chain([&format!("only-{ns}")])
            .map(|n| ('l', n.clone()))
            .collect();
        expected.insert(('q', "{b:0}".into()));
        assert_eq!(lock_keys_of(&keys, ns), expected, "lock keys of {ns}");
    }
    let shards_used: BTreeMap<&str, BTreeSet<u32>> =
        keys.iter().fold(BTreeMap::new(), |mut m, k| {
            if let KeyKind::Lock {
                namespace, shard, ..
            } = k
            {
                m.entry(namespace.as_str()).or_default().insert(*shard);
            }
            m
        });
    assert!(
        shards_used.values().all(|s| s.len() > 1),
        "the names should spread over several shards: {shards_used:?}"
    );

    // Each namespace lists and inspects only its own locks.
    for (ns, other) in [("a", "b"), ("b", "a")] {
        let listed: BTreeSet<String> = list_all(&mut client, ns).await.into_iter().collect();
        let expected: BTreeSet<String> = names
            .iter()
            .cloned()
            .chain([format!("only-{ns}")])
            .collect();
        assert_eq!(listed, expected, "List of {ns}");
        let foreign = inspect_in(&mut client, ns, &format!("only-{other}")).await;
        assert!(foreign.holders.is_empty(), "only-{other} seen from {ns}");
        for name in &names {
            let seen = inspect_in(&mut client, ns, name).await;
            assert_eq!(seen.holders.len(), 1, "{ns}/{name}");
            let grant = seen.holders[0].grant.as_ref().unwrap();
            assert_eq!(grant.holder, holder_of(ns));
            assert_eq!(grant.metadata["namespace"], ns);
            assert_eq!(&grant.metadata["name"], name);
        }
    }

    // Releasing everything in `a` (the waiter gets its turn, then lets go)
    // leaves `b` exactly as it was.
    let b_before = lock_keys_of(&all_keys(&redis.url(), &layout).await, "b");
    release_namespace(&mut client, "a", &names, waiters.remove(0)).await;
    let keys = all_keys(&redis.url(), &layout).await;
    assert!(lock_keys_of(&keys, "a").is_empty(), "{keys:#?}");
    assert_eq!(lock_keys_of(&keys, "b"), b_before);
    for name in &names {
        let seen = inspect_in(&mut client, "b", name).await;
        assert_eq!(seen.holders.len(), 1, "b/{name} after releasing a");
    }
    assert!(list_all(&mut client, "a").await.is_empty());

    // Clearing `a` (re-acquired) leaves `b` alone too.
    for name in &names {
        acquire_in(&mut client, "a", name).await;
    }
    let cleared = client
        .clear(proto::ClearRequest {
            namespace: "a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.grants_released, names.len() as u64);
    let keys = all_keys(&redis.url(), &layout).await;
    assert!(lock_keys_of(&keys, "a").is_empty());
    assert_eq!(lock_keys_of(&keys, "b"), b_before);

    // Then `b`: no lock key remains anywhere, nor a shard index.
    release_namespace(&mut client, "b", &names, waiters.remove(0)).await;
    let left = all_keys(&redis.url(), &layout).await;
    for key in &left {
        match key {
            KeyKind::Lock { .. } => panic!("lock key left: {key:?}"),
            KeyKind::Shard { what, .. } => assert!(
                what == "fence" || what.starts_with("m:"),
                "shard key left: {key:?}"
            ),
            // A wait's edge leaves its registry after the answer.
            KeyKind::Deployment(_) | KeyKind::Waits(_) => {}
        }
    }
}
