//! The Redis key layout: which shard a lock lives in and the names of its
//! keys. This layout is a public, versioned interface (see the README):
//! other tools may read these keys, so changes bump [`LAYOUT_VERSION`].
//!
//! Every key of one shard carries the hash tag `{<namespace>:<shard>}`, so
//! every function call, which only touches one lock and its shard's
//! fencing counter, stays inside one Redis Cluster slot. Layouts v3 and v4 keep
//! no per-lock index: listing, reaping and clearing find lock keys with
//! `SCAN` (see [`Layout::lock_pattern`]).

/// Version of the key layout written to the `<prefix>:meta` hash.
pub const LAYOUT_VERSION: u32 = 4;

/// Where the keys of a deployment live: its prefix and its shard count.
#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
    shards: u32,
}

pub use tumbler_face::LockKeys;

impl Layout {
    /// `prefix` must not contain braces (it would move the hash tag);
    /// `shards` must be at least 1. Both are checked by the config.
    pub fn new(prefix: &str, shards: u32) -> Self {
        Layout {
            prefix: prefix.to_owned(),
            shards: shards.max(1),
        }
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard of a lock: CRC-32 (IEEE) of `namespace`, a NUL byte and
    /// `name`, modulo the shard count. Stable across versions and easy to
    /// compute in any language.
    pub fn shard_of(&self, namespace: &str, name: &str) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(namespace.as_bytes());
        hasher.update(&[0]);
        hasher.update(name.as_bytes());
        hasher.finalize() % self.shards
    }

    /// The keys of one lock.
    pub fn lock_keys(&self, namespace: &str, name: &str) -> LockKeys {
        let shard = self.shard_prefix(namespace, self.shard_of(namespace, name));
        // Concatenated rather than formatted: this runs on every lock
        // operation.
        let key = |parts: &[&str]| {
            let mut key =
                String::with_capacity(shard.len() + parts.iter().map(|p| p.len()).sum::<usize>());
            key.push_str(&shard);
            parts.iter().for_each(|part| key.push_str(part));
            key
        };
        LockKeys {
            lock: key(&[":l:", name]),
            queue: key(&[":q:", name]),
            fence: key(&[":fence"]),
            live: key(&[":n"]),
        }
    }

    /// The per-shard keys of one shard of a namespace.
    pub fn shard_keys(&self, namespace: &str, shard: u32) -> ShardKeys {
        let prefix = self.shard_prefix(namespace, shard);
        ShardKeys {
            fence: format!("{prefix}:fence"),
            prefix,
        }
    }

    /// A `SCAN MATCH` pattern for the lock keys of a namespace (every
    /// namespace when None) whose names start with `name_prefix`; with
    /// `queued`, the queue keys instead (locks someone waits for).
    pub fn lock_pattern(&self, namespace: Option<&str>, name_prefix: &str, queued: bool) -> String {
        let namespace = namespace.map_or_else(|| "*".to_owned(), glob_escape);
        let kind = if queued { 'q' } else { 'l' };
        format!(
            "{}:{{{namespace}:*}}:{kind}:{}*",
            glob_escape(&self.prefix),
            glob_escape(name_prefix)
        )
    }

    /// The deployment's key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A `SCAN MATCH` pattern for every shard key of `kind`
    /// (`<prefix>:{*}:<kind>:*`), in every namespace. Its `*` may reach
    /// past the tag: callers check what they find.
    pub fn tagged_pattern(&self, kind: &str) -> String {
        format!("{}:{{*}}:{kind}:*", glob_escape(&self.prefix))
    }

    /// The lock a key found by [`Self::lock_pattern`] belongs to: its
    /// shard prefix (`<prefix>:{<namespace>:<shard>}`), namespace and name.
    pub fn parse_lock_key<'a>(&self, key: &'a str) -> Option<(&'a str, &'a str, &'a str)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix(":{")?;
        // Neither the prefix nor a namespace holds a brace: the first '}'
        // closes the tag.
        let close = rest.find('}')?;
        let (namespace, shard) = rest[..close].rsplit_once(':')?;
        shard.parse::<u32>().ok()?;
        let name = rest[close + 1..]
            .strip_prefix(":l:")
            .or_else(|| rest[close + 1..].strip_prefix(":q:"))?;
        let shard_prefix = &key[..self.prefix.len() + 2 + close + 1];
        Some((shard_prefix, namespace, name))
    }

    /// A namespace's per-minute counters of one minute (in its shard 0,
    /// so one slot holds them all).
    pub fn metrics_key(&self, namespace: &str, minute_ms: i64) -> String {
        format!("{}:m:{minute_ms}", self.shard_prefix(namespace, 0))
    }

    /// LIST: the latest lock events of one shard of a namespace with a
    /// changelog, newest first (`lua/shared/events.lua`'s `emit` writes it).
    pub fn changelog_key(&self, namespace: &str, shard: u32) -> String {
        format!("{}:c", self.shard_prefix(namespace, shard))
    }

    /// HASH: a namespace's wait-for registry (decision 0077): waiting
    /// holder → its edges (the locks it waits for and their holders, its
    /// request, when its wait ends). Written only when a holder that may
    /// hold other locks starts to wait, removed when the wait ends; its
    /// own hash tag `{<namespace>:waits}` (no shard's: the graph spans
    /// them all), expiring a minute after the longest wait recorded.
    pub fn waits_key(&self, namespace: &str) -> String {
        format!("{}:{{{namespace}:waits}}", self.prefix)
    }

    /// ZSET namespace → until when (Redis ms) some replica watches it.
    pub fn watching_key(&self) -> String {
        format!("{}:watching", self.prefix)
    }

    /// The namespaces in use: ZSET namespace → when a replica last saw it
    /// used (ms). The reaper walks these.
    pub fn namespaces_key(&self) -> String {
        format!("{}:namespaces", self.prefix)
    }

    /// `<prefix>:{<namespace>:<shard>}`, the start of every key of a shard.
    pub fn shard_prefix(&self, namespace: &str, shard: u32) -> String {
        format!("{}:{{{namespace}:{shard}}}", self.prefix)
    }

    /// The pub/sub channel on which scripts name the waiters that may now
    /// be granted. Every replica subscribes to it once.
    pub fn wake_channel(&self) -> String {
        format!("{}:wake", self.prefix)
    }

    /// The pub/sub channel of lock events (for watchers).
    pub fn events_channel(&self) -> String {
        format!("{}:events", self.prefix)
    }

    /// HASH: a session's record, so any replica can resume it: `owner`,
    /// `digest` (SHA-256 of its resume secret), `ttl`, `epoch` (moves on
    /// at each resume), and `g:<namespace>\n<name>` → fencing token per
    /// grant. Expires two session TTLs after its last touch.
    pub fn session_key(&self, session: &str) -> String {
        format!("{}:s:{{{session}}}", self.prefix)
    }

    /// HASH: tumbler function library → when (Redis ms) a replica last
    /// named it as its own (`libraries.rs`: a library nobody named for the
    /// grace period is deleted). Expires three grace periods after the
    /// last heartbeat.
    pub fn libraries_key(&self) -> String {
        format!("{}:libraries", self.prefix)
    }

    /// The deployment's own record (layout version and shard count).
    pub fn meta_key(&self) -> String {
        format!("{}:meta", self.prefix)
    }
}

