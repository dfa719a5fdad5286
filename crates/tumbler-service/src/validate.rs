//! Request validation: every rule a request must meet before it reaches
//! the engine. A broken rule is INVALID_ARGUMENT naming the field and the
//! rule, and nothing is sent to Redis.

use std::collections::{BTreeMap, HashMap};

pub use crate::engine::names::{
    DEFAULT_KIND, DEFAULT_NAMESPACE, Invalid, MAX_KIND_BYTES, MAX_NAME_BYTES, MAX_NAMESPACE_BYTES,
    text,
};
use crate::engine::{Holder, Kind, LockMode, LockName, Namespace, Ttl};

mod multi;
mod page_tokens;

pub use multi::{MAX_MULTI_NAMES, multi_names, multi_plain, multi_set, no_set_tokens, set_tokens};

pub use page_tokens::{
    changelog_page_token, encode_page_token, next_changelog_page_token, next_page_token,
    next_waits_page_token, page_token, waits_page_token,
};

/// Bounds that depend on the deployment (set by flags).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest `limit` (holders per lock) a request may ask for.
    pub max_limit: u32,
    /// Lease used when a request gives none.
    pub default_ttl_ms: u64,
    /// Longest lease a request may ask for.
    pub max_ttl_ms: u64,
    /// Longest wait a request may ask for.
    pub max_wait_ms: u64,
    /// Waiting-request TTL when a request gives none.
    pub default_queue_ttl_ms: u64,
}

pub const MIN_QUEUE_TTL_MS: u64 = 100;
pub const MAX_PRIORITY: i32 = 1000;
pub const DEFAULT_QUEUE_ENTRIES: u32 = 100;
pub const MAX_QUEUE_ENTRIES: u32 = 1000;

/// 0 (try once) ..= max_wait_ms.
pub fn wait_ms(value: u64, limits: &Limits) -> Result<u64, Invalid> {
    if value > limits.max_wait_ms {
        return Err(invalid(
            "wait_ms",
            format!("must be at most {}", limits.max_wait_ms),
        ));
    }
    Ok(value)
}

/// Absent → the default; otherwise 100..=max_ttl_ms.
pub fn queue_ttl_ms(value: Option<u64>, limits: &Limits) -> Result<u64, Invalid> {
    match value {
        None => Ok(limits.default_queue_ttl_ms),
        Some(ms) if !(MIN_QUEUE_TTL_MS..=limits.max_ttl_ms).contains(&ms) => Err(invalid(
            "queue_ttl_ms",
            format!(
                "must be between {MIN_QUEUE_TTL_MS} and {}",
                limits.max_ttl_ms
            ),
        )),
        Some(ms) => Ok(ms),
    }
}

/// -1000..=1000.
pub fn priority(value: i32) -> Result<i32, Invalid> {
    if !(-MAX_PRIORITY..=MAX_PRIORITY).contains(&value) {
        return Err(invalid(
            "priority",
            format!("must be between -{MAX_PRIORITY} and {MAX_PRIORITY}"),
        ));
    }
    Ok(value)
}

pub const DEFAULT_PAGE_SIZE: u32 = 100;
pub const MAX_PAGE_SIZE: u32 = 1000;

/// A name prefix for listing: like a name, but may be empty.
pub fn prefix(value: &str) -> Result<String, Invalid> {
    text("prefix", value, MAX_NAME_BYTES)?;
    Ok(value.to_owned())
}

/// 0 → 100; otherwise at most 1000.
pub fn page_size(value: u32) -> Result<u32, Invalid> {
    match value {
        0 => Ok(DEFAULT_PAGE_SIZE),
        n if n > MAX_PAGE_SIZE => Err(invalid(
            "page_size",
            format!("must be at most {MAX_PAGE_SIZE}"),
        )),
        n => Ok(n),
    }
}

/// Absent: no cutoff; otherwise at least 1.
pub fn older_than_ms(value: Option<u64>) -> Result<Option<u64>, Invalid> {
    if value == Some(0) {
        return Err(invalid("older_than_ms", "must be at least 1"));
    }
    Ok(value)
}

pub const MAX_METRICS_RANGE_MS: i64 = 24 * 3600 * 1000;
const DEFAULT_METRICS_RANGE_MS: i64 = 3600 * 1000;

