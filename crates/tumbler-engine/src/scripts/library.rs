//! The function library's Lua read as text: every shared step
//! (`lua/shared/*.lua`) is defined once, before anything uses it (a
//! `local` used above its definition would be an undefined global at run
//! time), and every operation's file (`lua/<operation>.lua`) calls only
//! steps the shared files define, its own locals, or Lua's and Redis'
//! built-in functions; and no file of the library is over 400 lines.
//!
//! The reading is plain on purpose: comments and string literals are
//! blanked, then identifiers are read off the code; a call is an
//! identifier followed by `(` that is not a field (`x.f(`, `x:f(`).

use super::{OPERATIONS, SHARED};
use std::collections::{BTreeMap, BTreeSet};

/// The global functions Redis' Lua 5.1 offers scripts (the libraries,
/// `redis`, `string`, `cjson`, …, are only ever called through a field).
const BUILT_IN: &[&str] = &[
    "assert",
    "error",
    "getmetatable",
    "ipairs",
    "next",
    "pairs",
    "pcall",
    "rawequal",
    "rawget",
    "rawset",
    "select",
    "setmetatable",
    "tonumber",
    "tostring",
    "type",
    "unpack",
    "xpcall",
];

/// Lua's keywords, never names.
const KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// Lua source with its comments and string literals blanked (each
/// character of them a space, newlines kept), so what is left is code
/// with its lines where they were.
fn code_only(lua: &str) -> String {
    let chars: Vec<char> = lua.chars().collect();
    let mut out = String::with_capacity(lua.len());
    let mut i = 0;
    // A long bracket `[[`, `[=[`, … at `i`: its level, if it is one.
    let long_open = |i: usize| -> Option<usize> {
        if chars.get(i) != Some(&'[') {
            return None;
        }
        let level = chars[i + 1..].iter().take_while(|c| **c == '=').count();
        (chars.get(i + 1 + level) == Some(&'[')).then_some(level)
    };
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let c = chars[i];
        if c == '-' && chars.get(i + 1) == Some(&'-') {
            if let Some(level) = long_open(i + 2) {
                let close: String = format!("]{}]", "=".repeat(level));
                i = skip_long(&chars, i + 4 + level, &close, &mut out, i);
            } else {
                while i < chars.len() && chars[i] != '\n' {
                    out.push(' ');
                    i += 1;
                }
            }
        } else if let Some(level) = long_open(i) {
            let close: String = format!("]{}]", "=".repeat(level));
            i = skip_long(&chars, i + 2 + level, &close, &mut out, i);
        } else if c == '\'' || c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Blanks a long comment or string from `start` (where it opened) to the
/// end of `close`; returns the index after it.
fn skip_long(chars: &[char], body: usize, close: &str, out: &mut String, start: usize) -> usize {
    let close: Vec<char> = close.chars().collect();
    let mut end = body;
    while end < chars.len() && !chars[end..].starts_with(&close) {
        end += 1;
    }
    let end = (end + close.len()).min(chars.len());
    for c in &chars[start..end] {
        out.push(if *c == '\n' { '\n' } else { ' ' });
    }
    end
}

/// One identifier of the code: its name, line (1-based), and what stands
/// around it.
#[derive(Debug)]
struct Token {
    name: String,
    line: usize,
    /// After `.` or `:`: a field, not a name in scope.
    field: bool,
    /// Followed by `(`: a call (when not a field).
    call: bool,
    /// Followed by `=` (not `==`): assigned to, or a table constructor's key.
    assigned: bool,
}

fn tokens(code: &str) -> Vec<Token> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if b.is_ascii_alphabetic() || b == b'_' {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let before = line[..start].trim_end();
                let after = line[i..].trim_start();
                let name = &line[start..i];
                if !KEYWORDS.contains(&name) {
                    found.push(Token {
                        name: name.to_owned(),
                        line: n + 1,
                        field: before.ends_with('.') && !before.ends_with("..")
                            || before.ends_with(':'),
                        call: after.starts_with('('),
                        assigned: after.starts_with('=') && !after.starts_with("=="),
                    });
                }
            } else if b.is_ascii_digit() {
                // A number (hex digits and exponents included) is no name.
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
    }
    found
}

/// The names a chunk of code defines at its top level (unindented
/// `local function f` and `local a, b = …` lines), with their lines.
fn top_level_locals(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let Some(rest) = line.strip_prefix("local ") else {
            continue;
        };
        let rest = rest.strip_prefix("function ").unwrap_or(rest);
        let names = rest.split(['=', '(']).next().unwrap_or_default();
        for name in names.split(',') {
            found.push((name.trim().to_owned(), n + 1));
        }
    }
    found
}

