//! Writes the Redis function list and the `Scripts` struct from the
//! repository's `lua/` folder (the library's code stays there, beside the
//! other crates, as the protocol's source), and the list of the shared
//! steps' files in `lua/shared/`, in the order the library joins them.

use std::path::{Path, PathBuf};

/// The files of `lua/shared/`, in the order the library joins them: a
/// file uses only what an earlier one (or its own earlier lines) defines,
/// since each shared step is a Lua `local` (the engine's `library` test
/// checks it). The folder holds exactly these files.
const SHARED: &[&str] = &[
    "numbers",       // statuses, constants, numbers as text, clock, fence, batch
    "records",       // the header, grant and waiter records: encoders, decoders
    "lock",          // the lock table: load, bookkeeping, queue head, settle
    "events",        // lock events: PUBLISH and the changelog
    "waiters",       // waiting requests: dropped, dead ones purged and swept, walked
    "permits",       // grants, purge, slots, room, hand-over
    "held",          // release and extend of a held grant; a held set's call
    "wait_registry", // a namespace's wait-for registry
];

/// The Redis function library's operations, one per `lua/<name>.lua` (the
/// shared steps are in `lua/shared/`): writes `operations.rs`, which
/// `src/scripts.rs` includes: the list of operations (name, code,
/// read only) and the `Scripts` struct with one field per operation. A
/// file whose header has the line `-- flags: no-writes` only reads (Redis
/// runs it even while it refuses writes). Adding an operation is adding
/// its file (and its typed twin in `src/ops/`).
fn operations(out_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let lua = Path::new(&std::env::var("CARGO_MANIFEST_DIR")?).join("../../lua");
    println!("cargo:rerun-if-changed={}", lua.display());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&lua)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(stem) = name.strip_suffix(".lua") {
            let valid = stem.starts_with(|c: char| c.is_ascii_lowercase())
                && stem
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !valid {
                return Err(format!("lua/{name}: an operation's name is [a-z][a-z0-9_]*").into());
            }
            let code = std::fs::read_to_string(&path)?;
            let read_only = code
                .lines()
                .take_while(|line| line.starts_with("--"))
                .any(|line| line.starts_with("-- flags: no-writes"));
            names.push((stem.to_owned(), read_only));
        }
    }
    names.sort();
    let mut list = String::new();
    let mut fields = String::new();
    let mut inits = String::new();
    for (name, read_only) in &names {
        list.push_str(&format!(
            "    (\"{name}\", include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/../../lua/{name}.lua\")), {read_only}),\n"
        ));
        fields.push_str(&format!(
            "    /// `lua/{name}.lua`\n    pub {name}: LockScript,\n"
        ));
        inits.push_str(&format!("            {name}: script(\"{name}\"),\n"));
    }
    let mut shared = String::new();
    for name in SHARED {
        shared.push_str(&format!(
            "    (\"{name}\", include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/../../lua/shared/{name}.lua\"))),\n"
        ));
    }
    let code = format!(
        "// Written by build.rs from the files in lua/.\n\n\
         /// The shared steps' files (`lua/shared/<name>.lua`), in the order\n\
         /// the library joins them: (name, code).\n\
         const SHARED: &[(&str, &str)] = &[\n{shared}];\n\n\
         /// Every operation: its name, its code, and whether it only reads.\n\
         const OPERATIONS: &[(&str, &str, bool)] = &[\n{list}];\n\n\
         /// The library's functions, one per operation.\n\
         pub struct Scripts {{\n\
         \x20   /// `tumbler_<hash>`, the name Redis lists the library under.\n\
         \x20   pub library_name: String,\n{fields}}}\n\n\
         impl Scripts {{\n\
         \x20   /// Each operation's function, as `script` names it.\n\
         \x20   fn with_functions(library_name: String, script: impl Fn(&str) -> LockScript) -> Self {{\n\
         \x20       Scripts {{\n{inits}            library_name,\n        }}\n    }}\n}}\n"
    );
    std::fs::write(out_dir.join("operations.rs"), code)?;
    Ok(())
}

/// Checks that `lua/shared/` holds exactly the files `SHARED` lists, so a
/// new shared file is given its place in the order (and none is left out).
fn shared_files() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR")?).join("../../lua/shared");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            found.push(name.to_owned());
        }
    }
    found.sort();
    let mut listed: Vec<String> = SHARED.iter().map(|name| format!("{name}.lua")).collect();
    listed.sort();
    if found != listed {
        return Err(format!(
            "lua/shared/ holds {found:?}, and build.rs's SHARED lists {listed:?}: give each shared file its place in SHARED"
        )
        .into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    shared_files()?;
    operations(&PathBuf::from(std::env::var("OUT_DIR")?))
}
