//! Everything the client subcommands print: the output format (`-o
//! table|json|yaml`), writing to stdout without panicking (a closed pipe
//! or a full disk is an `io::Error` the caller turns into an exit code),
//! the one reply → JSON mapping, and the tables and times for people.
//!
//! JSON (and YAML) is the proto3 JSON mapping of the reply's message, the
//! same as Connect's JSON on the gRPC port (`tumbler-proto`'s pbjson
//! impls): lowerCamel field names, enums by their full name
//! (`ACQUIRE_STATUS_ACQUIRED`), 64-bit integers as strings, fields at
//! their default value (0, "", false, empty) left out.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use clap::ValueEnum;
use comfy_table::{Table, presets};
use serde::Serialize;
use serde_json::Value;

use super::Failure;
use tumbler_proto as proto;

/// How replies are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Tables and lines for people.
    #[default]
    Table,
    /// The reply as JSON (one object per line for `watch`).
    Json,
    /// The reply as YAML (one document per event for `watch`).
    Yaml,
}

/// Where replies go: stdout, in one format.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub format: Format,
}

impl Output {
    /// Prints a reply: `message` as JSON or YAML, or the text `table`
    /// makes. A reader that closed the pipe is no failure: the command's
    /// outcome (its exit code) still stands.
    pub fn reply(
        &self,
        message: &impl Serialize,
        table: impl FnOnce() -> String,
    ) -> Result<(), Failure> {
        let written = match self.format {
            Format::Table => write_stdout(&table()),
            Format::Json => write_stdout(&format!("{:#}\n", to_json(message))),
            Format::Yaml => write_stdout(&yaml(&to_json(message))),
        };
        match written {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => Ok(other?),
        }
    }

    /// Prints one item of a stream (`watch`): a JSON line, a YAML
    /// document, or the text `line` makes.
    pub fn item(
        &self,
        message: &impl Serialize,
        line: impl FnOnce() -> String,
    ) -> std::io::Result<()> {
        match self.format {
            Format::Table => write_stdout(&line()),
            Format::Json => write_stdout(&format!("{}\n", to_json(message))),
            Format::Yaml => write_stdout(&format!("---\n{}", yaml(&to_json(message)))),
        }
    }
}

fn yaml(value: &Value) -> String {
    // A serde_json::Value always serializes: its keys are strings.
    serde_yaml_ng::to_string(value).unwrap_or_default()
}

/// Writes `text` to stdout and flushes, so a failed write is reported here
/// rather than lost when the buffer is dropped.
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// A status line for people, on stderr (never mixed into stdout, which
/// belongs to the reply or to `hold`'s command). A failed write to stderr
/// has nowhere to be reported and is ignored.
pub fn status_line(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

// ---- JSON: the one place where replies are mapped to serde_json. ----

/// A reply as JSON: a proto message through its proto3 JSON mapping
/// (pbjson's serde impls, as Connect answers), or a value of the CLI's own.
pub fn to_json(message: &impl Serialize) -> Value {
    // Messages and maps with string keys always serialize.
    serde_json::to_value(message).unwrap_or(Value::Null)
}

/// `ACQUIRE_STATUS_ACQUIRED` → `ACQUIRED`, for tables and status lines.
pub fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix).unwrap_or(full).to_owned()
}

pub fn acquire_status(reply: &proto::AcquireResponse) -> String {
    enum_name(reply.status().as_str_name(), "ACQUIRE_STATUS_")
}

/// `read` or `write` for a read/write lock's mode; `None` for a plain
/// lock's (unspecified).
pub fn lock_mode(mode: proto::LockMode) -> Option<&'static str> {
    match mode {
        proto::LockMode::Read => Some("read"),
        proto::LockMode::Write => Some("write"),
        proto::LockMode::Unspecified => None,
    }
}

pub fn acquire_reason(reply: &proto::AcquireResponse) -> String {
    enum_name(reply.reason().as_str_name(), "NOT_ACQUIRED_REASON_")
}

// ---- Tables and times for people. ----

