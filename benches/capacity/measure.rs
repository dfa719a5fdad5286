//! CPU from outside: each process's user + system time from
//! `/proc/<pid>/stat` (every thread, live or exited), the machine's busy
//! and idle time from `/proc/stat`, and Redis' own call counts (`INFO
//! commandstats`, reset when a window starts).

use std::time::Duration;

/// User + system CPU of a process so far.
pub fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) start at ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ticks = field(11) + field(12);
    Duration::from_micros(ticks * 1_000_000 / ticks_per_second())
}

fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |t| t as u64)
}

/// The machine's CPU time so far: (busy, all), over every core.
pub fn machine() -> (Duration, Duration) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = (stat.lines().next().unwrap_or_default().split_whitespace())
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    if ticks.len() < 8 {
        return (Duration::ZERO, Duration::ZERO);
    }
    // user nice system idle iowait irq softirq steal (guest is in user).
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks[3] + ticks[4];
    let tick = |t: u64| Duration::from_micros(t * 1_000_000 / ticks_per_second());
    (tick(all - idle), tick(all))
}

/// CPU of each watched process, of this one (the load generator) and of
/// the machine, at one instant.
#[derive(Clone)]
pub struct Snapshot {
    pub processes: Vec<Duration>,
    pub client: Duration,
    pub busy: Duration,
    pub all: Duration,
}

pub fn snapshot(pids: &[u32]) -> Snapshot {
    let (busy, all) = machine();
    Snapshot {
        processes: pids.iter().map(|&p| process_cpu(p)).collect(),
        client: process_cpu(std::process::id()),
        busy,
        all,
    }
}

/// What a window cost: each watched process, the load generator, the
/// machine's busy time and its whole CPU time (cores × seconds).
pub struct Spent {
    pub processes: Vec<Duration>,
    pub client: Duration,
    pub busy: Duration,
    pub all: Duration,
}

impl Snapshot {
    pub fn since(&self, before: &Snapshot) -> Spent {
        Spent {
            processes: (self.processes.iter().zip(&before.processes))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            client: self.client.saturating_sub(before.client),
            busy: self.busy.saturating_sub(before.busy),
            all: self.all.saturating_sub(before.all),
        }
    }
}

/// `CONFIG RESETSTAT` on the node at `port`.
pub async fn reset_stats(port: u16) {
    let mut conn = connect(port).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Calls of `names` (e.g. `fcall`, `publish`) the node at `port` counted
/// since its last reset.
pub async fn calls(port: u16, names: &[&str]) -> u64 {
    let mut conn = connect(port).await;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(name, _)| names.contains(name))
        .filter_map(|(_, stats)| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Connections on the node at `port` subscribed to a channel (`CLIENT
/// LIST`'s `sub=` above 0): where the replicas hear their wake-ups.
pub async fn subscribers(port: u16) -> usize {
    let mut conn = connect(port).await;
    let text: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    text.lines()
        .filter(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("sub="))
                .is_some_and(|n| n != "0")
        })
        .count()
}

/// Whether the node at `port` holds a key whose name contains `part`
/// (SCAN, the benchmark's own small data).
pub async fn has_key_with(port: u16, part: &str) -> bool {
    let mut conn = connect(port).await;
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*{part}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            return true;
        }
        if next == 0 {
            return false;
        }
        cursor = next;
    }
}

async fn connect(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
