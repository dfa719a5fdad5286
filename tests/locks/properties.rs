//! Property tests over the real gRPC API, against a real redis-server:
//! thousands of random requests to every RPC (hostile names, control
//! characters, oversize fields, out-of-range numbers, tampered page
//! tokens), each with zero, one or several fields broken on purpose.
//!
//! Every reply must be OK (or RESOURCE_EXHAUSTED, a documented answer to
//! load) when nothing is broken, and INVALID_ARGUMENT naming a broken
//! field otherwise (the broken field itself when exactly one is); never
//! UNKNOWN or INTERNAL, and the server never panics and still answers its
//! health check afterwards.
//!
//! The checks behind the fuzz targets (`fuzz/src/lib.rs`) also run here on
//! random bytes and on the seed corpus, so they work on stable too.

use crate::common;

#[path = "../../fuzz/src/lib.rs"]
mod fuzz_checks;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use proptest::collection::{hash_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::service::validate::{MAX_NAME_BYTES, encode_page_token};
use tumbler_engine::ListCursor;

/// Random cases; each sends 1..=MAX_BATCH requests at once.
const CASES: u32 = 2500;
const MAX_BATCH: usize = 4;
/// Shards of the test deployment (page tokens must stay below it).
const SHARDS: u32 = 8;

/// A field value and, when it breaks a rule, the field's name.
type Field<T> = (T, Option<&'static str>);

fn ok<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Field<T>> {
    s.prop_map(|v| (v, None)).boxed()
}

fn bad<T: std::fmt::Debug + Clone + 'static>(
    field: &'static str,
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Field<T>> {
    s.prop_map(move |v| (v, Some(field))).boxed()
}

/// Nine in ten valid, one in ten broken.
fn field<T: std::fmt::Debug + Clone + 'static>(
    valid: BoxedStrategy<Field<T>>,
    broken: BoxedStrategy<Field<T>>,
) -> BoxedStrategy<Field<T>> {
    prop_oneof![9 => valid, 1 => broken].boxed()
}

/// Pieces that have meant something to key layouts, hash tags, Lua
/// patterns, JSON or terminals.
const HOSTILE: &[&str] = &[
    "{",
    "}",
    "{}",
    "{a:0}",
    "{default:0}",
    "x}:h:y",
    ":index",
    "index",
    "fence",
    "names",
    "h:",
    "i:",
    "q:",
    "d:",
    "m:0",
    ":",
    "tumbler:{default:1}:h:x",
    "größe",
    "名前",
    "🔒",
    "a|b",
    "%d%s",
    "'",
    "\"",
    "\\",
    "]]",
    "--",
    "\u{202e}",
    "\u{feff}",
    "\u{2028}",
    " ",
    "*?[",
    "\u{10ffff}",
];

/// Characters `char::is_control` refuses.
const CONTROLS: &[char] = &[
    '\0', '\n', '\r', '\t', '\u{7}', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}',
];

fn truncate(mut text: String, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// Exactly `bytes` bytes, multibyte characters included.
fn full(bytes: usize) -> String {
    let mut text = "é{:}".repeat(bytes / 5 + 1);
    text = truncate(text, bytes);
    while text.len() < bytes {
        text.push('x');
    }
    text
}

/// Text without control characters of at most `max` bytes.
fn free_text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[^\\p{Cc}]{0,24}",
        3 => vec(select(HOSTILE), 1..5).prop_map(|parts| parts.concat()),
        1 => Just(full(max)),
    ]
    .prop_map(move |text| truncate(text, max))
    .boxed()
}

fn nonempty_text(max: usize) -> BoxedStrategy<String> {
    free_text(max)
        .prop_map(|text| if text.is_empty() { "n".into() } else { text })
        .boxed()
}

/// Text with a control character somewhere.
fn with_control(max: usize) -> BoxedStrategy<String> {
    (
        free_text(max - 4),
        select(CONTROLS),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(text, control, at)| {
            let boundaries: Vec<usize> = (0..=text.len())
                .filter(|i| text.is_char_boundary(*i))
                .collect();
            let mut text = text.clone();
            text.insert(*at.get(&boundaries), control);
            text
        })
        .boxed()
}

fn too_long(max: usize) -> BoxedStrategy<String> {
    (1usize..4).prop_map(move |extra| full(max + extra)).boxed()
}