/// Every name a chunk of code makes local anywhere (`local …`, `for …
/// in`/`=`, a function's parameters): what its calls may name besides
/// the shared steps and the built-ins.
fn locals_anywhere(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut add = |list: &str| {
        for name in list.split(',') {
            let name = name.trim();
            if !name.is_empty() && name != "..." {
                found.insert(name.to_owned());
            }
        }
    };
    for line in code.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("local function ") {
            add(rest.split('(').next().unwrap_or_default());
        } else if let Some(rest) = line.strip_prefix("local ") {
            add(rest.split('=').next().unwrap_or_default());
        } else if let Some(rest) = line.strip_prefix("for ") {
            add(rest.split(['=', ' ']).next().unwrap_or_default());
            if let Some((list, _)) = rest.split_once(" in ") {
                add(list);
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("function") {
            rest = &rest[at + "function".len()..];
            if let (Some(open), Some(close)) = (rest.find('('), rest.find(')'))
                && open < close
            {
                add(&rest[open + 1..close]);
            }
        }
    }
    found
}

/// What is wrong with a library of `shared` files (name, code, in order)
/// and `operations` (name, code): one line per fault, none when it holds.
fn faults(shared: &[(&str, &str)], operations: &[(&str, &str)]) -> Vec<String> {
    let mut faults = Vec::new();
    // Every shared definition: name → (file's place, line, file).
    let mut defined: BTreeMap<String, (usize, usize, &str)> = BTreeMap::new();
    let mut count = 0;
    for (place, (file, lua)) in shared.iter().enumerate() {
        for (name, line) in top_level_locals(&code_only(lua)) {
            count += 1;
            if let Some((_, first_line, first_file)) = defined.get(&name) {
                faults.push(format!(
                    "shared/{file}.lua:{line}: `{name}` is defined again (first in shared/{first_file}.lua:{first_line})"
                ));
            } else {
                defined.insert(name, (place, line, file));
            }
        }
    }
    // Lua 5.1 allows a chunk 200 locals; the library adds `OPS`.
    if count + 1 > 200 {
        faults.push(format!(
            "the shared steps define {count} top-level locals (Lua allows 199 beside OPS)"
        ));
    }
    for (place, (file, lua)) in shared.iter().enumerate() {
        let code = code_only(lua);
        let own = locals_anywhere(&code);
        for token in tokens(&code).iter().filter(|t| !t.field) {
            match defined.get(&token.name) {
                Some(&(at, line, def_file))
                    if (at, line) > (place, token.line) && !token.assigned =>
                {
                    faults.push(format!(
                        "shared/{file}.lua:{}: `{}` is used before its definition (shared/{def_file}.lua:{line})",
                        token.line, token.name
                    ));
                }
                Some(_) => {}
                None if token.call
                    && !BUILT_IN.contains(&token.name.as_str())
                    && !own.contains(&token.name) =>
                {
                    faults.push(format!(
                        "shared/{file}.lua:{}: `{}(` calls nothing the library defines",
                        token.line, token.name
                    ));
                }
                None => {}
            }
        }
    }
    for (file, lua) in operations {
        let code = code_only(lua);
        let own = locals_anywhere(&code);
        for token in tokens(&code).iter().filter(|t| t.call && !t.field) {
            let name = token.name.as_str();
            // `OPS`: the table scripts.rs defines after the shared steps.
            let known = defined.contains_key(name)
                || BUILT_IN.contains(&name)
                || own.contains(name)
                || name == "OPS";
            if !known {
                faults.push(format!(
                    "{file}.lua:{}: `{name}(` calls nothing the library defines",
                    token.line
                ));
            }
        }
        for (name, line) in top_level_locals(&code) {
            if let Some((_, def_line, def_file)) = defined.get(&name)
                && code.contains(&format!("local function {name}("))
            {
                faults.push(format!(
                    "{file}.lua:{line}: `{name}` is defined again (shared/{def_file}.lua:{def_line})"
                ));
            }
        }
    }
    faults
}

#[test]
fn every_shared_step_is_defined_once_before_use_and_every_call_is_defined() {
    let operations: Vec<(&str, &str)> = OPERATIONS.iter().map(|(n, c, _)| (*n, *c)).collect();
    assert!(SHARED.len() >= 5, "the shared steps are several files");
    assert!(
        operations.len() > 20,
        "found only {} operations",
        operations.len()
    );
    let faults = faults(SHARED, &operations);
    assert!(faults.is_empty(), "the function library's Lua: {faults:#?}");
    // The reading sees the library's steps: the hot path's among them.
    let code: String = SHARED.iter().map(|(_, c)| code_only(c)).collect();
    let names: Vec<String> = top_level_locals(&code)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for step in [
        "load",
        "settle",
        "hand_over",
        "next_token",
        "emit",
        "purge",
        "OK",
    ] {
        assert!(
            names.iter().any(|n| n == step),
            "no `{step}` among {names:?}"
        );
    }
}

#[test]
fn no_file_of_the_library_is_over_400_lines() {
    let shared = SHARED
        .iter()
        .map(|(name, code)| (format!("lua/shared/{name}.lua"), *code));
    let operations = OPERATIONS
        .iter()
        .map(|(name, code, _)| (format!("lua/{name}.lua"), *code));
    for (path, code) in shared.chain(operations) {
        let lines = code.lines().count();
        assert!(lines <= 400, "{path} has {lines} lines (at most 400)");
    }
}

#[test]
fn the_reading_finds_what_would_break() {
    let shared = [
        (
            "a",
            "-- a comment: undefined_in_comment()\nlocal function one()\n  return two()\nend\n",
        ),
        (
            "b",
            "local function two()\n  return 'x(' .. one()\nend\nlocal one = 1\n",
        ),
    ];
    let ops = [(
        "op",
        "local function mine() end\nmine()\nstring.format('%d', 1)\nmissing(1)\n",
    )];
    let faults = faults(&shared, &ops);
    assert!(
        faults
            .iter()
            .any(|f| f.contains("`two` is used before its definition")),
        "{faults:#?}"
    );
    assert!(
        faults.iter().any(|f| f.contains("`one` is defined again")),
        "{faults:#?}"
    );
    assert!(
        faults.iter().any(|f| f.contains("op.lua:4: `missing(`")),
        "{faults:#?}"
    );
    assert_eq!(faults.len(), 3, "{faults:#?}");
    // Strings and long comments hide what they hold.
    let code = code_only("x = 'a(' --[[ b(\n c( ]] y = \"d(\\\"\" z = [==[ e( ]==]\n");
    assert_eq!(
        tokens(&code)
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["x", "y", "z"]
    );
}
