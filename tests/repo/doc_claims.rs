//! What ARCHITECTURE.md and SAFETY.md (with docs/safety/) cite exists: every
//! path in backticks (`src/api/convert.rs`, `api/convert.rs`, `keys.rs`,
//! `lua/session_*.lua`) names a file or folder of the repository; every
//! name in backticks (`hand_over`, `Lock::room`, a test's name) is a word
//! of the sources, and of the cited file when it stands beside one
//! (`` `settle` in `lua/shared/lock.lua` ``, `` `lua/shared/lock.lua`'s `settle` ``);
//! and every Lua step a document numbers (`` `acquire.lua` step 4 ``,
//! `` `release.lua` 2–4 (…) ``) is a step of that file (`-- 4.`).
//! ARCHITECTURE.md stays under 350 lines, each codemap section with its
//! invariant lines.
//!
//! The reading is plain: backticked spans of the prose (fenced blocks
//! left out), a span with a space or a placeholder (`<name>`) is no claim.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Folders never read: builds, installed packages, generated code.
const SKIPPED: &[&str] = &[
    "target",
    "node_modules",
    ".git",
    "gen",
    "corpus",
    "artifacts",
    "coverage",
    "logs",
];

/// The files whose words are the names a document may cite.
const SOURCE_EXTENSIONS: &[&str] = &[
    "rs", "lua", "proto", "sh", "toml", "yaml", "yml", "mjs", "js", "html", "py", "go", "rb", "pm",
    "css",
];

/// What a path claim ends with when it names a file.
const FILE_EXTENSIONS: &[&str] = &[
    ".rs", ".lua", ".md", ".toml", ".sh", ".proto", ".yaml", ".mjs", ".html", ".js", ".css",
    ".json",
];

/// The repository's top folders, which make a span a path even without an
/// extension (`src/dashboard/templates/`).
const TOP: &[&str] = &[
    "src/",
    "crates/",
    "lua/",
    "tests/",
    "benches/",
    "bench/",
    "docs/",
    "clients/",
    "helm/",
    "proto/",
    "fuzz/",
    "scripts/",
    "dashboard-tests/",
    ".ci/",
];

/// Cited on purpose though not in the repository: the design notes the
/// project grew from, and chrony's setting that steps the clock.
const OUTSIDE: &[&str] = &["DESIGN.md", "makestep"];

/// The documents whose claims are checked.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut docs = vec![root.join("ARCHITECTURE.md"), root.join("SAFETY.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs/safety")) {
        let mut more: Vec<PathBuf> = (entries.map(|e| e.unwrap().path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        more.sort();
        docs.extend(more);
    }
    docs
}

/// Every file and folder of the repository, as paths from its root.
fn tree(dir: &Path, root: &Path, files: &mut Vec<String>, dirs: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if path.is_dir() {
            if !SKIPPED.contains(&name.as_str()) {
                dirs.push(relative);
                tree(&path, root, files, dirs);
            }
        } else {
            files.push(relative);
        }
    }
}

/// The files git tracks or would track (untracked ones it does not
/// ignore), so generated code and installed packages never count; `None`
/// outside a git checkout.
fn git_files(root: &Path) -> Option<Vec<String>> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .ok()?;
    let listed = String::from_utf8(out.stdout).ok()?;
    let files: Vec<String> = (listed.lines())
        .filter(|f| root.join(f).is_file())
        .map(str::to_owned)
        .collect();
    (out.status.success() && !files.is_empty()).then_some(files)
}

/// The repository as the claims are checked against it.
struct Repo {
    files: Vec<String>,
    dirs: Vec<String>,
    /// Every identifier-shaped word of the sources.
    words: BTreeSet<String>,
    /// Each source file's words, by path.
    file_words: BTreeMap<String, BTreeSet<String>>,
    /// Each file's text, by path (the sources and Lua, for steps).
    texts: BTreeMap<String, String>,
}

fn words_of(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
        .map(str::to_owned)
        .collect()
}

