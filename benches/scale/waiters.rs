//! The scale bench's waiting part: what 10,000 waiting RPCs cost one
//! `tumbler serve` process (RSS) and Redis (commands per second while
//! they wait).

use super::*;

/// 10,000 waiting RPCs on one `tumbler serve` process.
pub async fn many_waiters(waiters: usize, locks: usize, idle: Duration) {
    let redis_server = RedisServer::start("redis-server").expect("redis-server");
    let serve = common::ServeProcess::start(
        &redis_server.url(),
        &[
            "--reap-interval-ms",
            "0",
            "--max-waiters-per-namespace",
            "1000000",
        ],
    )
    .await;
    let endpoint = serve.endpoint.clone();
    let chans = channels(&endpoint, waiters.div_ceil(500)).await;
    let mut client = LockServiceClient::new(chans[0].clone());
    for l in 0..locks {
        client
            .acquire(proto::AcquireRequest {
                name: format!("busy-{l}"),
                holder: "owner".into(),
                ttl_ms: Some(LONG_TTL_MS),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let rss_before = serve.rss_kib();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..waiters {
        let mut c = LockServiceClient::new(chans[w / 500].clone());
        tasks.spawn(async move {
            let _ = c
                .acquire(proto::AcquireRequest {
                    name: format!("busy-{}", w % locks),
                    holder: format!("w{w}"),
                    wait_ms: 600_000,
                    ..Default::default()
                })
                .await;
        });
    }
    loop {
        let mut queued = 0;
        for l in 0..locks {
            queued += client
                .inspect(proto::InspectRequest {
                    name: format!("busy-{l}"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .waiters as usize;
        }
        if queued == waiters {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rss_waiting = serve.rss_kib();
    let mut conn = common::redis_conn(&redis_server.url()).await;
    common::reset_command_stats(&mut conn).await;
    tokio::time::sleep(idle).await;
    let stats = common::command_stats(&mut conn).await;
    let calls: u64 = stats.iter().map(|stat| stat.calls).sum();
    let rss_after_idle = serve.rss_kib();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(serve);

    let seconds = idle.as_secs_f64();
    let per_command: Vec<String> = (stats.iter())
        .filter(|stat| stat.calls > 0)
        .map(|stat| format!("{} {:.1}/s", stat.name, stat.calls as f64 / seconds))
        .collect();
    // What the waiters' heartbeats should cost: one refresh per lock per
    // queue_ttl/3 (default queue TTL 5 s), plus the health PING each second.
    let expected = locks as f64 * 3.0 / 5.0 + 1.0;
    println!("\n### {waiters} waiting RPCs on one replica ({locks} locks, {seconds:.0} s idle)\n");
    println!("| measure | value |");
    println!("| --- | ---: |");
    println!(
        "| replica RSS before the waiters | {:.1} MiB |",
        rss_before as f64 / 1024.0
    );
    println!(
        "| replica RSS with them waiting | {:.1} MiB |",
        rss_waiting as f64 / 1024.0
    );
    println!(
        "| replica RSS after {seconds:.0} s of waiting | {:.1} MiB |",
        rss_after_idle as f64 / 1024.0
    );
    println!(
        "| RSS per waiter | {:.1} KiB |",
        (rss_waiting.saturating_sub(rss_before)) as f64 / waiters as f64
    );
    println!(
        "| Redis commands/s while they wait (INFO is the bench's own) | {:.1} ({}) |",
        calls as f64 / seconds,
        per_command.join(", ")
    );
    println!("| expected: one refresh per lock per queue_ttl/3 + health PING | {expected:.1} |");
}
