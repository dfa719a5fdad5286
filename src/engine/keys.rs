//! The Redis key layout: which shard a lock lives in and the names of its
//! keys. This layout is a public, versioned interface (see the README):
//! other tools may read these keys, so changes bump [`LAYOUT_VERSION`].
//!
//! Every key of one shard carries the hash tag `{<namespace>:<shard>}`, so
//! every script, which only touches one lock and its shard's index and
//! fencing counter, stays inside one Redis Cluster slot.

/// Version of the key layout written to the `<prefix>:meta` hash.
pub const LAYOUT_VERSION: u32 = 2;

/// Where the keys of a deployment live: its prefix and its shard count.
#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
    shards: u32,
}

/// The keys one lock operation touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKeys {
    /// HASH: the whole lock in one key — grants (with their lease
    /// expiry), slots, holder count, earliest possible expiry, limit,
    /// waiter records and the arrival counter.
    pub lock: String,
    /// ZSET of waiting requests in grant order; exists only while someone waits.
    pub queue: String,
    /// ZSET waiting request → liveness deadline; exists with the queue.
    pub deadlines: String,
    /// ZSET (per shard) lock name → next time something in it expires.
    pub index: String,
    /// ZSET (per shard) lock name → 0, in name order (for listing).
    pub names: String,
    /// STRING (per shard) last fencing token handed out.
    pub fence: String,
}

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
        LockKeys {
            lock: format!("{shard}:l:{name}"),
            queue: format!("{shard}:q:{name}"),
            deadlines: format!("{shard}:d:{name}"),
            index: format!("{shard}:index"),
            names: format!("{shard}:names"),
            fence: format!("{shard}:fence"),
        }
    }

    /// The per-shard keys of one shard of a namespace.
    pub fn shard_keys(&self, namespace: &str, shard: u32) -> ShardKeys {
        let prefix = self.shard_prefix(namespace, shard);
        ShardKeys {
            index: format!("{prefix}:index"),
            names: format!("{prefix}:names"),
            fence: format!("{prefix}:fence"),
            prefix,
        }
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

    /// The deployment's own record (layout version and shard count).
    pub fn meta_key(&self) -> String {
        format!("{}:meta", self.prefix)
    }
}

impl LockKeys {
    /// The keys in the order every lock script expects them (see
    /// lua/common.lua).
    pub fn as_script_keys(&self) -> [&str; 6] {
        [
            &self.lock,
            &self.queue,
            &self.deadlines,
            &self.index,
            &self.names,
            &self.fence,
        ]
    }
}

/// The per-shard keys a shard-walking script (list, reap, clear) gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardKeys {
    /// `<prefix>:{<namespace>:<shard>}`: lock keys are this plus `:l:<name>` …
    pub prefix: String,
    pub index: String,
    pub names: String,
    pub fence: String,
}

impl ShardKeys {
    pub fn as_script_keys(&self) -> [&str; 3] {
        [&self.index, &self.names, &self.fence]
    }
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
        for key in [&keys.lock, &keys.queue, &keys.index, &keys.fence] {
            assert!(key.starts_with(&format!("tumbler:{tag}:")), "{key}");
        }
        assert_eq!(keys.lock, format!("tumbler:{tag}:l:orders:{{42}}"));
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
}