/// `name`, or `namespace/name` outside the default namespace.
pub fn display_name(namespace: &str, name: &str) -> String {
    if namespace.is_empty() || namespace == "default" {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// This machine's clock in Unix milliseconds (0 before 1970): for a
/// metrics range and "how long ago"; lock times are the server's.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A Redis-clock timestamp as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(at_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(at_ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

/// `in 29s`, `3m 2s ago`: whole seconds from 10 s on, milliseconds below.
fn relative(delta_ms: i64) -> String {
    let size = delta_ms.unsigned_abs();
    let size = if size >= 10_000 {
        size / 1000 * 1000
    } else {
        size
    };
    let text = humantime::format_duration(Duration::from_millis(size));
    if size == 0 {
        "now".to_owned()
    } else if delta_ms > 0 {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A timestamp with its distance from `now_ms`.
pub fn when(at_ms: i64, now_ms: i64) -> String {
    format!("{} ({})", rfc3339(at_ms), relative(at_ms - now_ms))
}

pub fn metadata_text(metadata: &HashMap<String, String>) -> String {
    let mut pairs: Vec<_> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(", ")
}

pub fn new_table() -> Table {
    let mut table = Table::new();
    table.load_preset(presets::UTF8_FULL_CONDENSED);
    table
}

pub fn grant_table(grant: &proto::Grant, now_ms: i64) -> Table {
    let mut table = new_table();
    table.set_header(["field", "value"]);
    table.add_row(["holder".to_owned(), grant.holder.clone()]);
    table.add_row(["fencing token".to_owned(), grant.fencing_token.to_string()]);
    if grant.slots.len() > 1 {
        let slots: Vec<String> = grant.slots.iter().map(u32::to_string).collect();
        table.add_row(["permits".to_owned(), grant.permits.to_string()]);
        table.add_row(["slots".to_owned(), slots.join(", ")]);
    } else {
        table.add_row(["slot".to_owned(), grant.slot.to_string()]);
    }
    if let Some(mode) = lock_mode(grant.mode()) {
        table.add_row(["mode".to_owned(), mode.to_owned()]);
    }
    table.add_row(["acquired".to_owned(), when(grant.acquired_at_ms, now_ms)]);
    table.add_row(["expires".to_owned(), when(grant.expires_at_ms, now_ms)]);
    table.add_row([
        "ttl".to_owned(),
        humantime::format_duration(Duration::from_millis(grant.ttl_ms)).to_string(),
    ]);
    table.add_row(["kind".to_owned(), grant.kind.clone()]);
    if !grant.metadata.is_empty() {
        table.add_row(["metadata".to_owned(), metadata_text(&grant.metadata)]);
    }
    table
}

/// The one-line summary of a refused acquire:
/// `NOT_ACQUIRED name: BUSY, 1 holder(s); a lease ends …`.
pub fn not_acquired_line(lock: &str, reply: &proto::AcquireResponse) -> String {
    let mut line = format!(
        "{} {lock}: {}, {} holder(s)",
        acquire_status(reply),
        acquire_reason(reply),
        reply.holders
    );
    if reply.next_expiry_at_ms > 0 {
        let _ = write!(
            line,
            "; a lease ends {}",
            when(reply.next_expiry_at_ms, now_ms())
        );
    }
    if reply.queue_position > 0 {
        let _ = write!(line, "; was {} in the queue", reply.queue_position);
    }
    line
}

/// A table of named counts (reap, clear), or `message` (the reply they
/// come from) as JSON.
pub fn print_counts(
    out: Output,
    message: &impl Serialize,
    counts: &[(&str, u64)],
) -> Result<(), Failure> {
    out.reply(message, || {
        let mut table = new_table();
        table.set_header(["", "count"]);
        for (name, count) in counts {
            table.add_row([name.replace('_', " "), count.to_string()]);
        }
        format!("{table}\n")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times() {
        assert_eq!(relative(0), "now");
        assert_eq!(relative(1500), "in 1s 500ms");
        assert_eq!(relative(29_998), "in 29s");
        assert_eq!(relative(-61_000), "1m 1s ago");
    }

    #[test]
    fn rfc3339_in_utc_with_millis() {
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn replies_are_proto3_json_with_tokens_as_strings_in_json_and_yaml() {
        let reply = proto::AcquireResponse {
            status: proto::AcquireStatus::Acquired as i32,
            grant: Some(proto::Grant {
                fencing_token: 9_007_199_254_740_993,
                acquired_at_ms: 1_700_000_000_123,
                slot: 1,
                ..Default::default()
            }),
            holders: 1,
            ..Default::default()
        };
        let value = to_json(&reply);
        assert_eq!(value["status"], "ACQUIRE_STATUS_ACQUIRED");
        assert_eq!(value["grant"]["fencingToken"], "9007199254740993");
        assert_eq!(value["grant"]["acquiredAtMs"], "1700000000123");
        assert_eq!(value["grant"]["slot"], 1);
        // Defaults are left out, as Connect leaves them out.
        assert!(value.get("reason").is_none(), "{value}");
        assert!(value.get("queuePosition").is_none(), "{value}");
        assert!(
            yaml(&value).contains("fencingToken: '9007199254740993'"),
            "{}",
            yaml(&value)
        );
    }
}