/// Escapes the glob characters of `SCAN MATCH` (`* ? [ ] \`).
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The per-shard keys a shard function (list, reap, clear, renew) gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardKeys {
    /// `<prefix>:{<namespace>:<shard>}`: lock keys are this plus `:l:<name>` …
    pub prefix: String,
    /// The shard's fencing counter: the key a shard function is called
    /// with (it names the slot).
    pub fence: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_lock_share_the_shard_hash_tag() {
        let layout = Layout::new("tumbler", 32);
        let keys = layout.lock_keys("default", "orders:{42}");
        let shard = layout.shard_of("default", "orders:{42}");
        let tag = format!("{{default:{shard}}}");
        for key in [&keys.lock, &keys.queue, &keys.fence] {
            assert!(key.starts_with(&format!("tumbler:{tag}:")), "{key}");
        }
        assert_eq!(keys.lock, format!("tumbler:{tag}:l:orders:{{42}}"));
    }

    /// The key suffixes exist twice, here and in `lua/shared/` (the
    /// functions build a lock's keys from its shard and name, and the
    /// shard keys from the fence key they get): this pins both spellings.
    #[test]
    fn lua_builds_the_keys_rust_builds() {
        let common = crate::scripts::shared_steps();
        let layout = Layout::new("tumbler", 4);
        let keys = layout.lock_keys("ns", "x");
        let shard = layout.shard_prefix("ns", layout.shard_of("ns", "x"));
        let changelog = layout.changelog_key("ns", layout.shard_of("ns", "x"));
        // How the shared steps join each key: the shard prefix (or the
        // deployment's prefix, for channels), the suffix, the lock's name.
        let lock_key =
            |key: &str| format!("shard .. '{}' .. name", &key[shard.len()..key.len() - 1]);
        let shard_key = |key: &str| format!("shard .. '{}'", &key[shard.len()..]);
        let channel = |key: &str| format!("prefix .. '{}'", &key["tumbler".len()..]);
        let joins = [
            lock_key(&keys.lock),
            lock_key(&keys.queue),
            shard_key(&keys.fence),
            shard_key(&keys.live),
            shard_key(&changelog),
            channel(&layout.wake_channel()),
            channel(&layout.events_channel()),
        ];
        for join in joins {
            assert!(common.contains(&join), "{join} is not in lua/shared/");
        }
    }

    #[test]
    fn shard_is_crc32_of_namespace_nul_name() {
        let layout = Layout::new("tumbler", 32);
        let expected = crc32fast::hash(b"team-a\0report") % 32;
        assert_eq!(layout.shard_of("team-a", "report"), expected);
        // The namespace takes part: the same name may land elsewhere.
        assert_ne!(
            layout.lock_keys("a", "x").lock,
            layout.lock_keys("b", "x").lock
        );
    }

    #[test]
    fn lock_keys_found_by_scan_parse_back_to_their_lock() {
        let layout = Layout::new("tumbler", 8);
        for name in ["plain", "a}:l:b", "{x}", "*?[]\\", "sp ace|pipe"] {
            let keys = layout.lock_keys("team-a", name);
            let (shard, namespace, parsed) = layout.parse_lock_key(&keys.lock).unwrap();
            assert_eq!((namespace, parsed), ("team-a", name));
            assert_eq!(format!("{shard}:fence"), keys.fence);
            assert_eq!(layout.parse_lock_key(&keys.queue).unwrap().2, name);
        }
        assert_eq!(layout.parse_lock_key("other:{a:1}:l:x"), None);
        // The wait-for registry is no lock key, and no SCAN finds it as one.
        assert_eq!(layout.waits_key("team-a"), "tumbler:{team-a:waits}");
        assert_eq!(layout.parse_lock_key(&layout.waits_key("team-a")), None);
        assert_eq!(layout.parse_lock_key("tumbler:{a:x}:l:x"), None);
        assert_eq!(
            layout.lock_pattern(Some("a.b"), "j*b", false),
            "tumbler:{a.b:*}:l:j\\*b*"
        );
        assert_eq!(layout.lock_pattern(None, "", true), "tumbler:{*:*}:q:*");
    }
}
