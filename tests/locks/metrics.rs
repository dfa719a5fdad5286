//! The Metrics RPC: per-minute counters per kind, recorded by the scripts
//! at the point of each operation, so two replicas' counts meet in Redis.

use crate::common;

use std::time::Duration;

use common::*;
use proto::{AcquireStatus, NotAcquiredReason};
use tonic_health::pb::health_check_response::ServingStatus;

fn kinded(name: &str, holder: &str, kind: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        kind: kind.into(),
        ..acquire(name, holder)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_counts_sum_per_kind_and_minute() {
    let redis = start_redis();
    let here = TestServer::new().redis(&redis.url()).start().await;
    let mut a = here.client().await;
    // The second replica is its own process.
    let other = TumblerProcess::start(&redis.url(), &[]).await;
    let mut b = other.client().await;

    // Replica A: 3 email grants, 2 released, 1 extended, 1 denied.
    for i in 0..3 {
        a.acquire(kinded(&format!("mail-{i}"), "a", "email"))
            .await
            .unwrap();
    }
    a.release(release("mail-0", "a")).await.unwrap();
    a.release(release("mail-1", "a")).await.unwrap();
    a.extend(proto::ExtendRequest {
        name: "mail-2".into(),
        holder: "a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let denied = a
        .acquire(kinded("mail-2", "someone", "email"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(denied.reason(), NotAcquiredReason::Busy);

    // Replica B: 2 email grants, 1 report grant, 1 report wait that times out.
    for i in 3..5 {
        b.acquire(kinded(&format!("mail-{i}"), "b", "email"))
            .await
            .unwrap();
    }
    b.acquire(kinded("monthly", "b", "report")).await.unwrap();
    let timed_out = b
        .acquire(proto::AcquireRequest {
            wait_ms: 200,
            ..kinded("monthly", "late", "report")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(timed_out.reason(), NotAcquiredReason::Timeout);

    // An email lease that expires, purged by the next grant on its lock.
    b.acquire(proto::AcquireRequest {
        limit: Some(2),
        ttl_ms: Some(100),
        ..kinded("burst", "short", "email")
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reply = a
        .acquire(proto::AcquireRequest {
            limit: Some(2),
            ..kinded("burst", "next", "email")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);

    // Each replica adds its counts to Redis every second (the one asked
    // first writes its own): wait for the other replica's.
    // Seven email grants and one report.
    let report = common::wait::wait_for("both replicas' counts", Duration::from_secs(10), || {
        let mut a = a.clone();
        async move {
            let report = a
                .metrics(proto::MetricsRequest::default())
                .await
                .unwrap()
                .into_inner();
            (report.overall.as_ref().map_or(0, |o| o.acquired) >= 8).then_some(report)
        }
    })
    .await;
    let total = |kind: &str| {
        report
            .totals
            .iter()
            .find(|row| row.kind == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} totals in {report:?}"))
    };
    let email = total("email");
    assert_eq!(email.acquired, 3 + 2 + 2, "{email:?}");
    assert_eq!(email.released, 2);
    assert_eq!(email.extended, 1);
    assert_eq!(email.denied, 1);
    assert_eq!(email.expired, 1);
    let reports = total("report");
    assert_eq!((reports.acquired, reports.timed_out), (1, 1), "{reports:?}");
    let overall = report.overall.clone().unwrap();
    assert_eq!(overall.kind, "*");
    assert_eq!(overall.acquired, email.acquired + reports.acquired);

    // Minute rows add up to the totals.
    let summed: u64 = report
        .minutes
        .iter()
        .filter(|row| row.kind == "email")
        .map(|row| row.acquired)
        .sum();
    assert_eq!(summed, email.acquired);
    assert!(report.minutes.iter().all(|row| row.minute_ms % 60_000 == 0));

    // A kind filter, and the same answer from the other replica.
    let only = b
        .metrics(proto::MetricsRequest {
            kind: "report".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(only.totals.len(), 1);
    assert_eq!(only.totals[0].acquired, 1);

    // The counters carry a retention TTL.
    let mut conn = redis_conn(&redis.url()).await;
    let keys = scan_keys(&mut conn, "tumbler:{default:*}:m:*").await;
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 24 * 3600 * 1000, "{key}: {ttl}");
    }
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_and_reap_are_counted_per_kind() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let in_ns = |request: proto::AcquireRequest| proto::AcquireRequest {
        namespace: "counted".into(),
        ..request
    };
    // Reap with a cutoff: two old email grants and one report grant.
    for (name, kind) in [("r-1", "email"), ("r-2", "email"), ("r-3", "report")] {
        client
            .acquire(in_ns(kinded(name, "old", kind)))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reaped = client
        .reap(proto::ReapRequest {
            namespace: "counted".into(),
            older_than_ms: Some(100),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reaped.old_grants, 3);

    // Clear: one email grant, one report grant and one waiting report
    // request.
    client
        .acquire(in_ns(kinded("c-1", "a", "email")))
        .await
        .unwrap();
    client
        .acquire(in_ns(kinded("c-2", "a", "report")))
        .await
        .unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(proto::AcquireRequest {
                namespace: "counted".into(),
                wait_ms: 2_000,
                ..kinded("c-2", "b", "report")
            })
            .await
    });
    until_waiters_in(&mut client, "counted", "c-2", 1).await;
    let cleared = client
        .clear(proto::ClearRequest {
            namespace: "counted".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((cleared.grants_released, cleared.requests_dropped), (2, 1));

    let report = client
        .metrics(proto::MetricsRequest {
            namespace: "counted".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let total = |kind: &str| {
        report
            .totals
            .iter()
            .find(|row| row.kind == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} totals in {report:?}"))
    };
    let (email, reports) = (total("email"), total("report"));
    assert_eq!((email.reaped, email.cleared), (2, 1), "{email:?}");
    assert_eq!((reports.reaped, reports.cleared), (1, 2), "{reports:?}");
    let overall = report.overall.clone().unwrap();
    assert_eq!((overall.reaped, overall.cleared), (3, 3));
    let _ = waiting.await;
}

#[tokio::test]
async fn redis_errors_are_counted_once_redis_is_back() {
    let mut redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    redis.kill();
    for i in 0..3 {
        let err = client
            .acquire(kinded(&format!("x{i}"), "h", "flaky"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
    }
    redis.restart().unwrap();
    server.wait_for_health(ServingStatus::Serving).await;
    let mut errors = 0;
    for _ in 0..100 {
        let report = client
            .metrics(proto::MetricsRequest {
                kind: "flaky".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        errors = report.totals.first().map_or(0, |row| row.errors);
        if errors == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(errors, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_past_the_cap_of_one_shard_minute_are_counted_as_other() {
    // The scripts keep at most this many kind|event fields per shard-minute.
    const CAP: usize = 512;
    const KINDS: usize = CAP + 8;
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .shards(1)
        .start()
        .await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    // The cap is per minute: a run that crosses a minute boundary is
    // repeated in a fresh namespace.
    for attempt in 0..3 {
        let namespace = format!("cap-{attempt}");
        let minute = |conn: &mut redis::aio::MultiplexedConnection| {
            let mut conn = conn.clone();
            async move {
                let (secs, _): (i64, i64) =
                    redis::cmd("TIME").query_async(&mut conn).await.unwrap();
                secs / 60
            }
        };
        let started = minute(&mut conn).await;
        for i in 0..KINDS {
            let reply = client
                .acquire(proto::AcquireRequest {
                    namespace: namespace.clone(),
                    ..kinded(&format!("lock-{i}"), "h", &format!("k{i}"))
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired);
        }
        if minute(&mut conn).await != started {
            continue;
        }
        let metrics = client
            .metrics(proto::MetricsRequest {
                namespace,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let named = metrics.totals.iter().filter(|r| r.kind != "other").count();
        let other = metrics.totals.iter().find(|r| r.kind == "other");
        assert_eq!(named, CAP);
        assert_eq!(other.map(|r| r.acquired), Some((KINDS - CAP) as u64));
        assert_eq!(metrics.overall.unwrap().acquired, KINDS as u64);
        return;
    }
    panic!("three runs in a row crossed a minute boundary");
}

/// A server in this process with an HTTP port (and a fast reaper).
async fn serve_with_http() -> TestServer {
    let mut args = service_args();
    args.reap_interval_ms = 100;
    TestServer::new().args(args).http().start().await
}

/// Scrapes until `check` holds (up to 10 s).
async fn scrape_until(addr: std::net::SocketAddr, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = common::http::scrape(addr).await;
        if check(&page) {
            return page;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One Session holding one lock and one Watch, open on the server.
async fn open_session_and_watch(
    client: &mut proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
) -> (
    tokio::sync::mpsc::Sender<proto::SessionRequest>,
    tonic::Streaming<proto::SessionResponse>,
    tonic::Streaming<proto::LockEvent>,
) {
    use proto::session_request::Command;
    let (commands, outbox) = tokio::sync::mpsc::channel(4);
    commands
        .send(proto::SessionRequest {
            command: Some(Command::Open(proto::SessionOpen {
                ttl_ms: Some(5_000),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
    commands
        .send(proto::SessionRequest {
            command: Some(Command::Acquire(proto::SessionAcquire {
                request_id: 1,
                acquire: Some(acquire("gauged", "")),
            })),
        })
        .await
        .unwrap();
    let mut events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .unwrap()
        .into_inner();
    // Opened, then acquired.
    for _ in 0..2 {
        events.message().await.unwrap().unwrap();
    }
    let watch = client
        .watch(proto::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    (commands, events, watch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_show_open_streams_session_grants_build_and_process() {
    // Its own process: the gauges are the process's, and other tests in
    // this one open streams of their own meanwhile.
    let redis = start_redis();
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], tumbler::dev::free_port().unwrap()));
    let listen = format!("--http-listen={http}");
    let server = TumblerProcess::start(&redis.url(), &[&listen]).await;
    let mut client = server.client().await;
    let page = common::http::scrape(http).await;
    let value = |page: &str, name: &str, labels: &[(&str, &str)]| {
        common::http::sample(page, name, labels).unwrap_or_else(|| panic!("{name}: {page}"))
    };
    let version = env!("CARGO_PKG_VERSION");
    let commit = page
        .lines()
        .find(|l| l.starts_with("tumbler_build_info{"))
        .and_then(|l| l.split("commit=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    assert!(
        commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    assert_eq!(
        value(
            &page,
            "tumbler_build_info",
            &[("version", version), ("commit", &commit)]
        ),
        1.0
    );
    assert!(value(&page, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(value(&page, "process_start_time_seconds", &[]) > 1e9);
    assert!(page.contains("process_cpu_seconds_total"));
    let before_sessions = value(&page, "tumbler_open_streams", &[("stream", "session")]);
    let before_watches = value(&page, "tumbler_open_streams", &[("stream", "watch")]);

    let (commands, events, watch) = open_session_and_watch(&mut client).await;
    let page = scrape_until(http, |page| {
        common::http::sample(page, "tumbler_open_streams", &[("stream", "watch")])
            == Some(before_watches + 1.0)
    })
    .await;
    assert_eq!(
        value(&page, "tumbler_open_streams", &[("stream", "session")]),
        before_sessions + 1.0
    );
    assert!(value(&page, "tumbler_session_grants", &[]) >= 1.0);

    // Streams that end are counted down.
    drop((commands, events, watch));
    scrape_until(http, |page| {
        common::http::sample(page, "tumbler_open_streams", &[("stream", "session")])
            == Some(before_sessions)
            && common::http::sample(page, "tumbler_open_streams", &[("stream", "watch")])
                == Some(before_watches)
    })
    .await;
}

/// The metric names the table of docs/operating.md lists (`process_*` stands for the
/// process metrics).
fn documented_metrics() -> std::collections::BTreeSet<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md")).unwrap();
    let section = readme
        .split("### Prometheus metrics")
        .nth(1)
        .expect("docs/operating.md has a Prometheus metrics section");
    let section = section.split("\n#").next().unwrap();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_metric_list_is_exactly_what_is_served() {
    let server = serve_with_http().await;
    let http = server.http();
    let mut client = server.client().await;
    // Traffic that makes every lazily created series appear: grants, a
    // wait, a release (hold time), a short lease the reaper finds expired.
    client.acquire(acquire("listed", "a")).await.unwrap();
    client
        .acquire(proto::AcquireRequest {
            wait_ms: 50,
            ..acquire("listed", "b")
        })
        .await
        .unwrap();
    client.release(release("listed", "a")).await.unwrap();
    client
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(1),
            ..acquire("lapsing", "a")
        })
        .await
        .unwrap();
    let _streams = open_session_and_watch(&mut client).await;
    let page = scrape_until(http, |page| {
        page.contains("tumbler_reaper_runs_total") && page.contains("tumbler_reaped_total")
    })
    .await;

    let served: std::collections::BTreeSet<String> = page
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .map(|name| {
            if name.starts_with("process_") {
                "process_*".to_owned()
            } else {
                name.to_owned()
            }
        })
        .collect();
    let documented = documented_metrics();
    // Appears with the first Redis failure behind an RPC.
    let on_failure = ["tumbler_redis_errors_total"];
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented
        .difference(&served)
        .filter(|name| !on_failure.contains(&name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "served but not in docs/operating.md: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "in docs/operating.md but not served: {stale:?}"
    );
}

/// A session's commands are counted as the Acquire and Release RPCs are:
/// per kind, outcome, wait and hold (its own process: the series are the
/// process's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_commands_are_counted_like_the_rpcs() {
    use common::session::Session;
    use proto::session_request::Command;
    use proto::session_response::Event;
    let redis = start_redis();
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], tumbler::dev::free_port().unwrap()));
    let listen = format!("--http-listen={http}");
    let server = TumblerProcess::start(&redis.url(), &[&listen]).await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 10_000).await;
    let granted = session.acquire(1, kinded("sess-1", "", "batch")).await;
    assert_eq!(granted.status(), AcquireStatus::Acquired);
    let busy = client
        .acquire(kinded("sess-2", "other", "batch"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.status(), AcquireStatus::Acquired);
    let refused = session.acquire(2, kinded("sess-2", "", "batch")).await;
    assert_eq!(refused.reason(), NotAcquiredReason::Busy);
    session
        .send(Command::Release(proto::SessionRelease {
            request_id: 3,
            namespace: "default".into(),
            name: "sess-1".into(),
            names: Vec::new(),
        }))
        .await;
    match session.next().await {
        Some(Event::Released(r)) => {
            assert_eq!(r.response.unwrap().status(), proto::ReleaseStatus::Released)
        }
        other => panic!("{other:?}"),
    }

    let page = common::http::scrape(http).await;
    let outcome = |outcome: &str| {
        common::http::sample(
            &page,
            "tumbler_acquire_outcomes_total",
            &[("kind", "batch"), ("outcome", outcome)],
        )
    };
    // Two grants (one through the session, one by the RPC), one busy.
    assert_eq!(outcome("acquired"), Some(2.0), "{page}");
    assert_eq!(outcome("busy"), Some(1.0), "{page}");
    assert_eq!(
        common::http::sample(&page, "tumbler_hold_seconds_count", &[("kind", "batch")]),
        Some(1.0),
        "{page}"
    );
}
