//! The changelog: the latest lock events of a namespace, kept in Redis for
//! the dashboard's Changelog page. Only namespaces named by
//! `--changelog-namespaces` have one (none by default, so by default no
//! function writes anything for it).
//!
//! The functions record it themselves, exactly: `lua/shared/events.lua`'s `emit`
//! pushes each event, the same message it publishes to watchers (its
//! metadata cut to [`LOG_METADATA_BYTES`]), onto the lock's shard's capped
//! list (`<prefix>:{<ns>:<shard>}:c`, newest first, trimmed to the
//! changelog's size and to [`LOG_BYTES_PER_EVENT`] bytes per event of it,
//! expiring after the retention since its last event), in the lock's own
//! cluster slot.
//!
//! Reading is a walk in pages, newest first, each bounded in Redis work,
//! in the replica's memory and in time, whatever the lists hold: a page
//! reads every shard once, `CALLS_AT_ONCE` shards at a time: a search
//! for where the last page ended (`lua/changelog.lua`, a few `LINDEX`
//! probes), then one `LRANGE` of at most [`window`] entries. It filters
//! what it read (an entry that fails is only a time to the merge), merges
//! the shards by time and returns what it can order for sure, with a
//! cursor to go on. A page that reached its bound before it found
//! `limit` events returns what it found and the cursor.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream};

mod walk;

pub use tumbler_face::changelog::{
    ChangelogCursor, ChangelogEvent, ChangelogPage, ChangelogQuery, ChangelogSettings,
    DEFAULT_READS_PER_SECOND, LOG_BYTES_PER_EVENT, LOG_METADATA_BYTES,
};
use walk::{ShardPage, StartOf, merge};

use super::EngineError;
use super::calls::Calls;
use super::ops::Emit;
use super::ops::changelog::{self as op, Start};
use super::watchers::Watchers;
use crate::errors::OrTrouble;

/// Entries one read looks at, over all shards: each shard gives at most
/// [`window`] of them (at least one, so a namespace of more shards than
/// this reads one entry per shard).
pub const SCAN_PER_READ: usize = 2048;
/// Entries one shard's part of a read takes at most: one `LRANGE` of
/// them keeps Redis busy ~45 µs for entries of ~400 bytes (measured with
/// `INFO commandstats`; read into a Lua script instead, the same entries
/// cost it ~225 µs, and ~400 µs with the filters applied there).
pub const WINDOW_MAX: usize = 128;
/// A read's shards read at once (each a function call, then an
/// `LRANGE`): Redis runs a connection's pipelined commands back to back,
/// so one read's commands sent all at once would hold every other client
/// up for all of them.
const CALLS_AT_ONCE: usize = 2;

/// Entries one read takes from each shard: [`SCAN_PER_READ`] shared by
/// the shards, at most [`WINDOW_MAX`], and for an unfiltered read no more
/// than `limit` (the newest `limit` of the namespace are among each
/// shard's newest `limit`).
pub fn window(shards: u32, limit: usize, filtered: bool) -> usize {
    let share = (SCAN_PER_READ / shards.max(1) as usize).clamp(1, WINDOW_MAX);
    if filtered {
        share
    } else {
        share.min(limit.max(1))
    }
}

/// The changelog part: which namespaces keep a changelog, where a
/// namespace's lock events go ([`Changelog::emits`]: published while some
/// replica watches it, recorded when it keeps a changelog), and reading
/// a page of one.
pub(super) struct Changelog {
    settings: ChangelogSettings,
    /// Which namespaces some replica watches (publish or not).
    watchers: Arc<Watchers>,
    calls: Arc<Calls>,
}

impl Changelog {
    pub(super) fn new(
        settings: ChangelogSettings,
        watchers: Arc<Watchers>,
        calls: Arc<Calls>,
    ) -> Self {
        Changelog {
            settings,
            watchers,
            calls,
        }
    }

    /// The changelog settings in force.
    pub(super) fn settings(&self) -> &ChangelogSettings {
        &self.settings
    }

    /// Where the events of a namespace's locks go: published while some
    /// replica watches it, recorded when it keeps a changelog.
    pub(super) fn emits(&self, namespace: &str) -> Emit {
        Emit {
            publish: self.watchers.is_watched(namespace),
            record: self
                .settings
                .covers(namespace)
                .then_some((self.settings.size, self.settings.retention_ms)),
        }
    }

    /// One page of a namespace's changelog: events that match `query`,
    /// newest first, after `query.from`.
    pub(super) async fn page(
        &self,
        namespace: &str,
        query: &ChangelogQuery,
    ) -> Result<ChangelogPage, EngineError> {
        self.calls.ready().or_trouble()?;
        let settings = &self.settings;
        let mut page = ChangelogPage {
            enabled: settings.covers(namespace),
            size: settings.size,
            retention_ms: settings.retention_ms,
            ..ChangelogPage::default()
        };
        if !page.enabled {
            return Ok(page);
        }
        let shards = self.calls.layout().shards();
        let window = window(shards, query.limit, query.filters());
        let reads = (0..shards).map(|shard| {
            let start = query.from.map_or(Start::Newest, |c| c.start_of(shard));
            async move {
                let part = self
                    .read_shard(namespace, shard, start, window, query)
                    .await?;
                Ok::<_, EngineError>((shard, start, part))
            }
        });
        let read: Vec<_> = stream::iter(reads)
            .buffered(CALLS_AT_ONCE)
            .try_collect()
            .await?;
        let merged = merge(shards, window, query, read);
        page.scanned = merged.scanned;
        page.next = merged.next;
        page.events = merged.events;
        Ok(page)
    }