/// Names shared between requests, so that releases, extends and inspects
/// also meet held locks.
const NAMES: &[&str] = &[
    "shared",
    "x}:h:y",
    "{default:0}",
    ":index",
    "größe|🔒",
    "h:",
];
const HOLDERS: &[&str] = &["h1", "h2", "{h}:3"];

fn namespace() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![
            Just(String::new()),
            select(vec!["p0".to_owned(), "p-1.x_Y".to_owned()]),
            "[A-Za-z0-9_.-]{1,64}",
        ]),
        bad(
            "namespace",
            prop_oneof![
                "[A-Za-z0-9]{0,8}[{}:| /\\\\\\x00\\nü🔒][A-Za-z0-9]{0,8}",
                Just("n".repeat(65)),
            ],
        ),
    )
}

fn name() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![
            select(NAMES).prop_map(str::to_owned),
            nonempty_text(MAX_NAME_BYTES)
        ]),
        bad(
            "name",
            prop_oneof![
                Just(String::new()),
                too_long(MAX_NAME_BYTES),
                with_control(MAX_NAME_BYTES)
            ],
        ),
    )
}

/// Acquire's holder: empty means "make one up".
fn optional_holder() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![
            Just(String::new()),
            select(HOLDERS).prop_map(str::to_owned),
            free_text(256)
        ]),
        bad("holder", prop_oneof![too_long(256), with_control(256)]),
    )
}

/// Release's and Extend's holder: required.
fn holder() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![
            select(HOLDERS).prop_map(str::to_owned),
            nonempty_text(256)
        ]),
        bad(
            "holder",
            prop_oneof![Just(String::new()), too_long(256), with_control(256)],
        ),
    )
}

/// Weighted permits (decision 0075): absent, 0 and 1 fit any limit;
/// past 1000 they are past every valid limit (`limit` tops out there).
fn permits() -> BoxedStrategy<Field<Option<u32>>> {
    field(
        ok(prop_oneof![Just(None), Just(Some(0)), Just(Some(1))]),
        bad(
            "permits",
            prop_oneof![Just(Some(u32::MAX)), (1001u32..).prop_map(Some)],
        ),
    )
}

fn limit() -> BoxedStrategy<Field<Option<u32>>> {
    field(
        ok(prop_oneof![
            Just(None),
            (1u32..=3).prop_map(Some),
            (1u32..=1000).prop_map(Some)
        ]),
        bad(
            "limit",
            prop_oneof![
                Just(Some(0)),
                Just(Some(u32::MAX)),
                (1001u32..).prop_map(Some)
            ],
        ),
    )
}

fn ttl_ms() -> BoxedStrategy<Field<Option<u64>>> {
    field(
        ok(prop_oneof![Just(None), (1u64..=3_600_000).prop_map(Some)]),
        bad(
            "ttl_ms",
            prop_oneof![
                Just(Some(0)),
                Just(Some(u64::MAX)),
                (3_600_001u64..).prop_map(Some)
            ],
        ),
    )
}

fn kind() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![Just(String::new()), "[a-z0-9_.-]{1,32}"]),
        bad(
            "kind",
            prop_oneof![
                "[a-z]{0,5}[A-Z |{}:/ü\\x00][a-z]{0,5}",
                Just("k".repeat(33))
            ],
        ),
    )
}

fn metadata() -> BoxedStrategy<Field<HashMap<String, String>>> {
    let key = || nonempty_text(64);
    let value = || prop_oneof!["(?s:.){0,64}", free_text(1024)];
    let big = |n: usize, len: usize| {
        (0..n)
            .map(|i| (format!("k{i}"), "v".repeat(len)))
            .collect::<HashMap<_, _>>()
    };
    field(
        ok(hash_map(key(), value(), 0..5)),
        bad(
            "metadata",
            prop_oneof![
                Just(big(33, 0)),
                Just(big(9, 1000)),
                Just(big(1, 1025)),
                value().prop_map(|v| HashMap::from([(String::new(), v)])),
                with_control(64).prop_map(|k| HashMap::from([(k, String::new())])),
                too_long(64).prop_map(|k| HashMap::from([(k, String::new())])),
            ],
        ),
    )
}

