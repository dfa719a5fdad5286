//! Writes the Redis function list and the `Scripts` struct from the
//! repository's `lua/` folder (the library's code stays there, beside the
//! other crates, as the protocol's source).

use std::path::{Path, PathBuf};

/// The Redis function library's operations, one per `lua/<name>.lua` but
/// `common.lua` (the shared steps): writes `operations.rs`, which
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
        if let Some(stem) = name.strip_suffix(".lua")
            && stem != "common"
        {
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
    let code = format!(
        "// Written by build.rs from the files in lua/.\n\n\
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    operations(&PathBuf::from(std::env::var("OUT_DIR")?))
}
