//! The checks behind tumbler's fuzz targets, one function per target, each
//! taking the fuzzer's raw bytes. They panic (a "crash" to libFuzzer) when
//! a decoder panics or breaks one of its promises.
//!
//! The same functions run on stable in `cargo test --test locks properties::`
//! (random bytes from proptest, plus the seed corpus in `fuzz/corpus/`),
//! so they keep compiling and passing between fuzzing sessions. This file
//! therefore only uses crates that tumbler itself depends on.

use std::collections::{BTreeMap, HashMap};

use tonic::Code;
use tumbler::service::validate;
use tumbler_engine::{self as engine, ListCursor};

/// A fuzz target's check: panics when the target finds a bug.
pub type Check = fn(&[u8]);

/// The fuzz targets and their checks, by name (`fuzz/fuzz_targets/<name>.rs`).
pub const TARGETS: &[(&str, Check)] = &[
    ("page_token", page_token),
    ("grant_record", grant_record),
    ("lua_reply", lua_reply),
    ("metadata", metadata),
];

/// Reads the fuzzer's bytes front to back; past the end it yields zeros
/// and empty slices, so every input means something.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(f, r)| (*f, r));
        self.0 = rest;
        first
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn u64(&mut self) -> u64 {
        let mut buf = [0u8; 8];
        let taken = self.take(8);
        buf[..taken.len()].copy_from_slice(taken);
        u64::from_le_bytes(buf)
    }

    /// A string of up to `max` bytes (invalid UTF-8 replaced).
    fn text(&mut self, max: usize) -> String {
        let len = usize::from(self.u8()) * max / 255;
        String::from_utf8_lossy(self.take(len)).into_owned()
    }

    fn rest(&mut self) -> &'a [u8] {
        self.take(usize::MAX)
    }
}

/// The message of an INVALID_ARGUMENT names `field` first.
fn assert_names(status: &tonic::Status, field: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let rest = status.message().strip_prefix(field);
    assert!(
        rest.is_some_and(|r| r.starts_with(':') || r.starts_with(' ')),
        "message should name {field}: {status:?}"
    );
}

/// Page tokens: decoding any string never panics and yields either a
/// `page_token` error or a cursor that re-encodes to itself; every cursor
/// the server can issue round-trips.
pub fn page_token(data: &[u8]) {
    let mut bytes = Bytes(data);
    let mode = bytes.u8();
    let token = match mode % 3 {
        // The bytes as the token itself.
        0 => String::from_utf8_lossy(bytes.rest()).into_owned(),
        // The bytes as the decoded token (so the fuzzer reaches past base64).
        1 => {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes.rest())
        }
        // A cursor the server could have issued.
        _ => {
            let cursor = ListCursor {
                node: (bytes.u64() % 16) as u32,
                position: bytes.u64(),
                after: bytes.text(200),
            };
            let token = validate::encode_page_token(&cursor);
            assert_eq!(
                validate::page_token(&token).unwrap(),
                Some(cursor),
                "an issued token must decode to its cursor"
            );
            token
        }
    };
    match validate::page_token(&token) {
        Ok(None) => assert!(token.is_empty()),
        Ok(Some(cursor)) => {
            let again = validate::encode_page_token(&cursor);
            assert_eq!(validate::page_token(&again).unwrap(), Some(cursor));
        }
        Err(invalid) => assert_names(&tumbler::service::errors::invalid(invalid), "page_token"),
    }
}