fn wait_ms() -> BoxedStrategy<Field<u64>> {
    field(
        ok(prop_oneof![8 => Just(0u64), 1 => 1u64..=20]),
        bad("wait_ms", prop_oneof![Just(u64::MAX), 600_001u64..]),
    )
}

fn queue_ttl_ms() -> BoxedStrategy<Field<Option<u64>>> {
    field(
        ok(prop_oneof![Just(None), (100u64..=3_600_000).prop_map(Some)]),
        bad(
            "queue_ttl_ms",
            prop_oneof![
                (0u64..100).prop_map(Some),
                Just(Some(u64::MAX)),
                (3_600_001u64..).prop_map(Some)
            ],
        ),
    )
}

fn priority() -> BoxedStrategy<Field<i32>> {
    field(
        ok(-1000i32..=1000),
        bad(
            "priority",
            prop_oneof![Just(i32::MIN), Just(i32::MAX), i32::MIN..-1000, 1001i32..],
        ),
    )
}

fn fencing_token() -> BoxedStrategy<Field<Option<u64>>> {
    field(
        ok(prop_oneof![Just(None), (1u64..).prop_map(Some)]),
        bad("fencing_token", Just(Some(0))),
    )
}

fn max_entries() -> BoxedStrategy<Field<u32>> {
    field(ok(0u32..=1000), bad("max_entries", 1001u32..))
}

fn page_size() -> BoxedStrategy<Field<u32>> {
    field(
        ok(prop_oneof![0u32..=50, Just(1000)]),
        bad("page_size", 1001u32..),
    )
}

fn prefix() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![
            Just(String::new()),
            free_text(16),
            Just(full(512))
        ]),
        bad("prefix", prop_oneof![too_long(512), with_control(32)]),
    )
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn page_token() -> BoxedStrategy<Field<String>> {
    field(
        ok(prop_oneof![
            Just(String::new()),
            (0u32..4, any::<u64>(), free_text(MAX_NAME_BYTES)).prop_map(
                |(node, position, after)| {
                    encode_page_token(&ListCursor {
                        node,
                        position,
                        after,
                    })
                }
            ),
        ]),
        bad(
            "page_token",
            prop_oneof![
                "[A-Za-z0-9_-]{0,10}[!@#$%^&*+/= .ü][A-Za-z0-9_-]{0,10}",
                (20_000u32..).prop_map(|node| base64(format!("{node}.0.0").as_bytes())),
                "[a-z0-9]{1,20}".prop_map(|text| base64(text.as_bytes())),
                Just(base64(b"1\n\xff\xfe")),
                Just(base64(format!("1\n{}", "x".repeat(513)).as_bytes())),
                Just(base64(b"-1\nx")),
            ],
        ),
    )
}

fn older_than_ms() -> BoxedStrategy<Field<Option<u64>>> {
    field(
        ok(prop_oneof![Just(None), (1u64..).prop_map(Some)]),
        bad("older_than_ms", Just(Some(0))),
    )
}

/// A metrics range, relative to now (resolved when sent).
#[derive(Clone, Debug)]
enum Range {
    /// Both 0: the last hour.
    Default,
    /// From `back` ms ago to now.
    Recent { back: i64 },
    /// Raw values.
    Raw { from: i64, to: i64 },
    /// From `ahead` ms after now to now (from after to).
    Reversed { ahead: i64 },
    /// From 25 hours ago (longer than the retention).
    TooLong,
}

fn range() -> BoxedStrategy<Field<Range>> {
    field(
        ok(prop_oneof![
            Just(Range::Default),
            (0i64..600_000).prop_map(|back| Range::Recent { back }),
            Just(Range::Raw { from: 1, to: 1 }),
            Just(Range::Raw {
                from: i64::MAX - 120_000,
                to: i64::MAX
            }),
        ]),
        prop_oneof![
            bad(
                "from_ms",
                prop_oneof![Just(i64::MIN), i64::MIN..0]
                    .prop_map(|from| Range::Raw { from, to: 0 })
            ),
            bad(
                "to_ms",
                prop_oneof![Just(i64::MIN), Just(-1), i64::MIN..0]
                    .prop_map(|to| Range::Raw { from: 0, to })
            ),
            bad(
                "from_ms",
                (1i64..1_000_000).prop_map(|ahead| Range::Reversed { ahead })
            ),
            bad("from_ms", Just(Range::TooLong)),
        ]
        .boxed(),
    )
}

