//! What the overview costs Redis: one walk per second however often it
//! is asked, and acquire latency beside a busy overview.

use super::*;

// ------------------------------------------------------------ overview cost

/// Redis' call counts of `commands` (INFO commandstats), in that order.
async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
    commands: &[&str],
) -> Vec<u64> {
    let calls = common::command_calls(conn).await;
    (commands.iter())
        .map(|command| calls.get(*command).copied().unwrap_or(0))
        .collect()
}

/// The commands an overview walk sends: SCAN (List finds lock keys) and
/// HGETALL (List's function reads each lock; Metrics one per minute).
/// Nothing else here sends them: the reaper is off and the probe's
/// acquires are uncontended.
const OVERVIEW_COMMANDS: [&str; 2] = ["scan", "hgetall"];

/// What [`overview_under_load`] saw.
#[derive(Debug)]
struct OverviewLoad {
    /// Redis calls of one overview walk of the 10,000 locks, measured alone.
    walk: Vec<u64>,
    /// Redis calls while the overview loops ran (acquires alone subtracted).
    hammered: Vec<u64>,
    overview_requests: u64,
    overview_errors: u64,
    seconds: f64,
    acquires_alone: Vec<Duration>,
    acquires_loaded: Vec<Duration>,
    acquires_failed: u64,
}

fn p50(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// Acquire+release pairs on fresh names for `seconds`: each acquire's
/// latency, and how many were not granted.
async fn acquire_probe(server: &DashServer, seconds: f64) -> (Vec<Duration>, u64) {
    let mut client = server.client().await;
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let (mut latencies, mut failed) = (Vec::new(), 0);
    let mut i = 0u64;
    while tokio::time::Instant::now() < until {
        i += 1;
        let name = format!("probe-{i}");
        let started = std::time::Instant::now();
        let granted = client
            .acquire(acquire(&name, "probe"))
            .await
            .is_ok_and(|reply| reply.into_inner().grant.is_some());
        latencies.push(started.elapsed());
        if granted {
            client.release(release(&name, "probe")).await.unwrap();
        } else {
            failed += 1;
        }
    }
    (latencies, failed)
}

/// 10,000 locks held in `bulk`; acquires on other locks for `seconds`
/// alone, then again while 8 loops fetch `bulk`'s overview as fast as
/// they can.
async fn overview_under_load(seconds: f64) -> OverviewLoad {
    let redis = start_redis();
    let server = DashServer::launch_with(&redis.url(), false, &service_args()).await;
    let mut conn = redis_conn(&redis.url()).await;

    // 10,000 locks, 16 clients at a time.
    let fill: Vec<_> = (0..16)
        .map(|worker| {
            let endpoint = server.grpc.clone();
            tokio::spawn(async move {
                let mut client = proto::lock_service_client::LockServiceClient::connect(endpoint)
                    .await
                    .unwrap();
                for i in (worker..10_000).step_by(16) {
                    let reply = client
                        .acquire(proto::AcquireRequest {
                            namespace: "bulk".into(),
                            ttl_ms: Some(600_000),
                            ..acquire(&format!("job-{i:05}"), "filler")
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    assert!(reply.grant.is_some());
                }
            })
        })
        .collect();
    for task in fill {
        task.await.unwrap();
    }

    // One walk, alone: what it costs Redis.
    let before = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let (status, overview) = server.get_json("/api/v1/overview?namespace=bulk").await;
    assert_eq!(status, 200, "{overview}");
    assert_eq!(overview["locks"], "10000", "{overview}");
    let after = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let walk: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(walk.iter().all(|&calls| calls > 0), "{walk:?}");

    // Acquires alone.
    let before = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let (acquires_alone, failed_alone) = acquire_probe(&server, seconds).await;
    let after = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let background: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();

    // Acquires while 8 loops hammer the overview.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let http_addr = server.http;
    let loops: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut errors) = (0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, _) =
                        http(http_addr, "GET", "/api/v1/overview?namespace=bulk", &[], "").await;
                    if status == 200 {
                        ok += 1;
                    } else {
                        errors += 1;
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    let before = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let started = std::time::Instant::now();
    let (acquires_loaded, failed_loaded) = acquire_probe(&server, seconds).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut overview_requests, mut overview_errors) = (0, 0);
    for task in loops {
        let (ok, errors) = task.await.unwrap();
        overview_requests += ok;
        overview_errors += errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = command_calls(&mut conn, &OVERVIEW_COMMANDS).await;
    let hammered: Vec<u64> = after
        .iter()
        .zip(&before)
        .zip(&background)
        .map(|((a, b), bg)| (a - b).saturating_sub((*bg as f64 * elapsed / seconds) as u64))
        .collect();
    OverviewLoad {
        walk,
        hammered,
        overview_requests,
        overview_errors,
        seconds: elapsed,
        acquires_alone,
        acquires_loaded,
        acquires_failed: failed_alone + failed_loaded,
    }
}

impl OverviewLoad {
    /// Walks Redis did for the overview while it was hammered, by the
    /// command that shows the most.
    fn walks(&self) -> f64 {
        self.hammered
            .iter()
            .zip(&self.walk)
            .map(|(&calls, &per_walk)| calls as f64 / per_walk as f64)
            .fold(0.0, f64::max)
    }

    fn report(&self) -> String {
        let (alone, loaded) = (p50(&self.acquires_alone), p50(&self.acquires_loaded));
        format!(
            "overview: {} requests in {:.1} s by 8 loops, {:.1} walks' worth of Redis work \
             (one walk: {:?} calls of {:?}; while hammered: {:?}); acquire p50 {:.2} ms alone \
             ({} acquires), {:.2} ms with the overview loops ({} acquires): ratio {:.2}",
            self.overview_requests,
            self.seconds,
            self.walks(),
            self.walk,
            OVERVIEW_COMMANDS,
            self.hammered,
            alone.as_secs_f64() * 1e3,
            self.acquires_alone.len(),
            loaded.as_secs_f64() * 1e3,
            self.acquires_loaded.len(),
            loaded.as_secs_f64() / alone.as_secs_f64(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_costs_redis_one_walk_per_second_however_often_it_is_asked() {
    let seconds = 3.0;
    let load = overview_under_load(seconds).await;
    println!("{}", load.report());
    assert_eq!(load.overview_errors, 0, "{load:?}");
    // About one walk per second (each kept for a second after it ends),
    // plus the one under way at either end.
    let most = load.seconds.ceil() + 2.0;
    assert!(load.walks() <= most, "{}", load.report());
    // ...while the loops asked many times more often.
    assert!(
        load.overview_requests as f64 >= 3.0 * most,
        "{}",
        load.report()
    );
    // Acquires kept being granted throughout.
    assert_eq!(load.acquires_failed, 0, "{}", load.report());
    assert!(!load.acquires_loaded.is_empty());
}

/// The figures for docs/benchmarks/notebook.md ("Dashboard overview under load"):
/// `cargo test --profile bench --test surface -- --ignored --nocapture dashboard::overview::overview_latency`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn overview_latency_ratio_for_the_benchmarks() {
    let load = overview_under_load(10.0).await;
    println!("{}", load.report());
    assert_eq!(load.acquires_failed, 0);
}
