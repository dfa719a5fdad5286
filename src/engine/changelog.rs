//! The changelog: the latest lock events of a namespace, kept in Redis for
//! the dashboard's Changelog page. Only namespaces named by
//! `--changelog-namespaces` have one (none by default, so by default no
//! function writes anything for it).
//!
//! The functions record it themselves, exactly: `lua/common.lua`'s `emit`
//! pushes each event, the same message it publishes to watchers, onto the
//! lock's shard's capped list (`<prefix>:{<ns>:<shard>}:c`, newest first,
//! trimmed to the changelog's size, expiring after the retention since its
//! last event), in the lock's own cluster slot. Each shard keeps up to the
//! whole size, so the namespace's newest `size` events are always kept,
//! however unevenly its locks spread over shards (at the price of up to
//! `shards × size` entries per namespace in Redis; the retention bounds an
//! idle one). Reading merges the shards' lists by time, newest first, and
//! filters after reading.

use futures::future::join_all;

use super::LockEngine;
use super::ops::Emit;
use super::types::EngineError;
use super::watchers::LockEvent;

/// Which namespaces keep a changelog, how long and how much.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangelogSettings {
    /// Namespace names, `prefix*` patterns or `*` (empty: none).
    pub namespaces: Vec<String>,
    /// Events kept per namespace.
    pub size: u32,
    /// How long a changelog lives after its last event.
    pub retention_ms: u64,
}

impl Default for ChangelogSettings {
    fn default() -> Self {
        ChangelogSettings {
            namespaces: Vec::new(),
            size: 1000,
            retention_ms: 24 * 3600 * 1000,
        }
    }
}

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
}

/// What a changelog read asks for: events whose lock name starts with
/// `prefix`, of `holder` and of `event` (each empty: any), `limit` at most.
#[derive(Clone, Debug, Default)]
pub struct ChangelogQuery {
    pub prefix: String,
    pub holder: String,
    pub event: String,
    pub limit: usize,
}

impl ChangelogQuery {
    fn matches(&self, event: &LockEvent) -> bool {
        event.name.starts_with(&self.prefix)
            && (self.holder.is_empty() || event.holder == self.holder)
            && (self.event.is_empty() || event.event == self.event)
    }

    fn filters(&self) -> bool {
        !(self.prefix.is_empty() && self.holder.is_empty() && self.event.is_empty())
    }
}

/// A changelog read: the matching events, newest first.
#[derive(Clone, Debug, Default)]
pub struct ChangelogPage {
    /// The namespace keeps a changelog (when false, `events` is empty).
    pub enabled: bool,
    pub size: u32,
    pub retention_ms: u64,
    pub events: Vec<LockEvent>,
    /// Events read before filtering.
    pub scanned: usize,
}

impl LockEngine {
    /// Keeps a changelog for the namespaces `settings` names.
    pub fn with_changelog(mut self, settings: ChangelogSettings) -> Self {
        self.changelog = settings;
        self
    }

    /// Where the events of a namespace's locks go: published while some
    /// replica watches it, recorded when it keeps a changelog.
    pub(super) fn emits(&self, namespace: &str) -> Emit {
        Emit {
            publish: self.watchers.is_watched(namespace),
            record: self
                .changelog
                .covers(namespace)
                .then_some((self.changelog.size, self.changelog.retention_ms)),
        }
    }

    /// The latest events of a namespace's changelog that match `query`,
    /// newest first.
    pub async fn changelog(
        &self,
        namespace: &str,
        query: &ChangelogQuery,
    ) -> Result<ChangelogPage, EngineError> {
        self.ready()?;
        let settings = &self.changelog;
        let mut page = ChangelogPage {
            enabled: settings.covers(namespace),
            size: settings.size,
            retention_ms: settings.retention_ms,
            ..ChangelogPage::default()
        };
        if !page.enabled {
            return Ok(page);
        }
        // Unfiltered, the newest `limit` of the namespace are among each
        // shard's newest `limit`; filtered, every kept event is looked at.
        let last = if query.filters() {
            -1
        } else {
            query.limit.min(settings.size as usize) as i64 - 1
        };
        let reads = (0..self.layout.shards()).map(|shard| {
            let mut cmd = redis::cmd("LRANGE");
            cmd.arg(self.layout.changelog_key(namespace, shard))
                .arg(0)
                .arg(last);
            self.store.command::<Vec<String>>(cmd)
        });
        let mut events = Vec::new();
        for shard in join_all(reads).await {
            events.extend(shard?.iter().filter_map(|m| LockEvent::parse(m)));
        }
        page.scanned = events.len();
        // Each list is newest first; a stable sort keeps a shard's order
        // among events of one millisecond.
        events.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
        events.truncate(settings.size as usize);
        page.events = events
            .into_iter()
            .filter(|e| query.matches(e))
            .take(query.limit)
            .collect();
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
