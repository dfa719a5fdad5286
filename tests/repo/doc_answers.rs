//! The answers the documentation shows are the answers tumbler gives: each
//! JSON example output in README.md and docs/*.md is compared, by field
//! names, with the real answer of the same calls on a real server.
//!
//! **What counts as an example.** In a fenced block, a *call* is a command
//! that names an RPC: `…tumbler.v1.LockService/<Method>` (grpcurl, curl),
//! `$api/<Method>` (curl, with `api=…/tumbler.v1.LockService`), or
//! `tumbler <subcommand> … --json` / `-o json` (the CLI). In `console`
//! blocks a call is a `$ ` line (with its `\` continuation lines) and its
//! *answer* is the JSON among the output lines up to the next `$ ` line
//! (written as they are or as `# ` comments);
//! in other blocks a call is a command line and its answer is the comment
//! lines right after it that start with `# {` (continued by `#  ` lines).
//! Blocks whose calls show no answer are not replayed.
//!
//! **The real answer.** Each block with an answer gets a fresh server (its
//! own redis-server on free loopback ports), and its calls are replayed in
//! order up to its last answered one: grpcurl and curl calls as Connect
//! JSON (`POST /tumbler.v1.LockService/<Method>` with the call's `-d`
//! body), CLI calls by running the built `tumbler` with the line as
//! written. Server-streaming calls (Watch, Observe) are not replayed:
//! their events come from other callers, so nothing in the block makes
//! them.
//!
//! **The rule**, on field paths (`grant.slots`, `holders[].remainingMs`;
//! array elements share their path; the content of a `metadata` map is
//! user data, not field names):
//! 1. every path the example shows is a path of the real answer;
//! 2. an example object written without `…` (or `...`) is complete: it
//!    shows every field its real object has;
//! 3. an object written with `…` may leave fields out, but never those of
//!    [`NEVER_ELIDED`] its real object has (the permits and slots that
//!    tell a weighted grant from a plain one: issue 54).

use crate::common;

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Fields an elided example object must show all the same, when its real
/// object has them.
const NEVER_ELIDED: &[&str] = &["permits", "slots", "permitsInUse"];

/// The key an ellipsis becomes while an example is parsed.
const ELIDED: &str = "\u{2026}";

/// How a call reaches the server.
#[derive(Debug, Clone, PartialEq)]
enum Via {
    /// Connect JSON: the method and the body.
    Connect { method: String, body: String },
    /// The CLI, the command line as written.
    Cli(String),
}

/// One call of a block, and the answer the block shows for it.
#[derive(Debug)]
struct Call {
    /// `docs/api.md:123`: the call's line.
    place: String,
    via: Via,
    /// The answer's JSON text, as shown (ellipses included).
    answer: Option<String>,
}

/// The documents searched: README.md and docs/*.md (not the decisions,
/// which record what was true when they were taken).
fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    files
}

/// The single-quoted argument after `-d` (or `--data`) in a command.
fn data_arg(command: &str) -> Option<String> {
    let at = [" -d '", " --data '"]
        .iter()
        .find_map(|flag| command.find(flag).map(|i| i + flag.len()))?;
    let rest = &command[at..];
    Some(rest[..rest.find('\'')?].to_owned())
}

/// The RPC a command line calls, if it names one.
fn call_of(command: &str) -> Option<Via> {
    let command = command.trim();
    for marker in ["tumbler.v1.LockService/", "$api/"] {
        if let Some(at) = command.find(marker) {
            let method: String = command[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if method.is_empty() {
                continue;
            }
            let body = data_arg(command).unwrap_or_else(|| "{}".to_owned());
            return Some(Via::Connect { method, body });
        }
    }
    let words: Vec<&str> = (command.split_whitespace())
        .map(|w| w.trim_end_matches(';'))
        .collect();
    if words.first() == Some(&"tumbler")
        && (words.contains(&"--json") || words.windows(2).any(|w| w == ["-o", "json"]))
    {
        return Some(Via::Cli(command.to_owned()));
    }
    None
}

/// The calls (and shown answers) of one Markdown text.
fn calls_in(name: &str, text: &str) -> Vec<Vec<Call>> {
    let mut blocks = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let ticks = trimmed.chars().take_while(|c| *c == '`').count();
        if ticks < 3 {
            i += 1;
            continue;
        }
        let console = trimmed[ticks..].trim().starts_with("console");
        let start = i + 1;
        let mut end = start;
        while end < lines.len() {
            let t = lines[end].trim_start();
            let n = t.chars().take_while(|c| *c == '`').count();
            if n >= ticks && t[n..].trim().is_empty() {
                break;
            }
            end += 1;
        }
        let body: Vec<&str> = lines[start..end.min(lines.len())].to_vec();
        blocks.push(block_calls(name, start, &body, console));
        i = end + 1;
    }
    blocks.retain(|calls| !calls.is_empty());
    blocks
}

