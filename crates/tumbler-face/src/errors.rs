//! Why an engine call failed ([`EngineError`], its [`ErrorKind`] for the
//! transports' one error table). Not getting a lock is not a failure:
//! that is an outcome (`types.rs`). Redis trouble is a [`StoreTrouble`]:
//! its kind and what Redis said, which the engine sorts out of the
//! store's own error, so nothing above the engine names the store.

use std::fmt;

use super::types::WaitStep;

/// Why an engine call failed. Not getting a lock is not a failure.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreTrouble),
    #[error("the queue of this lock is full ({0} waiting requests)")]
    QueueFull(u32),
    #[error("this replica already holds {0} waiting requests")]
    TooManyWaiters(usize),
    #[error("this namespace already has {0} waiting requests on this replica")]
    TooManyInNamespace(usize),
    #[error("this namespace has reached its lock limit")]
    NamespaceFull,
    #[error(
        "the lock is in use with limit {lock_limit}; this request asks for limit {requested} (a lock's limit is fixed while anyone holds or waits)"
    )]
    LimitMismatch { lock_limit: u32, requested: u32 },
    #[error("the lock is a read/write lock: acquire it with mode READ or WRITE")]
    RwLockNeedsMode,
    #[error("the lock is a plain lock: acquire it without a mode")]
    PlainLockHasNoMode,
    #[error(
        "the holder holds a read permit: an upgrade to WRITE is refused (two upgraders would wait for each other forever); release it, then acquire WRITE"
    )]
    UpgradeRefused,
    #[error("this replica is shutting down; retry on another")]
    ShuttingDown,
    #[error("this session was resumed on another stream")]
    SessionMoved,
    /// A session's command that would split or overlap a multi-lock set
    /// it holds (decision 0078); the message names the field and the set.
    #[error("{0}")]
    SetMismatch(String),
    #[error("the caller stopped waiting")]
    Stopped,
    /// The wait would close a cycle in the namespace's wait-for graph
    /// (decision 0077): refused at once, its queue entry gone.
    #[error("deadlock: {}", describe(.0))]
    Deadlock(Vec<WaitStep>),
    /// An election's grant, acted on without its proof (decision 0082).
    #[error(
        "secret: not this leadership's: only the leader may proclaim, resign or release it, with the secret its winning Campaign returned (a session's leadership: through its session)"
    )]
    NotYours,
    /// Acquire's `takes_over` named an election's or a session's grant
    /// (decision 0083): such a grant does not pass.
    #[error(
        "takes_over: the grant is an election's or a session's: it is not taken over (an election's goes with its secret, a session's through its session)"
    )]
    NotPassed,
    /// A mode or permits on an election's name, or a Campaign on a lock
    /// of another rule (decision 0082).
    #[error(
        "the lock is an election's (a Campaign holds or waits for it): acquire it without a mode or permits, or campaign on another name; a Campaign needs a plain lock of limit 1 (this one is a read/write lock or takes several permits)"
    )]
    ElectionRule,
}

/// What kind of failure an engine error is: the one table the transports
/// map from (`api::convert` to gRPC codes; the dashboard from those to HTTP
/// statuses, ARCHITECTURE.md "Errors").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Redis is unreachable, too slow or refusing writes, or this replica
    /// is shutting down: nothing was granted; retry later or elsewhere.
    Unavailable,
    /// Redis answered something the engine cannot read.
    Internal,
    /// A bound was reached: the lock's queue, this replica's or this
    /// namespace's waiting requests, the namespace's locks.
    Exhausted,
    /// The request conflicts with the lock as it is (another limit).
    Conflict,
    /// The session was taken over by another stream.
    Moved,
    /// The caller's own stop signal ended the wait (the transport says why).
    Stopped,
    /// The wait would close a wait-for cycle: refused, nothing left behind.
    Deadlock,
    /// The caller did not prove it owns what it acts on (decision 0082).
    NotYours,
}

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            // A refusal of Redis' ACL is the operator's to fix, like an
            // outage: nothing ran, retry once the user has its grants.
            EngineError::Store(StoreTrouble {
                kind: TroubleKind::Unavailable | TroubleKind::Denied,
                ..
            })
            | EngineError::ShuttingDown => ErrorKind::Unavailable,
            EngineError::Store(StoreTrouble {
                kind: TroubleKind::Protocol | TroubleKind::Config,
                ..
            }) => ErrorKind::Internal,
            EngineError::QueueFull(_)
            | EngineError::TooManyWaiters(_)
            | EngineError::TooManyInNamespace(_)
            | EngineError::NamespaceFull => ErrorKind::Exhausted,
            EngineError::LimitMismatch { .. }
            | EngineError::RwLockNeedsMode
            | EngineError::PlainLockHasNoMode
            | EngineError::UpgradeRefused
            | EngineError::SetMismatch(_)
            | EngineError::ElectionRule => ErrorKind::Conflict,
            EngineError::NotYours | EngineError::NotPassed => ErrorKind::NotYours,
            EngineError::SessionMoved => ErrorKind::Moved,
            EngineError::Stopped => ErrorKind::Stopped,
            EngineError::Deadlock(_) => ErrorKind::Deadlock,
        }
    }

    /// What Redis said, for logs, when the error is Redis trouble.
    pub fn store_detail(&self) -> Option<&str> {
        match self {
            EngineError::Store(trouble) => Some(&trouble.detail),
            _ => None,
        }
    }
}