#[derive(Clone, Debug)]
enum Op {
    Acquire(proto::AcquireRequest),
    Release(proto::ReleaseRequest),
    Extend(proto::ExtendRequest),
    Inspect(proto::InspectRequest),
    Queue(proto::QueueRequest),
    List(proto::ListRequest),
    Reap(proto::ReapRequest),
    Metrics {
        namespace: String,
        range: Range,
        kind: String,
    },
    Watch(proto::WatchRequest),
    Clear(proto::ClearRequest),
}

/// A request and the fields broken in it.
#[derive(Clone, Debug)]
struct Case {
    op: Op,
    broken: Vec<&'static str>,
}

fn broken(fields: &[Option<&'static str>]) -> Vec<&'static str> {
    fields.iter().flatten().copied().collect()
}

fn acquire_case() -> impl Strategy<Value = Case> {
    (
        (
            namespace(),
            name(),
            optional_holder(),
            limit(),
            ttl_ms(),
            kind(),
        ),
        (
            metadata(),
            wait_ms(),
            queue_ttl_ms(),
            priority(),
            any::<Option<bool>>(),
            permits(),
        ),
    )
        .prop_map(
            |(
                (ns, name, holder, limit, ttl, kind),
                (metadata, wait, queue_ttl, priority, fair, permits),
            )| {
                Case {
                    broken: broken(&[
                        ns.1,
                        name.1,
                        holder.1,
                        limit.1,
                        ttl.1,
                        kind.1,
                        metadata.1,
                        wait.1,
                        queue_ttl.1,
                        priority.1,
                        permits.1,
                    ]),
                    op: Op::Acquire(proto::AcquireRequest {
                        namespace: ns.0,
                        name: name.0,
                        holder: holder.0,
                        limit: limit.0,
                        ttl_ms: ttl.0,
                        kind: kind.0,
                        metadata: metadata.0,
                        wait_ms: wait.0,
                        queue_ttl_ms: queue_ttl.0,
                        priority: priority.0,
                        fair,
                        mode: 0,
                        prefer_readers: false,
                        permits: permits.0,
                        names: Vec::new(),
                        takes_over: String::new(),
                    }),
                }
            },
        )
}

fn lock_case() -> impl Strategy<Value = Case> {
    (
        namespace(),
        name(),
        holder(),
        fencing_token(),
        ttl_ms(),
        max_entries(),
        0..5u8,
    )
        .prop_map(|(ns, name, holder, token, ttl, most, which)| {
            let lock = [ns.1, name.1];
            match which {
                0 => Case {
                    broken: broken(&[lock[0], lock[1], holder.1, token.1]),
                    op: Op::Release(proto::ReleaseRequest {
                        namespace: ns.0,
                        name: name.0,
                        holder: holder.0,
                        fencing_token: token.0,
                        names: Vec::new(),
                        fencing_tokens: Vec::new(),
                    }),
                },
                1 => Case {
                    broken: broken(&[lock[0], lock[1], holder.1, ttl.1, token.1]),
                    op: Op::Extend(proto::ExtendRequest {
                        namespace: ns.0,
                        name: name.0,
                        holder: holder.0,
                        ttl_ms: ttl.0,
                        fencing_token: token.0,
                        names: Vec::new(),
                        fencing_tokens: Vec::new(),
                    }),
                },
                2 => Case {
                    broken: broken(&lock),
                    op: Op::Inspect(proto::InspectRequest {
                        namespace: ns.0,
                        name: name.0,
                    }),
                },
                3 => Case {
                    broken: broken(&[lock[0], lock[1], most.1]),
                    op: Op::Queue(proto::QueueRequest {
                        namespace: ns.0,
                        name: name.0,
                        max_entries: most.0,
                    }),
                },
                _ => {
                    // Watch: an empty name means "by prefix", so it is valid here.
                    let (name, name_broken) = match name {
                        (n, Some(_)) if n.is_empty() => (n, None),
                        other => other,
                    };
                    Case {
                        broken: broken(&[lock[0], name_broken]),
                        op: Op::Watch(proto::WatchRequest {
                            namespace: ns.0,
                            name,
                            prefix: String::new(),
                            initial_state: false,
                        }),
                    }
                }
            }
        })
}

fn namespace_case() -> impl Strategy<Value = Case> {
    (
        namespace(),
        prefix(),
        page_size(),
        page_token(),
        any::<bool>(),
        older_than_ms(),
        range(),
        kind(),
        0..4u8,
    )
        .prop_map(
            |(ns, prefix, size, token, only_waiting, older, range, kind, which)| match which {
                0 => Case {
                    broken: broken(&[ns.1, prefix.1, size.1, token.1]),
                    op: Op::List(proto::ListRequest {
                        namespace: ns.0,
                        prefix: prefix.0,
                        page_size: size.0,
                        page_token: token.0,
                        only_waiting,
                    }),
                },
                1 => Case {
                    broken: broken(&[ns.1, older.1]),
                    op: Op::Reap(proto::ReapRequest {
                        namespace: ns.0,
                        older_than_ms: older.0,
                    }),
                },
                2 => Case {
                    broken: broken(&[ns.1, range.1, kind.1]),
                    op: Op::Metrics {
                        namespace: ns.0,
                        range: range.0,
                        kind: kind.0,
                    },
                },
                _ => {
                    // Clear only ever runs on throwaway namespaces.
                    let namespace = match ns {
                        (ns, None) => format!("scratch-{}", ns.len() % 4),
                        (ns, Some(_)) => ns,
                    };
                    Case {
                        broken: broken(&[ns_broken(&namespace)]),
                        op: Op::Clear(proto::ClearRequest { namespace }),
                    }
                }
            },
        )
}

fn ns_broken(namespace: &str) -> Option<&'static str> {
    tumbler::service::validate::namespace(namespace)
        .is_err()
        .then_some("namespace")
}

fn any_case() -> impl Strategy<Value = Case> {
    prop_oneof![
        4 => acquire_case(),
        4 => lock_case(),
        2 => namespace_case(),
    ]
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn request<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    // A hang is a failure too (the longest valid wait here is 20 ms).
    request.set_timeout(Duration::from_secs(30));
    request
}

/// Sends one request; checks what a successful reply promises.
async fn send(mut client: LockServiceClient<Channel>, op: Op) -> Result<(), Status> {
    let wrong = |what: String| Status::internal(format!("reply check failed: {what}"));
    match op {
        Op::Acquire(req) => {
            let reply = client.acquire(request(req.clone())).await?.into_inner();
            if reply.status() == proto::AcquireStatus::Acquired {
                let grant = reply.grant.ok_or_else(|| wrong("no grant".into()))?;
                if grant.metadata != req.metadata {
                    return Err(wrong(format!("metadata came back as {:?}", grant.metadata)));
                }
                let kind = if req.kind.is_empty() {
                    "default"
                } else {
                    &req.kind
                };
                let limit = req.limit.unwrap_or(1);
                if grant.kind != kind || grant.slot == 0 || grant.slot > limit {
                    return Err(wrong(format!("grant {grant:?}")));
                }
                if !req.holder.is_empty() && grant.holder != req.holder {
                    return Err(wrong(format!("holder {:?}", grant.holder)));
                }
            }
        }
        Op::Release(req) => {
            client.release(request(req)).await?;
        }
        Op::Extend(req) => {
            client.extend(request(req)).await?;
        }
        Op::Inspect(req) => {
            let reply = client.inspect(request(req.clone())).await?.into_inner();
            if reply.name != req.name {
                return Err(wrong(format!("name came back as {:?}", reply.name)));
            }
        }
        Op::Queue(req) => {
            client.queue(request(req)).await?;
        }
        Op::List(req) => {
            let reply = client.list(request(req.clone())).await?.into_inner();
            if let Some(lock) = reply
                .locks
                .iter()
                .find(|l| !l.name.starts_with(&req.prefix))
            {
                return Err(wrong(format!("{:?} outside prefix", lock.name)));
            }
        }
        Op::Reap(req) => {
            client.reap(request(req)).await?;
        }
        Op::Metrics {
            namespace,
            range,
            kind,
        } => {
            let now = unix_ms();
            let (from_ms, to_ms) = match range {
                Range::Default => (0, 0),
                Range::Recent { back } => (now - back, now),
                Range::Raw { from, to } => (from, to),
                Range::Reversed { ahead } => (now + ahead, now),
                Range::TooLong => (now - 25 * 3600 * 1000, 0),
            };
            client
                .metrics(request(proto::MetricsRequest {
                    namespace,
                    from_ms,
                    to_ms,
                    kind,
                }))
                .await?;
        }
        Op::Watch(req) => {
            // Opening is what validates; the stream is dropped at once.
            drop(client.watch(request(req)).await?);
        }
        Op::Clear(req) => {
            client.clear(request(req)).await?;
        }
    }
    Ok(())
}

/// `message` starts with `field` followed by ':' or ' ' ("metadata key: …").
fn names(status: &Status, field: &str) -> bool {
    status
        .message()
        .strip_prefix(field)
        .is_some_and(|rest| rest.starts_with(':') || rest.starts_with(' '))
}

fn judge(case: &Case, result: Result<(), Status>) -> Result<(), TestCaseError> {
    let fail = |what: String| Err(TestCaseError::fail(format!("{what}\n  for {case:?}")));
    match result {
        Ok(()) if case.broken.is_empty() => Ok(()),
        Ok(()) => fail(format!("accepted although {:?} broken", case.broken)),
        Err(status) if status.code() == Code::InvalidArgument => match case.broken.as_slice() {
            [] => fail(format!("refused a valid request: {status:?}")),
            [field] if !names(&status, field) => {
                fail(format!("should name {field}: {:?}", status.message()))
            }
            fields if !fields.iter().any(|f| names(&status, f)) => fail(format!(
                "should name one of {fields:?}: {:?}",
                status.message()
            )),
            _ => Ok(()),
        },
        // Documented answer to load (a full queue), not to bad input.
        Err(status) if status.code() == Code::ResourceExhausted && case.broken.is_empty() => Ok(()),
        // Documented answer to a valid Acquire whose limit differs from the
        // lock's (random requests reuse names with random limits).
        Err(status)
            if status.code() == Code::FailedPrecondition
                && case.broken.is_empty()
                && matches!(case.op, Op::Acquire(_))
                && status.message().contains("is in use with limit") =>
        {
            Ok(())
        }
        Err(status) => fail(format!("unexpected status {status:?}")),
    }
}

/// Panics on the server's threads (tokio workers), recorded by a hook.
fn server_panics() -> &'static Mutex<Vec<String>> {
    static PANICS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    PANICS.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if thread.name().is_some_and(|n| n.starts_with("tokio-"))
                && let Some(panics) = PANICS.get()
            {
                panics.lock().unwrap().push(info.to_string());
            }
            previous(info);
        }));
        Mutex::new(Vec::new())
    })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES)
}

