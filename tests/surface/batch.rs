//! Batch at the door (decision 0087): each item is checked against the
//! caller's namespaces as its own call would be, each counts against the
//! token's request rate (a batch past it is refused whole, before any item
//! runs), and Connect JSON from `curl` carries it like any unary call.

use crate::auth::{TEAM_A, bearer, entry, setup_with, tokens_file};
use crate::common;
use crate::connect::call;

use common::{TestServer, acquire, inspect, proto};
use proto::batch_item::Call;
use proto::batch_result::Result as Answer;
use serde_json::json;
use tonic::Code;

fn acquiring(namespace: &str, name: &str) -> proto::BatchItem {
    proto::BatchItem {
        call: Some(Call::Acquire(proto::AcquireRequest {
            namespace: namespace.into(),
            ..acquire(name, "jid")
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_outside_the_tokens_namespaces_is_refused_alone() {
    let s = setup_with(&tokens_file()).await;
    let mut c = bearer(&s.server, TEAM_A).await;
    let reply = c
        .batch(proto::BatchRequest {
            items: vec![
                acquiring("team-a", "ours"),
                acquiring("team-b", "theirs"),
                acquiring("team-a", "ours-too"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let answers: Vec<_> = reply.results.iter().map(|r| r.result.clone()).collect();
    assert!(
        matches!(&answers[0], Some(Answer::Acquire(a)) if a.status() == proto::AcquireStatus::Acquired),
        "{answers:?}"
    );
    assert!(
        matches!(&answers[1], Some(Answer::Error(e)) if e.code == Code::PermissionDenied as i32),
        "{answers:?}"
    );
    assert!(
        matches!(&answers[2], Some(Answer::Acquire(a)) if a.status() == proto::AcquireStatus::Acquired),
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_item_counts_against_the_tokens_request_rate() {
    let five = entry(
        "five",
        "five-secret",
        "client",
        r#"["team-a"]"#,
        "requests_per_second = 5",
    );
    let s = setup_with(&format!("{}{five}", tokens_file())).await;
    let mut c = bearer(&s.server, "five-secret").await;
    let items = (0..20)
        .map(|i| acquiring("team-a", &format!("bulk-{i}")))
        .collect();
    let status = c.batch(proto::BatchRequest { items }).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // Refused whole: not one of the 20 ran.
    let mut admin = bearer(&s.server, crate::auth::ADMIN).await;
    for i in 0..20 {
        let state = admin
            .inspect(proto::InspectRequest {
                namespace: "team-a".into(),
                ..inspect(&format!("bulk-{i}"))
            })
            .await
            .unwrap()
            .into_inner();
        assert!(state.holders.is_empty(), "bulk-{i}: {state:?}");
    }
}

#[tokio::test]
async fn curl_sends_a_batch_over_connect_json() {
    let server = TestServer::new().start().await;
    let answer = call(
        &server,
        "Batch",
        json!({"items": [
            {"acquire": {"name": "report-1", "holder": "jid-1", "ttlMs": "30000"}},
            {"acquire": {"name": "report-1", "holder": "jid-2"}},
            {"release": {"name": "report-1", "holder": "jid-1"}},
            {"acquire": {"name": "", "holder": "jid-3"}}
        ]}),
        &[],
    )
    .await;
    assert_eq!(answer.status, 200);
    let body = answer.json();
    let results = body["results"].as_array().expect("results");
    assert_eq!(
        results[0]["acquire"]["status"], "ACQUIRE_STATUS_ACQUIRED",
        "{body}"
    );
    assert_eq!(
        results[1]["acquire"]["reason"], "NOT_ACQUIRED_REASON_BUSY",
        "{body}"
    );
    assert_eq!(
        results[2]["release"]["status"], "RELEASE_STATUS_RELEASED",
        "{body}"
    );
    assert_eq!(
        results[3]["error"]["code"],
        Code::InvalidArgument as i32,
        "{body}"
    );
    assert!(
        results[3]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("name"),
        "{body}"
    );

    // Refused whole: Connect's own error, HTTP 400, naming `items`.
    let refused = call(&server, "Batch", json!({"items": []}), &[]).await;
    assert_eq!(refused.status, 400);
    let body = refused.json();
    assert_eq!(body["code"], "invalid_argument", "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("items"),
        "{body}"
    );
}