impl Repo {
    fn read() -> Repo {
        let root = Path::new(ROOT);
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        match git_files(root) {
            Some(listed) => {
                let mut parents = BTreeSet::new();
                for file in &listed {
                    let mut dir = Path::new(file).parent();
                    while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
                        parents.insert(d.to_string_lossy().into_owned());
                        dir = d.parent();
                    }
                }
                files = listed;
                dirs = parents.into_iter().collect();
            }
            None => tree(root, root, &mut files, &mut dirs),
        }
        let mut words = BTreeSet::new();
        let mut file_words = BTreeMap::new();
        let mut texts = BTreeMap::new();
        for file in &files {
            let source = Path::new(file)
                .extension()
                .is_some_and(|e| SOURCE_EXTENSIONS.contains(&e.to_string_lossy().as_ref()));
            // This file names what does not exist, to see it refused.
            if !source || file.starts_with("docs/") || file == "tests/repo/doc_claims.rs" {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(root.join(file)) else {
                continue;
            };
            let found = words_of(&text);
            words.extend(found.iter().cloned());
            file_words.insert(file.clone(), found);
            texts.insert(file.clone(), text);
        }
        Repo {
            files,
            dirs,
            words,
            file_words,
            texts,
        }
    }

    /// The files a path claim names: the path from the root, or any file
    /// whose path ends with it (`api/convert.rs`, `keys.rs`); `*` matches
    /// within one name.
    fn matches(&self, claim: &str) -> Vec<&String> {
        let claim = claim.trim_end_matches('/');
        let fits = |path: &String| {
            glob(claim, path) || (path.len() > claim.len() && glob(&format!("*/{claim}"), path))
        };
        let mut found: Vec<&String> = self.files.iter().filter(|f| fits(f)).collect();
        found.extend(self.dirs.iter().filter(|d| fits(d)));
        found
    }
}

/// `pattern` matches `text`, `*` standing for any run of characters but
/// `/` (a leading `*/` for any folders).
fn glob(pattern: &str, text: &str) -> bool {
    if let Some(rest) = pattern.strip_prefix("*/") {
        return text == rest || text.ends_with(&format!("/{rest}")) || glob_name(rest, text);
    }
    glob_name(pattern, text)
}

fn glob_name(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len()).any(|i| {
                rest.is_char_boundary(i) && !rest[..i].contains('/') && glob_name(tail, &rest[i..])
            })
        }
    }
}

/// A backticked span of the prose: its text, its line, and the prose
/// around it on that line.
struct Span<'a> {
    text: &'a str,
    line: usize,
    /// The line's text, and where the span's backticks stand in it.
    line_text: &'a str,
    open: usize,
    close: usize,
}

impl Span<'_> {
    /// The prose after the span, to the end of its line.
    fn after(&self) -> &str {
        &self.line_text[self.close + 1..]
    }

    /// The prose between this span and `next`, when both are on one line.
    fn gap<'b>(&'b self, next: &Span<'_>) -> Option<&'b str> {
        (next.line == self.line).then(|| &self.line_text[self.close + 1..next.open])
    }
}

fn spans(doc: &str) -> Vec<Span<'_>> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (n, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = 0;
        while let Some(open) = line[rest..].find('`').map(|i| rest + i) {
            // A double-backtick span (`` a `b` ``) is an example: skipped.
            if line[open..].starts_with("``") {
                match line[open + 2..].find("``") {
                    Some(close) => rest = open + 2 + close + 2,
                    None => break,
                }
                continue;
            }
            let Some(close) = line[open + 1..].find('`').map(|i| open + 1 + i) else {
                break;
            };
            found.push(Span {
                text: &line[open + 1..close],
                line: n + 1,
                line_text: line,
                open,
                close,
            });
            rest = close + 1;
        }
    }
    found
}