#[test]
fn random_requests_get_ok_or_invalid_argument_naming_the_broken_field() {
    server_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, clients) = rt.block_on(async {
        let server = TestServer::new().shards(SHARDS).start().await;
        // One connection per request of a batch, as separate clients
        // would have.
        let mut clients = Vec::new();
        for _ in 0..MAX_BATCH {
            clients.push(server.client().await);
        }
        (server, clients)
    });

    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&vec(any_case(), 1..=MAX_BATCH), |batch| {
        sent.fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed);
        let results = rt.block_on(futures::future::join_all(
            batch
                .iter()
                .zip(&clients)
                .map(|(case, client)| send(client.clone(), case.op.clone())),
        ));
        for (case, result) in batch.iter().zip(results) {
            judge(case, result)?;
        }
        Ok(())
    });
    println!(
        "{} random requests in {} cases",
        sent.load(std::sync::atomic::Ordering::Relaxed),
        cases()
    );
    if let Err(err) = outcome {
        panic!("{err}");
    }

    rt.block_on(async {
        assert_eq!(server.health("").await.unwrap(), ServingStatus::Serving);
        // And it still grants locks.
        let mut client = server.client().await;
        let reply = client
            .acquire(acquire("after-the-storm", "h"))
            .await
            .unwrap();
        assert_eq!(reply.into_inner().status(), proto::AcquireStatus::Acquired);
    });
    let panics = server_panics().lock().unwrap();
    assert!(panics.is_empty(), "the server panicked: {panics:#?}");
    drop(server);
    drop(rt);
}

