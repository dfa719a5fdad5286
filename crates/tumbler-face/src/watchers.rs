//! What a Watch stream is given (the Watch RPC; the engine's
//! `watchers.rs` keeps the registry and fans events out): a lock event as
//! scripts publish it, a watcher's filter, and the handle of a registered
//! watcher.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::sync::mpsc;

use crate::LockId;

/// Events of the initial state (not changes): a live grant, a live
/// waiting request, and the end of the state.
pub const HELD: &str = "held";
pub const WAITING: &str = "waiting";
pub const SYNCED: &str = "synced";

/// Locks (with a prefix) whose state a Watch's initial state shows at most.
pub const STATE_MAX_LOCKS: usize = 1000;

/// One lock event, as scripts publish it (transports show its proto
/// message, `tumbler.v1.LockEvent`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockEvent {
    pub namespace: String,
    pub name: String,
    /// acquired, released, extended, expired, lost, reaped, cleared,
    /// queued, dequeued, skipped, downgraded (and held, waiting, synced for
    /// the initial state).
    pub event: String,
    /// The grant's holder, or the waiting request's id.
    pub holder: String,
    /// The grant's fencing token (0 for events of waiting requests).
    pub fencing_token: u64,
    /// Redis clock, Unix ms.
    pub at_ms: i64,
    /// The grant's slot (0 for waiting requests).
    pub slot: u32,
    pub kind: String,
    pub metadata: BTreeMap<String, String>,
    pub ttl_ms: u64,
    /// When the grant's lease ends (or ended), Redis clock; 0 if none.
    pub expires_at_ms: i64,
    pub acquired_at_ms: i64,
    /// How long the grant was held (when it ended).
    pub hold_ms: u64,
    /// holder, reaper or admin ('' for initial state).
    pub actor: String,
    /// Of a read/write lock: the mode of the grant the event is about, or
    /// the one a waiting request asks; Plain otherwise.
    pub mode: crate::LockMode,
}

impl LockEvent {
    /// Parses `namespace\nname\nevent\nholder\ntoken\ntime_ms` and, from
    /// `lua/shared/events.lua`'s `emit`, `\nslot\nkind\nttl_ms\nexpires_at\n
    /// acquired_at\nhold_ms\nactor\nmetadata` (absent from an older
    /// replica's events: left at their defaults). A read/write lock's
    /// event carries its mode as a suffix of the actor, `holder:r` or
    /// `holder:w` (no new line, so a plain lock's message is what it was
    /// and one stored before modes existed parses as it did).
    pub fn parse(payload: &str) -> Option<LockEvent> {
        let mut fields = payload.splitn(14, '\n');
        let mut event = LockEvent {
            namespace: fields.next()?.to_owned(),
            name: fields.next()?.to_owned(),
            event: fields.next()?.to_owned(),
            holder: fields.next()?.to_owned(),
            fencing_token: fields.next()?.parse().ok()?,
            at_ms: fields.next()?.parse().ok()?,
            ..LockEvent::default()
        };
        let Some(slot) = fields.next() else {
            return Some(event);
        };
        event.slot = slot.parse().ok()?;
        event.kind = fields.next()?.to_owned();
        event.ttl_ms = fields.next()?.parse().ok()?;
        event.expires_at_ms = fields.next()?.parse().ok()?;
        event.acquired_at_ms = fields.next()?.parse().ok()?;
        event.hold_ms = fields.next()?.parse().ok()?;
        let actor = fields.next()?;
        (event.actor, event.mode) = match actor.split_once(':') {
            Some((actor, "r")) => (actor.to_owned(), crate::LockMode::Read),
            Some((actor, "w")) => (actor.to_owned(), crate::LockMode::Write),
            _ => (actor.to_owned(), crate::LockMode::Plain),
        };
        let metadata = fields.next()?;
        if !metadata.is_empty() {
            event.metadata = serde_json::from_str(metadata).ok()?;
            // An election's proof (decision 0082) is nobody's to read.
            event.metadata.remove(crate::election::PROOF_KEY);
        }
        Some(event)
    }

