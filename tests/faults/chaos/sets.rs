//! Invariant 15 under chaos: multi-locks are all or nothing as any other
//! caller can observe them, and no part of a set outlives a failure longer
//! than its reservation (or its lease).
//!
//! What is recorded (on the clients' one monotonic clock): every set a
//! client was answered ACQUIRED for ([`Set`]), every attempt (single or
//! set) on the mutexes' names, granted or not ([`Attempt`]: its sending
//! and its answer, a grant, a no or an error), and every observation
//! another client made of one of those names with Inspect ([`Peek`]: one
//! atomic read of one lock, the holders with their tokens and leases).
//! Mutual exclusion per name, set members counted, is the ordinary
//! checker's (each member is also an exclusive [`super::check::Grant`]).
//!
//! The rules checked here, precisely:
//!
//! - **Whole while held.** From the moment a set's ACQUIRED answer arrived
//!   until its holder sent the release (or the set's lease ran out, sent +
//!   ttl, whichever is first), every Inspect of one of its names that was
//!   sent and answered inside that window shows the set's holder holding
//!   that name with the set's token for it. Anything else (the name free,
//!   held by another, or by the holder under another token) is a partial
//!   set visible to another caller.
//! - **No part outlives its failure.** An Inspect that shows a client
//!   holding a name with a token that client was never answered with is a
//!   grant of an attempt that was not answered with it: a part of a set
//!   taken in a round that did not finish (the set's caller failed, or
//!   waited and tried again), or a whole set or a single grant whose answer
//!   was lost. It must be seen no later than
//!   `max(answered, sent + wait + SLACK) + hold` of some attempt of that
//!   client naming that lock, sent before the Inspect was answered: a grant
//!   can land until the attempt's answer-by time (its wait, plus one
//!   command timeout and scheduling: `SLACK`), and `hold` is the
//!   reservation of decision 0076 (`min(ttl, 2 × groups × redis timeout,
//!   10 s)`, groups counted as the set's names, an upper bound) when the
//!   grant seen is a reservation (its lease, expiry minus acquired, is
//!   shorter than the set's ttl), and the attempt's ttl otherwise (a whole
//!   set or single grant whose answer was lost, or the documented window
//!   between a set's first and last Extend).
//!
//! Between a set's sending and its answer (the round), and between its
//! release's sending and the last release (one call per lock), a part may
//! be visible by design (decision 0076): neither window is checked as whole.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The command timeout the chaos replicas run with (`--redis-timeout-ms`).
pub(super) const REDIS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long after an attempt's answer-by time a grant of it may still
/// land: one command timeout plus scheduling on a loaded machine.
const SLACK: Duration = Duration::from_millis(1_000);

/// A set a client was answered ACQUIRED for.
#[derive(Clone, Debug)]
pub(super) struct Set {
    pub(super) client: usize,
    /// (lock index, token), in the request's order.
    pub(super) members: Vec<(usize, u64)>,
    /// The answer arrived.
    pub(super) start: Instant,
    /// The release was sent, or the lease ran out (sent + ttl).
    pub(super) end: Instant,
}

/// An attempt on the mutexes' names, granted or not.
#[derive(Clone, Debug)]
pub(super) struct Attempt {
    pub(super) client: usize,
    pub(super) locks: Vec<usize>,
    pub(super) sent: Instant,
    pub(super) answered: Instant,
    pub(super) wait: Duration,
    pub(super) ttl: Duration,
}

/// A holder an Inspect saw.
#[derive(Clone, Debug)]
pub(super) struct Seen {
    pub(super) client: usize,
    pub(super) token: u64,
    /// The grant's lease as recorded: expires_at minus acquired_at.
    pub(super) lease: Duration,
}

/// One Inspect of one lock by some client.
#[derive(Clone, Debug)]
pub(super) struct Peek {
    pub(super) lock: usize,
    pub(super) sent: Instant,
    pub(super) answered: Instant,
    pub(super) holders: Vec<Seen>,
}

/// Everything the set checker reads.
#[derive(Default)]
pub(super) struct History {
    pub(super) sets: Vec<Set>,
    pub(super) attempts: Vec<Attempt>,
    pub(super) peeks: Vec<Peek>,
    /// Sets answered with a lease shorter than the set's ttl by more than
    /// 100 ms on some lock (one its holder held already, on one Redis
    /// server: that lock keeps what remained of its lease).
    pub(super) short: usize,
}

