//! What a changelog read asks and gets (the engine's `changelog.rs`
//! reads it): the settings of which namespaces keep one, a query, a page
//! of events, and the cursor a walk goes on from.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use serde::de::{Deserializer as _, MapAccess, Visitor};

use crate::watchers::LockEvent;

/// Metadata bytes a changelog entry keeps (its JSON's first bytes; the
/// entries that fit whole are shown, and the event says it was cut).
/// `emit` in `lua/shared/events.lua` holds the same number.
pub const LOG_METADATA_BYTES: usize = 256;
/// A shard's list holds at most this many bytes (as Redis counts them,
/// `MEMORY USAGE`) per event of the changelog's size (`emit` checks every
/// eighth push).
pub const LOG_BYTES_PER_EVENT: u64 = 256;
/// Which namespaces keep a changelog, how long and how much.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangelogSettings {
    /// Namespace names, `prefix*` patterns or `*` (empty: none).
    pub namespaces: Vec<String>,
    /// Events kept per shard of a namespace.
    pub size: u32,
    /// How long a changelog lives after its last event.
    pub retention_ms: u64,
    /// Changelog reads (pages) one caller may make per second on a
    /// replica: a token, or with auth off a client address.
    pub reads_per_second: NonZeroU32,
}

impl Default for ChangelogSettings {
    fn default() -> Self {
        ChangelogSettings {
            namespaces: Vec::new(),
            size: 1000,
            retention_ms: 24 * 3600 * 1000,
            reads_per_second: NonZeroU32::new(DEFAULT_READS_PER_SECOND).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// `--changelog-reads-per-second`'s default.
pub const DEFAULT_READS_PER_SECOND: u32 = 10;

impl ChangelogSettings {
    /// True when the namespace keeps a changelog.
    pub fn covers(&self, namespace: &str) -> bool {
        self.namespaces
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => namespace.starts_with(prefix),
                None => pattern == namespace,
            })
    }

    /// Bytes one shard's list holds at most (then it is trimmed).
    pub fn shard_bytes(&self) -> u64 {
        u64::from(self.size) * LOG_BYTES_PER_EVENT
    }
}

/// What a changelog read asks for: events whose lock name starts with
/// `prefix`, of `holder` and of `event` (each empty: any), `limit` at most,
/// after `from` (none: from the newest).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChangelogQuery {
    pub prefix: String,
    pub holder: String,
    pub event: String,
    pub limit: usize,
    pub from: Option<ChangelogCursor>,
}

impl ChangelogQuery {
    /// Whether any filter is set (a read then takes fuller windows).
    pub fn filters(&self) -> bool {
        !(self.prefix.is_empty() && self.holder.is_empty() && self.event.is_empty())
    }
}

/// One entry of a changelog: the lock event as watchers get it, but for
/// metadata longer than [`LOG_METADATA_BYTES`], of which it holds the
/// entries that fit whole in that many bytes (and says so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangelogEvent {
    pub event: LockEvent,
    /// The metadata was cut: `metadata` lacks some of its entries.
    pub metadata_truncated: bool,
    /// The whole metadata's size (its JSON, bytes), when it was cut.
    pub metadata_bytes: Option<u64>,
}

impl ChangelogEvent {
    /// Reads an entry as `emit` pushed it: an event message whose
    /// metadata (its 14th line on) may be cut, then followed by a line
    /// with the whole metadata's size.
    pub fn parse(message: &str) -> Option<ChangelogEvent> {
        let metadata_at = message.match_indices('\n').nth(12).map(|(i, _)| i + 1);
        if let Some(at) = metadata_at
            && let Some((cut, size)) = message[at..].split_once('\n')
        {
            let mut event = LockEvent::parse(&message[..at])?;
            event.metadata = whole_entries(cut);
            return Some(ChangelogEvent {
                event,
                metadata_truncated: true,
                metadata_bytes: Some(size.parse().ok()?),
            });
        }
        LockEvent::parse(message).map(|event| ChangelogEvent {
            event,
            metadata_truncated: false,
            metadata_bytes: None,
        })
    }
}