/// The calls of one fenced block whose first line is line `first` (0-based).
fn block_calls(name: &str, first: usize, body: &[&str], console: bool) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    let mut j = 0;
    while j < body.len() {
        let line = body[j];
        let is_command = if console {
            line.starts_with("$ ")
        } else {
            !line.trim_start().starts_with('#') && !line.trim().is_empty()
        };
        if !is_command {
            j += 1;
            continue;
        }
        let at = j;
        let mut command = line.strip_prefix("$ ").unwrap_or(line).to_owned();
        while command.trim_end().ends_with('\\') && j + 1 < body.len() {
            let kept = command.trim_end();
            command = format!("{} {}", &kept[..kept.len() - 1], body[j + 1].trim());
            j += 1;
        }
        j += 1;
        // The output shown after it.
        let mut shown = Vec::new();
        if console {
            while j < body.len() && !body[j].starts_with("$ ") {
                // Output may be written as comments (`# {…}`).
                let line = body[j].trim_start();
                shown.push(line.strip_prefix('#').unwrap_or(line).to_owned());
                j += 1;
            }
        } else if j < body.len() && body[j].trim_start().starts_with("# {") {
            shown.push(body[j].trim_start()[2..].to_owned());
            j += 1;
            while j < body.len() && body[j].trim_start().starts_with("#  ") {
                shown.push(body[j].trim_start()[2..].to_owned());
                j += 1;
            }
        }
        let Some(via) = call_of(&command) else {
            continue;
        };
        let shown = shown.join("\n");
        let answer = shown.find('{').map(|from| shown[from..].to_owned());
        calls.push(Call {
            place: format!("{name}:{}", first + at + 1),
            via,
            answer,
        });
    }
    // Only blocks that show an answer are replayed, up to the last one.
    match calls.iter().rposition(|c| c.answer.is_some()) {
        Some(last) => {
            calls.truncate(last + 1);
            calls
        }
        None => Vec::new(),
    }
}

/// The JSON values of a shown answer: ellipses outside strings become a
/// member `"…": 0` of their object, so it parses and says it is elided.
/// Several values (lines of a stream, text after the JSON) are split.
fn parse_shown(text: &str) -> Result<Vec<Value>, String> {
    let mut json = String::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            json.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                json.push(c);
            }
            '\u{2026}' => json.push_str(&format!("\"{ELIDED}\": 0")),
            '.' if chars.peek() == Some(&'.') => {
                while chars.peek() == Some(&'.') {
                    chars.next();
                }
                json.push_str(&format!("\"{ELIDED}\": 0"));
            }
            _ => json.push(c),
        }
    }
    let mut values = Vec::new();
    let mut rest = json.as_str();
    while let Some(from) = rest.find('{') {
        let mut stream = serde_json::Deserializer::from_str(&rest[from..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                let used = stream.byte_offset();
                values.push(value);
                rest = &rest[from + used..];
            }
            Some(Err(e)) => return Err(format!("{e}: {json}")),
            None => break,
        }
    }
    Ok(values)
}

/// The field paths of an answer; with `elided`, the paths of the objects
/// an example marked elided (empty for a real answer).
fn paths(value: &Value, prefix: &str, out: &mut BTreeSet<String>, elided: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => object_paths(map, prefix, out, elided),
        Value::Array(items) => {
            for item in items {
                paths(item, &format!("{prefix}[]"), out, elided);
            }
        }
        _ => {}
    }
}

fn object_paths(
    map: &Map<String, Value>,
    prefix: &str,
    out: &mut BTreeSet<String>,
    elided: &mut BTreeSet<String>,
) {
    for (key, value) in map {
        if key == ELIDED {
            elided.insert(prefix.to_owned());
            continue;
        }
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        out.insert(path.clone());
        if key != "metadata" {
            paths(value, &path, out, elided);
        }
    }
}