/// A metrics range: 0 means the last hour up to `now_ms`; from ≤ to; at
/// most 24 hours (the counters' retention).
pub fn metrics_range(from_ms: i64, to_ms: i64, now_ms: i64) -> Result<(i64, i64), Invalid> {
    let to = if to_ms == 0 { now_ms } else { to_ms };
    if to < 0 {
        return Err(invalid("to_ms", "must not be negative"));
    }
    let from = if from_ms == 0 {
        to - DEFAULT_METRICS_RANGE_MS
    } else {
        from_ms
    };
    if from < 0 {
        return Err(invalid("from_ms", "must not be negative"));
    }
    if from > to {
        return Err(invalid("from_ms", "must not be after to_ms"));
    }
    if to - from > MAX_METRICS_RANGE_MS {
        return Err(invalid(
            "from_ms",
            format!(
                "the range must be at most {MAX_METRICS_RANGE_MS} ms (the counters' retention)"
            ),
        ));
    }
    Ok((from, to))
}

/// 0 → 100; otherwise at most 1000.
pub fn max_entries(value: u32) -> Result<u32, Invalid> {
    match value {
        0 => Ok(DEFAULT_QUEUE_ENTRIES),
        n if n > MAX_QUEUE_ENTRIES => Err(invalid(
            "max_entries",
            format!("must be at most {MAX_QUEUE_ENTRIES}"),
        )),
        n => Ok(n),
    }
}

pub use crate::engine::names::MAX_HOLDER_BYTES;
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY_BYTES: usize = 64;
pub const MAX_METADATA_VALUE_BYTES: usize = 1024;
pub const MAX_METADATA_TOTAL_BYTES: usize = 8192;

fn invalid(field: &'static str, rule: impl std::fmt::Display) -> Invalid {
    Invalid::new(field, rule)
}

/// Empty → `default`; otherwise 1..=64 bytes of `[A-Za-z0-9_.-]`.
pub fn namespace(value: impl Into<String>) -> Result<Namespace, Invalid> {
    Namespace::parse(value)
}

/// 1..=512 bytes, no control characters.
pub fn name(value: impl Into<String>) -> Result<LockName, Invalid> {
    LockName::parse(value)
}

/// Whether a holder id is a session's (`session-<uuid>`, made by the
/// server): such ids are reserved to sessions (decision 0082).
pub fn is_session_holder(holder: &str) -> bool {
    holder.starts_with("session-")
}

/// A plain call may not act as a session: a session's grants are taken,
/// released and extended only through its stream, or by an admin's Clear
/// (DESIGN.md invariant 18, decision 0082). PERMISSION_DENIED, naming the
/// field.
pub fn not_a_session(field: &str, holder: &str) -> Result<(), tonic::Status> {
    if is_session_holder(holder) {
        return Err(tonic::Status::permission_denied(format!(
            "{field}: ids beginning with \"session-\" belong to sessions: a session's grants are acquired, extended and released only through its Session stream (or removed by an admin's Clear)"
        )));
    }
    Ok(())
}

/// Acquire's `takes_over` (decision 0083): empty is None; otherwise a
/// holder id that is not a session's nor the request's own, on a plain
/// request of one permit.
pub fn takes_over(
    value: String,
    holder: &Holder,
    mode: LockMode,
    permits: u32,
) -> Result<Option<Holder>, tonic::Status> {
    if value.is_empty() {
        return Ok(None);
    }
    let bad = |rule: &str| super::errors::invalid(invalid("takes_over", rule));
    let old = Holder::parse(value).map_err(|e| bad(&e.rule))?;
    not_a_session("takes_over", old.as_str())?;
    if old.as_str() == holder.as_str() {
        return Err(bad("must name another holder than the request's own"));
    }
    if mode.is_rw() {
        return Err(bad(
            "takes over a plain lock's grant only: not with mode READ or WRITE",
        ));
    }
    if permits > 1 {
        return Err(bad(
            "takes over a grant of one permit only: not with permits > 1",
        ));
    }
    Ok(Some(old))
}

/// An acquiring holder: empty means "make one up" (None).
pub fn optional_holder(value: impl Into<String>) -> Result<Option<Holder>, Invalid> {
    let value = value.into();
    if value.is_empty() {
        return Ok(None);
    }
    Holder::parse(value).map(Some)
}