/// What kind of claim a span makes.
enum Claim<'a> {
    Path(&'a str),
    Name(&'a str),
    None,
}

fn claim(span: &str) -> Claim<'_> {
    if span.is_empty()
        || span.contains([' ', '<', '>', '@'])
        || span.contains("://")
        || span.starts_with(['/', '-', '.', '$'])
    {
        return Claim::None;
    }
    if FILE_EXTENSIONS.iter().any(|e| span.ends_with(e)) || TOP.iter().any(|t| span.starts_with(t))
    {
        return Claim::Path(span);
    }
    let name = span.strip_suffix("()").unwrap_or(span);
    let ident = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if name.split("::").all(ident) {
        Claim::Name(name)
    } else {
        Claim::None
    }
}

/// The step numbers cited right after a Lua file's span: `step 4`,
/// `steps 3/7/8`, `: step 3`, `1 (…), 3 (…), 3b (…), 10–11 (…)`. A range
/// stands for its ends.
fn steps_after(after: &str) -> Vec<String> {
    let mut rest = after.strip_prefix("'s").unwrap_or(after);
    rest = rest.trim_start_matches(':').trim_start();
    for word in ["steps ", "step "] {
        if let Some(r) = rest.strip_prefix(word) {
            rest = r;
        }
    }
    let mut steps = Vec::new();
    loop {
        let number: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || c.is_ascii_lowercase() && *c < 'e')
            .collect();
        if number.is_empty() || !number.starts_with(|c: char| c.is_ascii_digit()) {
            break;
        }
        // A number that runs into a word ("2nd", "1 call") is no step.
        let after_number = &rest[number.len()..];
        if after_number.starts_with(|c: char| c.is_alphanumeric()) {
            break;
        }
        steps.push(number.clone());
        rest = after_number;
        if let Some(r) = rest.strip_prefix('–').or_else(|| rest.strip_prefix('-')) {
            rest = r;
            continue;
        }
        rest = rest.trim_start();
        if rest.starts_with('(') {
            let mut depth = 0;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = rest[end..].trim_start();
        }
        match rest.strip_prefix([',', '/']) {
            Some(r) => rest = r.trim_start(),
            None => match rest.strip_prefix("and ") {
                Some(r) => rest = r,
                None => break,
            },
        }
    }
    steps
}

/// The steps a Lua file numbers: its comment lines `-- 4.`, `-- 3b.`.
fn lua_steps(text: &str) -> BTreeSet<String> {
    (text.lines())
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("-- ")?;
            let (number, _) = rest.split_once(". ")?;
            (number.starts_with(|c: char| c.is_ascii_digit())
                && number.chars().all(|c| c.is_ascii_alphanumeric()))
            .then(|| number.to_owned())
        })
        .collect()
}

/// What is wrong with `doc` (named `name`) against the repository.
fn faults(name: &str, doc: &str, repo: &Repo) -> Vec<String> {
    let mut faults = Vec::new();
    let spans = spans(doc);
    for (i, span) in spans.iter().enumerate() {
        let at = format!("{name}:{}", span.line);
        match claim(span.text) {
            Claim::None => {}
            Claim::Path(path) if OUTSIDE.contains(&path) => {}
            Claim::Path(path) => {
                let found = repo.matches(path);
                if found.is_empty() {
                    faults.push(format!(
                        "{at}: `{path}` is no file or folder of the repository"
                    ));
                    continue;
                }
                let lua: Vec<&&String> = found.iter().filter(|f| f.ends_with(".lua")).collect();
                let steps = steps_after(span.after());
                if !steps.is_empty() && lua.len() == 1 {
                    let known = lua_steps(&repo.texts[lua[0].as_str()]);
                    for step in steps.iter().filter(|s| !known.contains(*s)) {
                        faults.push(format!("{at}: `{path}` has no step {step}"));
                    }
                }
                // `file`'s `name`, `file` `name`: the name is the file's.
                if let Some(next) = spans.get(i + 1)
                    && matches!(span.gap(next), Some("'s " | " "))
                    && let Claim::Name(word) = claim(next.text)
                {
                    check_in_file(&mut faults, &at, word, &found, repo);
                }
            }
            Claim::Name(word) => {
                let unknown: Vec<&str> = (word.split("::"))
                    .filter(|part| !repo.words.contains(*part) && !OUTSIDE.contains(part))
                    .collect();
                if !unknown.is_empty() {
                    faults.push(format!("{at}: `{word}` is no name in the sources"));
                    continue;
                }
                // `name` in `file`: the name is the file's.
                if let Some(next) = spans.get(i + 1)
                    && span.gap(next) == Some(" in ")
                    && let Claim::Path(path) = claim(next.text)
                {
                    check_in_file(&mut faults, &at, word, &repo.matches(path), repo);
                }
            }
        }
    }
    faults
}

