//! A changelog walk's order and its pages: where a walk goes on (the
//! cursor), and how the shards' parts of a page merge into the page.

use super::{ChangelogCursor, ChangelogEvent, ChangelogQuery};
use crate::ops::changelog::Start;

/// Where a cursor has a shard's part of the next page start.
pub(super) trait StartOf {
    fn start_of(&self, shard: u32) -> Start;
}

impl StartOf for ChangelogCursor {
    /// Where `shard`'s part of the next page starts.
    fn start_of(&self, shard: u32) -> Start {
        let skip = match shard.cmp(&self.shard) {
            std::cmp::Ordering::Less => None,
            std::cmp::Ordering::Equal => Some(self.index.saturating_add(1)),
            std::cmp::Ordering::Greater => Some(0),
        };
        Start::At {
            at_ms: self.at_ms,
            skip,
        }
    }
}

/// One shard's part of a page: Redis' clock when it was read, and each
/// entry read, newest first: its time, and its message when it passed the
/// filters.
#[derive(Debug, Default)]
pub(super) struct ShardPage {
    pub(super) now: i64,
    pub(super) entries: Vec<(i64, Option<String>)>,
}

/// What [`merge`] makes of the shards' parts of a page.
pub(super) struct Merged {
    pub(super) events: Vec<ChangelogEvent>,
    pub(super) scanned: usize,
    pub(super) next: Option<ChangelogCursor>,
}