/// What the set checker found.
#[derive(Debug, Default)]
pub(super) struct SetFindings {
    /// A set held (as its holder was told) and an Inspect inside its window
    /// that did not see the set's grant of the lock it read.
    pub(super) partial: Vec<(Set, Peek)>,
    /// An Inspect that saw a grant nobody was answered with, past every
    /// window an attempt of its holder explains.
    pub(super) outlived: Vec<(Peek, Seen)>,
    /// The Inspects that fell inside a set's window (whole-while-held
    /// checks made) and the unanswered grants seen (outlive checks made).
    pub(super) inside: usize,
    pub(super) leftovers: usize,
}

/// The decision 0076 reservation of a set of `names` with lease `ttl`
/// (groups ≤ names: an upper bound).
pub(super) fn reservation(names: usize, ttl: Duration) -> Duration {
    ttl.min(2 * names as u32 * REDIS_TIMEOUT)
        .min(Duration::from_secs(10))
}

/// Checks `history`; `grants` are every grant the clients were answered
/// with, as (client, lock, token).
pub(super) fn check_sets(
    history: &History,
    answered: impl IntoIterator<Item = (usize, usize, u64)>,
) -> SetFindings {
    let answered: std::collections::HashSet<(usize, usize, u64)> = answered.into_iter().collect();
    let mut peeks_of: HashMap<usize, Vec<&Peek>> = HashMap::new();
    for peek in &history.peeks {
        peeks_of.entry(peek.lock).or_default().push(peek);
    }
    let mut found = SetFindings::default();
    for set in &history.sets {
        for &(lock, token) in &set.members {
            let inside = (peeks_of.get(&lock).into_iter().flatten())
                .filter(|p| p.sent >= set.start && p.answered <= set.end);
            for &peek in inside {
                found.inside += 1;
                let whole =
                    (peek.holders.iter()).any(|h| h.client == set.client && h.token == token);
                if !whole {
                    found.partial.push((set.clone(), peek.clone()));
                }
            }
        }
    }
    for peek in &history.peeks {
        for seen in &peek.holders {
            if answered.contains(&(seen.client, peek.lock, seen.token)) {
                continue;
            }
            found.leftovers += 1;
            let explained = (history.attempts.iter())
                .filter(|a| a.client == seen.client && a.locks.contains(&peek.lock))
                .filter(|a| a.sent <= peek.answered)
                .any(|a| {
                    let hold = if a.locks.len() > 1 && seen.lease < a.ttl {
                        reservation(a.locks.len(), a.ttl)
                    } else {
                        a.ttl
                    };
                    peek.sent <= a.answered.max(a.sent + a.wait + SLACK) + hold
                });
            if !explained {
                found.outlived.push((peek.clone(), seen.clone()));
            }
        }
    }
    found
}

/// The set checker's counts in a run.
pub(super) struct Counts {
    sets: usize,
    inside: usize,
    partial: usize,
    outlived: usize,
}

impl Counts {
    /// Enough sets and observations for the run to say something, and no
    /// violation of invariant 15.
    pub(super) fn assert_clean(&self) {
        assert!(
            self.sets > 5 && self.inside > 5,
            "too few sets ({}) or Inspects inside one ({}) to say anything",
            self.sets,
            self.inside
        );
        assert_eq!(
            self.partial, 0,
            "a set held whole was seen partial by another caller"
        );
        assert_eq!(
            self.outlived, 0,
            "a part of a set outlived its reservation (or a grant its lease)"
        );
    }
}