/// Redis trouble, store-neutral: what kind it is and what Redis (or the
/// store) said. The engine makes it from the store's error; it reads as
/// that error did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreTrouble {
    pub kind: TroubleKind,
    pub detail: String,
}

/// The kinds of Redis trouble, as the store sorts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TroubleKind {
    /// Redis is unreachable, timed out, or cannot serve writes right now:
    /// nothing was granted that the caller may count on.
    Unavailable,
    /// Redis' ACL refused the configured user a command, key or channel
    /// (`NOPERM`); the detail names what to grant.
    Denied,
    /// Redis answered, but not as the functions promise (a bug).
    Protocol,
    /// The Redis settings cannot be used (found before any connection).
    Config,
}

impl StoreTrouble {
    pub fn new(kind: TroubleKind, detail: impl Into<String>) -> Self {
        StoreTrouble {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for StoreTrouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let detail = &self.detail;
        match self.kind {
            TroubleKind::Unavailable => write!(f, "redis unavailable: {detail}"),
            TroubleKind::Denied => f.write_str(detail),
            TroubleKind::Protocol => write!(f, "redis reply not understood: {detail}"),
            TroubleKind::Config => write!(f, "redis settings: {detail}"),
        }
    }
}

impl std::error::Error for StoreTrouble {}

/// Steps of a cycle its message names, and characters of each name.
const MESSAGE_STEPS: usize = 8;
const MESSAGE_NAME_CHARS: usize = 64;

/// A cycle as its error message says it: `holder "a" waits for lock "x"
/// held by "b", "b" waits for lock "y" held by "a"`; at most 8 steps (then
/// `and N more`), each name cut at 64 characters, so the message stays
/// under 2 KB whatever the cycle (a gRPC client refuses a long one).
fn describe(cycle: &[WaitStep]) -> String {
    let mut steps: Vec<String> = (cycle.iter().take(MESSAGE_STEPS))
        .enumerate()
        .map(|(i, step)| {
            let who = if i == 0 { "holder " } else { "" };
            format!(
                "{who}{:?} waits for lock {:?} held by {:?}",
                short(&step.holder),
                short(&step.lock),
                short(&step.held_by)
            )
        })
        .collect();
    if cycle.len() > MESSAGE_STEPS {
        steps.push(format!("and {} more", cycle.len() - MESSAGE_STEPS));
    }
    steps.join(", ")
}

/// A name as a message shows it: its first 64 characters, then `…`.
fn short(name: &str) -> String {
    match name.char_indices().nth(MESSAGE_NAME_CHARS) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod cycle_tests {
    use super::*;

    #[test]
    fn a_cycle_reads_as_its_message() {
        let step = |h: &str, l: &str, b: &str| WaitStep {
            holder: h.into(),
            lock: l.into(),
            held_by: b.into(),
        };
        assert_eq!(
            describe(&[step("a", "x", "b"), step("b", "y", "a")]),
            r#"holder "a" waits for lock "x" held by "b", "b" waits for lock "y" held by "a""#
        );
    }

    #[test]
    fn a_long_cycles_message_stays_short() {
        let long = "h".repeat(256);
        let cycle: Vec<WaitStep> = (0..200)
            .map(|i| WaitStep {
                holder: format!("{long}{i}"),
                lock: format!("{long}-lock"),
                held_by: format!("{long}{}", i + 1),
            })
            .collect();
        let message = describe(&cycle);
        assert!(message.len() < 2048, "{} bytes", message.len());
        assert!(message.ends_with("and 192 more"), "{message}");
        assert!(message.contains(&format!("\"{}…\"", "h".repeat(64))));
    }
}
