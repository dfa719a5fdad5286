//! The Rust client's README snippets can be pasted: each ```rust block of
//! clients/rust/README.md imports what it names. The rule, per block (its
//! `//` comments left out): every name the crate exports at its root
//! (`pub use` in clients/rust/src/lib.rs, but `Result`, which the prelude
//! has) and `Duration`, written as a word and not as the end of a path
//! (`tumbler_client::Mode`), is imported by a `use` line of that block. A
//! block that uses `Mode` with no `use tumbler_client::Mode` fails here as
//! it fails with E0433 when pasted (issue 54).

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The names the crate exports at its root, from lib.rs's `pub use` lines.
fn exported(lib: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let list = match (rest.find('{'), rest.rfind('}')) {
            (Some(open), Some(close)) => rest[open + 1..close].to_owned(),
            _ => rest.rsplit("::").next().unwrap().to_owned(),
        };
        for item in list.split(',') {
            let name = item.rsplit(" as ").next().unwrap().trim();
            if name.starts_with(|c: char| c.is_ascii_uppercase()) && name != "Result" {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The bodies of the ```rust blocks of a Markdown text, with where each
/// starts.
fn rust_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut open {
            None if trimmed.starts_with("```rust") => open = Some((number + 1, String::new())),
            None => {}
            Some(_) if trimmed.starts_with("```") => blocks.push(open.take().unwrap()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    blocks
}

/// The identifier-like words of a line, with their byte offsets.
fn words(line: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
        match (c.is_alphanumeric() || c == '_', start) {
            (true, None) => start = Some(i),
            (false, Some(from)) => {
                found.push((from, &line[from..i]));
                start = None;
            }
            _ => {}
        }
    }
    found
}

/// What a block names without importing it.
fn missing_imports(block: &str, names: &BTreeSet<String>) -> Vec<String> {
    let code: Vec<&str> = block
        .lines()
        .map(|line| line.split("//").next().unwrap())
        .collect();
    let mut imported = BTreeSet::new();
    for line in code.iter().filter(|l| l.trim_start().starts_with("use ")) {
        for word in line.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            imported.insert(word.to_owned());
        }
    }
    let mut missing = BTreeSet::new();
    for line in code.iter().filter(|l| !l.trim_start().starts_with("use ")) {
        for (start, word) in words(line) {
            let qualified = line[..start].ends_with("::");
            if names.contains(word) && !qualified && !imported.contains(word) {
                missing.insert(word.to_owned());
            }
        }
    }
    missing.into_iter().collect()
}

#[test]
fn every_rust_snippet_of_the_clients_readme_imports_what_it_names() {
    let root = Path::new(ROOT).join("clients/rust");
    let mut names = exported(&std::fs::read_to_string(root.join("src/lib.rs")).unwrap());
    for name in ["Client", "Error", "Mode", "Lock"] {
        assert!(
            names.contains(name),
            "{name} is not found exported: {names:?}"
        );
    }
    names.insert("Duration".to_owned());
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = rust_blocks(&readme);
    assert!(blocks.len() >= 4, "{blocks:?}");
    let mut wrong = Vec::new();
    for (line, block) in &blocks {
        let missing = missing_imports(block, &names);
        if !missing.is_empty() {
            wrong.push(format!(
                "clients/rust/README.md:{line}: uses {} without a `use`",
                missing.join(", ")
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_import_rule_is_not_vacuous() {
    let names: BTreeSet<String> = ["Mode", "Duration", "Client"].map(String::from).into();
    let pasted = "// a connected Client\nlet w = client.lock(\"x\").wait(Duration::from_secs(5));\nassert_eq!(w.mode(), Some(Mode::Read));\n";
    assert_eq!(missing_imports(pasted, &names), ["Duration", "Mode"]);
    let fixed =
        format!("use std::time::Duration;\nuse tumbler_client::{{Client, Mode}};\n{pasted}");
    assert!(missing_imports(&fixed, &names).is_empty());
    let qualified = "let m = tumbler_client::Mode::Read;\n";
    assert!(missing_imports(qualified, &names).is_empty());
    let lib = "pub use lock::{Lock, LockRequest, Mode, new_holder};\npub use error::{Error, Result};\npub use tumbler_proto as proto;\npub use x::Single;\n";
    let found: Vec<String> = exported(lib).into_iter().collect();
    assert_eq!(found, ["Error", "Lock", "LockRequest", "Mode", "Single"]);
}