    /// The event of a live grant in a Watch's initial state.
    pub fn held(lock: &LockId, grant: crate::Grant, now_ms: i64) -> LockEvent {
        LockEvent {
            namespace: lock.namespace.to_string(),
            name: lock.name.to_string(),
            event: HELD.into(),
            holder: grant.holder,
            fencing_token: grant.fencing_token,
            at_ms: now_ms,
            slot: grant.slot,
            kind: grant.kind,
            metadata: grant.metadata,
            ttl_ms: grant.ttl_ms,
            expires_at_ms: grant.expires_at_ms,
            acquired_at_ms: grant.acquired_at_ms,
            mode: grant.mode,
            ..LockEvent::default()
        }
    }
}

/// Which events a watcher wants: one namespace, and one name or a prefix.
#[derive(Clone, Debug)]
pub struct Filter {
    pub namespace: crate::Namespace,
    pub name: Option<crate::LockName>,
    pub prefix: String,
}

impl Filter {
    pub fn matches(&self, event: &LockEvent) -> bool {
        self.matches_lock(&event.namespace, &event.name)
    }

    pub fn matches_lock(&self, namespace: &str, name: &str) -> bool {
        namespace == self.namespace
            && match &self.name {
                Some(wanted) => name == wanted,
                None => name.starts_with(&self.prefix),
            }
    }
}

/// A registered watcher: its events, whether it was dropped for falling
/// behind, and the guard that unregisters it when dropped.
pub struct WatchHandle {
    pub events: mpsc::Receiver<LockEvent>,
    pub overflowed: Arc<AtomicBool>,
    pub guard: WatchGuard,
}

/// Unregisters its watcher when dropped: it holds what the engine's
/// registry drops to do that.
pub struct WatchGuard {
    _unregister: Box<dyn std::any::Any + Send + Sync>,
}

impl WatchGuard {
    /// A guard that drops `unregister` with it.
    pub fn new(unregister: impl std::any::Any + Send + Sync) -> Self {
        WatchGuard {
            _unregister: Box::new(unregister),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_with_and_without_the_grant_parts() {
        // An older replica's event: six fields.
        let old = LockEvent::parse("ns\nlock\nreleased\nh\n17\n1000").unwrap();
        assert_eq!(
            (old.event.as_str(), old.fencing_token, old.at_ms),
            ("released", 17, 1000)
        );
        assert_eq!((old.slot, old.actor.as_str()), (0, ""));
        // This version's: the grant's parts, metadata last.
        let full = LockEvent::parse(
            "ns\nlock\nreleased\nh\n17\n1500\n2\nreport\n30000\n31000\n1000\n500\nholder\n{\"a\":\"x\\ny\"}",
        )
        .unwrap();
        assert_eq!(full.slot, 2);
        assert_eq!(full.kind, "report");
        assert_eq!((full.ttl_ms, full.expires_at_ms), (30_000, 31_000));
        assert_eq!((full.acquired_at_ms, full.hold_ms), (1000, 500));
        assert_eq!(full.actor, "holder");
        assert_eq!(full.metadata.get("a").map(String::as_str), Some("x\ny"));
        assert_eq!(full.mode, crate::LockMode::Plain);
        // A read/write lock's: the mode a suffix of the actor.
        for (actor, mode) in [
            ("holder:r", crate::LockMode::Read),
            ("reaper:w", crate::LockMode::Write),
        ] {
            let rw = LockEvent::parse(&format!(
                "ns\nlock\nexpired\nh\n17\n1500\n1\ndefault\n30000\n31000\n1000\n500\n{actor}\n"
            ))
            .unwrap();
            assert_eq!((rw.actor.as_str(), rw.mode), (&actor[..6], mode));
        }
        // Broken ones are refused, not half read.
        assert!(LockEvent::parse("ns\nlock\nreleased\nh\nnot-a-number\n1").is_none());
        assert!(LockEvent::parse("ns\nlock\nreleased\nh\n1\n1\n2\nk").is_none());
    }
}
