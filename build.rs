//! Writes the Redis function list and the `Scripts` struct from `lua/`
//! (the generated gRPC code is the `tumbler-proto` crate's, in
//! `crates/tumbler-proto`).
//!
//! Also records the commit the binary is built from (`TUMBLER_COMMIT`:
//! the variable when set, as an image build without `.git` can pass it,
//! else `git rev-parse`, else "unknown") for `tumbler_build_info`.

use std::path::PathBuf;
use std::process::Command;

/// `git <args>`'s output, trimmed; None when git or the repository is
/// missing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn commit() -> String {
    println!("cargo:rerun-if-env-changed=TUMBLER_COMMIT");
    if let Ok(commit) = std::env::var("TUMBLER_COMMIT")
        && !commit.trim().is_empty()
    {
        return commit.trim().to_owned();
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    // Built again when HEAD moves: HEAD itself (a checkout), the branch it
    // names (a commit) and the packed refs. Only files that exist are
    // named: cargo takes a named file that is missing as changed on every
    // build, which would rebuild the crate each time in a clone whose
    // branch ref is packed or whose refs were never packed.
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(branch)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["rev-parse", "--symbolic-full-name", "HEAD"]),
    ) {
        // A packed branch gets a loose file at its next commit: watch the
        // folder it will appear in until it exists.
        let loose = std::path::Path::new(&common).join(&branch);
        match loose.parent() {
            Some(folder) if !loose.exists() => watched.push(folder.display().to_string()),
            _ => watched.push(loose.display().to_string()),
        }
        watched.push(format!("{common}/packed-refs"));
    }
    for file in watched {
        if std::path::Path::new(&file).exists() {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    commit
}

/// The Redis function library's operations, one per `lua/<name>.lua` but
/// `common.lua` (the shared steps): writes `operations.rs`, which
/// `src/engine/scripts.rs` includes: the list of operations (name, code,
/// read only) and the `Scripts` struct with one field per operation. A
/// file whose header has the line `-- flags: no-writes` only reads (Redis
/// runs it even while it refuses writes). Adding an operation is adding
/// its file (and its typed twin in `src/engine/ops/`).
fn operations(out_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=lua");
    let mut names = Vec::new();
    for entry in std::fs::read_dir("lua")? {
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
            "    (\"{name}\", include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/lua/{name}.lua\")), {read_only}),\n"
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
    operations(&PathBuf::from(std::env::var("OUT_DIR")?))?;
    println!("cargo:rustc-env=TUMBLER_COMMIT={}", commit());
    Ok(())
}
