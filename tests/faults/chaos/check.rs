//! The chaos run's checker: from the grants the clients recorded, each
//! with the interval its holder relied on it (on one monotonic clock),
//! the pairs that break a rule.
//!
//! - **Exclusion.** An exclusive grant (a plain lock's, a leader's term, a
//!   writer's) overlaps no other grant of its lock; readers overlap each
//!   other freely but never a writer.
//! - **Readers within the limit.** At no instant do more readers of a
//!   read/write lock rely on their grants than its reader limit.
//! - **Permits within the limit** (invariant 14). At no instant do the
//!   permits of the grants relied on of a semaphore sum past its limit.
//! - **Tokens rise.** Of two grants that exclude each other (one of them
//!   exclusive, or k and j permits with k + j past the limit), the one
//!   that arrived first carries the lower token: a
//!   grant arrives after Redis made it and is relied on only until its
//!   release is sent (or its lease ends), so two grants that Redis kept
//!   apart arrive in the order Redis made them. Two readers (two weighted
//!   grants that fit together) may be made in one order and arrive in the
//!   other: between them only distinct tokens are required.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// What a grant allows beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// A plain lock's grant (limit 1) or a leader's term: nothing beside it.
    Exclusive,
    /// A reader of a read/write lock: other readers, up to the limit.
    Read,
    /// The writer of a read/write lock: nothing beside it.
    Write,
    /// k permits of a semaphore: other grants whose permits fit beside
    /// them within its limit.
    Permits(u32),
}

impl Mode {
    fn exclusive(self) -> bool {
        !matches!(self, Mode::Read | Mode::Permits(_))
    }

    /// What a shared grant takes of its lock's limit (a reader one).
    fn reader(self) -> Option<usize> {
        (self == Mode::Read).then_some(1)
    }

    /// The permits a weighted grant takes of its semaphore's limit.
    fn permits(self) -> Option<usize> {
        match self {
            Mode::Permits(k) => Some(k as usize),
            _ => None,
        }
    }
}

/// One grant (or one term of a leader) as its client saw it.
#[derive(Clone, Debug)]
pub(super) struct Grant {
    /// The lock: an index the run gives each lock and election.
    pub(super) lock: usize,
    pub(super) mode: Mode,
    pub(super) token: u64,
    /// The grant arrived.
    pub(super) start: Instant,
    /// The holder stopped relying on it: when it sent its release (its
    /// critical section was over, whether or not the release got through),
    /// or when the lease ran out at the latest (its acquire was sent + ttl).
    pub(super) end: Instant,
    pub(super) client: usize,
}

/// Pairs of grants of one lock that break a rule.
pub(super) type Pairs = Vec<(Grant, Grant)>;

/// What the checker found.
#[derive(Debug, Default)]
pub(super) struct Findings {
    /// Two grants of one lock relied on at once, one of them exclusive.
    pub(super) overlaps: Pairs,
    /// Two grants whose tokens did not rise in grant order (or two
    /// readers with one token).
    pub(super) token_drops: Pairs,
    /// Readers that arrived while `readers` others of their lock were
    /// relied on: each such reader once.
    pub(super) over_limit: Vec<Grant>,
    /// Weighted grants that arrived while others of their semaphore were
    /// relied on whose permits, with theirs, summed past the limit.
    pub(super) permits_over: Vec<Grant>,
}

/// Checks `grants`; a read/write lock admits `readers` readers at once, a
/// semaphore `permits` permits.
pub(super) fn check(grants: &[Grant], readers: usize, permits: usize) -> Findings {
    let mut by_lock: HashMap<usize, Vec<&Grant>> = HashMap::new();
    for grant in grants {
        by_lock.entry(grant.lock).or_default().push(grant);
    }
    let mut findings = Findings::default();
    for list in by_lock.values_mut() {
        list.sort_by_key(|g| g.start);
        overlaps(list, &mut findings.overlaps);
        tokens(list, permits, &mut findings.token_drops);
        over_limit(list, readers, Mode::reader, &mut findings.over_limit);
        over_limit(list, permits, Mode::permits, &mut findings.permits_over);
    }
    findings
}

/// Each grant that starts while a grant it excludes is still relied on,
/// paired with the one of those that ends last. `list` is in start order.
fn overlaps(list: &[&Grant], found: &mut Pairs) {
    // The grant that ends last so far, of any mode and of an exclusive one.
    let mut latest: Option<&Grant> = None;
    let mut latest_exclusive: Option<&Grant> = None;
    for &grant in list {
        let against = if grant.mode.exclusive() {
            latest
        } else {
            latest_exclusive
        };
        if let Some(previous) = against
            && grant.start < previous.end
        {
            found.push((previous.clone(), grant.clone()));
        }
        if latest.is_none_or(|l| grant.end > l.end) {
            latest = Some(grant);
        }
        if grant.mode.exclusive() && latest_exclusive.is_none_or(|l| grant.end > l.end) {
            latest_exclusive = Some(grant);
        }
    }
}