/// A releasing or extending holder: required.
pub fn holder(value: impl Into<String>) -> Result<Holder, Invalid> {
    Holder::parse(value)
}

/// Absent → 1; otherwise 1..=max_limit.
pub fn limit(value: Option<u32>, limits: &Limits) -> Result<u32, Invalid> {
    match value {
        None => Ok(1),
        Some(0) => Err(invalid("limit", "must be at least 1")),
        Some(n) if n > limits.max_limit => Err(invalid(
            "limit",
            format!("must be at most {}", limits.max_limit),
        )),
        Some(n) => Ok(n),
    }
}

/// The `mode` enum (`tumbler.v1.LockMode`: 0 plain, 1 READ, 2 WRITE) and
/// `prefer_readers`, which only a READ request may set (decision 0074).
pub fn mode(value: i32, prefer_readers: bool) -> Result<(LockMode, bool), Invalid> {
    let mode = match value {
        0 => LockMode::Plain,
        1 => LockMode::Read,
        2 => LockMode::Write,
        other => {
            return Err(invalid(
                "mode",
                format!(
                    "unknown value {other} (LOCK_MODE_UNSPECIFIED, LOCK_MODE_READ or LOCK_MODE_WRITE)"
                ),
            ));
        }
    };
    if prefer_readers && mode != LockMode::Read {
        return Err(invalid(
            "prefer_readers",
            "only applies to mode LOCK_MODE_READ",
        ));
    }
    Ok((mode, prefer_readers))
}

/// The limit of an acquire of `mode`: a read/write lock's limit is the
/// most readers at once, and absent it is the deployment's maximum (a
/// plain lock's absent limit is 1).
pub fn limit_for(value: Option<u32>, mode: LockMode, limits: &Limits) -> Result<u32, Invalid> {
    match (value, mode) {
        (None, LockMode::Read | LockMode::Write) => Ok(limits.max_limit),
        _ => limit(value, limits),
    }
}

/// The permits of an acquire (decision 0075): absent or 0 → 1; at most
/// the request's `limit` (after its default); more than one only for a
/// plain request (a read/write lock's writer takes the whole lock already).
pub fn permits(value: Option<u32>, limit: u32, mode: LockMode) -> Result<u32, Invalid> {
    let permits = value.unwrap_or(0).max(1);
    if permits > 1 && mode.is_rw() {
        return Err(invalid(
            "permits",
            "only applies to a plain lock (mode LOCK_MODE_UNSPECIFIED)",
        ));
    }
    if permits > limit {
        return Err(invalid(
            "permits",
            format!("must be at most the lock's limit ({limit})"),
        ));
    }
    Ok(permits)
}

/// Absent → `default`; otherwise 1..=max_ttl_ms.
pub fn ttl_ms(value: Option<u64>, limits: &Limits) -> Result<Ttl, Invalid> {
    Ttl::parse(
        "ttl_ms",
        value.unwrap_or(limits.default_ttl_ms),
        limits.max_ttl_ms,
    )
}

/// Absent stays absent (Extend then reuses the grant's own ttl).
pub fn optional_ttl_ms(value: Option<u64>, limits: &Limits) -> Result<Option<Ttl>, Invalid> {
    value
        .map(|ms| Ttl::parse("ttl_ms", ms, limits.max_ttl_ms))
        .transpose()
}

/// A session id to resume: as SessionOpened gave it (`session-<uuid>`).
pub fn session_id(value: &str) -> Result<String, Invalid> {
    let valid = value.starts_with("session-")
        && value.len() <= 64
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if valid {
        Ok(value.to_owned())
    } else {
        Err(invalid(
            "resume.session_id",
            "must be a session id as SessionOpened gave it",
        ))
    }
}

/// A resume secret: 64 hex digits, as SessionOpened gave it.
pub fn resume_secret(value: &str) -> Result<String, Invalid> {
    if value.len() == 64 && value.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(value.to_owned())
    } else {
        Err(invalid(
            "resume.secret",
            "must be the resume secret SessionOpened gave (64 hex digits)",
        ))
    }
}

/// Absent means any token; 0 is never granted, so it is refused.
pub fn fencing_token(value: Option<u64>) -> Result<Option<u64>, Invalid> {
    if value == Some(0) {
        return Err(invalid(
            "fencing_token",
            "must be a token the server granted (never 0); leave it unset to match any",
        ));
    }
    Ok(value)
}

