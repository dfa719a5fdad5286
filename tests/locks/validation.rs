//! Bad input gets INVALID_ARGUMENT naming the field and the rule, over the
//! real gRPC API, and writes nothing to Redis.

use crate::common;

use common::*;
use tonic::Code;

fn rejected(result: Result<tonic::Response<impl std::fmt::Debug>, tonic::Status>, field: &str) {
    let status = result.expect_err(&format!("{field} should be rejected"));
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert!(
        status.message().starts_with(field),
        "message should name {field}: {}",
        status.message()
    );
    println!("{:<14} {}", field, status.message());
}

#[tokio::test]
async fn every_rule_names_its_field_and_nothing_is_written() {
    let redis = start_redis();
    let server = TestServer::new().redis(&redis.url()).start().await;
    let mut client = server.client().await;
    let ok = || acquire("valid-name", "h");

    let cases: Vec<(&str, proto::AcquireRequest)> = vec![
        (
            "name",
            proto::AcquireRequest {
                name: String::new(),
                ..ok()
            },
        ),
        (
            "name",
            proto::AcquireRequest {
                name: "x".repeat(513),
                ..ok()
            },
        ),
        (
            "name",
            proto::AcquireRequest {
                name: "bad\u{0}name".into(),
                ..ok()
            },
        ),
        (
            "name",
            proto::AcquireRequest {
                name: "tab\there".into(),
                ..ok()
            },
        ),
        (
            "namespace",
            proto::AcquireRequest {
                namespace: "a:b".into(),
                ..ok()
            },
        ),
        (
            "namespace",
            proto::AcquireRequest {
                namespace: "{x}".into(),
                ..ok()
            },
        ),
        (
            "namespace",
            proto::AcquireRequest {
                namespace: "n".repeat(65),
                ..ok()
            },
        ),
        (
            "holder",
            proto::AcquireRequest {
                holder: "h".repeat(257),
                ..ok()
            },
        ),
        (
            "holder",
            proto::AcquireRequest {
                holder: "line\nbreak".into(),
                ..ok()
            },
        ),
        (
            "limit",
            proto::AcquireRequest {
                limit: Some(0),
                ..ok()
            },
        ),
        (
            "limit",
            proto::AcquireRequest {
                limit: Some(1001),
                ..ok()
            },
        ),
        (
            "ttl_ms",
            proto::AcquireRequest {
                ttl_ms: Some(0),
                ..ok()
            },
        ),
        (
            "ttl_ms",
            proto::AcquireRequest {
                ttl_ms: Some(3_600_001),
                ..ok()
            },
        ),
        (
            "kind",
            proto::AcquireRequest {
                kind: "Upper".into(),
                ..ok()
            },
        ),
        (
            "kind",
            proto::AcquireRequest {
                kind: "k".repeat(33),
                ..ok()
            },
        ),
        (
            "kind",
            proto::AcquireRequest {
                kind: "a|b".into(),
                ..ok()
            },
        ),
        (
            "metadata",
            proto::AcquireRequest {
                metadata: (0..33).map(|i| (format!("k{i}"), "v".into())).collect(),
                ..ok()
            },
        ),
        (
            "metadata",
            proto::AcquireRequest {
                metadata: [("k".to_string(), "v".repeat(1025))].into(),
                ..ok()
            },
        ),
        (
            "metadata",
            proto::AcquireRequest {
                metadata: (0..10)
                    .map(|i| (format!("k{i}"), "v".repeat(1000)))
                    .collect(),
                ..ok()
            },
        ),
        (
            "metadata",
            proto::AcquireRequest {
                metadata: [(String::new(), "v".into())].into(),
                ..ok()
            },
        ),
        (
            "metadata key",
            proto::AcquireRequest {
                metadata: [("k".repeat(65), "v".into())].into(),
                ..ok()
            },
        ),
        // Weighted permits (decision 0075): past the limit (absent: 1),
        // or more than one with a read/write mode.
        (
            "permits",
            proto::AcquireRequest {
                permits: Some(2),
                ..ok()
            },
        ),
        (
            "permits",
            proto::AcquireRequest {
                limit: Some(3),
                permits: Some(4),
                ..ok()
            },
        ),
        (
            "permits",
            proto::AcquireRequest {
                limit: Some(3),
                permits: Some(2),
                mode: proto::LockMode::Write as i32,
                ..ok()
            },
        ),
    ];
    for (field, request) in cases {
        rejected(client.acquire(request).await, field);
    }

    rejected(client.release(release("", "h")).await, "name");
    rejected(client.release(release("n", "")).await, "holder");
    rejected(
        client
            .release(proto::ReleaseRequest {
                fencing_token: Some(0),
                ..release("n", "h")
            })
            .await,
        "fencing_token",
    );
    let extend = |ttl| proto::ExtendRequest {
        name: "n".into(),
        holder: "h".into(),
        ttl_ms: ttl,
        ..Default::default()
    };
    rejected(client.extend(extend(Some(0))).await, "ttl_ms");
    rejected(client.extend(extend(Some(3_600_001))).await, "ttl_ms");
    rejected(
        client
            .extend(proto::ExtendRequest {
                holder: String::new(),
                ..extend(None)
            })
            .await,
        "holder",
    );
    rejected(client.inspect(inspect("")).await, "name");
    rejected(
        client
            .inspect(proto::InspectRequest {
                namespace: "white space".into(),
                name: "n".into(),
            })
            .await,
        "namespace",
    );

    // Nothing reached Redis but the server's own records: the layout and
    // the function library it uses.
    let mut conn = redis_conn(&redis.url()).await;
    let mut keys = scan_keys(&mut conn, "*").await;
    keys.retain(|k| k != "tumbler:libraries");
    assert_eq!(keys, ["tumbler:meta"]);

    // The limits are inclusive: the largest allowed values are accepted.
    let edge = proto::AcquireRequest {
        name: "x".repeat(512),
        holder: "h".repeat(256),
        limit: Some(1000),
        ttl_ms: Some(3_600_000),
        kind: "k".repeat(32),
        metadata: (0..8)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect(),
        ..Default::default()
    };
    let reply = client.acquire(edge).await.unwrap().into_inner();
    assert_eq!(reply.status(), proto::AcquireStatus::Acquired);
}