/// Records read back from Redis: grant and waiter records, event and
/// wake-up messages. Any bytes decode or fail without panicking; a grant
/// record written the way `lua/shared/records.lua` writes it (with the metadata
/// JSON the engine sends) decodes to exactly what was written, whatever
/// `|`, quotes or unicode the holder and metadata hold.
pub fn grant_record(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = engine::parse_grant("h", &text);
    let _ = engine::parse_waiter("h", &text, 0, 1);
    let _ = engine::watchers::LockEvent::parse(&text);
    engine::waiters::Waiters::new(1, 1).handle_message(&text);

    let mut bytes = Bytes(data);
    let expires = bytes.u64() >> 1;
    let token = bytes.u64();
    let slot = bytes.u64() as u32;
    let acquired_at_ms = bytes.u64() >> 1;
    let ttl_ms = bytes.u64();
    let kind = validate::kind(bytes.text(validate::MAX_KIND_BYTES))
        .unwrap_or_else(|_| engine::Kind::default_kind());
    let holder = validate::holder(bytes.text(64))
        .map(engine::Holder::into_string)
        .unwrap_or_else(|_| "h".to_owned());
    let metadata: BTreeMap<String, String> = entries(&mut bytes).into_iter().collect();
    let json = engine::records::metadata_arg(&metadata);
    let mut record = format!("{slot}|{expires}|{token}|{acquired_at_ms}|{ttl_ms}|{kind}");
    if !json.is_empty() {
        record = format!("{record}\n{json}");
    }
    let grant = engine::parse_grant(&holder, &record).expect("a written record decodes");
    assert_eq!(grant.expires_at_ms, expires as i64);
    assert_eq!(grant.fencing_token, token);
    assert_eq!(grant.slot, slot);
    assert_eq!(grant.acquired_at_ms, acquired_at_ms as i64);
    assert_eq!(grant.ttl_ms, ttl_ms);
    assert_eq!(grant.kind, kind);
    assert_eq!(grant.holder, holder);
    assert_eq!(grant.metadata, metadata);
}

/// Function replies: any RESP bytes Redis could send, read by each typed
/// twin of `engine::ops`, give a value or an error, never a panic.
pub fn lua_reply(data: &[u8]) {
    use engine::ops;
    let Ok(value) = redis::parse_redis_value(data) else {
        return;
    };
    let _ = ops::acquire::parse(value.clone());
    let _ = ops::release::parse(value.clone());
    let _ = ops::extend::parse(value.clone());
    let _ = ops::renew::parse(value.clone());
    let _ = ops::refresh::parse(value.clone());
    let _ = ops::dequeue::parse(value.clone());
    let _ = ops::inspect::parse(value.clone());
    let _ = ops::queue::parse(value.clone());
    let _ = ops::list::parse(value.clone());
    let _ = ops::reap::parse(value.clone());
    let _ = ops::clear::parse(value.clone());
    let _ = tumbler_store::convert::<Vec<HashMap<String, u64>>>(value);
}

/// Metadata: validation of any map never panics; what it accepts keeps
/// every documented bound, and survives the trip through a grant record
/// unchanged; what it refuses is INVALID_ARGUMENT naming `metadata`.
pub fn metadata(data: &[u8]) {
    let mut bytes = Bytes(data);
    let map: HashMap<String, String> = entries(&mut bytes).into_iter().collect();
    match validate::metadata(&map) {
        Ok(valid) => {
            assert_eq!(valid.len(), map.len());
            assert!(valid.len() <= validate::MAX_METADATA_ENTRIES);
            let mut total = 0;
            for (key, value) in &valid {
                assert_eq!(map.get(key), Some(value));
                assert!(!key.is_empty() && key.len() <= validate::MAX_METADATA_KEY_BYTES);
                assert!(!key.chars().any(char::is_control));
                assert!(value.len() <= validate::MAX_METADATA_VALUE_BYTES);
                total += key.len() + value.len();
            }
            assert!(total <= validate::MAX_METADATA_TOTAL_BYTES);
            let json = engine::records::metadata_arg(&valid);
            let record = format!("1|1|1|0|1|default\n{json}");
            let grant = if valid.is_empty() {
                engine::parse_grant("h", "1|1|1|0|1|default")
            } else {
                engine::parse_grant("h", &record)
            }
            .expect("a written record decodes");
            assert_eq!(grant.metadata, valid);
        }
        Err(invalid) => assert_names(&tumbler::service::errors::invalid(invalid), "metadata"),
    }
}

/// Up to 40 metadata entries: a key of up to 80 bytes and a value of up to
/// 1100 bytes each, so that every bound can be crossed.
fn entries(bytes: &mut Bytes) -> Vec<(String, String)> {
    let count = usize::from(bytes.u8()) % 41;
    (0..count)
        .map(|_| (bytes.text(80), bytes.text(1100)))
        .collect()
}
