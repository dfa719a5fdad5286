//! Rooms stay small enough to read: a source file (Rust under `src/`,
//! `crates/`, `tests/`, `benches/` and `clients/rust/`, the Lua under
//! `lua/`) has at most `LIMIT` lines, unless `BUDGETS` records a budget
//! for it: its path, the most lines it may have, and why it is one file.
//! A file that grows past its budget fails, and so does a budget that no
//! longer fits its file (gone, back under the limit, or far above it), so
//! the table stays the list of long files as they are (decision 0084).

use std::path::{Path, PathBuf};

/// About 600 lines, with a little slack so a file does not need a budget
/// for the last few lines of a test.
const LIMIT: usize = 620;

/// How far a budget may lie above its file's lines: a file that shrank
/// by more gets its budget lowered, so it cannot grow back unnoticed.
const SLACK: usize = 50;

/// A long file: the most lines it may have, and why it is one file.
struct Budget {
    path: &'static str,
    lines: usize,
    reason: &'static str,
}

/// The budgets, longest file first. Raising one is a change to review
/// like any other: say in the commit why the file is still one.
const BUDGETS: &[Budget] = &[
    Budget {
        path: "tests/locks/properties.rs",
        lines: 1190,
        reason: "its properties share one strategy per request field (each able to break its field) and one reply oracle; split up, every part would import all of them",
    },
    Budget {
        path: "tests/surface/auth.rs",
        lines: 1089,
        reason: "every test drives `every_rpc` (each RPC of the service, called with one token) over the same tokens file and clients; it grows by a row when the service gains an RPC (Batch: 17 lines)",
    },
    Budget {
        path: "tests/cli/cli.rs",
        lines: 1005,
        reason: "the subcommands' tests share the `tumbler` runner and its output readers, and each is one flat scenario against the real binary",
    },
    Budget {
        path: "tests/locks/semantics.rs",
        lines: 997,
        reason: "the invariants of the four unary RPCs, read as one list; each test stands alone (its own Redis and server), so the file is long but flat",
    },
    Budget {
        path: "clients/rust/src/lock.rs",
        lines: 913,
        reason: "the request, the guard and its watchdog share the grant's state (`Shared`) and its Extend and Release, which the election's and the multi-lock's guards reuse through `Lock`",
    },
    Budget {
        path: "tests/surface/tls.rs",
        lines: 888,
        reason: "the certificate authorities, leaf certificates and the secret-volume fixture above the tests (~250 lines) serve every test here",
    },
    Budget {
        path: "tests/locks/session.rs",
        lines: 808,
        reason: "the list of the ways a session ends, each a flat scenario over the same session stream helper (`tests/common/session.rs`)",
    },
    Budget {
        path: "benches/load.rs",
        lines: 789,
        reason: "the three paths (tumbler, the plain Redis lock, etcd) run every scenario through one driver, so their rows compare",
    },
    Budget {
        path: "crates/tumbler-model/tests/check.rs",
        lines: 760,
        reason: "every configuration CI checks, with what it expects, in one place and in the order of SAFETY.md's table",
    },
    Budget {
        path: "tests/observability.rs",
        lines: 708,
        reason: "its tests read the same registry through the metrics-page readers and the small OTLP collector defined here",
    },
    Budget {
        path: "benches/script_cost.rs",
        lines: 695,
        reason: "its measurements share the Redis under callgrind and the plain lock's calls, and their tables read side by side",
    },
    Budget {
        path: "clients/rust/examples/conformance_steps.rs",
        lines: 696,
        reason: "one program, one function per step, as in the other languages' steps programs",
    },
    Budget {
        path: "tests/locks/model_replay.rs",
        lines: 623,
        reason: "each model call replayed as its real function call in one match, with the arguments each function takes; the paths replayed are in model_replay/paths.rs",
    },
    Budget {
        path: "tests/locks/queue.rs",
        lines: 625,
        reason: "every rule of the queue (order, liveness, dead waiters skipped, wake-ups) beside the others, so a change to one is read against all of them",
    },
    Budget {
        path: "crates/tumbler-model/src/redis.rs",
        lines: 668,
        reason: "the functions side by side, each beside the others' steps as `lua/` has them beside `lua/shared/`, so a change to one step is compared with every function that takes it",
    },
    Budget {
        path: "tests/faults/maintenance.rs",
        lines: 660,
        reason: "List, Reap, Clear and the reaper share the listing and key-counting helpers at its top",
    },
    Budget {
        path: "src/config.rs",
        lines: 659,
        reason: "every flag is a field of the structs clap reads, with its help text, and the one conversion into `ServerConfig` sits beside them, so a flag and where it lands are read together",
    },
    Budget {
        path: "tests/locks/key_isolation.rs",
        lines: 638,
        reason: "both tests read Redis through the same key classifier (`classify`), which is most of its length",
    },
];

