//! The layers ARCHITECTURE.md draws, kept by reading the sources where
//! crates cannot keep them: proto → adapters (api, connect, dashboard) →
//! service → engine → store. The engine, the store and the handlers
//! (`crates/tumbler-service`: the service and the gRPC adapter) are
//! crates of their own, so none can name what is above it, and the
//! handlers cannot name the engine, the store or Redis: they see the
//! engine's face, `tumbler-face` (`crates.rs` checks what each depends
//! on); the rules below are for what shares a crate.
//! Each names what a layer may not reach; a path a file names
//! (`tumbler_store::…`, `use redis::…`) in its code, not its comments,
//! breaks it.

use std::path::{Path, PathBuf};

/// The service's own files in the handlers' crate (what every transport
/// shares), beside the gRPC adapter (`api/`), access and metrics.
const SERVICE: &[&str] = &[
    "crates/tumbler-service/src/errors.rs",
    "crates/tumbler-service/src/replies.rs",
    "crates/tumbler-service/src/report.rs",
    "crates/tumbler-service/src/requests.rs",
    "crates/tumbler-service/src/validate.rs",
    "crates/tumbler-service/src/validate",
    "crates/tumbler-service/src/watch.rs",
];

/// (files or folders, from the repository's root; what they may not
/// name; why)
const RULES: &[(&[&str], &[&str], &str)] = &[
    (
        SERVICE,
        &["crate::api"],
        "the service serves every transport alike; the gRPC adapter is one of them",
    ),
    (
        &["src/dashboard"],
        &[
            "tumbler_store::",
            "redis::",
            "crate::api",
            "tumbler_service::api",
            "crate::connect",
        ],
        "an adapter reaches Redis only through the engine, and imports no other adapter",
    ),
    (
        &["src/connect"],
        &[
            "tumbler_store::",
            "tumbler_engine",
            "crate::api",
            "tumbler_service::api",
            "crate::dashboard",
            "crate::auth",
            "tumbler_service::auth",
            "redis::",
        ],
        "Connect reaches the lock service only as a gRPC call, through the same stack",
    ),
    (
        &["src/config.rs", "src/config"],
        &["crate::api", "tumbler_service::api", "crate::connect"],
        "flags are checked by the service's rules, not an adapter's",
    ),
    (
        &["crates/tumbler-service/src/observe"],
        &["crate::engine", "tumbler_engine"],
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
    line.match_indices(name)
        .any(|(at, _)| starts_a_path(line, at))
}

/// True when what stands at `at` in `line` is not the tail of a longer
/// identifier.
fn starts_a_path(line: &str, at: usize) -> bool {
    !(line[..at].chars().next_back()).is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The code lines of every source file of a layer (files and folders
/// from the repository's root): (the file, from the root; the line's
/// number; the line).
fn layer_lines(root: &Path, layer: &[&str]) -> Vec<(String, usize, String)> {
    let mut files = Vec::new();
    for part in layer {
        let before = files.len();
        sources(&root.join(part), &mut files);
        assert!(files.len() > before, "no sources at {part}");
    }
    let mut lines = Vec::new();
    for file in files {
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (n, line) in code_lines(&file) {
            lines.push((name.clone(), n, line));
        }
    }
    lines
}

#[test]
fn each_layer_names_only_the_layers_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    for (layer, forbidden, why) in RULES {
        for (file, n, line) in layer_lines(root, layer) {
            for name in forbidden.iter().filter(|name| names(&line, name)) {
                broken.push(format!("{file}:{n}: names {name} ({why})"));
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

/// The paths in the first column of the tables of ARCHITECTURE.md's
/// "Codemap" section: `` `src/engine/keys.rs` ``, `` `src/api/validate/` ``,
/// several per row.
fn codemap_paths(text: &str) -> Vec<String> {
    let section = text
        .split("\n## Codemap")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Codemap section");
    let mut paths = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let first = line[1..].split(" | ").next().unwrap_or("");
        paths.extend(
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| p.contains('/') || p.contains('.'))
                .map(str::to_owned),
        );
    }
    paths
}

#[test]
fn the_codemap_matches_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let paths = codemap_paths(&text);
    // Every path it names exists (a `*` stands for any run of characters).
    let gone: Vec<&String> = (paths.iter())
        .filter(|p| !p.contains('*') && !p.contains('<') && !root.join(p).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "the codemap names paths that do not exist: {gone:?}"
    );
    // Every source file of the server and of the workspace's crates is
    // named, itself or by a folder row (`crates/tumbler-cli/`).
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("crates"), &mut files);
    let unnamed: Vec<String> = (files.iter())
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .filter(|f| {
            !paths
                .iter()
                .any(|p| p == f || (p.ends_with('/') && f.starts_with(p.as_str())))
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "source files missing from ARCHITECTURE.md's codemap: {unnamed:?}"
    );
}
