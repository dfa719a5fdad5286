//! Read/write locks under shared load: acquire READ + release pairs per
//! second with 64 concurrent readers on ONE read/write lock, against 64
//! clients each on a mutex of its own (the uncontended pair), and, to
//! tell the one hot lock from the mode rule, 64 holders of ONE plain
//! semaphore of limit 64; the same in-process server and redis-server, in
//! the same run, on loopback. Nobody waits in any row: the read/write
//! lock admits the server's maximum of readers (its limit left out), the
//! semaphore 64.
//!
//! Then Redis' own count of the work per pair (`INFO commandstats` after
//! `CONFIG RESETSTAT`, around a fixed number of pairs per client): the
//! function calls the server sent (group commit may carry several
//! operations in one) and the commands run inside them (both measured by
//! `common/pairs.rs`).
//!
//! `cargo bench --bench read_write` (READ_WRITE_SECONDS=N per row after
//! 1 s of warm-up, default 3). Under `cargo test` a smoke run with tiny
//! counts only checks that numbers come out.

pub mod common;

use common::pairs::{Timing, redis_work, throughput};
use tumbler::proto::{self, LockMode};

const CLIENTS: usize = 64;

/// What each client acquires and releases.
#[derive(Clone, Copy, Debug)]
enum Row {
    /// Client i: mutex `mutex-i`.
    Mutexes,
    /// Every client: semaphore `semaphore`, limit 64.
    Semaphore,
    /// Every client: read/write lock `catalog`, READ.
    Readers,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Mutexes => "64 clients, 64 mutexes (one each): acquire + release",
            Row::Semaphore => "64 clients, ONE semaphore of limit 64: acquire + release",
            Row::Readers => "64 readers, ONE read/write lock: acquire READ + release",
        }
    }

    fn request(self, client: usize) -> proto::AcquireRequest {
        let holder = format!("client-{client}");
        let mut request = proto::AcquireRequest {
            holder,
            ttl_ms: Some(30_000),
            ..Default::default()
        };
        match self {
            Row::Mutexes => request.name = format!("mutex-{client}"),
            Row::Semaphore => {
                request.name = "semaphore".into();
                request.limit = Some(CLIENTS as u32);
            }
            Row::Readers => {
                request.name = "catalog".into();
                request.set_mode(LockMode::Read);
            }
        }
        request
    }

    /// Every client's request.
    fn requests(self) -> Vec<proto::AcquireRequest> {
        (0..CLIENTS).map(|client| self.request(client)).collect()
    }
}

#[tokio::main]
async fn main() {
    let Timing {
        warm_up,
        window,
        each,
    } = Timing::from_env("READ_WRITE_SECONDS");
    let (_redis, endpoint, mut conn) = common::pairs::server().await;

    println!(
        "tumbler read/write benchmark: {CLIENTS} clients, {} s per row after {} ms of warm-up; \
         Redis work over {each} pairs per client; one in-process server and redis-server on loopback",
        window.as_secs_f64(),
        warm_up.as_millis()
    );
    println!("| row | pairs/s | vs 64 mutexes | Redis calls per pair | commands inside per pair |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut mutexes = 0.0;
    for row in [Row::Mutexes, Row::Semaphore, Row::Readers] {
        let rate = throughput(&endpoint, &row.requests(), warm_up, window).await;
        assert!(rate > 0.0, "{row:?} made no pairs");
        if let Row::Mutexes = row {
            mutexes = rate;
        }
        let (calls, inner) = redis_work(&endpoint, &row.requests(), &mut conn, each).await;
        assert!(inner > 0.0, "{row:?}: Redis counted no work");
        println!(
            "| {} | {rate:.0} | {:.2}× | {calls:.2} | {inner:.2} |",
            row.label(),
            rate / mutexes
        );
    }
}
