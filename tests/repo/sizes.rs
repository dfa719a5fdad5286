//! Rooms stay small enough to read: a source file (Rust under `src/`,
//! `crates/`, `tests/`, `benches/`, the Lua under `lua/`) over `LIMIT` lines says in
//! its head comment why it is one file, with the words "on purpose".

use std::path::{Path, PathBuf};

/// About 600 lines, with a little slack so a file does not need a reason
/// for the last few lines of a test.
const LIMIT: usize = 620;

fn sources(path: &Path, found: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            sources(&entry.unwrap().path(), found);
        }
    } else if path.extension().is_some_and(|e| e == "rs" || e == "lua") {
        found.push(path.to_owned());
    }
}

/// The head comment: the comment lines the file opens with.
fn head_comment(text: &str) -> String {
    (text.lines())
        .take_while(|line| line.starts_with("//") || line.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Why `text` breaks the rule, if it does.
fn too_long_without_a_reason(text: &str) -> Option<String> {
    let lines = text.lines().count();
    (lines > LIMIT && !head_comment(text).contains("on purpose"))
        .then(|| format!("{lines} lines and no \"on purpose\" in its head comment"))
}

#[test]
fn a_long_file_says_why_it_is_one_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "crates", "tests", "benches", "lua"] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} source files", files.len());
    let broken: Vec<String> = (files.iter())
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            too_long_without_a_reason(&text)
                .map(|why| format!("{}: {why}", path.strip_prefix(root).unwrap().display()))
        })
        .collect();
    assert!(broken.is_empty(), "split these or say why: {broken:#?}");
}

#[test]
fn the_checker_sees_a_long_file_and_its_reason() {
    let body = "fn f() {}\n".repeat(LIMIT);
    let plain = format!("//! A module.\n{body}");
    assert!(too_long_without_a_reason(&plain).is_some());
    let reasoned = format!("//! A module.\n//! One file on purpose: a reason.\n{body}");
    assert_eq!(too_long_without_a_reason(&reasoned), None);
    let lua = format!("-- a library\n-- long on purpose\n{body}");
    assert_eq!(too_long_without_a_reason(&lua), None);
    // A reason further down, outside the head comment, does not count.
    let buried = format!("//! A module.\n{body}// on purpose\n");
    assert!(too_long_without_a_reason(&buried).is_some());
    assert_eq!(too_long_without_a_reason("//! short\nfn f() {}\n"), None);
}