fn check_in_file(faults: &mut Vec<String>, at: &str, word: &str, files: &[&String], repo: &Repo) {
    let last = word.rsplit("::").next().unwrap_or(word);
    let sources: Vec<&&String> = files
        .iter()
        .filter(|f| repo.file_words.contains_key(f.as_str()))
        .collect();
    if !sources.is_empty()
        && !sources
            .iter()
            .any(|f| repo.file_words[f.as_str()].contains(last))
    {
        faults.push(format!(
            "{at}: `{word}` is not in {}",
            sources
                .iter()
                .map(|f| f.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

#[test]
fn what_the_architecture_and_safety_documents_cite_exists() {
    let repo = Repo::read();
    assert!(repo.words.contains("hand_over") && repo.words.contains("LockEngine"));
    let mut all = Vec::new();
    let mut spans_seen = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc
            .strip_prefix(ROOT)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        spans_seen += spans(&text).len();
        all.extend(faults(name.trim_start_matches('/'), &text, &repo));
    }
    assert!(spans_seen > 500, "read only {spans_seen} backticked spans");
    assert!(all.is_empty(), "stale claims: {all:#?}");
}

#[test]
fn the_reader_catches_each_kind_of_stale_claim() {
    let repo = Repo::read();
    let doc = "\
`acquire.lua` step 4 returns; `acquire.lua` step 99 does not.
`release.lua` 2–4 (purge, holder), 3 (x) | `store/mod.rs` | `repo/doc_claims.rs`
`lua/session_*.lua` and `lua/nothing_*.lua`; `hand_over` in `lua/shared/permits.lua`
`settle` in `lua/shared/events.lua`; `lua/shared/lock.lua`'s `settle`; `no_such_function_here`
```
`inside/a/fence.rs`
```
`<prefix>:meta`, `--hand-over`, `a b`, `DESIGN.md`
";
    let found = faults("doc", doc, &repo);
    let expected = [
        "doc:1: `acquire.lua` has no step 99",
        "doc:2: `store/mod.rs` is no file or folder of the repository",
        "doc:3: `lua/nothing_*.lua` is no file or folder of the repository",
        "doc:4: `settle` is not in lua/shared/events.lua",
        "doc:4: `no_such_function_here` is no name in the sources",
    ];
    assert_eq!(found, expected);
    assert_eq!(steps_after(" step 2 returns"), ["2"]);
    assert_eq!(steps_after(" steps 3/7/8, `x`"), ["3", "7", "8"]);
    assert_eq!(steps_after(": step 3 also"), ["3"]);
    assert_eq!(
        steps_after(" 1 (answer-by), 3 (purge (x)), 3b (mode), 10–11 (queue) |"),
        ["1", "3", "3b", "10", "11"]
    );
    assert_eq!(steps_after(", one group (purge)"), Vec::<String>::new());
    assert_eq!(steps_after(" (it names: finding 6)"), Vec::<String>::new());
}

#[test]
fn the_architecture_reads_in_one_sitting() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines < 350,
        "ARCHITECTURE.md has {lines} lines: keep it under 350"
    );
    // Each crate's section of the codemap states the rules it keeps.
    let codemap = text
        .split("\n## Codemap")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    for section in codemap.split("\n### ").skip(1) {
        let heading = section.lines().next().unwrap_or_default();
        assert!(
            section.contains("**Invariant:**"),
            "codemap section {heading:?} has no invariant line"
        );
    }
}