/// Checks and prints the sets of a run.
pub(super) fn report(mode: &str, history: &History, grants: &[super::check::Grant]) -> Counts {
    let found = check_sets(history, grants.iter().map(|g| (g.client, g.lock, g.token)));
    let names: usize = history.sets.iter().map(|s| s.members.len()).sum();
    let tried = (history.attempts.iter())
        .filter(|a| a.locks.len() > 1)
        .count();
    println!(
        "chaos ({mode}), multi-locks: {} sets checked ({names} grants) of {tried} sets asked ({} answered with a lock's lease shorter than the set's), {} Inspects ({} inside a held set, {} grants seen that no caller was answered with); \
         partial sets seen: {}; parts past their reservation or lease: {}",
        history.sets.len(),
        history.short,
        history.peeks.len(),
        found.inside,
        found.leftovers,
        found.partial.len(),
        found.outlived.len()
    );
    for (set, peek) in found.partial.iter().take(3) {
        println!("  partial set: {set:?} / {peek:?}");
    }
    for (peek, seen) in found.outlived.iter().take(3) {
        println!("  part past its window: {seen:?} in {peek:?}");
        let tried = (history.attempts.iter())
            .filter(|a| a.client == seen.client && a.locks.contains(&peek.lock))
            .filter(|a| a.sent <= peek.answered)
            .max_by_key(|a| a.sent);
        if let Some(a) = tried {
            let before = |t: Instant| peek.sent.saturating_duration_since(t);
            println!(
                "    its holder's last attempt on that lock: {:?} sent {:?} and answered {:?} before",
                a.locks,
                before(a.sent),
                before(a.answered)
            );
        }
    }
    Counts {
        sets: history.sets.len(),
        inside: found.inside,
        partial: found.partial.len(),
        outlived: found.outlived.len(),
    }
}

#[test]
fn the_set_checker_finds_a_partial_set_and_a_part_that_outlived_its_reservation() {
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let ms = Duration::from_millis;
    let set = Set {
        client: 1,
        members: vec![(0, 10), (1, 11)],
        start: at(100),
        end: at(200),
    };
    let seen = |client, token, lease| Seen {
        client,
        token,
        lease: ms(lease),
    };
    let peek = |lock, sent, holders| Peek {
        lock,
        sent: at(sent),
        answered: at(sent + 5),
        holders,
    };
    let answered = [(1, 0, 10), (1, 1, 11)];
    // Both names seen held by the set inside its window, and a name seen
    // free before the answer and after the release was sent: clean.
    let clean = History {
        sets: vec![set.clone()],
        attempts: vec![],
        peeks: vec![
            peek(0, 120, vec![seen(1, 10, 4_000)]),
            peek(1, 150, vec![seen(1, 11, 4_000)]),
            peek(1, 50, vec![]),
            peek(0, 201, vec![]),
        ],
        short: 0,
    };
    let found = check_sets(&clean, answered);
    assert!(
        found.partial.is_empty() && found.outlived.is_empty(),
        "{found:?}"
    );
    assert_eq!(found.inside, 2);
    // A name of the set seen free, or held by another, while it stands.
    let partial = History {
        sets: vec![set.clone()],
        attempts: vec![],
        peeks: vec![peek(1, 150, vec![]), peek(0, 160, vec![seen(2, 12, 1_500)])],
        short: 0,
    };
    let found = check_sets(&partial, answered.into_iter().chain([(2, 0, 12)]));
    assert_eq!(found.partial.len(), 2, "{found:?}");
    // A failed attempt of 2 names (ttl 4 s, wait 1 s) sent at 0, answered
    // at 1,000: a grant of it may land until 0 + 1,000 + SLACK (1,000); a
    // part of it (a reservation of at most 2 s) may be seen until 4,000, a
    // whole-lease grant until 6,000.
    let failed = Attempt {
        client: 3,
        locks: vec![0, 1],
        sent: at(0),
        answered: at(1_000),
        wait: ms(1_000),
        ttl: ms(4_000),
    };
    let history = |sent, lease| History {
        sets: vec![],
        attempts: vec![failed.clone()],
        peeks: vec![peek(1, sent, vec![seen(3, 30, lease)])],
        short: 0,
    };
    let found = check_sets(&history(3_900, 2_000), []);
    assert!(found.outlived.is_empty(), "{found:?}");
    assert_eq!(found.leftovers, 1);
    assert_eq!(check_sets(&history(4_100, 2_000), []).outlived.len(), 1);
    assert!(check_sets(&history(5_900, 4_000), []).outlived.is_empty());
    assert_eq!(check_sets(&history(6_100, 4_000), []).outlived.len(), 1);
    // A grant of a client that never tried that lock is never explained.
    let stray = History {
        sets: vec![],
        attempts: vec![failed],
        peeks: vec![peek(2, 500, vec![seen(3, 31, 4_000)])],
        short: 0,
    };
    assert_eq!(check_sets(&stray, []).outlived.len(), 1);
}
