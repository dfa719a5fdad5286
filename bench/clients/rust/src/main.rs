//! tumbler-client-bench TARGET ADDR CALLERS PAIRS SECS
//!
//! Acquire+release pairs, try-once, each caller on its own lock name, as
//! bench/clients/run.sh runs every language: TARGET `tumbler` (tumbler-client,
//! watchdog off, ADDR the gRPC port) or `redis` (the plain lock: `SET key
//! token NX PX ttl`, then compare-and-delete by EVALSHA, ADDR the Redis
//! port). CALLERS tasks share one client (one HTTP/2 channel for tumbler,
//! one multiplexed connection for Redis). A warm-up of 20 pairs per caller,
//! then up to PAIRS pairs in all, cut at SECS seconds. Prints
//! `pairs=N secs=S`; any pair that is not granted and released fails the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(10);
const UNLOCK: &str =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";

#[derive(Clone)]
enum Target {
    Tumbler(tumbler_client::Client),
    Redis(MultiplexedConnection, Arc<redis::Script>),
}

impl Target {
    async fn pair(&mut self, name: &str) -> Result<(), String> {
        match self {
            Target::Tumbler(client) => {
                let lock = client
                    .lock(name)
                    .ttl(TTL)
                    .watchdog(false)
                    .acquire()
                    .await
                    .map_err(|e| format!("acquire {name}: {e}"))?;
                match lock.release().await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(format!("release {name}: not held")),
                    Err(e) => Err(format!("release {name}: {e}")),
                }
            }
            Target::Redis(conn, unlock) => {
                let token = uuid::Uuid::new_v4().to_string();
                let set: Option<String> = redis::cmd("SET")
                    .arg(name)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(conn)
                    .await
                    .map_err(|e| format!("SET {name}: {e}"))?;
                if set.as_deref() != Some("OK") {
                    return Err(format!("SET {name}: not acquired"));
                }
                let deleted: i64 = unlock
                    .key(name)
                    .arg(&token)
                    .invoke_async(conn)
                    .await
                    .map_err(|e| format!("unlock {name}: {e}"))?;
                if deleted != 1 {
                    return Err(format!("unlock {name}: not held"));
                }
                Ok(())
            }
        }
    }
}

/// Runs `callers` tasks until `total` pairs are done or `deadline` passes;
/// returns the pairs done.
async fn run(target: &Target, callers: u64, total: u64, deadline: Option<Instant>) -> Result<u64, String> {
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let mut target = target.clone();
        let done = done.clone();
        let share = total / callers + u64::from(caller < total % callers);
        tasks.push(tokio::spawn(async move {
            let name = format!("bench-rust-{}-{caller}", std::process::id());
            for _ in 0..share {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                target.pair(&name).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    Ok(done.load(Ordering::Relaxed))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 {
        eprintln!("usage: {} tumbler|redis ADDR CALLERS PAIRS SECS", args[0]);
        std::process::exit(2);
    }
    let (addr, callers, pairs, secs) = (
        args[2].clone(),
        args[3].parse::<u64>().expect("CALLERS"),
        args[4].parse::<u64>().expect("PAIRS"),
        args[5].parse::<f64>().expect("SECS"),
    );
    let target = match args[1].as_str() {
        "tumbler" => Target::Tumbler(
            tumbler_client::Client::connect(addr).await.expect("connect to tumbler"),
        ),
        "redis" => {
            let client = redis::Client::open(format!("redis://{addr}")).expect("redis url");
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect to redis");
            Target::Redis(conn, Arc::new(redis::Script::new(UNLOCK)))
        }
        other => {
            eprintln!("unknown target {other}");
            std::process::exit(2);
        }
    };
    let result = async {
        run(&target, callers, 20 * callers, None).await?;
        let start = Instant::now();
        let done = run(&target, callers, pairs, Some(start + Duration::from_secs_f64(secs))).await?;
        Ok::<_, String>((done, start.elapsed()))
    }
    .await;
    match result {
        Ok((done, elapsed)) => println!("pairs={done} secs={:.6}", elapsed.as_secs_f64()),
        Err(e) => {
            eprintln!("rust {}: {e}", args[1]);
            std::process::exit(1);
        }
    }
}