/// The folders whose sources the rule covers.
const ROOTS: &[&str] = &["src", "crates", "tests", "benches", "lua", "clients/rust"];

fn sources(path: &Path, found: &mut Vec<PathBuf>) {
    if path.is_dir() {
        if path.file_name().is_some_and(|n| n == "target") {
            return;
        }
        for entry in std::fs::read_dir(path).unwrap() {
            sources(&entry.unwrap().path(), found);
        }
    } else if path.extension().is_some_and(|e| e == "rs" || e == "lua") {
        found.push(path.to_owned());
    }
}

/// What is wrong with files of these sizes (path, lines) under these
/// budgets: one line per fault.
fn faults(files: &[(String, usize)], budgets: &[Budget]) -> Vec<String> {
    let mut faults = Vec::new();
    for (path, lines) in files {
        match budgets.iter().find(|b| b.path == path) {
            None if *lines > LIMIT => faults.push(format!(
                "{path}: {lines} lines, over {LIMIT} with no budget: split it, or record a budget (path, lines, reason) in tests/repo/sizes.rs"
            )),
            Some(b) if *lines > b.lines => faults.push(format!(
                "{path}: {lines} lines, past its budget of {}: split it, or raise the budget and say why",
                b.lines
            )),
            Some(_) if *lines <= LIMIT => faults.push(format!(
                "{path}: {lines} lines, within {LIMIT}: drop its budget"
            )),
            Some(b) if b.lines > lines + SLACK => faults.push(format!(
                "{path}: {lines} lines, its budget {} lies far above: lower it to {lines}",
                b.lines
            )),
            _ => {}
        }
    }
    for b in budgets {
        if !files.iter().any(|(path, _)| path == b.path) {
            faults.push(format!("{}: no such source file: drop its budget", b.path));
        }
        if b.reason.trim().len() < 20 {
            faults.push(format!("{}: its budget needs a reason", b.path));
        }
    }
    faults
}

#[test]
fn no_file_grows_past_its_budget() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    for dir in ROOTS {
        sources(&root.join(dir), &mut paths);
    }
    assert!(paths.len() > 100, "found only {} source files", paths.len());
    let files: Vec<(String, usize)> = (paths.iter())
        .map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            let name = path.strip_prefix(root).unwrap().to_string_lossy();
            (name.replace('\\', "/"), text.lines().count())
        })
        .collect();
    let faults = faults(&files, BUDGETS);
    assert!(faults.is_empty(), "{faults:#?}");
}

#[test]
fn the_checker_sees_each_kind_of_drift() {
    let budget = |path: &'static str, lines| Budget {
        path,
        lines,
        reason: "one driver, so the rows compare",
    };
    let budgets = [
        budget("a.rs", 700),
        budget("b.rs", 700),
        budget("gone.rs", 700),
    ];
    let files = [
        ("a.rs".to_owned(), 690),   // within its budget
        ("b.rs".to_owned(), 701),   // past it
        ("c.rs".to_owned(), 621),   // long, no budget
        ("d.rs".to_owned(), LIMIT), // short
    ];
    let found = faults(&files, &budgets);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].starts_with("b.rs: 701 lines, past its budget of 700"));
    assert!(found[1].starts_with("c.rs: 621 lines, over 620 with no budget"));
    assert!(found[2].starts_with("gone.rs: no such source file"));
    // A file that shrank: back under the limit, or far under its budget.
    let shrunk = [("a.rs".to_owned(), 600), ("b.rs".to_owned(), 640)];
    let found = faults(&shrunk, &budgets[..2]);
    assert!(found[0].contains("drop its budget"), "{found:#?}");
    assert!(found[1].contains("lower it to 640"), "{found:#?}");
    // A budget without a reason.
    let bare = [Budget {
        path: "a.rs",
        lines: 700,
        reason: "",
    }];
    assert!(faults(&files[..1], &bare)[0].contains("needs a reason"));
}
