//! The layers ARCHITECTURE.md draws, kept by reading the sources: proto →
//! handlers (api, dashboard) → engine → store. Each rule names what a
//! layer may not reach; a path a file names (`crate::store::…`, `use
//! redis::…`) in its code, not its comments, breaks it.

use std::path::{Path, PathBuf};

/// (files under `src/`, what they may not name, why)
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "store",
        &[
            "crate::engine",
            "crate::api",
            "crate::dashboard",
            "crate::observe",
            "tonic::",
            "axum::",
        ],
        "the store knows connections and commands, not locks or transports",
    ),
    (
        "engine",
        &[
            "crate::api",
            "crate::dashboard",
            "crate::proto",
            "crate::http",
            "tonic::",
            "axum::",
        ],
        "the engine knows no gRPC or web",
    ),
    (
        "api",
        &["crate::store", "redis::"],
        "handlers reach Redis only through the engine",
    ),
    (
        "dashboard",
        &["crate::store", "redis::"],
        "handlers reach Redis only through the engine",
    ),
    (
        "observe",
        &["crate::engine"],
        "observation does not reach back into the engine",
    ),
];

fn sources(path: &Path, found: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            sources(&entry.unwrap().path(), found);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        found.push(path.to_owned());
    }
}

/// The file's code lines: comments (`//`, `///`, `//!`) left out.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    (text.lines().enumerate())
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(n, line)| (n + 1, line.split(" //").next().unwrap_or("").to_owned()))
        .collect()
}

/// True when `line` names the path `name` (not as the tail of a longer
/// identifier: `bb8_redis::` does not name `redis::`).
fn names(line: &str, name: &str) -> bool {
    line.match_indices(name).any(|(at, _)| {
        !(line[..at].chars().next_back()).is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn each_layer_names_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (layer, forbidden, why) in RULES {
        let mut files = Vec::new();
        sources(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "no sources for layer {layer}");
        for file in files {
            for (n, line) in code_lines(&file) {
                for name in forbidden.iter().filter(|name| names(&line, name)) {
                    broken.push(format!(
                        "{}:{n}: names {name} ({why})",
                        file.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_a_forbidden_name() {
    // The rule reader itself: a line naming the store in code is caught,
    // the same name in a comment is not.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "//! uses crate::store in prose\nuse crate::store::Store;\n",
    )
    .unwrap();
    let lines = code_lines(&file);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].0, 2);
    assert!(names(&lines[0].1, "crate::store"));
    assert!(!names("use bb8_redis::Pool;", "redis::"));
    assert!(names("let x: redis::Value;", "redis::"));
}
