//! The documentation can be navigated: every relative link in README.md,
//! docs/ (docs/decisions/ and docs/benchmarks/ too), ARCHITECTURE.md, SAFETY.md, BENCHMARKS.md and the Helm chart's README
//! leads to a file that exists and, with a `#fragment` into Markdown, to a
//! heading of that file. And what it shows runs: every fenced block marked
//! `sh runnable` in README.md and docs/ is run against the built binary
//! (see docs/contributing.md, "Runnable examples in the docs").

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The documents checked.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "SAFETY.md",
        "BENCHMARKS.md",
        "helm/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    let mut docs: Vec<PathBuf> = ["docs", "docs/decisions", "docs/benchmarks"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root.join(dir)).expect("a docs/ directory"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Markdown text outside fenced code blocks, line by line.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|line| {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            (1..=6)
                .contains(&hashes)
                .then(|| line[hashes..].strip_prefix(' '))
                .flatten()
                .map(anchor)
        })
        .collect()
}

/// The targets of `[label](target)` links in prose (inline code skipped).
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        // Drop inline code spans, whose brackets are not links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn the_anchor_rule_matches_githubs() {
    assert_eq!(
        anchor("Security: tokens, namespaces and limits"),
        "security-tokens-namespaces-and-limits"
    );
    assert_eq!(
        anchor("Redis key layout (version 3)"),
        "redis-key-layout-version-3"
    );
    assert_eq!(anchor("`tumbler hold`"), "tumbler-hold");
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                document.clone()
            } else {
                document.parent().unwrap().join(path)
            };
            let name = document.strip_prefix(ROOT).unwrap().display().to_string();
            if !file.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment
                && file.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&file).unwrap()).contains(fragment)
            {
                broken.push(format!("{name}: {target} (no such heading)"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_starts_with_the_two_commands_and_links_every_document() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let first_block = readme.split("```").nth(1).unwrap();
    let commands: Vec<&str> = first_block
        .lines()
        .skip(1)
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands, ["cargo run -- dev", "scripts/test.sh"]);
    // docs/README.md links every document of docs/ and the index of each
    // folder below it (docs/decisions/README.md), which links its own.
    let docs = Path::new(ROOT).join("docs");
    for document in documents() {
        let Ok(inside) = document.strip_prefix(&docs) else {
            continue;
        };
        let (index, name) = match inside.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(_) if inside.ends_with("README.md") => ("README.md".into(), inside),
            Some(folder) => (
                folder.join("README.md"),
                inside.strip_prefix(folder).unwrap(),
            ),
            None if inside == Path::new("README.md") => continue,
            None => ("README.md".into(), inside),
        };
        let text = std::fs::read_to_string(docs.join(&index)).unwrap();
        let name = name.display().to_string();
        assert!(
            text.contains(&format!("]({name}")),
            "docs/{} does not link {name}",
            index.display()
        );
    }
}

/// A fenced block marked runnable.
#[derive(Debug)]
struct Runnable {
    /// `docs/cli.md:123`: where the block starts.
    place: String,
    /// `sh runnable server`: it needs a private server.
    server: bool,
    script: String,
}

/// The runnable blocks of one Markdown text (`place` names the file).
/// Fences follow CommonMark: a block opened by N backticks closes only at
/// a line of at least N backticks, so an example of the marker inside a
/// longer fence is not itself run. Unknown words after `runnable` are an
/// error (a typo would otherwise skip the block silently).
fn runnable_blocks(place: &str, text: &str) -> Result<Vec<Runnable>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, Option<bool>, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|c| *c == '`').count();
        match &mut open {
            None if ticks >= 3 => {
                let info: Vec<&str> = trimmed[ticks..].split_whitespace().collect();
                let kind = match info.as_slice() {
                    ["sh", "runnable"] => Some(false),
                    ["sh", "runnable", "server"] => Some(true),
                    [_, "runnable", ..] | ["runnable", ..] => {
                        return Err(format!(
                            "{place}:{}: unknown runnable marker {:?}: use `sh runnable` or `sh runnable server`",
                            number + 1,
                            info.join(" ")
                        ));
                    }
                    _ => None,
                };
                open = Some((ticks, number + 1, kind, String::new()));
            }
            None => {}
            Some((fence, start, kind, script)) => {
                if ticks >= *fence && trimmed[ticks..].trim().is_empty() {
                    if let Some(server) = *kind {
                        blocks.push(Runnable {
                            place: format!("{place}:{start}"),
                            server,
                            script: std::mem::take(script),
                        });
                    }
                    open = None;
                } else {
                    script.push_str(line);
                    script.push('\n');
                }
            }
        }
    }
    if let Some((_, start, _, _)) = open {
        return Err(format!("{place}:{start}: a fenced block is never closed"));
    }
    Ok(blocks)
}