/// The names of the locks that a listing of `namespace` returns, following
/// page tokens from `token` to the end (at most `pages` pages).
async fn list_names(
    client: &mut LockServiceClient<Channel>,
    namespace: &str,
    prefix: &str,
    token: String,
    pages: usize,
) -> Result<Vec<String>, Status> {
    let mut names = Vec::new();
    let mut token = token;
    for _ in 0..pages {
        let reply = client
            .list(proto::ListRequest {
                namespace: namespace.into(),
                prefix: prefix.into(),
                page_size: 7,
                page_token: token,
                only_waiting: false,
            })
            .await?
            .into_inner();
        names.extend(reply.locks.into_iter().map(|l| l.name));
        if reply.next_page_token.is_empty() {
            break;
        }
        token = reply.next_page_token;
    }
    Ok(names)
}

/// How a genuine page token is damaged.
#[derive(Clone, Debug)]
enum Tamper {
    /// Flip bits of one byte of the token text.
    FlipText { at: prop::sample::Index, bits: u8 },
    /// Flip bits of one byte of the decoded token, re-encode.
    FlipDecoded { at: prop::sample::Index, bits: u8 },
    /// Replace the decoded token's SCAN position.
    Position(u64),
    /// Replace the decoded token's last key.
    After(String),
    /// Replace the decoded token's node.
    Node(u32),
    /// Cut the token short.
    Truncate(prop::sample::Index),
    /// Use a token issued for the other namespace.
    Foreign,
    /// Random text.
    Random(String),
}

