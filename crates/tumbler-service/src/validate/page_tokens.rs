//! Page tokens: where a List (or a changelog walk) goes on, as clients
//! carry it: base64url text, opaque to them, checked when it comes back
//! (a token that is not one this service issued is INVALID_ARGUMENT
//! naming `page_token`), and harmless when made up, since it holds
//! positions within the request's own namespace only.

use super::{Invalid, MAX_NAME_BYTES, invalid};
use crate::engine::ListCursor;
use crate::engine::changelog::ChangelogCursor;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A page token is `base64url(<node>.<scan cursor>.<last key listed>)`:
/// opaque to clients, and harmless when tampered with (it only moves where
/// a listing of the request's own namespace goes on).
pub fn page_token(value: &str) -> Result<Option<ListCursor>, Invalid> {
    let Some(text) = page_token_text(value)? else {
        return Ok(None);
    };
    let mut parts = text.splitn(3, '.');
    let mut next = || parts.next().ok_or_else(not_issued);
    let cursor = ListCursor {
        node: next()?.parse().map_err(|_| not_issued())?,
        position: next()?.parse().map_err(|_| not_issued())?,
        after: next()?.to_owned(),
    };
    if cursor.node > MAX_NODES || cursor.after.len() > MAX_AFTER_BYTES {
        return Err(not_issued());
    }
    Ok(Some(cursor))
}

/// A page token's text (None for an empty token): base64url of UTF-8.
fn page_token_text(value: &str) -> Result<Option<String>, Invalid> {
    if value.is_empty() {
        return Ok(None);
    }
    let bytes = URL_SAFE_NO_PAD.decode(value).map_err(|_| not_issued())?;
    String::from_utf8(bytes).map(Some).map_err(|_| not_issued())
}

fn not_issued() -> Invalid {
    invalid("page_token", "is not a token this service issued")
}

/// Bounds a page token's parts must keep: a cluster has at most 16,384
/// primaries; a key is a lock name with the prefix and shard tag before it.
pub(super) const MAX_NODES: u32 = 16_384;
pub(super) const MAX_AFTER_BYTES: usize = MAX_NAME_BYTES + 256;

/// The `next_page_token` of a page: empty when the listing is done.
pub fn next_page_token(next: Option<&ListCursor>) -> String {
    next.map(encode_page_token).unwrap_or_default()
}

/// The token that resumes a listing at `cursor`.
pub fn encode_page_token(cursor: &ListCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!(
        "{}.{}.{}",
        cursor.node, cursor.position, cursor.after
    ))
}

/// A wait-for chains page's token, `base64url(w.<scan cursor>)` (the `w`
/// keeps other tokens from passing for one): harmless when tampered with,
/// since it only moves where a scan of the request's own namespace's
/// registry goes on.
pub fn waits_page_token(value: &str) -> Result<Option<u64>, Invalid> {
    let Some(text) = page_token_text(value)? else {
        return Ok(None);
    };
    let cursor = text.strip_prefix("w.").ok_or_else(not_issued)?;
    cursor.parse().map(Some).map_err(|_| not_issued())
}

/// The `next_page_token` of a wait-for chains page: empty at the end.
pub fn next_waits_page_token(next: Option<u64>) -> String {
    next.map(|c| URL_SAFE_NO_PAD.encode(format!("w.{c}")))
        .unwrap_or_default()
}

/// A changelog read's page token, `base64url(c.<ms>.<shard>.<index>)`
/// (the `c` keeps a List token from passing for one): opaque to clients,
/// and harmless when tampered with, as a List token is (it holds positions
/// in time only: a made-up one moves where a walk of the request's own
/// namespace goes on). Numbers out of their range are refused.
pub fn changelog_page_token(value: &str) -> Result<Option<ChangelogCursor>, Invalid> {
    let Some(text) = page_token_text(value)? else {
        return Ok(None);
    };
    let mut parts = text.split('.');
    if parts.next() != Some("c") {
        return Err(not_issued());
    }
    let mut next = || parts.next().ok_or_else(not_issued);
    let cursor = ChangelogCursor {
        at_ms: next()?.parse().map_err(|_| not_issued())?,
        shard: next()?.parse().map_err(|_| not_issued())?,
        index: next()?.parse().map_err(|_| not_issued())?,
    };
    if parts.next().is_some() || cursor.at_ms < 0 || cursor.shard > MAX_SHARDS {
        return Err(not_issued());
    }
    Ok(Some(cursor))
}

/// `--shards` at most (a cursor's shard may be one past the last).
const MAX_SHARDS: u32 = 16_384;

/// The `next_page_token` of a changelog page: empty when the walk is done.
pub fn next_changelog_page_token(next: Option<&ChangelogCursor>) -> String {
    next.map(|c| URL_SAFE_NO_PAD.encode(format!("c.{}.{}.{}", c.at_ms, c.shard, c.index)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejects<T: std::fmt::Debug>(result: Result<T, Invalid>, field: &str) {
        let invalid = result.expect_err("should be rejected");
        assert_eq!(invalid.field, field, "{invalid}");
    }

    #[test]
    fn waits_page_tokens_round_trip_and_refuse_what_was_not_issued() {
        let token = next_waits_page_token(Some(1234));
        assert_eq!(waits_page_token(&token).unwrap(), Some(1234));
        assert_eq!(next_waits_page_token(None), "");
        assert_eq!(waits_page_token("").unwrap(), None);
        for bad in ["w.", "w.-1", "w.x", "c.1", "12"] {
            rejects(waits_page_token(&URL_SAFE_NO_PAD.encode(bad)), "page_token");
        }
        rejects(waits_page_token("%%%"), "page_token");
    }

    #[test]
    fn changelog_page_tokens_round_trip_and_refuse_what_was_not_issued() {
        let cursor = ChangelogCursor {
            at_ms: 1_764_000_000_123,
            shard: 31,
            index: 4,
        };
        let token = next_changelog_page_token(Some(&cursor));
        assert_eq!(changelog_page_token(&token).unwrap(), Some(cursor));
        assert_eq!(next_changelog_page_token(None), "");
        assert_eq!(changelog_page_token("").unwrap(), None);
        for bad in [
            "c.1.2",
            "c.1.2.3.4",
            "x.1.2.3",
            "c.-1.0.0",
            "c.1.16385.0",
            "c.1.0.-1",
            "c.1.0.4294967296",
            "0.0.",
        ] {
            rejects(
                changelog_page_token(&URL_SAFE_NO_PAD.encode(bad)),
                "page_token",
            );
        }
        rejects(changelog_page_token("%%%"), "page_token");
        // A List token is no changelog token, and the other way round.
        let list = encode_page_token(&ListCursor {
            node: 0,
            position: 0,
            after: String::new(),
        });
        rejects(changelog_page_token(&list), "page_token");
        rejects(page_token(&token), "page_token");
    }
}
