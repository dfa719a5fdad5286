//! Every metric name the documentation mentions is one `/metrics` serves,
//! so the docs and the exporter cannot drift apart.

use crate::common;

use std::collections::BTreeSet;

use common::*;

/// The documents that name metrics.
const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/api.md",
    "docs/cli.md",
    "docs/clients.md",
    "docs/concepts.md",
    "docs/contributing.md",
    "docs/getting-started.md",
    "docs/operating.md",
    "docs/security.md",
    "helm/README.md",
    "helm/tumbler/README.md",
];

/// Words shaped like metric names that are something else.
const NOT_METRICS: &[(&str, &str)] = &[
    ("tumbler_token", "the dashboard's session cookie"),
    (
        "tumbler_fencing_token",
        "the Sidekiq job field that carries a grant's token",
    ),
];

/// Metrics a few operations on a healthy server do not bring out, each
/// with why.
const RARE: &[(&str, &str)] = &[(
    "tumbler_redis_errors_total",
    "counted from the first failed Redis call on; a healthy Redis gives none",
)];

/// `tumbler_…` and `process_…` words in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for prefix in ["tumbler_", "process_"] {
        for (at, _) in text.match_indices(prefix) {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || b"_-./".contains(&bytes[at - 1]))
            {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let name = name.trim_end_matches('_');
            if name.len() > prefix.len() {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The metric names of a Prometheus text exposition, histogram and summary
/// series folded into their family.
fn served(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let name = if let Some(rest) = line.strip_prefix("# TYPE ") {
            rest.split(' ').next().unwrap_or_default()
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else {
            line.split(['{', ' ']).next().unwrap_or_default()
        };
        names.insert(name.to_owned());
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(family) = name.strip_suffix(suffix) {
                names.insert(family.to_owned());
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_docs_name_is_served() {
    let server = TestServer::new()
        .http()
        .args(tumbler::config::ServiceArgs {
            reap_interval_ms: 100,
            ..service_args()
        })
        .start()
        .await;
    let mut client = server.client().await;
    // A grant, a refusal, a wait that times out, a release, a reap, and a
    // lease left to expire for the background reaper: enough for the series
    // that appear on first use.
    let mut short = acquire("docs-metrics-expiring", "a");
    short.ttl_ms = Some(100);
    client.acquire(short).await.unwrap();
    client.acquire(acquire("docs-metrics", "a")).await.unwrap();
    client.acquire(acquire("docs-metrics", "b")).await.unwrap();
    let mut waiting = acquire("docs-metrics", "c");
    waiting.wait_ms = 50;
    client.acquire(waiting).await.unwrap();
    client.release(release("docs-metrics", "a")).await.unwrap();
    client.reap(proto::ReapRequest::default()).await.unwrap();

    let root = env!("CARGO_MANIFEST_DIR");
    let missing_from = |served: &BTreeSet<String>| {
        let mut missing = Vec::new();
        for document in DOCUMENTS {
            let text = std::fs::read_to_string(format!("{root}/{document}")).unwrap();
            for name in names_in(&text) {
                let known = served.contains(&name)
                    || NOT_METRICS.iter().any(|(n, _)| *n == name)
                    || RARE.iter().any(|(n, _)| *n == name);
                if !known {
                    missing.push(format!("{document}: {name}"));
                }
            }
        }
        missing
    };
    // The background reaper's series appear once it has found the lapsed
    // lease: scrape until nothing is missing, for a bounded time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (missing, served) = loop {
        let exposition = reqwest::get(format!("http://{}/metrics", server.http()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let served = served(&exposition);
        let missing = missing_from(&served);
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break (missing, served);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // A rare metric is still one the server defines.
    let observe =
        std::fs::read_to_string(format!("{root}/crates/tumbler-service/src/observe/mod.rs"))
            .unwrap();
    for (name, _) in RARE {
        assert!(
            observe.contains(&format!("\"{name}\"")),
            "{name} is not defined"
        );
    }
    assert!(
        missing.is_empty(),
        "named in the docs but not served by /metrics: {missing:#?}\nserved: {served:#?}"
    );
}

#[test]
fn names_are_read_as_words() {
    let names = names_in(
        "`tumbler_rpc_requests_total{rpc=\"x\"}` and tumbler_waiters; not x_tumbler_y, helm/tumbler_z or tumbler_*",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["tumbler_rpc_requests_total", "tumbler_waiters"]
    );
}
