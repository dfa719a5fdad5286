//! Leader election, on top of the lock: an election is a fair lock of
//! limit 1 under the election's name. Campaign is a waiting acquire (the
//! lock's queue orders the candidates), the leader is the holder, its term
//! the grant's fencing token (so terms strictly rise and are never reused),
//! and its value the grant's metadata entry [`VALUE_KEY`], which Acquire's
//! metadata may not use: only elections write it, so a plain mutex pays
//! nothing for elections. Proclaim and Resign need the leader's secret,
//! whose digest the grant keeps in [`PROOF_KEY`] (decision 0082). Resign
//! is a release pinned to the term and proved by that digest (which
//! wakes the next candidate); Leader is Inspect; Observe is a Watch of the
//! one name whose events [`LeaderTracker`] turns into leader changes.
//! Proclaim is the one function of its own (`lua/proclaim.lua`; its call
//! is the engine's `election.rs`).
//! docs/decisions/0069-leader-election-is-a-fair-lock-of-limit-one.md says why.

use std::collections::BTreeMap;

use super::watchers::{HELD, LockEvent, SYNCED};
use super::{AcquireOutcome, Grant, LeaderChange, Leadership, LockId, LockState};

/// The metadata entry that carries a leader's value. Acquire refuses an
/// empty metadata key, so no plain grant carries one.
pub const VALUE_KEY: &str = "";

/// The metadata entry that carries the digest of the leader's secret
/// (decision 0082): a key Acquire refuses (it holds a control character),
/// read only by the functions (`lua/shared/records.lua` `owned`, `proven`) and
/// taken out of the metadata wherever a grant is decoded.
pub const PROOF_KEY: &str = "\u{1}";

/// The metadata of a campaign's grant: its value alone.
pub fn value_metadata(value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(VALUE_KEY.to_owned(), value.to_owned())])
}

/// A new leader's secret: 256 random bits as hex, told only to the
/// Campaign that wins (only its digest is stored, with the grant).
pub fn new_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The digest a grant keeps of its leader's secret (hex SHA-256, as a
/// session keeps its resume secret's).
pub fn proof_of(secret: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

/// Whether a grant is a leadership: made by a Campaign (its metadata has
/// the value entry) and plain (not a reader's or a writer's).
pub fn is_leadership(grant: &Grant) -> bool {
    grant.metadata.contains_key(VALUE_KEY) && grant.mode == super::LockMode::Plain
}

/// A grant of an election's lock, as a leadership.
pub fn leadership(grant: Grant) -> Leadership {
    Leadership {
        value: grant.metadata.get(VALUE_KEY).cloned().unwrap_or_default(),
        candidate: grant.holder,
        term: grant.fencing_token,
        elected_at_ms: grant.acquired_at_ms,
        expires_at_ms: grant.expires_at_ms,
        ttl_ms: grant.ttl_ms,
    }
}

/// A Campaign as the acquire it is: limit 1, fair, the value in the
/// grant's metadata entry [`VALUE_KEY`].
pub struct Campaign {
    pub lock: LockId,
    pub candidate: super::Holder,
    pub value: String,
    pub ttl: super::Ttl,
    pub wait: std::time::Duration,
    pub answer_by: Option<tokio::time::Instant>,
    pub queue_ttl_ms: u64,
    pub kind: super::Kind,
    /// The digest of the secret that will prove the leader ([`proof_of`]).
    pub proof: String,
}

pub fn campaign(c: Campaign) -> super::AcquireRequest {
    // A fair mutex acquire. A candidate may hold other locks of the
    // namespace: its wait is an edge of the wait-for graph like any other
    // (decision 0077; `holds_nothing` stays false).
    let mut metadata = value_metadata(&c.value);
    metadata.insert(PROOF_KEY.to_owned(), c.proof);
    super::AcquireRequest {
        metadata,
        kind: c.kind,
        wait: c.wait,
        queue_ttl_ms: c.queue_ttl_ms,
        answer_by: c.answer_by,
        ..super::AcquireRequest::new(c.lock, c.candidate, c.ttl)
    }
}

/// A Campaign's acquire, answered as an election.
pub fn campaign_outcome(outcome: AcquireOutcome) -> super::CampaignOutcome {
    use super::CampaignOutcome::*;
    match outcome {
        AcquireOutcome::Acquired { grant, .. } | AcquireOutcome::AlreadyHeld { grant, .. } => {
            Elected(leadership(grant))
        }
        AcquireOutcome::TimedOut { position, .. } => NotElected { position },
        AcquireOutcome::Busy { .. } => NotElected { position: 0 },
    }
}

/// The leader an Inspect of the election's lock shows: its one holder,
/// when a Campaign made its grant (a lock of another limit, a reader, a
/// writer or a plain Acquire's grant is no leader: decision 0082).
pub fn leader_of(state: LockState) -> Option<Leadership> {
    if state.limit != 1 || state.mode != super::LockMode::Plain {
        return None;
    }
    state
        .holders
        .into_iter()
        .next()
        .filter(is_leadership)
        .map(leadership)
}

/// Turns the lock events of one election (a Watch of its name, initial
/// state first) into leader changes: a new leader, a new value, or the
/// end of a term. Duplicates (the state and the event that made it, both
/// seen) and events of terms older than one already seen are dropped.
#[derive(Debug, Default)]
pub struct LeaderTracker {
    /// The term of the leader last told, if someone leads.
    current: Option<u64>,
    /// The highest term seen: older ones are history.
    highest: u64,
    /// The value last told of the current leader.
    value: String,
    /// The initial state's leader, until `synced` tells it.
    state: Option<Leadership>,
    synced: bool,
}

impl LeaderTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The change an event makes, if any. Until the initial state ends
    /// (`synced`), nothing is told; then its leader, as "current".
    pub fn next(&mut self, event: &LockEvent) -> Option<LeaderChange> {
        if !self.synced {
            match event.event.as_str() {
                HELD if event.metadata.contains_key(VALUE_KEY)
                    && event.mode == super::LockMode::Plain =>
                {
                    self.state = Some(leadership_of(event))
                }
                SYNCED => {
                    self.synced = true;
                    let leader = self.state.take();
                    if let Some(l) = &leader {
                        self.current = Some(l.term);
                        self.highest = l.term;
                        self.value = l.value.clone();
                    }
                    return Some(LeaderChange {
                        leader,
                        event: "current",
                        at_ms: event.at_ms,
                        ended_term: 0,
                    });
                }
                _ => {}
            }
            return None;
        }
        let term = event.fencing_token;
        match event.event.as_str() {
            "acquired" | HELD | "proclaimed" => {
                // Only a Campaign's grant leads (decision 0082).
                if term < self.highest
                    || !event.metadata.contains_key(VALUE_KEY)
                    || event.mode != super::LockMode::Plain
                {
                    return None;
                }
                let leader = leadership_of(event);
                let same = self.current == Some(term);
                if same && leader.value == self.value {
                    return None;
                }
                self.current = Some(term);
                self.highest = term;
                self.value = leader.value.clone();
                Some(LeaderChange {
                    leader: Some(leader),
                    event: if same { "proclaimed" } else { "elected" },
                    at_ms: event.at_ms,
                    ended_term: 0,
                })
            }
            "released" | "expired" | "reaped" | "cleared" => {
                if self.current != Some(term) {
                    return None;
                }
                self.current = None;
                Some(LeaderChange {
                    leader: None,
                    event: match event.event.as_str() {
                        "released" => "resigned",
                        "expired" => "expired",
                        _ => "removed",
                    },
                    at_ms: event.at_ms,
                    ended_term: term,
                })
            }
            _ => None,
        }
    }
}