/// The page the shards' parts make: their entries in walk order, as far
/// as every shard that has more was read (an entry past the oldest entry
/// read of such a shard could be preceded by one it has not given yet),
/// the matching ones up to `query.limit`, and where the next page starts.
pub(super) fn merge(
    shards: u32,
    window: usize,
    query: &ChangelogQuery,
    read: Vec<(u32, Start, ShardPage)>,
) -> Merged {
    // A first page walks what is older than every shard's call: events of
    // a millisecond one shard had not finished when it was read are left
    // to a later walk, so a walk never misses one shard's event of a
    // millisecond while showing another's.
    let newest = read.iter().map(|(_, _, part)| part.now - 1).min();
    let first = match (query.from, newest) {
        (Some(from), _) => from,
        (None, Some(newest)) => ChangelogCursor {
            at_ms: newest.saturating_add(1),
            shard: shards,
            index: 0,
        },
        (None, None) => {
            return Merged {
                events: Vec::new(),
                scanned: 0,
                next: None,
            };
        }
    };
    let mut scanned = 0;
    // The newest of the last positions read of the shards that have more
    // than they gave: the page ends there.
    let mut frontier: Option<ChangelogCursor> = None;
    let mut entries = Vec::new();
    for (shard, start, part) in read {
        scanned += part.entries.len();
        let exhausted = part.entries.len() < window;
        let mut last: Option<ChangelogCursor> = None;
        for (at_ms, message) in part.entries {
            // Its place among the shard's events of its millisecond.
            let index = match (last, start) {
                (Some(before), _) if before.at_ms == at_ms => before.index + 1,
                (Some(_), _) => 0,
                (
                    None,
                    Start::At {
                        at_ms: from,
                        skip: Some(skip),
                    },
                ) if from == at_ms => skip,
                (None, _) => 0,
            };
            let position = ChangelogCursor {
                at_ms,
                shard,
                index,
            };
            last = Some(position);
            if position.key() > first.key() {
                entries.push((position, message));
            }
        }
        if let Some(last) = last
            && !exhausted
            && frontier.is_none_or(|f| last.key() < f.key())
        {
            frontier = Some(last);
        }
    }
    entries.sort_by_key(|(position, _)| position.key());
    let limit = query.limit.max(1);
    let mut events = Vec::new();
    let mut handled = first;
    let mut more = false;
    for (position, message) in entries {
        if frontier.is_some_and(|f| position.key() > f.key()) {
            break;
        }
        if events.len() == limit {
            more = true;
            break;
        }
        handled = position;
        if let Some(event) = message.as_deref().and_then(ChangelogEvent::parse) {
            events.push(event);
        }
    }
    let next = if more {
        Some(handled)
    } else {
        // Past the frontier is for the next page; no frontier: every shard
        // gave all it had.
        frontier.map(|f| if f.key() > first.key() { f } else { first })
    };
    Merged {
        events,
        scanned,
        // A page that would start where this one did ends the walk (only
        // a clock that went back in Redis could make one).
        next: next.filter(|next| Some(*next) != query.from),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// An event message as `emit` makes it, without metadata.
    fn message(at_ms: i64, name: &str) -> String {
        format!("ns\n{name}\nacquired\nh\n7\n{at_ms}\n1\ndefault\n1000\n0\n0\n0\nholder\n")
    }

    fn part(now: i64, ats: &[i64]) -> ShardPage {
        ShardPage {
            now,
            entries: ats
                .iter()
                .map(|&at| (at, Some(message(at, &format!("at-{at}")))))
                .collect(),
        }
    }

    fn names(merged: &Merged) -> Vec<String> {
        merged.events.iter().map(|e| e.event.name.clone()).collect()
    }

    fn query(limit: usize, from: Option<ChangelogCursor>) -> ChangelogQuery {
        ChangelogQuery {
            limit,
            from,
            ..ChangelogQuery::default()
        }
    }

    #[test]
    fn a_page_ends_where_a_shard_with_more_was_read_to() {
        // Shard 0 gave its whole window (it may have more), shard 1 less.
        let read = vec![
            (0, Start::Newest, part(200, &[100, 90])),
            (1, Start::Newest, part(200, &[95, 80])),
            (2, Start::Newest, part(200, &[])),
        ];
        let merged = merge(3, 2, &query(10, None), read);
        // Shard 1's 80 waits: shard 0 may hold events between 90 and 80.
        // (Shard 1 gave a full window too, so 90 is the frontier.)
        assert_eq!(names(&merged), ["at-100", "at-95", "at-90"]);
        assert_eq!(merged.scanned, 4);
        let next = merged.next.unwrap();
        assert_eq!((next.at_ms, next.shard, next.index), (90, 0, 0));
        // The next page: shard 0 after its event of 90, shards after 0
        // from 90 on, shards before 0 after 90.
        assert_eq!(
            next.start_of(0),
            Start::At {
                at_ms: 90,
                skip: Some(1)
            }
        );
        assert_eq!(
            next.start_of(1),
            Start::At {
                at_ms: 90,
                skip: Some(0)
            }
        );
        let read = vec![
            (0, next.start_of(0), part(201, &[70])),
            (1, next.start_of(1), part(201, &[80])),
            (2, next.start_of(2), part(201, &[])),
        ];
        let merged = merge(3, 2, &query(10, Some(next)), read);
        assert_eq!(names(&merged), ["at-80", "at-70"]);
        assert_eq!(merged.next, None, "every shard gave less than its window");
    }

    #[test]
    fn the_limit_ends_a_page_and_the_next_goes_on_after_it() {
        let read = vec![
            (0, Start::Newest, part(200, &[100, 98, 96])),
            (1, Start::Newest, part(200, &[99, 97])),
        ];
        let merged = merge(2, 10, &query(3, None), read);
        assert_eq!(names(&merged), ["at-100", "at-99", "at-98"]);
        let next = merged.next.unwrap();
        assert_eq!((next.at_ms, next.shard, next.index), (98, 0, 0));
        // Exactly `limit` left and nothing more: the walk is done.
        let read = vec![
            (0, Start::Newest, part(200, &[100])),
            (1, Start::Newest, part(200, &[99])),
        ];
        assert_eq!(merge(2, 10, &query(2, None), read).next, None);
    }

    #[test]
    fn events_of_one_millisecond_are_walked_shard_by_shard_and_in_list_order() {
        let read = vec![
            (0, Start::Newest, part(200, &[50, 50, 49])),
            (1, Start::Newest, part(200, &[50])),
        ];
        let merged = merge(2, 10, &query(2, None), read);
        let at = |e: &ChangelogEvent| e.event.at_ms;
        assert_eq!(merged.events.iter().map(at).collect::<Vec<_>>(), [50, 50]);
        let next = merged.next.unwrap();
        assert_eq!((next.at_ms, next.shard, next.index), (50, 0, 1));
        // Shard 0 then starts past its two events of 50 (index 2 on).
        let start = next.start_of(0);
        assert_eq!(
            start,
            Start::At {
                at_ms: 50,
                skip: Some(2)
            }
        );
        let read = vec![
            (0, start, part(201, &[49])),
            (1, next.start_of(1), part(201, &[50])),
        ];
        let merged = merge(2, 10, &query(10, Some(next)), read);
        let positions: Vec<_> = merged.events.iter().map(at).collect();
        assert_eq!(positions, [50, 49]);
    }

    #[test]
    fn a_first_page_shows_only_what_is_older_than_every_shards_read() {
        // Shard 1 was read a millisecond later, and had an event of 150
        // that shard 0 could not have shown yet.
        let read = vec![
            (0, Start::Newest, part(150, &[140])),
            (1, Start::Newest, part(151, &[150, 130])),
        ];
        let merged = merge(2, 10, &query(10, None), read);
        assert_eq!(names(&merged), ["at-140", "at-130"]);
        assert_eq!(merged.scanned, 3);
        // A shard whose whole window is newer than that: the page is
        // empty and the walk goes on from before it.
        let read = vec![
            (0, Start::Newest, part(150, &[100])),
            (1, Start::Newest, part(160, &[155, 152])),
        ];
        let merged = merge(2, 2, &query(10, None), read);
        assert!(merged.events.is_empty());
        let next = merged.next.unwrap();
        assert_eq!((next.at_ms, next.shard), (150, 2));
        assert_eq!(
            next.start_of(1),
            Start::At {
                at_ms: 150,
                skip: None
            }
        );
    }

    #[test]
    fn entries_that_failed_the_filters_move_the_walk_without_showing() {
        let mut shard = part(200, &[100, 99, 98]);
        shard.entries[0].1 = None;
        shard.entries[1].1 = None;
        let merged = merge(1, 3, &query(10, None), vec![(0, Start::Newest, shard)]);
        assert_eq!(names(&merged), ["at-98"]);
        let next = merged.next.unwrap();
        assert_eq!(next.at_ms, 98);
        // Nothing matched in a full window: no events, the walk goes on.
        let mut shard = part(200, &[100, 99]);
        shard.entries[0].1 = None;
        shard.entries[1].1 = None;
        let merged = merge(1, 2, &query(10, None), vec![(0, Start::Newest, shard)]);
        assert!(merged.events.is_empty());
        assert_eq!(merged.next.map(|n| n.at_ms), Some(99));
    }
}