    /// One shard's part of a page: where it starts (`lua/changelog.lua`),
    /// then at most `window` entries from there (one `LRANGE` counted from
    /// the tail), each with its message when it passes the filters. An
    /// `LRANGE` that did not find the entry the function named (the list
    /// was trimmed in between: its tail moved) is made again, at most
    /// [`SEEKS`] times in all.
    async fn read_shard(
        &self,
        namespace: &str,
        shard: u32,
        start: Start,
        window: usize,
        query: &ChangelogQuery,
    ) -> Result<ShardPage, EngineError> {
        let key = self.calls.layout().changelog_key(namespace, shard);
        let args = op::args(start);
        let mut seeks = 0;
        loop {
            seeks += 1;
            let reply = self.calls.call(|s| &s.changelog, &key, &args).await;
            let seek = reply.and_then(op::parse).or_trouble()?;
            let Some((first, last)) = seek.range(window) else {
                return Ok(ShardPage {
                    now: seek.now,
                    entries: Vec::new(),
                });
            };
            let mut lrange = redis::cmd("LRANGE");
            lrange.arg(&key).arg(first).arg(last);
            let read: Vec<Vec<u8>> = self.calls.store().command(lrange).await.or_trouble()?;
            let found = read.first().is_some_and(|entry| {
                entry.starts_with(seek.head.as_bytes())
                    && matches!(entry.get(seek.head.len()), None | Some(b'\n'))
            });
            if found || seeks == SEEKS {
                return Ok(ShardPage {
                    now: seek.now,
                    entries: read
                        .into_iter()
                        .map(|entry| query.sort_out(entry))
                        .collect(),
                });
            }
        }
    }
}

/// Seeks of one shard's part of a page at most (see `read_shard`).
const SEEKS: usize = 3;

/// What a read makes of an entry it took (a query's filters applied).
trait SortOut {
    fn sort_out(&self, entry: Vec<u8>) -> (i64, Option<String>);
}

impl SortOut for ChangelogQuery {
    /// An entry's time, and its message if it passes the filters: read
    /// from its first lines ('namespace\nname\nevent\nholder\ntoken\n
    /// time_ms…'); an unreadable entry is time 0, passing nothing.
    fn sort_out(&self, entry: Vec<u8>) -> (i64, Option<String>) {
        let mut lines = entry.splitn(7, |b| *b == b'\n');
        let mut line = || lines.next().unwrap_or_default();
        let (_, name, event, holder, _, time) = (line(), line(), line(), line(), line(), line());
        let at_ms = std::str::from_utf8(time)
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        let passes = at_ms > 0
            && name.starts_with(self.prefix.as_bytes())
            && (self.holder.is_empty() || holder == self.holder.as_bytes())
            && (self.event.is_empty() || event == self.event.as_bytes());
        (
            at_ms,
            passes.then(|| String::from_utf8(entry).ok()).flatten(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_sort_entries_out_by_their_first_lines() {
        let query = ChangelogQuery {
            prefix: "a/".into(),
            holder: "h".into(),
            event: "acquired".into(),
            ..ChangelogQuery::default()
        };
        let entry = |name: &str, event: &str| {
            format!("ns\n{name}\n{event}\nh\n7\n42\n1\ndefault\n1000\n0\n0\n0\nholder\n")
                .into_bytes()
        };
        let (at, kept) = query.sort_out(entry("a/1", "acquired"));
        assert_eq!(at, 42);
        assert!(kept.is_some());
        assert_eq!(query.sort_out(entry("b/1", "acquired")), (42, None));
        assert_eq!(query.sort_out(entry("a/1", "released")), (42, None));
        assert_eq!(query.sort_out(b"garbage".to_vec()), (0, None));
        let any = ChangelogQuery::default();
        assert!(any.sort_out(entry("b/1", "released")).1.is_some());
        // Bytes that are not UTF-8 pass nothing.
        let mut broken = entry("a/1", "acquired");
        broken.push(0xff);
        assert_eq!(query.sort_out(broken), (42, None));
    }

    #[test]
    fn windows_share_the_read_bound_between_shards() {
        assert_eq!(window(32, 100, true), 64);
        assert_eq!(window(32, 10, false), 10);
        assert_eq!(window(1, 1000, true), WINDOW_MAX);
        assert_eq!(window(4, 1000, false), WINDOW_MAX);
        assert_eq!(window(16_384, 100, true), 1);
    }

    #[test]
    fn event_flags_say_publish_and_record() {
        assert_eq!(Emit::default().arg(), "0");
        let publish = Emit {
            publish: true,
            record: None,
        };
        assert_eq!(publish.arg(), "1");
        let both = Emit {
            publish: true,
            record: Some((1000, 60_000)),
        };
        assert_eq!(both.arg(), "ec1000:60000");
        let mut flags = "f".to_owned();
        both.push_flags(&mut flags);
        assert_eq!(flags, "fec1000:60000");
    }
}
