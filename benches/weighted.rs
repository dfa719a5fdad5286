//! Weighted permits (decision 0075) against plain semaphore acquires:
//! acquire of k = 3 permits + release pairs per second beside acquire of
//! one permit (k = 1) + release, with the same limit N, the same clients,
//! the same in-process server and redis-server, in the same run, on
//! loopback; then Redis' own count of the work per pair (function calls
//! and the commands inside them, `common/pairs.rs`). Three loads:
//!
//! - uncontended: 64 clients, each on a semaphore of its own (N = 8);
//! - shared, nobody waits: 64 clients on ONE semaphore of N = 192, so
//!   even 64 × 3 permits fit;
//! - shared, contended: 64 clients on ONE semaphore of N = 8, waiting in
//!   its queue (FIFO): 8 holders at once with k = 1, 2 with k = 3.
//!
//! `cargo bench --bench weighted` (WEIGHTED_SECONDS=N per row after 1 s
//! of warm-up, default 3). Under `cargo test` a smoke run with tiny
//! counts only checks that numbers come out.

pub mod common;

use common::pairs::{Timing, redis_work, throughput};
use tumbler::proto;

const CLIENTS: usize = 64;

/// Where the clients acquire, and the limit N of each semaphore.
#[derive(Clone, Copy, Debug)]
enum Load {
    /// Client i: semaphore `own-i`, N = 8.
    Uncontended,
    /// Every client: semaphore `roomy`, N = 192 (64 × 3: nobody waits).
    Shared,
    /// Every client: semaphore `tight`, N = 8, waiting for its turn.
    Contended,
}

impl Load {
    fn label(self) -> &'static str {
        match self {
            Load::Uncontended => "64 clients, 64 semaphores of N = 8 (one each)",
            Load::Shared => "64 clients, ONE semaphore of N = 192 (nobody waits)",
            Load::Contended => "64 clients, ONE semaphore of N = 8 (they queue)",
        }
    }

    /// Every client's acquire of `permits`.
    fn requests(self, permits: u32) -> Vec<proto::AcquireRequest> {
        (0..CLIENTS)
            .map(|client| {
                let (name, limit) = match self {
                    Load::Uncontended => (format!("own-{client}"), 8),
                    Load::Shared => ("roomy".to_owned(), 192),
                    Load::Contended => ("tight".to_owned(), 8),
                };
                proto::AcquireRequest {
                    name,
                    holder: format!("client-{client}"),
                    limit: Some(limit),
                    // k = 1 sends no `permits`, as a plain semaphore
                    // acquire does.
                    permits: (permits > 1).then_some(permits),
                    ttl_ms: Some(30_000),
                    wait_ms: 30_000,
                    ..Default::default()
                }
            })
            .collect()
    }
}

#[tokio::main]
async fn main() {
    let Timing {
        warm_up,
        window,
        each,
    } = Timing::from_env("WEIGHTED_SECONDS");
    let (_redis, endpoint, mut conn) = common::pairs::server().await;

    println!(
        "tumbler weighted permits benchmark: {CLIENTS} clients, {} s per row after {} ms of warm-up; \
         Redis work over {each} pairs per client; one in-process server and redis-server on loopback",
        window.as_secs_f64(),
        warm_up.as_millis()
    );
    println!(
        "| load | acquire | pairs/s | vs k = 1 | Redis calls per pair | commands inside per pair |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for load in [Load::Uncontended, Load::Shared, Load::Contended] {
        let mut one = 0.0;
        for permits in [1, 3] {
            let requests = load.requests(permits);
            let rate = throughput(&endpoint, &requests, warm_up, window).await;
            assert!(rate > 0.0, "{load:?}, k = {permits}: no pairs");
            if permits == 1 {
                one = rate;
            }
            let (calls, inner) = redis_work(&endpoint, &requests, &mut conn, each).await;
            assert!(
                inner > 0.0,
                "{load:?}, k = {permits}: Redis counted no work"
            );
            println!(
                "| {} | k = {permits} + release | {rate:.0} | {:.2}× | {calls:.2} | {inner:.2} |",
                load.label(),
                rate / one
            );
        }
    }
}
