//! The scale bench's changelog part: what one changelog event costs
//! Redis, and a flooded namespace against its byte budget.

use super::*;

/// What one changelog event costs Redis: `pairs` acquire+release pairs in
/// each of three namespaces with a changelog (32 shards, size 1000), of
/// events without metadata, with a little (two short entries) and with
/// 8 KB (cut to 256 bytes in the changelog); then per event the list
/// bytes Redis counts (MEMORY USAGE ... SAMPLES 0 over every shard's
/// list, divided by the entries kept) and the entry's own length; and
/// the whole namespace's lists after `flood` pairs of 8 KB metadata
/// against the byte budget (shards x size x 256 bytes).
pub async fn changelog_bytes(pairs: usize, flood: usize) {
    let redis_server = RedisServer::start("redis-server").expect("redis-server");
    let mut conn = common::redis_conn(&redis_server.url()).await;
    let args = ServiceArgs {
        changelog_namespaces: vec!["plain".into(), "typical".into(), "meta8k".into()],
        ..service_args()
    };
    let shards = args.shards;
    let size = args.changelog_size;
    let config = ServerConfig::new(redis_server.url(), &args).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let _task = tokio::spawn(tumbler::server::serve(
        config,
        listener,
        std::future::pending(),
    ));
    common::wait_until_serving(&endpoint).await;
    let chans = channels(&endpoint, 8).await;
    let eight_kb: std::collections::HashMap<String, String> = (0..32)
        .map(|i| (format!("key-{i:02}"), "v".repeat(250)))
        .collect();
    let typical: std::collections::HashMap<String, String> = [
        ("job".to_owned(), "4711".to_owned()),
        ("host".to_owned(), "worker-3".to_owned()),
    ]
    .into();
    let run = |namespace: &'static str,
               metadata: std::collections::HashMap<String, String>,
               pairs: usize| {
        let chans = chans.clone();
        async move {
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut tasks = tokio::task::JoinSet::new();
            for c in 0..32 {
                let mut client = LockServiceClient::new(chans[c % chans.len()].clone());
                let (next, metadata) = (next.clone(), metadata.clone());
                tasks.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= pairs {
                            return;
                        }
                        let name = format!("jobs/nightly-{i:06}");
                        let holder = format!("worker-{:02}", i % 64);
                        client
                            .acquire(proto::AcquireRequest {
                                namespace: namespace.into(),
                                name: name.clone(),
                                holder: holder.clone(),
                                metadata: metadata.clone(),
                                ..Default::default()
                            })
                            .await
                            .unwrap();
                        client
                            .release(proto::ReleaseRequest {
                                namespace: namespace.into(),
                                name,
                                holder,
                                ..Default::default()
                            })
                            .await
                            .unwrap();
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        }
    };
    // (bytes Redis counts for the namespace's lists, entries, entry bytes)
    let lists_conn = conn.clone();
    let lists = |namespace: &'static str| {
        let mut conn = lists_conn.clone();
        async move {
            let (mut bytes, mut entries, mut raw) = (0i64, 0i64, 0usize);
            for shard in 0..shards {
                let key = format!("tumbler:{{{namespace}:{shard}}}:c");
                let usage: Option<i64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let kept: Vec<String> = redis::cmd("LRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                bytes += usage.unwrap_or(0);
                entries += kept.len() as i64;
                raw += kept.iter().map(String::len).sum::<usize>();
            }
            (bytes, entries, raw)
        }
    };
    println!(
        "\n### Changelog: bytes per event ({pairs} acquire+release pairs per namespace, {shards} shards, size {size})\n"
    );
    println!(
        "| events | list bytes per event (MEMORY USAGE) | entry length | INFO used_memory delta per event |"
    );
    println!("| --- | ---: | ---: | ---: |");
    for (namespace, metadata, label) in [
        ("plain", Default::default(), "no metadata"),
        (
            "typical",
            typical,
            "two short metadata entries (29 bytes of JSON)",
        ),
        (
            "meta8k",
            eight_kb.clone(),
            "8 KB of metadata (cut to 256 bytes)",
        ),
    ] {
        let before = info_field(&mut conn, "memory", "used_memory").await;
        run(namespace, metadata, pairs).await;
        let after = info_field(&mut conn, "memory", "used_memory").await;
        let (bytes, entries, raw) = lists(namespace).await;
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} |",
            bytes as f64 / entries as f64,
            raw as f64 / entries as f64,
            (after - before) as f64 / entries as f64,
        );
    }
    run("meta8k", eight_kb, flood).await;
    let (bytes, entries, _) = lists("meta8k").await;
    let budget = i64::from(shards) * i64::from(size) * 256;
    println!(
        "\nAfter {} more pairs of 8 KB metadata: {entries} events kept, {:.2} MB of lists \
         (budget {:.2} MB: {shards} shards x {size} x 256 bytes).",
        flood,
        bytes as f64 / 1e6,
        budget as f64 / 1e6
    );
}
