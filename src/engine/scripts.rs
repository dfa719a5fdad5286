//! The Lua scripts, one per lock operation, embedded in the binary. Each is
//! `lua/common.lua` (shared steps) followed by the operation's own file,
//! and runs with EVALSHA, reloaded by the redis crate on NOSCRIPT.

use redis::Script;

macro_rules! lua {
    ($file:literal) => {
        concat!(
            include_str!("../../lua/common.lua"),
            include_str!(concat!("../../lua/", $file))
        )
    };
}

/// The loaded scripts (their SHA1 is computed once, at start).
pub struct Scripts {
    pub acquire: Script,
    pub release: Script,
    pub extend: Script,
    pub inspect: Script,
    pub queue: Script,
    pub refresh: Script,
    pub dequeue: Script,
    pub list: Script,
    pub reap: Script,
    pub clear: Script,
    pub renew: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Scripts {
            acquire: Script::new(lua!("acquire.lua")),
            release: Script::new(lua!("release.lua")),
            extend: Script::new(lua!("extend.lua")),
            inspect: Script::new(lua!("inspect.lua")),
            queue: Script::new(lua!("queue.lua")),
            refresh: Script::new(lua!("refresh.lua")),
            dequeue: Script::new(lua!("dequeue.lua")),
            list: Script::new(lua!("list.lua")),
            reap: Script::new(lua!("reap.lua")),
            clear: Script::new(lua!("clear.lua")),
            renew: Script::new(lua!("renew.lua")),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