/// Empty → `default`; otherwise 1..=32 bytes of `[a-z0-9_.-]` (the rule:
/// [`Kind::parse`]).
pub fn kind(value: impl Into<String>) -> Result<Kind, Invalid> {
    Kind::parse(value)
}

/// At most 32 entries; keys 1..=64 bytes without control characters;
/// values up to 1024 bytes; 8192 bytes in all.
pub fn metadata(value: &HashMap<String, String>) -> Result<BTreeMap<String, String>, Invalid> {
    if value.len() > MAX_METADATA_ENTRIES {
        return Err(invalid(
            "metadata",
            format!("must have at most {MAX_METADATA_ENTRIES} entries"),
        ));
    }
    let mut total = 0;
    for (key, entry) in value {
        if key.is_empty() {
            return Err(invalid("metadata", "keys must not be empty"));
        }
        text("metadata key", key, MAX_METADATA_KEY_BYTES)?;
        if entry.len() > MAX_METADATA_VALUE_BYTES {
            return Err(invalid(
                "metadata",
                format!("value of {key:?} must be at most {MAX_METADATA_VALUE_BYTES} bytes"),
            ));
        }
        total += key.len() + entry.len();
    }
    if total > MAX_METADATA_TOTAL_BYTES {
        return Err(invalid(
            "metadata",
            format!("must be at most {MAX_METADATA_TOTAL_BYTES} bytes in all"),
        ));
    }
    Ok(value.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    use crate::engine::ListCursor;

    fn limits() -> Limits {
        Limits {
            max_limit: 100,
            default_ttl_ms: 30_000,
            max_ttl_ms: 60_000,
            max_wait_ms: 10_000,
            default_queue_ttl_ms: 5_000,
        }
    }

    fn rejects<T: std::fmt::Debug>(result: Result<T, Invalid>, field: &str) {
        let invalid = result.expect_err("should be rejected");
        assert_eq!(invalid.field, field, "{invalid}");
    }

    #[test]
    fn defaults_fill_empty_fields() {
        assert_eq!(namespace("").unwrap(), "default");
        assert_eq!(kind("").unwrap(), "default");
        assert_eq!(limit(None, &limits()).unwrap(), 1);
        assert_eq!(ttl_ms(None, &limits()).unwrap().ms(), 30_000);
        assert_eq!(optional_holder("").unwrap(), None);
    }

    #[test]
    fn modes_and_their_limits() {
        assert_eq!(mode(0, false).unwrap(), (LockMode::Plain, false));
        assert_eq!(mode(1, true).unwrap(), (LockMode::Read, true));
        assert_eq!(mode(2, false).unwrap(), (LockMode::Write, false));
        rejects(mode(3, false), "mode");
        rejects(mode(-1, false), "mode");
        rejects(mode(2, true), "prefer_readers");
        rejects(mode(0, true), "prefer_readers");
        // An absent limit: 1 for a plain lock, the maximum for a read/write one.
        assert_eq!(limit_for(None, LockMode::Plain, &limits()).unwrap(), 1);
        assert_eq!(limit_for(None, LockMode::Read, &limits()).unwrap(), 100);
        assert_eq!(limit_for(None, LockMode::Write, &limits()).unwrap(), 100);
        assert_eq!(limit_for(Some(4), LockMode::Write, &limits()).unwrap(), 4);
        rejects(limit_for(Some(0), LockMode::Read, &limits()), "limit");
    }

    #[test]
    fn each_rule_names_its_field() {
        rejects(namespace("a{b}"), "namespace");
        rejects(namespace("n".repeat(65)), "namespace");
        rejects(name(""), "name");
        rejects(name("x".repeat(513)), "name");
        rejects(name("a\nb"), "name");
        rejects(holder(""), "holder");
        rejects(holder("a\u{7}"), "holder");
        rejects(limit(Some(0), &limits()), "limit");
        rejects(limit(Some(101), &limits()), "limit");
        rejects(ttl_ms(Some(0), &limits()), "ttl_ms");
        rejects(ttl_ms(Some(60_001), &limits()), "ttl_ms");
        rejects(kind("Jobs"), "kind");
        rejects(kind("k".repeat(33)), "kind");
        rejects(fencing_token(Some(0)), "fencing_token");
        rejects(wait_ms(10_001, &limits()), "wait_ms");
        rejects(queue_ttl_ms(Some(99), &limits()), "queue_ttl_ms");
        rejects(queue_ttl_ms(Some(60_001), &limits()), "queue_ttl_ms");
        rejects(priority(1001), "priority");
        rejects(priority(-1001), "priority");
        rejects(max_entries(1001), "max_entries");
        rejects(page_size(1001), "page_size");
        rejects(metrics_range(2, 1, 10), "from_ms");
        rejects(metrics_range(1, MAX_METRICS_RANGE_MS + 2, 10), "from_ms");
        rejects(metrics_range(0, i64::MIN, 10), "to_ms");
        assert_eq!(
            metrics_range(0, 0, 7_200_000).unwrap(),
            (3_600_000, 7_200_000)
        );
        rejects(prefix("a\u{1}"), "prefix");
        rejects(older_than_ms(Some(0)), "older_than_ms");
        rejects(page_token("not base64!"), "page_token");
        rejects(page_token(&URL_SAFE_NO_PAD.encode("1.2")), "page_token");
        rejects(
            page_token(&URL_SAFE_NO_PAD.encode("99999.0.")),
            "page_token",
        );
        rejects(page_token(&URL_SAFE_NO_PAD.encode("0.x.")), "page_token");
        let long = format!("0.0.{}", "k".repeat(page_tokens::MAX_AFTER_BYTES + 1));
        rejects(page_token(&URL_SAFE_NO_PAD.encode(long)), "page_token");
    }

    #[test]
    fn page_tokens_round_trip_and_metadata_is_bounded() {
        let cursor = ListCursor {
            node: 2,
            position: u64::MAX,
            after: "tumbler:{a:3}:l:orders.{42}\u{e9}|x".into(),
        };
        let token = encode_page_token(&cursor);
        assert_eq!(page_token(&token).unwrap(), Some(cursor));
        let many: HashMap<_, _> = (0..33).map(|i| (i.to_string(), String::new())).collect();
        rejects(metadata(&many), "metadata");
        let long = HashMap::from([("k".to_owned(), "v".repeat(1025))]);
        rejects(metadata(&long), "metadata");
    }

    #[test]
    fn names_may_hold_braces_colons_and_unicode() {
        assert!(name("orders:{42}:größe").is_ok());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    use crate::engine::ListCursor;

    use crate::test_support::proptest_config as config;

    fn names_field(invalid: &Invalid, field: &str) -> bool {
        invalid.field == field && invalid.to_string().starts_with(&format!("{field}: "))
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn page_tokens_round_trip(node in 0u32..=page_tokens::MAX_NODES, position in any::<u64>(), after in "\\PC{0,40}|.{0,40}") {
            let cursor = ListCursor { node, position, after };
            let token = encode_page_token(&cursor);
            prop_assert_eq!(page_token(&token).unwrap(), Some(cursor));
        }

        #[test]
        fn any_string_decodes_to_a_cursor_in_range_or_a_page_token_error(
            token in ".{0,80}|[A-Za-z0-9_-]{0,80}",
        ) {
            match page_token(&token) {
                Ok(None) => prop_assert!(token.is_empty()),
                Ok(Some(cursor)) => {
                    prop_assert!(cursor.node <= page_tokens::MAX_NODES && cursor.after.len() <= page_tokens::MAX_AFTER_BYTES);
                    prop_assert_eq!(page_token(&encode_page_token(&cursor)).unwrap(), Some(cursor));
                }
                Err(status) => prop_assert!(names_field(&status, "page_token"), "{:?}", status),
            }
        }

        #[test]
        fn metrics_ranges_never_panic(from in any::<i64>(), to in any::<i64>(), now in 0i64..i64::MAX / 2) {
            match metrics_range(from, to, now) {
                Ok((from, to)) => {
                    prop_assert!(0 <= from && from <= to);
                    prop_assert!(to - from <= MAX_METRICS_RANGE_MS);
                }
                Err(status) => prop_assert!(
                    names_field(&status, "from_ms") || names_field(&status, "to_ms"),
                    "{:?}", status
                ),
            }
        }
    }
}