fn tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..).prop_map(|(at, bits)| Tamper::FlipText { at, bits }),
        (any::<prop::sample::Index>(), 1u8..)
            .prop_map(|(at, bits)| Tamper::FlipDecoded { at, bits }),
        prop_oneof![Just(0), Just(1), any::<u64>()].prop_map(Tamper::Position),
        prop_oneof![
            free_text(600),
            select(vec![
                "tumbler:{tb:0}:l:tb-00".to_owned(),
                "tumbler:{ta:9}:l:ta-99".to_owned(),
                String::new()
            ]),
            "(?s:.){0,20}",
        ]
        .prop_map(Tamper::After),
        prop_oneof![0u32..4, Just(u32::MAX)].prop_map(Tamper::Node),
        any::<prop::sample::Index>().prop_map(Tamper::Truncate),
        Just(Tamper::Foreign),
        "(?s:.){0,40}".prop_map(Tamper::Random),
    ]
}

fn decoded(token: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .unwrap()
}

fn apply(tamper: &Tamper, token: &str, foreign: &str) -> String {
    match tamper {
        Tamper::FlipText { at, bits } => {
            let mut bytes = token.as_bytes().to_vec();
            let i = at.index(bytes.len());
            bytes[i] ^= bits;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Tamper::FlipDecoded { at, bits } => {
            let mut bytes = decoded(token);
            let i = at.index(bytes.len());
            bytes[i] ^= bits;
            base64(&bytes)
        }
        Tamper::Position(position) => {
            let text = String::from_utf8(decoded(token)).unwrap();
            let parts: Vec<&str> = text.splitn(3, '.').collect();
            base64(format!("{}.{position}.{}", parts[0], parts[2]).as_bytes())
        }
        Tamper::After(after) => {
            let text = String::from_utf8(decoded(token)).unwrap();
            let parts: Vec<&str> = text.splitn(3, '.').collect();
            base64(format!("{}.{}.{after}", parts[0], parts[1]).as_bytes())
        }
        Tamper::Node(node) => {
            let text = String::from_utf8(decoded(token)).unwrap();
            let parts: Vec<&str> = text.splitn(3, '.').collect();
            base64(format!("{node}.{}.{}", parts[1], parts[2]).as_bytes())
        }
        Tamper::Truncate(at) => token[..at.index(token.len() + 1)].to_owned(),
        Tamper::Foreign => foreign.to_owned(),
        Tamper::Random(text) => text.clone(),
    }
}

/// Page tokens carry only a SCAN position (node, cursor, skip); the namespace
/// (and prefix) come from the request. So a tampered token is either
/// refused (INVALID_ARGUMENT naming page_token) or lists locks of the
/// request's own namespace, within its prefix: never another namespace's.
#[test]
fn tampered_page_tokens_never_reach_another_namespace() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, mut client, tokens) = rt.block_on(async {
        let server = TestServer::new().shards(SHARDS).start().await;
        let mut client = server.client().await;
        for ns in ["ta", "tb"] {
            for i in 0..40 {
                let req = proto::AcquireRequest {
                    namespace: ns.into(),
                    ..acquire(&format!("{ns}-{i:02}"), "h")
                };
                let reply = client.acquire(req).await.unwrap().into_inner();
                assert_eq!(reply.status(), proto::AcquireStatus::Acquired);
            }
        }
        // Genuine tokens of both namespaces, page by page.
        let mut tokens: HashMap<&str, Vec<String>> = HashMap::new();
        for ns in ["ta", "tb"] {
            let request = proto::ListRequest {
                namespace: ns.into(),
                page_size: 7,
                ..Default::default()
            };
            let pages = list_pages(&mut client, request).await;
            tokens.insert(
                ns,
                (pages.into_iter().map(|page| page.next_page_token))
                    .filter(|token| !token.is_empty())
                    .collect(),
            );
        }
        (server, client, tokens)
    });
    let expected =
        |ns: &str| -> BTreeSet<String> { (0..40).map(|i| format!("{ns}-{i:02}")).collect() };
    let all = [("ta", expected("ta")), ("tb", expected("tb"))];
    for (ns, names) in &all {
        let listed = rt
            .block_on(list_names(&mut client, ns, "", String::new(), 100))
            .unwrap();
        assert_eq!(&listed.iter().cloned().collect::<BTreeSet<_>>(), names);
        assert_eq!(listed.len(), names.len(), "each lock exactly once");
    }

    let mut runner = TestRunner::new(Config {
        cases: 600,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        any::<bool>(),
        any::<prop::sample::Index>(),
        tamper(),
        prop_oneof![
            Just(String::new()),
            Just("ta-1".to_owned()),
            Just("tb-1".to_owned()),
            Just("t".to_owned())
        ],
    );
    let (refused, accepted) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    runner
        .run(&strategy, |(first, which, tamper, prefix)| {
            let (ns, other) = if first { ("ta", "tb") } else { ("tb", "ta") };
            let own = &tokens[ns];
            let token = which.get(own);
            let foreign = which.get(&tokens[other]);
            let tampered = apply(&tamper, token, foreign);
            let mut client = client.clone();
            let listed = rt.block_on(list_names(&mut client, ns, &prefix, tampered.clone(), 20));
            match listed {
                Err(status) => {
                    prop_assert_eq!(status.code(), Code::InvalidArgument, "{:?}", status);
                    prop_assert!(names(&status, "page_token"), "{:?}", status);
                    refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(listed) => {
                    let own_names = &all.iter().find(|(n, _)| *n == ns).unwrap().1;
                    for name in &listed {
                        prop_assert!(
                            own_names.contains(name) && name.starts_with(&prefix),
                            "{:?} listed in {} with prefix {:?} from token {:?}",
                            name,
                            ns,
                            prefix,
                            tampered
                        );
                    }
                    accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Ok(())
        })
        .unwrap();
    println!(
        "tampered tokens: {} refused, {} listed the request's own namespace",
        refused.into_inner(),
        accepted.into_inner()
    );
    drop(server);
    drop(rt);
}

/// The fuzz targets' checks, on stable: random bytes through every one.
#[test]
fn fuzz_checks_hold_on_random_bytes() {
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    for (name, check) in fuzz_checks::TARGETS {
        runner
            .run(&vec(any::<u8>(), 0..4096), |bytes| {
                check(&bytes);
                Ok(())
            })
            .unwrap_or_else(|err| panic!("fuzz check {name}: {err}"));
    }
}

/// The fuzz targets' checks, on stable: every committed seed input (and
/// any crash reproducer added to `fuzz/seeds/<target>/`).
#[test]
fn fuzz_checks_hold_on_the_seed_corpus() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut ran = 0;
    for (name, check) in fuzz_checks::TARGETS {
        let dir = seeds.join(name);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        for entry in entries {
            let path = entry.unwrap().path();
            check(&std::fs::read(&path).unwrap());
            ran += 1;
        }
    }
    assert!(ran > 0, "no seeds found in {seeds:?}");
}