/// In start order: an exclusive grant's token is above every earlier
/// grant's, a reader's above every earlier exclusive grant's, k permits'
/// above every earlier grant's of more than `permits - k`, and no two
/// grants share a token. The same token twice for one client is one grant
/// seen twice (its holder acquired again while it stood: ALREADY_HELD).
fn tokens(list: &[&Grant], permits: usize, found: &mut Pairs) {
    let mut highest: Option<&Grant> = None;
    let mut highest_exclusive: Option<&Grant> = None;
    // The highest token of the weighted grants so far, by their permits.
    let mut highest_weighted: BTreeMap<usize, &Grant> = BTreeMap::new();
    let mut seen: HashMap<u64, &Grant> = HashMap::new();
    for &grant in list {
        if let Some(&first) = seen.get(&grant.token) {
            if first.client != grant.client {
                found.push((first.clone(), grant.clone()));
            }
            continue;
        }
        seen.insert(grant.token, grant);
        let against = if grant.mode.exclusive() {
            highest
        } else {
            highest_exclusive
        };
        if let Some(previous) = against
            && grant.token <= previous.token
        {
            found.push((previous.clone(), grant.clone()));
        }
        if let Some(k) = grant.mode.permits() {
            // The earlier grants that could not stand beside this one.
            let apart = highest_weighted.range(permits.saturating_sub(k) + 1..);
            if let Some((_, &previous)) = apart.max_by_key(|(_, g)| g.token)
                && grant.token <= previous.token
            {
                found.push((previous.clone(), grant.clone()));
            }
            let top = highest_weighted.entry(k).or_insert(grant);
            if grant.token > top.token {
                *top = grant;
            }
        }
        if highest.is_none_or(|h| grant.token > h.token) {
            highest = Some(grant);
        }
        if grant.mode.exclusive() && highest_exclusive.is_none_or(|h| grant.token > h.token) {
            highest_exclusive = Some(grant);
        }
    }
}

/// Shared grants (those `share` gives a weight: readers, or weighted
/// grants) that start while others are relied on whose weights, with
/// theirs, sum past `limit`. `list` is in start order.
fn over_limit(
    list: &[&Grant],
    limit: usize,
    share: fn(Mode) -> Option<usize>,
    found: &mut Vec<Grant>,
) {
    // The weight relied on now, by when it ends.
    let mut ends: BTreeMap<Instant, usize> = BTreeMap::new();
    for &grant in list {
        let Some(weight) = share(grant.mode) else {
            continue;
        };
        // Drop the grants that ended by this one's start.
        while let Some((&end, _)) = ends.first_key_value() {
            if end > grant.start {
                break;
            }
            ends.pop_first();
        }
        if ends.values().sum::<usize>() + weight > limit {
            found.push(grant.clone());
        }
        *ends.entry(grant.end).or_default() += weight;
    }
}

#[test]
fn the_checker_finds_overlaps_and_falling_tokens() {
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let grant = |lock, token, start, end| Grant {
        lock,
        mode: Mode::Exclusive,
        token,
        start: at(start),
        end: at(end),
        client: token as usize,
    };
    let clean = [grant(0, 1, 0, 10), grant(0, 2, 10, 20), grant(1, 1, 5, 15)];
    let found = check(&clean, 3, 4);
    assert_eq!(found.overlaps.len() + found.token_drops.len(), 0);
    let overlapping = [grant(0, 1, 0, 10), grant(0, 2, 9, 20)];
    assert_eq!(check(&overlapping, 3, 4).overlaps.len(), 1);
    // Overlap with an earlier, longer grant, not just the previous one.
    let nested = [grant(0, 1, 0, 30), grant(0, 2, 10, 12), grant(0, 3, 20, 25)];
    assert_eq!(check(&nested, 3, 4).overlaps.len(), 2);
    let falling = [grant(0, 5, 0, 10), grant(0, 4, 10, 20)];
    assert_eq!(check(&falling, 3, 4).token_drops.len(), 1);
    // One grant seen twice by its client is no drop; one token for two
    // clients is.
    let again = [grant(0, 5, 0, 10), grant(0, 5, 10, 20)];
    assert_eq!(check(&again, 3, 4).token_drops.len(), 0);
    let shared = [
        grant(0, 5, 0, 10),
        Grant {
            client: 9,
            ..grant(0, 5, 10, 20)
        },
    ];
    assert_eq!(check(&shared, 3, 4).token_drops.len(), 1);
}

