//! Runs one model configuration and prints what the checker found:
//! `cargo run -p tumbler-model --release --example explore -- <name> [depth]`
//! (the names are those of `tests/check.rs`'s configurations).

use stateright::{Checker, Model};
use std::time::Instant;
use tumbler_model::{Config, Faults, Mode};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("mutex", String::as_str);
    let depth: usize = args.get(2).map_or(0, |d| d.parse().unwrap());
    let mut cfg = Config::small(1);
    match name {
        "mutex" => {}
        "semaphore" => cfg = Config::small(2),
        "faults" => {
            cfg.faults = Faults {
                crash: 1,
                lose_wake: 1,
                duplicate_wake: 1,
                ..Faults::default()
            };
        }
        "pause" => cfg.faults.pause = 1,
        "failover" => cfg.faults.failover = 1,
        "restart" => cfg.faults.restart_empty = 1,
        "sessions" => {
            cfg.sessions = vec![true, false];
            cfg.faults.crash = 1;
        }
        "sessions-no-crash" => cfg.sessions = vec![true, false],
        "same-tick" => {
            cfg.faults.failover = 1;
            cfg.faults.failover_same_tick = true;
        }
        "slow" => {
            cfg.faults.slow_network = true;
            cfg.max_time = std::env::var("MAXT").map_or(5, |w| w.parse().unwrap());
        }
        "slow-network" => {
            cfg.faults.slow_network = true;
            cfg.rounds = 2;
            cfg.max_time = 6;
        }
        "crash2" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.reap = true;
            cfg.faults = Faults {
                crash: 1,
                lose_wake: 1,
                duplicate_wake: 1,
                ..Faults::default()
            };
        }
        "pause2" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.faults.pause = 1;
        }
        "failover2" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.faults.failover = 1;
        }
        "rounds" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.extend = true;
            cfg.reap = true;
        }
        "priorities" => {
            cfg.rounds = 2;
            cfg.priorities = vec![0, 1];
        }
        "live" => {
            cfg.wait = 20;
            cfg.max_time = 8;
            cfg.rounds = 2;
        }
        "live-lost" => {
            cfg.wait = 20;
            cfg.max_time = 8;
            cfg.rounds = 2;
            cfg.faults.lose_wake = 1;
            cfg.served_within = std::env::var("WITHIN").map_or(3, |w| w.parse().unwrap());
        }
        "late-dequeue" => {
            cfg.rounds = 2;
            cfg.wait = 1;
            cfg.ttl = 3;
            cfg.max_time = std::env::var("MAXT").map_or(5, |w| w.parse().unwrap());
            cfg.faults.crash = 1;
        }
        "no-retry" => {
            cfg.rounds = 2;
            cfg.retry_release = false;
            cfg.max_time = std::env::var("MAXT").map_or(4, |w| w.parse().unwrap());
            cfg.faults.crash = 1;
        }
        "long-faults" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.extend = true;
            cfg.reap = true;
            cfg.faults = Faults {
                crash: 1,
                lose_wake: 1,
                duplicate_wake: 1,
                ..Faults::default()
            };
        }
        "long-semaphore" => {
            cfg = Config::small(2);
            cfg.clients = 3;
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.reap = true;
        }
        "long-sessions" => {
            cfg.sessions = vec![true, false];
            cfg.rounds = 2;
            cfg.max_time = 7;
            cfg.faults = Faults {
                crash: 1,
                lose_wake: 1,
                ..Faults::default()
            };
        }
        "long-loss" => {
            cfg.rounds = 2;
            cfg.max_time = 7;
            cfg.faults = Faults {
                failover: 1,
                pause: 1,
                ..Faults::default()
            };
        }
        "big" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.extend = true;
            cfg.reap = true;
            cfg.sessions = vec![false, true];
            cfg.faults = Faults {
                crash: 1,
                lose_wake: 1,
                duplicate_wake: 1,
                pause: 1,
                failover: 1,
                ..Faults::default()
            };
        }
        "rw" | "rw-hand" | "long-rw" | "long-rw-hand" => {
            // A writer and two readers, limit 2, the writer may downgrade.
            cfg = Config::small(2);
            cfg.clients = 3;
            cfg.modes = vec![Some(Mode::Write), Some(Mode::Read), Some(Mode::Read)];
            cfg.downgrade = true;
            cfg.hand_over = name.ends_with("hand");
            if name.starts_with("long") {
                cfg.rounds = 2;
                cfg.max_time = 6;
                cfg.reap = true;
            }
        }
        "rw-writers" => {
            // Two writers and a reader, limit 2.
            cfg = Config::small(2);
            cfg.clients = 3;
            cfg.modes = vec![Some(Mode::Write), Some(Mode::Read), Some(Mode::Write)];
            cfg.downgrade = true;
        }
        "hand" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.extend = true;
            cfg.reap = true;
            cfg.hand_over = true;
        }
        "hand-crash" | "long-hand-crash" => {
            cfg.rounds = 2;
            cfg.max_time = 6;
            cfg.reap = true;
            cfg.hand_over = true;
            cfg.faults = Faults {
                crash: 1,
                lose_wake: 1,
                duplicate_wake: 1,
                ..Faults::default()
            };
            cfg.max_time = std::env::var("MAXT").map_or(6, |w| w.parse().unwrap());
            if name.starts_with("long") {
                cfg.extend = true;
            }
        }
        "dead-waiter" | "dead-waiter-hand" => {
            // A holder, a waiter whose replica dies, a live waiter behind.
            cfg.clients = 3;
            cfg.wait = 20;
            cfg.max_time = std::env::var("MAXT").map_or(7, |w| w.parse().unwrap());
            cfg.faults.crash = 1;
            cfg.hand_over = name.ends_with("hand");
            cfg.ttl = std::env::var("TTL").map_or(2, |w| w.parse().unwrap());
            cfg.served_within = std::env::var("WITHIN").map_or(4, |w| w.parse().unwrap());
        }
        "weighted" | "weighted-barging" | "long-weighted" => {
            // Limit 3; clients ask 2, 1 and 2 permits (the one of 1 barges
            // in `weighted-barging`).
            cfg = Config::small(3);
            cfg.clients = 3;
            cfg.permits = vec![2, 1, 2];
            cfg.barging = vec![false, name.ends_with("barging"), false];
            if name.starts_with("long") {
                cfg.barging = vec![false, true, false];
                cfg.rounds = 2;
                cfg.max_time = 6;
                cfg.reap = true;
            }
        }
        "election" | "election-pause" | "long-election" | "long-election-crash" => {
            // Two candidates campaign (fair, limit 1), proclaim, resign.
            cfg.election = true;
            cfg.extend = true;
            cfg.faults.pause = u8::from(name == "election-pause" || name == "long-election");
            if name.starts_with("long") {
                // Two campaigns per candidate, the reaper, a pause (or a
                // replica crash with a lost and a duplicated wake-up).
                cfg.rounds = 2;
                cfg.max_time = 6;
                cfg.reap = true;
            }
            if name.ends_with("crash") {
                cfg.faults.crash = 1;
                cfg.faults.lose_wake = 1;
                cfg.faults.duplicate_wake = 1;
            }
        }
        "prefer-readers" | "long-prefer-readers" => {
            // A writer, a fair reader and a reader that prefers readers, limit 2.
            cfg = Config::small(2);
            cfg.clients = 3;
            cfg.modes = vec![Some(Mode::Write), Some(Mode::Read), Some(Mode::Read)];
            cfg.barging = vec![false, false, true];
            cfg.rounds = std::env::var("ROUNDS").map_or(1, |w| w.parse().unwrap());
            cfg.limit = std::env::var("LIMIT").map_or(2, |w| w.parse().unwrap());
            if name.starts_with("long") {
                // Two requests each (with the reaper and downgrades too it
                // did not finish within 480 s).
                cfg.rounds = 2;
            }
        }
        "rw-hand-crash" | "weighted-hand-crash" => {
            // Finding 8: a downgrade (or an expiry a request that does not
            // fit purges) hands a permit over while a dead waiter heads
            // the queue.
            cfg = if name.starts_with("rw") {
                Config::read_write([Mode::Write, Mode::Read, Mode::Read], true)
            } else {
                Config {
                    hand_over: true,
                    ..Config::weighted(false)
                }
            };
            cfg.faults.crash = 1;
        }
        "multi" | "multi-cluster" | "long-multi" | "long-multi-cluster" => {
            // A set of locks 0 and 1, a client of lock 1, one of lock 0;
            // on the Cluster path a reservation of a tick.
            // OBSERVER=0: without client 2 (lock 0 alone); LOSE=0: no
            // lost wake-up; UNPINNED=1: the set's release names no token
            // (finding 10); EXTENDS=<n>: the set's extends per request (1);
            // CRASH=<n>: replica crashes (1); SLOW=1: a slow network.
            let cluster = name.ends_with("cluster");
            let observer = std::env::var("OBSERVER").map_or(true, |o| o != "0");
            cfg = Config::multi(u8::from(cluster), observer, 1);
            cfg.unpinned_set_release = std::env::var("UNPINNED").is_ok_and(|u| u == "1");
            cfg.set_extends = std::env::var("EXTENDS").map_or(1, |w| w.parse().unwrap());
            cfg.faults.crash = std::env::var("CRASH").map_or(1, |w| w.parse().unwrap());
            cfg.faults.slow_network = std::env::var("SLOW").is_ok_and(|s| s == "1");
            if name.starts_with("long") {
                cfg.rounds = 2;
                cfg.max_time = std::env::var("MAXT").map_or(6, |w| w.parse().unwrap());
                cfg.faults.lose_wake = std::env::var("LOSE").map_or(1, |w| w.parse().unwrap());
            }
        }
        "multi-retake" | "multi-retake-unpinned" => {
            // Finding 10's configuration: the set and lock 1, two requests
            // each, one crash; the set's release pinned to its tokens, or
            // (unpinned) naming none. MAXT: the clock's bound (3); WAIT:
            // how long a request waits (0); EXTENDS: the set's extends (0).
            let maxt = std::env::var("MAXT").map_or(3, |w| w.parse().unwrap());
            cfg = Config::multi_retake(name.ends_with("unpinned"), maxt);
            cfg.wait = std::env::var("WAIT").map_or(cfg.wait, |w| w.parse().unwrap());
            cfg.set_extends = std::env::var("EXTENDS").map_or(0, |w| w.parse().unwrap());
        }
        other => panic!("unknown configuration {other}"),
    }
    let start = Instant::now();
    let mut builder = cfg.clone().checker();
    if depth > 0 {
        builder = builder.target_max_depth(depth);
    }
    // TIMEOUT=<seconds>: stop there and report what was explored.
    if let Ok(secs) = std::env::var("TIMEOUT") {
        builder = builder.timeout(std::time::Duration::from_secs(secs.parse().unwrap()));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{name}: {} states, {} unique, depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    for p in cfg.properties() {
        let found = checker.discovery(p.name);
        println!(
            "  {:?} {:50} {}",
            p.expectation,
            p.name,
            if found.is_some() { "FOUND" } else { "-" }
        );
        let want = std::env::var("SHOW").unwrap_or_default();
        if let Some(path) =
            found.filter(|_| want.split(',').any(|w| !w.is_empty() && p.name.contains(w)))
        {
            for (state, action) in path.into_vec() {
                println!("      {action:?}  @{} {:?}", state.now, state.redis.lock);
            }
        }
    }
}