/// Every runnable block of README.md and docs/.
fn all_runnable_blocks() -> Vec<Runnable> {
    let root = Path::new(ROOT);
    let mut blocks = Vec::new();
    for document in documents() {
        let name = document.strip_prefix(root).unwrap().display().to_string();
        if name != "README.md" && !name.starts_with("docs/") {
            continue;
        }
        let text = std::fs::read_to_string(&document).unwrap();
        blocks.extend(runnable_blocks(&name, &text).unwrap_or_else(|e| panic!("{e}")));
    }
    blocks
}

/// How a block ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Passed,
    Failed { code: Option<i32>, output: String },
    TimedOut { output: String },
}

/// Runs `script` with bash (`-euo pipefail`) in a fresh temporary
/// directory that is also `$HOME`, the built tumbler first on `PATH`, no
/// `TUMBLER_*` variables but `env`, in a process group of its own that is
/// killed after `limit`.
fn run_block(script: &str, env: &[(&str, &str)], limit: Duration) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_tumbler")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_file = dir.path().join(".block-output");
    let out = std::fs::File::create(&out_file).unwrap();
    let mut command = Command::new("bash");
    command
        .args(["--noprofile", "--norc", "-euo", "pipefail", "-c", script])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    for (name, _) in std::env::vars() {
        if name.starts_with("TUMBLER_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("bash must be installed");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever the block left running in its group goes with it.
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    match status {
        None => Outcome::TimedOut { output },
        Some(status) if status.success() => Outcome::Passed,
        Some(status) => Outcome::Failed {
            code: status.code(),
            output,
        },
    }
}

/// The bound on one block.
const BLOCK_LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runnable_block_runs() {
    let blocks = all_runnable_blocks();
    assert!(
        blocks.iter().any(|b| !b.server) && blocks.iter().any(|b| b.server),
        "no runnable blocks (offline and with a server) found: {blocks:?}"
    );
    let mut failed = Vec::new();
    for block in &blocks {
        // A server of the block's own: nothing one block does can change
        // what the next one sees.
        let (redis, server) = if block.server {
            let redis = common::start_redis();
            let server = common::TumblerProcess::start(&redis.url(), &[]).await;
            (Some(redis), Some(server))
        } else {
            (None, None)
        };
        let addr = server.as_ref().map(|s| s.endpoint.clone());
        let script = block.script.clone();
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> = addr
                .as_deref()
                .map(|addr| vec![("TUMBLER_ADDR", addr)])
                .unwrap_or_default();
            run_block(&script, &env, BLOCK_LIMIT)
        })
        .await
        .unwrap();
        println!(
            "{} ({}): {:?} in {:.1} s",
            block.place,
            if block.server {
                "with a server"
            } else {
                "offline"
            },
            match &outcome {
                Outcome::Passed => "passed",
                Outcome::Failed { .. } => "FAILED",
                Outcome::TimedOut { .. } => "TIMED OUT",
            },
            started.elapsed().as_secs_f64()
        );
        if outcome != Outcome::Passed {
            failed.push(format!(
                "{}:\n{}\n=> {outcome:?}",
                block.place, block.script
            ));
        }
        drop(server);
        drop(redis);
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn the_block_runner_reports_failures_and_timeouts() {
    // Not vacuous: a failing command fails the block (even mid-pipeline
    // or before a later command that succeeds), a block that runs on is
    // stopped at its limit, and the built tumbler is the one on PATH.
    assert_eq!(
        run_block("tumbler --version >/dev/null\n", &[], BLOCK_LIMIT),
        Outcome::Passed
    );
    for script in ["false\ntrue\n", "false | cat\n", "tumbler acquire\n"] {
        assert!(
            matches!(run_block(script, &[], BLOCK_LIMIT), Outcome::Failed { .. }),
            "{script:?} should fail"
        );
    }
    let started = Instant::now();
    let outcome = run_block("sleep 30 &\nsleep 30\n", &[], Duration::from_millis(300));
    assert!(matches!(outcome, Outcome::TimedOut { .. }), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Nothing from a developer's environment leaks in.
    assert_eq!(
        run_block(
            "test -z \"${TUMBLER_ADDR:-}\"\ntest \"$HOME\" = \"$PWD\"\n",
            &[],
            BLOCK_LIMIT
        ),
        Outcome::Passed
    );
}

#[test]
fn runnable_markers_are_parsed_as_commonmark_fences() {
    let text = "```sh runnable\necho one\n```\n\n````markdown\n```sh runnable\nnot run\n```\n````\n\n```sh runnable server\ntumbler health\n```\n```sh\nnot marked\n```\n";
    let blocks = runnable_blocks("x.md", text).unwrap();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(
        (blocks[0].place.as_str(), blocks[0].server),
        ("x.md:1", false)
    );
    assert_eq!(blocks[0].script, "echo one\n");
    assert_eq!(
        (blocks[1].place.as_str(), blocks[1].server),
        ("x.md:11", true)
    );
    let typo = runnable_blocks("y.md", "```sh runnable sever\nx\n```\n").unwrap_err();
    assert!(
        typo.contains("y.md:1") && typo.contains("unknown runnable marker"),
        "{typo}"
    );
    assert!(runnable_blocks("z.md", "```sh runnable\nx\n").is_err());
}

/// The words of `text` (letters and digits), for "is X named" checks.
fn words_of(text: &str) -> BTreeSet<&str> {
    text.split(|c: char| !c.is_alphanumeric()).collect()
}

#[test]
fn the_connect_method_list_names_every_routed_procedure() {
    // Every procedure of the route table (`"Acquire" => Unary(…)`) is
    // named in docs/api.md's sentence listing the Connect methods.
    let routes = std::fs::read_to_string(Path::new(ROOT).join("src/connect/routes.rs")).unwrap();
    let routed: Vec<&str> = routes
        .lines()
        .filter_map(|line| {
            let (name, kind) = line.trim().split_once(" => ")?;
            (kind.starts_with("Unary(") || kind.starts_with("ServerStreaming("))
                .then(|| name.trim_matches('"'))
        })
        .collect();
    assert!(
        routed.contains(&"Acquire") && routed.contains(&"Observe"),
        "{routed:?}"
    );
    let api = std::fs::read_to_string(Path::new(ROOT).join("docs/api.md")).unwrap();
    let from = api
        .find("A Connect call is")
        .expect("docs/api.md lists the Connect methods");
    let list = &api[from..from + api[from..].find("**Session stays").unwrap()];
    let named = words_of(list);
    let missing: Vec<&&str> = routed.iter().filter(|m| !named.contains(**m)).collect();
    assert!(
        missing.is_empty(),
        "docs/api.md's Connect methods leave out {missing:?}"
    );
}

#[test]
fn the_document_indexes_name_every_clients_language() {
    // Each language under clients/ with a README of its own is named on
    // the Clients line of README.md and of docs/README.md.
    let languages = [
        ("python", "Python"),
        ("node", "Node"),
        ("go", "Go"),
        ("ruby", "Ruby"),
        ("perl", "Perl"),
        ("rust", "Rust"),
        ("java", "Java"),
    ];
    let root = Path::new(ROOT);
    for dir in std::fs::read_dir(root.join("clients")).unwrap() {
        let dir = dir.unwrap().file_name().into_string().unwrap();
        let known = languages.iter().any(|(d, _)| *d == dir);
        let client = root.join("clients").join(&dir).join("README.md").exists();
        assert!(
            known
                || !client
                || [
                    "connect-node",
                    "ruby-sidekiq",
                    "python-celery",
                    "conformance"
                ]
                .contains(&dir.as_str()),
            "clients/{dir}: a new client: name its language here and in the indexes"
        );
    }
    for (index, link) in [
        ("README.md", "[Clients](docs/clients.md)"),
        ("docs/README.md", "[Clients](clients.md)"),
    ] {
        let text = std::fs::read_to_string(root.join(index)).unwrap();
        let line = (text.lines())
            .find(|l| l.contains(link))
            .unwrap_or_else(|| panic!("{index} has no Clients line"));
        let named = words_of(line);
        for (_, language) in languages {
            assert!(
                named.contains(language),
                "{index}: {line} leaves out {language}"
            );
        }
        for job_system in ["Sidekiq", "Celery"] {
            assert!(
                line.contains(job_system),
                "{index}: {line} leaves out {job_system}"
            );
        }
    }
}
