//! The Lua scripts, one per lock operation, embedded in the binary and
//! loaded into Redis as one function library (`FUNCTION LOAD`):
//! `lua/common.lua`, the shared steps, runs once when the library loads,
//! and each operation's own file becomes one function, run with `FCALL`.
//! (As `EVAL` scripts, every call re-created the shared steps' closures
//! first: about 13 % of Redis' instructions per acquire+release pair,
//! measured with callgrind; see BENCHMARKS.md.)
//!
//! The library's name and its functions' names carry a hash of its code,
//! so two tumbler versions' libraries can sit side by side in one Redis
//! during a rolling upgrade, and a Redis that lacks the library (new,
//! restarted without persistence, another cluster node) gets it from the
//! first call that needs it (`Store::run_script`).

use std::sync::Arc;

use sha2::{Digest, Sha256};

/// One operation: a function of tumbler's library (named
/// `tumbler_<library hash>_<operation>`), as the store calls it.
pub use crate::store::Function as LockScript;

/// Every operation: its name, its file, and whether it only reads (then
/// Redis runs it even when it refuses writes for lack of memory).
const OPERATIONS: &[(&str, &str, bool)] = &[
    ("acquire", include_str!("../../lua/acquire.lua"), false),
    ("release", include_str!("../../lua/release.lua"), false),
    ("extend", include_str!("../../lua/extend.lua"), false),
    ("inspect", include_str!("../../lua/inspect.lua"), true),
    ("queue", include_str!("../../lua/queue.lua"), true),
    ("refresh", include_str!("../../lua/refresh.lua"), false),
    ("dequeue", include_str!("../../lua/dequeue.lua"), false),
    ("list", include_str!("../../lua/list.lua"), true),
    ("reap", include_str!("../../lua/reap.lua"), false),
    ("clear", include_str!("../../lua/clear.lua"), false),
    ("renew", include_str!("../../lua/renew.lua"), false),
    ("count", include_str!("../../lua/count.lua"), false),
    (
        "session_open",
        include_str!("../../lua/session_open.lua"),
        false,
    ),
    (
        "session_touch",
        include_str!("../../lua/session_touch.lua"),
        false,
    ),
    (
        "session_note",
        include_str!("../../lua/session_note.lua"),
        false,
    ),
    (
        "session_claim",
        include_str!("../../lua/session_claim.lua"),
        false,
    ),
    (
        "session_end",
        include_str!("../../lua/session_end.lua"),
        false,
    ),
    ("purge", include_str!("../../lua/purge.lua"), false),
    ("changelog", include_str!("../../lua/changelog.lua"), true),
];

const COMMON: &str = include_str!("../../lua/common.lua");

/// The library's functions, one per operation.
pub struct Scripts {
    /// `tumbler_<hash>`, the name Redis lists the library under.
    pub library_name: String,
    pub acquire: LockScript,
    pub release: LockScript,
    pub extend: LockScript,
    pub inspect: LockScript,
    pub queue: LockScript,
    pub refresh: LockScript,
    pub dequeue: LockScript,
    pub list: LockScript,
    pub reap: LockScript,
    pub clear: LockScript,
    pub renew: LockScript,
    pub count: LockScript,
    pub session_open: LockScript,
    pub session_touch: LockScript,
    pub session_note: LockScript,
    pub session_claim: LockScript,
    pub session_end: LockScript,
    pub purge: LockScript,
    pub changelog: LockScript,
}

impl Scripts {
    pub fn new() -> Self {
        let mut hasher = Sha256::new();
        hasher.update(COMMON);
        for (name, body, read_only) in OPERATIONS {
            hasher.update([u8::from(*read_only)]);
            hasher.update(name);
            hasher.update(body);
        }
        let library_name = format!("tumbler_{}", hex::encode(&hasher.finalize()[..8]));
        // Each operation's file is the body of its function, with this
        // call's keys and arguments as its locals `KEYS` and `ARGV`.
        let mut code = format!("#!lua name={library_name}\n{COMMON}\n");
        for (name, body, read_only) in OPERATIONS {
            let flags = if *read_only { "'no-writes'" } else { "" };
            code.push_str(&format!(
                "redis.register_function{{function_name = '{library_name}_{name}', flags = {{{flags}}}, \
                 callback = function(KEYS, ARGV)\n{body}\nend}}\n"
            ));
        }
        let library: Arc<str> = code.into();
        let script = |name: &str| LockScript {
            function: format!("{library_name}_{name}"),
            library: library.clone(),
        };
        Scripts {
            acquire: script("acquire"),
            release: script("release"),
            extend: script("extend"),
            inspect: script("inspect"),
            queue: script("queue"),
            refresh: script("refresh"),
            dequeue: script("dequeue"),
            list: script("list"),
            reap: script("reap"),
            clear: script("clear"),
            renew: script("renew"),
            count: script("count"),
            session_open: script("session_open"),
            session_touch: script("session_touch"),
            session_note: script("session_note"),
            session_claim: script("session_claim"),
            session_end: script("session_end"),
            purge: script("purge"),
            changelog: script("changelog"),
            library_name,
        }
    }
}

impl Scripts {
    /// How many functions the library has (one per operation).
    pub fn operations() -> usize {
        OPERATIONS.len()
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