/// The leadership a grant's event shows.
fn leadership_of(event: &LockEvent) -> Leadership {
    Leadership {
        candidate: event.holder.clone(),
        term: event.fencing_token,
        value: event.metadata.get(VALUE_KEY).cloned().unwrap_or_default(),
        elected_at_ms: event.acquired_at_ms,
        expires_at_ms: event.expires_at_ms,
        ttl_ms: event.ttl_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, holder: &str, term: u64, value: Option<&str>) -> LockEvent {
        LockEvent {
            event: kind.into(),
            holder: holder.into(),
            fencing_token: term,
            metadata: value.map(value_metadata).unwrap_or_default(),
            ..LockEvent::default()
        }
    }

    fn told(
        tracker: &mut LeaderTracker,
        e: LockEvent,
    ) -> Option<(&'static str, Option<String>, u64)> {
        tracker
            .next(&e)
            .map(|c| (c.event, c.leader.map(|l| l.candidate), c.ended_term))
    }

    #[test]
    fn events_become_leader_changes_once_each_and_old_terms_are_history() {
        let mut t = LeaderTracker::new();
        assert_eq!(
            told(&mut t, event("acquired", "a", 5, Some("x"))),
            None,
            "before the state ends"
        );
        assert_eq!(told(&mut t, event(HELD, "a", 5, Some("x"))), None);
        assert_eq!(
            told(&mut t, event(SYNCED, "", 0, None)),
            Some(("current", Some("a".into()), 0))
        );
        // The state and the event that made it: told once.
        assert_eq!(told(&mut t, event("acquired", "a", 5, Some("x"))), None);
        assert_eq!(told(&mut t, event("extended", "a", 5, Some("x"))), None);
        assert_eq!(
            told(&mut t, event("proclaimed", "a", 5, Some("y"))),
            Some(("proclaimed", Some("a".into()), 0))
        );
        assert_eq!(
            told(&mut t, event("released", "a", 5, Some("y"))),
            Some(("resigned", None, 5))
        );
        assert_eq!(
            told(&mut t, event("released", "a", 5, Some("y"))),
            None,
            "ended once"
        );
        assert_eq!(
            told(&mut t, event("acquired", "b", 9, Some("z"))),
            Some(("elected", Some("b".into()), 0))
        );
        assert_eq!(
            told(&mut t, event("acquired", "old", 7, None)),
            None,
            "an older term is history"
        );
        assert_eq!(
            told(&mut t, event("expired", "b", 9, None)),
            Some(("expired", None, 9))
        );
        assert_eq!(told(&mut t, event("queued", "c", 0, None)), None);
    }

    #[test]
    fn a_state_without_a_holder_is_told_as_nobody_leading() {
        let mut t = LeaderTracker::new();
        assert_eq!(
            told(&mut t, event(SYNCED, "", 0, None)),
            Some(("current", None, 0))
        );
    }
}
