//! Failed-authentication throttling per client address: the dashboard's
//! login form and session resumes (a resume secret is a credential too).
//! After `max_failures` failures from one address within a window
//! (counted from its first failure), that address's attempts are refused
//! (RESOURCE_EXHAUSTED; 429 on the HTTP port) until the window ends, right
//! or wrong: a refused attempt is not even checked, so it tells nothing.
//!
//! A success does not clear an address's count: a tenant holding one
//! valid token could otherwise reset its count between guesses at
//! another. IPv6 clients are counted by their /64 (one host usually has
//! a whole /64 to pick addresses from).
//!
//! Memory is bounded: at most `max_addresses` addresses are remembered
//! (~80 bytes each). An address that fails while the table is full is
//! counted in one shared overflow entry instead, which, while the table
//! is full, judges every address not in it: an attacker with more addresses than the
//! table holds throttles its excess as one, at the price of refusing new
//! addresses' attempts while that overflow entry is over the limit.
//! Entries leave when their window ends (the table keeps them in window
//! order, so that costs nothing per call).
//!
//! The throttle is per replica (no Redis round trip on a login), like the
//! per-token request rates.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::Status;

/// How the throttle counts (`--auth-failures-per-address`,
/// `--auth-failure-window-ms`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThrottleSettings {
    /// Failures one address may make per window; 0 turns the throttle off.
    pub max_failures: u32,
    /// How long, from an address's first failure, its failures are
    /// counted (and, past the limit, its attempts refused).
    pub window: Duration,
    /// Addresses remembered at most.
    pub max_addresses: usize,
}

impl ThrottleSettings {
    /// `--auth-failures-per-address`'s default.
    pub const DEFAULT_MAX_FAILURES: u32 = 10;
    /// Addresses the throttle remembers at most.
    pub const MAX_ADDRESSES: usize = 10_000;
}

impl Default for ThrottleSettings {
    /// On, as `tumbler serve` runs without flags.
    fn default() -> Self {
        ThrottleSettings {
            max_failures: Self::DEFAULT_MAX_FAILURES,
            window: Duration::from_secs(60),
            max_addresses: Self::MAX_ADDRESSES,
        }
    }
}

/// An attempt refused by the [`Throttle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// When the address's window ends.
    pub retry_after: Duration,
}

impl Throttled {
    /// Whole seconds to wait, at least 1 (for `Retry-After`).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs_f64().ceil().max(1.0) as u64
    }
}

impl std::fmt::Display for Throttled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "too many failed authentications from this address; retry in {} s",
            self.retry_after_secs()
        )
    }
}

impl From<Throttled> for Status {
    fn from(throttled: Throttled) -> Status {
        Status::resource_exhausted(throttled.to_string())
    }
}

/// One replica's count of failed authentications per client address
/// (shared by the dashboard and the Session RPC).
pub struct Throttle {
    settings: ThrottleSettings,
    /// A std mutex: held for a hash lookup, never across an await.
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    entries: HashMap<IpAddr, Entry>,
    /// The entries' keys in the order their windows started (so also
    /// ended): expired ones are taken off the front.
    order: VecDeque<(IpAddr, Instant)>,
    /// The failures of addresses that found the table full.
    overflow: Option<Entry>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    failures: u32,
    since: Instant,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(ThrottleSettings::default())
    }
}

impl Throttle {
    pub fn new(settings: ThrottleSettings) -> Self {
        Throttle {
            settings,
            table: Mutex::default(),
        }
    }

    /// Ok when an attempt from `from` may be checked; [`Throttled`]
    /// (RESOURCE_EXHAUSTED as a gRPC status, saying when to retry) when
    /// that address failed too often within its window. An unknown
    /// address is never refused.
    pub fn check(&self, from: Option<IpAddr>) -> Result<(), Throttled> {
        self.check_at(from, Instant::now())
    }

    /// Counts a failed authentication from `from`.
    pub fn failed(&self, from: Option<IpAddr>) {
        self.failed_at(from, Instant::now())
    }

    /// Addresses remembered now (the overflow entry not included).
    pub fn len(&self) -> usize {
        self.len_at(Instant::now())
    }