/// The entries of a JSON object of strings that are whole in `cut`, the
/// first bytes of its text (those after the last whole one are left out).
fn whole_entries(cut: &str) -> BTreeMap<String, String> {
    struct Collect<'a>(&'a mut BTreeMap<String, String>);
    impl<'de> Visitor<'de> for Collect<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of strings")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some((key, value)) = map.next_entry::<String, String>()? {
                self.0.insert(key, value);
            }
            Ok(())
        }
    }
    let mut entries = BTreeMap::new();
    let mut reader = serde_json::Deserializer::from_str(cut);
    // It ends in an error where the cut is; the entries before it stay.
    let _ = reader.deserialize_map(Collect(&mut entries));
    entries
}

/// A page of a changelog walk: the matching events, newest first.
#[derive(Clone, Debug, Default)]
pub struct ChangelogPage {
    /// The namespace keeps a changelog (when false, `events` is empty).
    pub enabled: bool,
    pub size: u32,
    pub retention_ms: u64,
    pub events: Vec<ChangelogEvent>,
    /// Entries read from Redis (matching or not): at most
    /// `shards` × [`window`].
    pub scanned: usize,
    /// Where the next page starts; none when the walk is done.
    pub next: Option<ChangelogCursor>,
}

/// Where a walk of a changelog goes on: after the event of `shard` that
/// is the `index`-th (0: the newest) of that shard's events of millisecond
/// `at_ms`. Events are walked by time, newest first; events of one
/// millisecond shard by shard, each shard's newest first. A shard number
/// past the last shard stands for "after every event of `at_ms`".
///
/// A cursor holds positions only, never a namespace or filter: one made
/// up or taken from another read only moves where a walk of the caller's
/// own namespace goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChangelogCursor {
    pub at_ms: i64,
    pub shard: u32,
    pub index: u32,
}

impl ChangelogCursor {
    /// Orders positions in walk order (earlier in the walk: smaller).
    pub fn key(&self) -> (std::cmp::Reverse<i64>, u32, u32) {
        (std::cmp::Reverse(self.at_ms), self.shard, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event message as `emit` makes it, without metadata.
    fn message(at_ms: i64, name: &str) -> String {
        format!("ns\n{name}\nacquired\nh\n7\n{at_ms}\n1\ndefault\n1000\n0\n0\n0\nholder\n")
    }

    #[test]
    fn namespaces_are_named_or_matched_by_prefix() {
        let settings = ChangelogSettings {
            namespaces: vec!["jobs".into(), "team-*".into()],
            ..ChangelogSettings::default()
        };
        assert!(settings.covers("jobs"));
        assert!(!settings.covers("jobs2"));
        assert!(settings.covers("team-a"));
        assert!(!settings.covers("default"));
        assert!(!ChangelogSettings::default().covers("default"));
        let all = ChangelogSettings {
            namespaces: vec!["*".into()],
            ..ChangelogSettings::default()
        };
        assert!(all.covers("anything"));
    }

    #[test]
    fn cut_metadata_keeps_its_whole_entries_and_says_so() {
        let whole = format!("{}{{\"a\":\"1\"}}", message(5, "x"));
        let parsed = ChangelogEvent::parse(&whole).unwrap();
        assert!(!parsed.metadata_truncated);
        assert_eq!(parsed.event.metadata["a"], "1");
        let cut = format!(
            "{}{{\"a\":\"1\",\"b\":\"é\",\"c\":\"33\n900",
            message(5, "x")
        );
        let parsed = ChangelogEvent::parse(&cut).unwrap();
        assert!(parsed.metadata_truncated);
        assert_eq!(parsed.metadata_bytes, Some(900));
        assert_eq!(parsed.event.metadata.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(parsed.event.name, "x");
        // A read/write lock's entry (its mode on the actor) is cut alike.
        let rw = cut.replacen("\nholder\n", "\nholder:w\n", 1);
        assert_ne!(rw, cut);
        let parsed = ChangelogEvent::parse(&rw).unwrap();
        assert_eq!(parsed.metadata_bytes, Some(900));
        assert_eq!(parsed.event.actor, "holder");
        assert_eq!(parsed.event.mode, crate::LockMode::Write);
        assert!(ChangelogEvent::parse(&format!("{}{{\n", message(5, "x"))).is_none());
        assert!(ChangelogEvent::parse("garbage").is_none());
    }
}
