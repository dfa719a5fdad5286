//! Multi-locks (decision 0076), uncontended: a set of 3 names taken with
//! ONE Acquire (`names`) and released with one Release, against the same 3
//! locks taken with 3 single Acquires in sequence and 3 Releases; the same
//! in-process server and redis-server, in the same run, on loopback. 16
//! clients, each on locks of its own (nobody waits).
//!
//! Then Redis' own count of the work per set (`INFO commandstats` after
//! `CONFIG RESETSTAT`, around a fixed number of sets per client): the
//! function calls the server sent and the commands run inside them.
//!
//! `cargo bench --bench multi` (MULTI_SECONDS=N per row after 1 s of
//! warm-up, default 3). Under `cargo test` a smoke run with tiny counts
//! only checks that numbers come out.

pub mod common;

use common::pairs::{Timing, Unit, redis_work, throughput};
use tonic::transport::Channel;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};

const CLIENTS: usize = 16;

#[derive(Clone, Copy, Debug)]
enum Row {
    /// One Acquire of 3 names, one Release of the set.
    Multi,
    /// 3 Acquires, then 3 Releases, one after the other.
    Singles,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Multi => "a multi-lock of 3 names: 1 Acquire + 1 Release",
            Row::Singles => "3 single locks in sequence: 3 Acquires + 3 Releases",
        }
    }

    /// Every client's set.
    fn sets(self) -> Vec<Set> {
        (0..CLIENTS)
            .map(|client| Set { row: self, client })
            .collect()
    }
}

/// One client's 3 locks, taken and let go as its row says.
#[derive(Clone, Copy)]
struct Set {
    row: Row,
    client: usize,
}

impl Unit for Set {
    async fn run(&self, rpc: &mut LockServiceClient<Channel>) {
        let holder = format!("client-{}", self.client);
        let names: Vec<String> = (0..3)
            .map(|i| format!("account-{}-{i}", self.client))
            .collect();
        let requests: Vec<(String, Vec<String>)> = match self.row {
            Row::Multi => vec![(String::new(), names)],
            Row::Singles => names.into_iter().map(|n| (n, Vec::new())).collect(),
        };
        for (name, names) in &requests {
            let acquire = proto::AcquireRequest {
                name: name.clone(),
                names: names.clone(),
                holder: holder.clone(),
                ttl_ms: Some(30_000),
                ..Default::default()
            };
            let reply = rpc.acquire(acquire).await.unwrap().into_inner();
            assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
        }
        for (name, names) in requests {
            let release = proto::ReleaseRequest {
                name,
                names,
                holder: holder.clone(),
                ..Default::default()
            };
            let reply = rpc.release(release).await.unwrap().into_inner();
            assert_eq!(reply.status(), ReleaseStatus::Released);
        }
    }
}

#[tokio::main]
async fn main() {
    let Timing {
        warm_up,
        window,
        each,
    } = Timing::from_env("MULTI_SECONDS");
    let (_redis, endpoint, mut conn) = common::pairs::server().await;
    println!(
        "tumbler multi-lock benchmark: {CLIENTS} clients on locks of their own, {} s per row after {} ms of warm-up; \
         Redis work over {each} sets per client; one in-process server and redis-server on loopback",
        window.as_secs_f64(),
        warm_up.as_millis()
    );
    println!("| row | sets/s | vs 3 singles | Redis calls per set | commands inside per set |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut results = Vec::new();
    for row in [Row::Singles, Row::Multi] {
        let rate = throughput(&endpoint, &row.sets(), warm_up, window).await;
        assert!(rate > 0.0, "{row:?} made no sets");
        let (calls, inner) = redis_work(&endpoint, &row.sets(), &mut conn, each).await;
        assert!(inner > 0.0, "{row:?}: Redis counted no work");
        results.push((row, rate, calls, inner));
    }
    let singles = results[0].1;
    for (row, rate, calls, inner) in results {
        println!(
            "| {} | {rate:.0} | {:.2}× | {calls:.2} | {inner:.2} |",
            row.label(),
            rate / singles
        );
    }
}