#[test]
fn the_checker_lets_readers_share_but_not_with_a_writer() {
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let grant = |mode, token, start, end| Grant {
        lock: 7,
        mode,
        token,
        start: at(start),
        end: at(end),
        client: token as usize,
    };
    use Mode::{Read, Write};
    // Three readers at once (the limit), then a writer after them all,
    // then a reader after the writer. Two readers arriving in the other
    // order than their tokens are fine.
    let clean = [
        grant(Read, 2, 0, 10),
        grant(Read, 1, 1, 12),
        grant(Read, 3, 2, 11),
        grant(Write, 4, 12, 20),
        grant(Read, 5, 20, 30),
    ];
    let found = check(&clean, 3, 4);
    assert!(
        found.overlaps.is_empty() && found.token_drops.is_empty() && found.over_limit.is_empty(),
        "{found:?}"
    );
    // A writer while a reader holds, and a reader while a writer holds.
    let writer_in = [grant(Read, 1, 0, 10), grant(Write, 2, 5, 20)];
    assert_eq!(check(&writer_in, 3, 4).overlaps.len(), 1);
    let reader_in = [grant(Write, 1, 0, 10), grant(Read, 2, 5, 20)];
    assert_eq!(check(&reader_in, 3, 4).overlaps.len(), 1);
    // Two writers.
    let writers = [grant(Write, 1, 0, 10), grant(Write, 2, 9, 20)];
    assert_eq!(check(&writers, 3, 4).overlaps.len(), 1);
    // A fourth reader at once.
    let four = [
        grant(Read, 1, 0, 10),
        grant(Read, 2, 1, 10),
        grant(Read, 3, 2, 10),
        grant(Read, 4, 3, 10),
    ];
    assert_eq!(check(&four, 3, 4).over_limit.len(), 1);
    // A writer's token below an earlier reader's, a reader's below an
    // earlier writer's.
    let writer_low = [grant(Read, 5, 0, 10), grant(Write, 4, 10, 20)];
    assert_eq!(check(&writer_low, 3, 4).token_drops.len(), 1);
    let reader_low = [grant(Write, 5, 0, 10), grant(Read, 4, 10, 20)];
    assert_eq!(check(&reader_low, 3, 4).token_drops.len(), 1);
}

#[test]
fn the_checker_finds_permits_past_the_limit_and_tokens_out_of_order() {
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let grant = |k, token, start, end| Grant {
        lock: 9,
        mode: Mode::Permits(k),
        token,
        start: at(start),
        end: at(end),
        client: token as usize,
    };
    // A semaphore of 4: 1 + 3 at once, then 2 + 2, then 4 alone; two that
    // fit together may arrive in the other order than their tokens.
    let clean = [
        grant(1, 2, 0, 10),
        grant(3, 1, 1, 10),
        grant(2, 3, 10, 20),
        grant(2, 4, 11, 20),
        grant(4, 5, 20, 30),
    ];
    let found = check(&clean, 3, 4);
    assert!(
        found.permits_over.is_empty() && found.token_drops.is_empty() && found.overlaps.is_empty(),
        "{found:?}"
    );
    // 3 + 2 at once: past 4.
    let over = [grant(3, 1, 0, 10), grant(2, 2, 5, 20)];
    assert_eq!(check(&over, 3, 4).permits_over.len(), 1);
    // 1 + 1 + 1, then a fourth permit is fine, a fifth is not.
    let ones = [
        grant(1, 1, 0, 10),
        grant(1, 2, 1, 10),
        grant(2, 3, 2, 10),
        grant(1, 4, 3, 10),
    ];
    assert_eq!(check(&ones, 3, 4).permits_over.len(), 1);
    // A grant that ended before the next started frees its permits.
    let after = [grant(4, 1, 0, 10), grant(4, 2, 10, 20)];
    assert!(check(&after, 3, 4).permits_over.is_empty());
    // 3 then 2 cannot stand together: the later arrival's token must be
    // higher; 1 then 2 could, so theirs may be in either order.
    let falling = [grant(3, 5, 0, 10), grant(2, 4, 10, 20)];
    assert_eq!(check(&falling, 3, 4).token_drops.len(), 1);
    let fitting = [grant(1, 5, 0, 10), grant(2, 4, 10, 20)];
    assert!(check(&fitting, 3, 4).token_drops.is_empty());
    // Weighted grants are not readers: 4 single permits are no readers
    // over the limit of 3.
    let four = [
        grant(1, 1, 0, 10),
        grant(1, 2, 1, 10),
        grant(1, 3, 2, 10),
        grant(1, 4, 3, 10),
    ];
    let found = check(&four, 3, 4);
    assert!(
        found.over_limit.is_empty() && found.permits_over.is_empty(),
        "{found:?}"
    );
}