    /// Whether no address is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check_at(&self, from: Option<IpAddr>, now: Instant) -> Result<(), Throttled> {
        let Some(key) = self.key(from) else {
            return Ok(());
        };
        let mut table = self.table();
        table.expire(now, self.settings.window);
        let entry = match table.entries.get(&key) {
            Some(entry) => Some(*entry),
            None if table.entries.len() >= self.settings.max_addresses => table.overflow,
            None => None,
        };
        match entry {
            Some(entry) if entry.failures >= self.settings.max_failures => {
                let ends = entry.since + self.settings.window;
                let left = ends.saturating_duration_since(now);
                if left.is_zero() {
                    return Ok(());
                }
                Err(Throttled { retry_after: left })
            }
            _ => Ok(()),
        }
    }

    fn failed_at(&self, from: Option<IpAddr>, now: Instant) {
        let Some(key) = self.key(from) else {
            return;
        };
        let window = self.settings.window;
        let mut table = self.table();
        table.expire(now, window);
        if let Some(entry) = table.entries.get_mut(&key) {
            entry.failures = entry.failures.saturating_add(1);
            return;
        }
        if table.entries.len() < self.settings.max_addresses {
            table.entries.insert(
                key,
                Entry {
                    failures: 1,
                    since: now,
                },
            );
            table.order.push_back((key, now));
            return;
        }
        let overflow = match table.overflow {
            Some(entry) if now < entry.since + window => entry,
            _ => {
                tracing::warn!(
                    addresses = self.settings.max_addresses,
                    "failed authentications from more addresses than the throttle remembers; the others are counted together"
                );
                Entry {
                    failures: 0,
                    since: now,
                }
            }
        };
        table.overflow = Some(Entry {
            failures: overflow.failures.saturating_add(1),
            ..overflow
        });
    }

    fn len_at(&self, now: Instant) -> usize {
        let mut table = self.table();
        table.expire(now, self.settings.window);
        table.entries.len()
    }

    /// The table key of an address: IPv4 as it is (also when mapped into
    /// IPv6), IPv6 by its /64; None when the throttle is off or the
    /// address unknown.
    fn key(&self, from: Option<IpAddr>) -> Option<IpAddr> {
        if self.settings.max_failures == 0 {
            return None;
        }
        Some(match from? {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
            },
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Table {
    /// Forgets the entries whose window has ended.
    fn expire(&mut self, now: Instant, window: Duration) {
        while let Some(&(key, since)) = self.order.front() {
            if now < since + window {
                break;
            }
            self.order.pop_front();
            if self.entries.get(&key).is_some_and(|e| e.since == since) {
                self.entries.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    fn throttle(max_failures: u32, max_addresses: usize) -> Throttle {
        Throttle::new(ThrottleSettings {
            max_failures,
            window: Duration::from_secs(60),
            max_addresses,
        })
    }

    #[test]
    fn an_address_is_refused_after_its_failures_until_the_window_ends() {
        let t = throttle(3, 100);
        let start = Instant::now();
        for i in 0..3 {
            let now = start + Duration::from_secs(i);
            t.check_at(v4(1), now).unwrap();
            t.failed_at(v4(1), now);
        }
        let refused = t.check_at(v4(1), start).unwrap_err();
        assert_eq!(refused.retry_after_secs(), 60);
        let status = Status::from(refused);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("retry in 60 s"), "{status:?}");
        // Another address, and an unknown one, are not affected.
        t.check_at(v4(2), start).unwrap();
        t.check_at(None, start).unwrap();
        // The window counts from the first failure.
        let late = start + Duration::from_millis(59_500);
        assert_eq!(t.check_at(v4(1), late).unwrap_err().retry_after_secs(), 1);
        t.check_at(v4(1), start + Duration::from_secs(60)).unwrap();
        assert_eq!(
            t.len_at(start + Duration::from_secs(60)),
            0,
            "gone with its window"
        );
    }

    #[test]
    fn off_counts_nothing() {
        let t = throttle(0, 100);
        for _ in 0..100 {
            t.failed(v4(1));
        }
        t.check(v4(1)).unwrap();
        assert!(t.is_empty());
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let t = throttle(2, 100);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        t.failed(Some(a));
        t.failed(Some(b));
        assert!(t.check(Some(a)).is_err());
        t.check(Some(other)).unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        t.failed(Some(mapped));
        t.failed(v4(7));
        assert!(t.check(v4(7)).is_err());
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn the_table_is_bounded_and_the_excess_is_counted_together() {
        let t = throttle(3, 50);
        let start = Instant::now();
        // 10,000 addresses fail once each within a second.
        for i in 0..10_000u32 {
            let [_, _, hi, lo] = i.to_be_bytes();
            let now = start + Duration::from_micros(u64::from(i) * 100);
            t.failed_at(Some(IpAddr::from([10, 1, hi, lo])), now);
        }
        let now = start + Duration::from_secs(1);
        assert_eq!(t.len_at(now), 50);
        assert!(t.table().order.len() <= 50, "{}", t.table().order.len());
        // The first 50 each failed once: not refused. Any other address
        // is judged by the overflow entry, which is far over.
        t.check_at(Some(IpAddr::from([10, 1, 0, 1])), now).unwrap();
        assert!(t.check_at(Some(IpAddr::from([192, 0, 2, 1])), now).is_err());
        // A minute later everything is forgotten, the overflow too.
        let later = start + Duration::from_secs(61);
        t.check_at(Some(IpAddr::from([192, 0, 2, 1])), later)
            .unwrap();
        assert_eq!(t.len_at(later), 0);
        assert!(t.table().order.is_empty());
    }
}