/// The parent object's path and the field name of a path.
fn split_path(path: &str) -> (&str, &str) {
    match path.rfind('.') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    }
}

/// What is wrong with a shown answer against the real one, by the rule.
fn compare(shown: &Value, real: &Value) -> Vec<String> {
    let (mut shown_paths, mut elided) = (BTreeSet::new(), BTreeSet::new());
    paths(shown, "", &mut shown_paths, &mut elided);
    let mut real_paths = BTreeSet::new();
    paths(real, "", &mut real_paths, &mut BTreeSet::new());
    let mut wrong = Vec::new();
    for path in shown_paths.difference(&real_paths) {
        wrong.push(format!(
            "shows `{path}`, which the real answer does not have"
        ));
    }
    for path in real_paths.difference(&shown_paths) {
        let (parent, field) = split_path(path);
        // A field inside a field the example does not show is told by that
        // field already (or it is elided).
        if !parent.is_empty() && !shown_paths.contains(parent.trim_end_matches("[]")) {
            continue;
        }
        if elided.contains(parent) && !NEVER_ELIDED.contains(&field) {
            continue;
        }
        wrong.push(format!("leaves out `{path}`, which the real answer has"));
    }
    wrong
}

/// Runs one CLI line with the built tumbler first on `PATH` and the
/// server's address in `TUMBLER_ADDR`; its standard output.
fn run_cli(line: &str, addr: &str) -> String {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_tumbler")).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new("bash");
    command
        .args(["--noprofile", "--norc", "-c", line])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("TUMBLER_ADDR", addr);
    for (name, _) in std::env::vars() {
        if name.starts_with("TUMBLER_") && name != "TUMBLER_ADDR" {
            command.env_remove(name);
        }
    }
    let out = command.output().expect("bash must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The server-streaming RPCs, not replayed.
const STREAMING: &[&str] = &["Watch", "Observe"];

/// Replays a block's calls on a fresh server and compares each shown
/// answer with the real one; what is wrong, by place.
async fn check_block(calls: &[Call]) -> Vec<String> {
    if calls.iter().any(
        |c| matches!(&c.via, Via::Connect { method, .. } if STREAMING.contains(&method.as_str())),
    ) {
        return Vec::new();
    }
    let server = common::TestServer::new().start().await;
    let mut wrong = Vec::new();
    for call in calls {
        let real = match &call.via {
            Via::Connect { method, body } => {
                let (status, text) = common::http::http(
                    server.addr,
                    "POST",
                    &format!("/tumbler.v1.LockService/{method}"),
                    &[("content-type", "application/json")],
                    body,
                )
                .await;
                if status != 200 {
                    wrong.push(format!("{}: the call answers {status}: {text}", call.place));
                    continue;
                }
                text
            }
            Via::Cli(line) => {
                let (line, addr) = (line.clone(), server.endpoint());
                tokio::task::spawn_blocking(move || run_cli(&line, &addr))
                    .await
                    .unwrap()
            }
        };
        let Some(shown) = &call.answer else { continue };
        let shown = match parse_shown(shown) {
            Ok(values) if values.len() == 1 => values.into_iter().next().unwrap(),
            Ok(values) => {
                wrong.push(format!(
                    "{}: {} JSON values shown for one answer",
                    call.place,
                    values.len()
                ));
                continue;
            }
            Err(e) => {
                wrong.push(format!("{}: the shown answer is not JSON: {e}", call.place));
                continue;
            }
        };
        let real: Value = match parse_shown(&real).map(|v| v.into_iter().next()) {
            Ok(Some(real)) => real,
            _ => {
                wrong.push(format!(
                    "{}: the real answer is not JSON: {real}",
                    call.place
                ));
                continue;
            }
        };
        for problem in compare(&shown, &real) {
            wrong.push(format!("{}: {problem}\n  real answer: {real}", call.place));
        }
    }
    wrong
}

/// Every block of the documents with a shown answer.
fn all_blocks() -> Vec<Vec<Call>> {
    let mut blocks = Vec::new();
    for document in documents() {
        let name = document.strip_prefix(ROOT).unwrap().display().to_string();
        let text = std::fs::read_to_string(&document).unwrap();
        blocks.extend(calls_in(&name, &text));
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_answer_has_the_real_answers_field_names() {
    let blocks = all_blocks();
    let answered = blocks
        .iter()
        .flatten()
        .filter(|c| c.answer.is_some())
        .count();
    // Not vacuous: the examples of getting-started, api, cli and clients.
    assert!(
        answered >= 10,
        "only {answered} example answers found: is the parser right? {blocks:#?}"
    );
    let mut wrong = Vec::new();
    for calls in &blocks {
        wrong.extend(check_block(calls).await);
    }
    assert!(
        wrong.is_empty(),
        "example answers that differ from tumbler's:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_example_parser_finds_calls_answers_and_ellipses() {
    let text = "```console\n$ grpcurl -plaintext -d '{\"name\":\"a\"}' \\\n    127.0.0.1:50051 tumbler.v1.LockService/Inspect\n{\n  \"name\": \"a\",\n  \"holders\": [ { \"grant\": { \"slot\": 1, … } } ]\n}\n$ tumbler acquire a --json; echo \"exit $?\"\n{ \"status\": \"X\" }\nexit 75\n```\n\n```sh\ncurl -s $api/Acquire -H \"$json\" -d '{\"name\":\"b\"}'\n# {\"status\":\"S\",\"grant\":{\"holder\":\"h\",...},\n#  \"holders\":1}\ncurl -s $api/Release -d '{}'\n```\n\n```sh\ncurl -s $api/Queue -d '{}'\n```\n";
    let blocks = calls_in("x.md", text);
    assert_eq!(blocks.len(), 2, "{blocks:#?}");
    assert_eq!(blocks[0].len(), 2);
    assert_eq!(blocks[0][0].place, "x.md:2");
    assert_eq!(
        blocks[0][0].via,
        Via::Connect {
            method: "Inspect".into(),
            body: "{\"name\":\"a\"}".into()
        }
    );
    assert_eq!(
        blocks[0][1].via,
        Via::Cli("tumbler acquire a --json; echo \"exit $?\"".into())
    );
    // The call after the last answer is not replayed.
    assert_eq!(blocks[1].len(), 1, "{blocks:#?}");
    let shown = parse_shown(blocks[1][0].answer.as_deref().unwrap()).unwrap();
    assert_eq!(
        shown,
        [serde_json::json!({"status": "S", "grant": {"holder": "h", ELIDED: 0}, "holders": 1})]
    );
    let inspect = parse_shown(blocks[0][0].answer.as_deref().unwrap()).unwrap();
    assert_eq!(inspect.len(), 1);
    let cli = parse_shown(blocks[0][1].answer.as_deref().unwrap()).unwrap();
    assert_eq!(cli, [serde_json::json!({"status": "X"})]);
}

#[test]
fn the_rule_catches_missing_and_unknown_fields() {
    use serde_json::json;
    let real = json!({"status": "S", "grant": {"holder": "h", "slot": 1, "permits": 1, "slots": [1], "metadata": {"job": "1"}}, "holders": 1, "permitsInUse": 1});
    // Complete and right.
    assert!(compare(&real, &real).is_empty());
    // A field that does not exist; a map's keys are not fields.
    let shown = json!({"status": "S", "grant": {"holder": "h", "slot": 1, "permits": 1, "slots": [1], "metadata": {"other": "2"}}, "holders": 1, "permitsInUse": 1, "extra": 0});
    assert_eq!(
        compare(&shown, &real).len(),
        1,
        "{:?}",
        compare(&shown, &real)
    );
    // A complete object must show every field; an elided one may leave out
    // all but the never-elided ones.
    let shown = json!({"status": "S", "grant": {"holder": "h", "slot": 1}, "holders": 1, "permitsInUse": 1});
    assert_eq!(
        compare(&shown, &real).len(),
        3,
        "{:?}",
        compare(&shown, &real)
    );
    let shown = json!({"status": "S", "grant": {"holder": "h", ELIDED: 0}, "holders": 1, "permitsInUse": 1});
    let wrong = compare(&shown, &real);
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(
        wrong
            .iter()
            .all(|w| w.contains("permits") || w.contains("slots"))
    );
    let shown = json!({"status": "S", "grant": {"holder": "h", "permits": 1, "slots": [1], ELIDED: 0}, "permitsInUse": 1, ELIDED: 0});
    assert!(
        compare(&shown, &real).is_empty(),
        "{:?}",
        compare(&shown, &real)
    );
    let shown = json!({"status": "S", ELIDED: 0});
    assert_eq!(
        compare(&shown, &real),
        ["leaves out `permitsInUse`, which the real answer has"]
    );
}
