//! The Lua scripts, one per lock operation, embedded in the binary and
//! loaded into Redis as one function library (`FUNCTION LOAD`): the
//! shared steps (`lua/shared/*.lua`, joined in the fixed order `build.rs`
//! lists) run once when the library loads, and each operation's own file
//! becomes one function, run with `FCALL`.
//! (As `EVAL` scripts, every call re-created the shared steps' closures
//! first: about 13 % of Redis' instructions per acquire+release pair,
//! measured with callgrind; see BENCHMARKS.md.)
//!
//! The library's name and its functions' names carry a hash of its code,
//! so two tumbler versions' libraries can sit side by side in one Redis
//! during a rolling upgrade, and a Redis that lacks the library (new,
//! restarted without persistence, another cluster node) gets it from the
//! first call that needs it (`Store::run_script`).
//!
//! The list of operations is the files in `lua/`: `build.rs` writes it
//! (and `Scripts`, a field per operation) at build time, so adding an
//! operation is adding its file, with `-- flags: no-writes` in its header
//! when it only reads.

use std::sync::Arc;

use sha2::{Digest, Sha256};

/// One operation: a function of tumbler's library (named
/// `tumbler_<library hash>_<operation>`), as the store calls it.
pub use crate::store::Function as LockScript;

// `SHARED` (the shared steps' files in order), `OPERATIONS` (name, code,
// read only) and `Scripts` (one field per operation), written by build.rs
// from the files in `lua/`.
include!(concat!(env!("OUT_DIR"), "/operations.rs"));

#[cfg(test)]
mod library;

/// The shared steps: the files of `lua/shared/` joined in their order,
/// each after a comment line naming it (so Redis' copy of the library
/// says where each part comes from).
pub(crate) fn shared_steps() -> String {
    let mut code = String::new();
    for (name, text) in SHARED {
        code.push_str(&format!("-- lua/shared/{name}.lua\n{text}\n"));
    }
    code
}

impl Scripts {
    /// The library's code and its functions' names, made once at start.
    /// The name's hash covers the shared steps as joined (their text and
    /// order) and every operation.
    pub fn compile() -> Self {
        let common = shared_steps();
        let mut hasher = Sha256::new();
        hasher.update(&common);
        for (name, body, read_only) in OPERATIONS {
            hasher.update([u8::from(*read_only)]);
            hasher.update(name);
            hasher.update(body);
        }
        let library_name = format!("tumbler_{}", hex::encode(&hasher.finalize()[..8]));
        // Each operation's file is the body of its function, with this
        // call's keys and arguments as its locals `KEYS` and `ARGV`; the
        // functions are also kept in the table `OPS` by name, so that
        // `lua/batch.lua` runs them as their own calls would (group
        // commit, `group.rs`).
        let mut code = format!("#!lua name={library_name}\n{common}\nlocal OPS = {{}}\n");
        for (name, body, read_only) in OPERATIONS {
            let flags = if *read_only { "'no-writes'" } else { "" };
            code.push_str(&format!(
                "OPS['{name}'] = function(KEYS, ARGV)\n{body}\nend\n\
                 redis.register_function{{function_name = '{library_name}_{name}', flags = {{{flags}}}, \
                 callback = OPS['{name}']}}\n"
            ));
        }
        let library: Arc<str> = code.into();
        Scripts::with_functions(library_name.clone(), |name| LockScript {
            function: format!("{library_name}_{name}"),
            library: library.clone(),
        })
    }
}

impl Scripts {
    /// The operation a function of this library runs (`acquire` for
    /// `tumbler_<hash>_acquire`).
    pub fn operation<'a>(&self, script: &'a LockScript) -> &'a str {
        script
            .function
            .get(self.library_name.len() + 1..)
            .unwrap_or_default()
    }

    /// How many functions the library has (one per operation).
    pub fn operations() -> usize {
        OPERATIONS.len()
    }
}
