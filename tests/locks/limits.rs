//! Resource limits: each one answers RESOURCE_EXHAUSTED (or, for HTTP/2
//! streams, makes the client wait) and the server stays healthy: request
//! size, streams per connection, waiters per namespace, locks per
//! namespace, sessions and watchers per replica; and the per-tenant
//! quotas that keep one token (or namespace) from using those pools up.

use crate::common;

use std::time::Duration;

use common::{
    TestServer, acquire, proto, release, service_args, start_redis, until_waiters, until_waiters_in,
};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler::config::ServiceArgs;

async fn server_with(args: ServiceArgs) -> (tumbler::dev::RedisServer, TestServer) {
    let redis = start_redis();
    let server = TestServer::new()
        .redis(&redis.url())
        .args(args)
        .start()
        .await;
    (redis, server)
}

async fn assert_healthy(server: &TestServer) {
    assert_eq!(server.health("").await.unwrap(), ServingStatus::Serving);
    let mut client = server.client().await;
    let answer = client.inspect(common::inspect("still-fine")).await;
    assert!(answer.is_ok(), "{answer:?}");
}

fn waiting(name: &str, holder: &str, namespace: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        namespace: namespace.into(),
        wait_ms: 30_000,
        ..acquire(name, holder)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_size_limit_is_resource_exhausted() {
    let (_redis, server) = server_with(ServiceArgs {
        max_request_bytes: 2048,
        ..service_args()
    })
    .await;
    let mut client = server.client().await;
    // Valid by every field rule (4 values of 1000 bytes), too big in all.
    let mut big = acquire("big", "h");
    big.metadata = (0..4)
        .map(|i| (format!("k{i}"), "v".repeat(1000)))
        .collect();
    let refused = client.acquire(big).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("2048"), "{}", refused.message());
    // The first message of a session is held to the same limit.
    let open = proto::SessionRequest {
        command: Some(proto::session_request::Command::Acquire(
            proto::SessionAcquire {
                request_id: 1,
                acquire: Some(proto::AcquireRequest {
                    name: "n".repeat(3000),
                    ..Default::default()
                }),
            },
        )),
    };
    let outbound = tokio_stream::iter([open]).chain(tokio_stream::pending());
    let refused = client.session(outbound).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // A request under the limit is served as usual.
    let small = client.acquire(acquire("small", "h")).await.unwrap();
    assert_eq!(small.into_inner().status(), proto::AcquireStatus::Acquired);
    assert_healthy(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_open_more_streams_than_the_limit() {
    let (_redis, server) = server_with(ServiceArgs {
        max_concurrent_streams: 2,
        ..service_args()
    })
    .await;
    let mut observer = server.client().await;
    observer.acquire(acquire("s", "owner")).await.unwrap();

    // Three waiting acquires over one connection: only two streams open.
    let shared = server.client().await;
    let mut calls = tokio::task::JoinSet::new();
    for (queued, holder) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let mut client = shared.clone();
        calls.spawn(async move {
            client
                .acquire(waiting("s", holder, ""))
                .await
                .map(|r| r.into_inner().status())
        });
        // Arrival order w1, w2; then w3 waits for a stream.
        if queued < 2 {
            until_waiters(&mut observer, "s", queued as u32 + 1).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let holders = queued_holders(&mut observer, "s").await;
    assert_eq!(
        holders,
        ["w1", "w2"],
        "the third stream must wait for a free one"
    );

    // A grant ends w1's stream: w3's request gets through.
    observer.release(release("s", "owner")).await.unwrap();
    let first = calls.join_next().await.unwrap().unwrap().unwrap();
    assert_eq!(first, proto::AcquireStatus::Acquired);
    until_waiters(&mut observer, "s", 2).await;
    let holders = queued_holders(&mut observer, "s").await;
    assert_eq!(holders, ["w2", "w3"]);
    calls.abort_all();
    assert_healthy(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_cannot_take_more_than_its_share_of_waiters() {
    let (_redis, server) = server_with(ServiceArgs {
        max_waiters_per_namespace: 2,
        ..service_args()
    })
    .await;
    let mut client = server.client().await;
    for namespace in ["greedy", "polite"] {
        client
            .acquire(proto::AcquireRequest {
                namespace: namespace.into(),
                ..acquire("busy", "owner")
            })
            .await
            .unwrap();
    }
    let mut waits = tokio::task::JoinSet::new();
    for holder in ["w1", "w2"] {
        let mut c = client.clone();
        waits.spawn(async move { c.acquire(waiting("busy", holder, "greedy")).await });
    }
    let mut observer = client.clone();
    until_waiters_in(&mut observer, "greedy", "busy", 2).await;
    let refused = client
        .acquire(waiting("busy", "w3", "greedy"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("namespace"),
        "{}",
        refused.message()
    );
    // Another namespace still waits.
    let mut c = client.clone();
    waits.spawn(async move { c.acquire(waiting("busy", "p1", "polite")).await });
    until_waiters_in(&mut observer, "polite", "busy", 1).await;
    waits.abort_all();
    assert_healthy(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_at_its_lock_limit_takes_no_new_lock() {
    let (_redis, server) = server_with(ServiceArgs {
        shards: 1,
        max_locks_per_namespace: 3,
        max_limit: 10,
        ..service_args()
    })
    .await;
    let mut client = server.client().await;
    let semaphore = |name: &str, holder: &str| proto::AcquireRequest {
        limit: Some(2),
        ..acquire(name, holder)
    };
    for name in ["l1", "l2", "l3"] {
        let granted = client.acquire(semaphore(name, "a")).await.unwrap();
        assert_eq!(
            granted.into_inner().status(),
            proto::AcquireStatus::Acquired
        );
    }
    for request in [acquire("l4", "a"), waiting("l4", "a", "")] {
        let refused = client.acquire(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        assert!(
            refused.message().contains("lock limit"),
            "{}",
            refused.message()
        );
    }
    // Existing locks still take holders; other namespaces are not counted.
    let more = client.acquire(semaphore("l1", "b")).await.unwrap();
    assert_eq!(more.into_inner().status(), proto::AcquireStatus::Acquired);
    let elsewhere = client
        .acquire(proto::AcquireRequest {
            namespace: "other".into(),
            ..acquire("l4", "a")
        })
        .await
        .unwrap();
    assert_eq!(
        elsewhere.into_inner().status(),
        proto::AcquireStatus::Acquired
    );
    // A lock that is gone frees its place.
    client.release(release("l2", "a")).await.unwrap();
    let granted = client.acquire(acquire("l4", "a")).await.unwrap();
    assert_eq!(
        granted.into_inner().status(),
        proto::AcquireStatus::Acquired
    );
    assert_healthy(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_watchers_per_replica_are_bounded() {
    let (_redis, server) = server_with(ServiceArgs {
        max_sessions: 1,
        max_watchers: 1,
        ..service_args()
    })
    .await;
    let mut client = server.client().await;
    // A session whose client side closes when `close` is dropped.
    let open = || {
        let (close, outbound) = tokio::sync::mpsc::channel(1);
        let first = proto::SessionRequest {
            command: Some(proto::session_request::Command::Open(proto::SessionOpen {
                ttl_ms: Some(10_000),
                ..Default::default()
            })),
        };
        close.try_send(first).unwrap();
        (close, tokio_stream::wrappers::ReceiverStream::new(outbound))
    };
    let (close, outbound) = open();
    let session = client.session(outbound).await.unwrap();
    let refused = client.session(open().1).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // The slot comes back when the session ends.
    drop(close);
    drop(session);
    let mut reopened = None;
    for _ in 0..100 {
        let (close, outbound) = open();
        match client.session(outbound).await {
            Ok(s) => {
                reopened = Some((close, s));
                break;
            }
            Err(e) => assert_eq!(e.code(), Code::ResourceExhausted),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reopened.is_some(),
        "a session slot is freed when its stream ends"
    );

    let watch = || proto::WatchRequest::default();
    let watcher = client.watch(watch()).await.unwrap();
    let refused = client.watch(watch()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    drop(watcher);
    let mut rewatched = false;
    for _ in 0..100 {
        if client.watch(watch()).await.is_ok() {
            rewatched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rewatched, "a watch slot is freed when its stream ends");
    assert_healthy(&server).await;
}

/// The holders queued on `name`, in grant order.
async fn queued_holders(
    client: &mut tumbler::proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    name: &str,
) -> Vec<String> {
    let queue = client
        .queue(proto::QueueRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    queue.requests.into_iter().map(|r| r.holder).collect()
}

/// A server with auth on: `tokens` (tokens-file entries) and `args`.
struct TenantServer {
    _redis: tumbler::dev::RedisServer,
    _dir: tempfile::TempDir,
    server: TestServer,
}

async fn tenant_server(tokens: &[String], args: ServiceArgs) -> TenantServer {
    let redis = start_redis();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, tokens.concat()).unwrap();
    let args = ServiceArgs {
        auth: tumbler::config::AuthArgs {
            auth_tokens_file: Some(path),
            no_auth: false,
            auth_reload_interval_ms: 100,
        },
        ..args
    };
    let server = TestServer::new()
        .redis(&redis.url())
        .args(args)
        .start()
        .await;
    TenantServer {
        _redis: redis,
        _dir: dir,
        server,
    }
}

/// Opens a session (ttl 10 s) whose client side stays open while the
/// returned sender lives.
async fn open_session(
    client: &mut common::BearerClient,
) -> Result<
    (
        tokio::sync::mpsc::Sender<proto::SessionRequest>,
        tonic::Streaming<proto::SessionResponse>,
    ),
    tonic::Status,
> {
    let (commands, outbound) = tokio::sync::mpsc::channel(4);
    commands
        .try_send(proto::SessionRequest {
            command: Some(proto::session_request::Command::Open(proto::SessionOpen {
                ttl_ms: Some(10_000),
                ..Default::default()
            })),
        })
        .unwrap();
    let events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(outbound))
        .await?
        .into_inner();
    Ok((commands, events))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tokens_watches_leave_room_for_other_tokens() {
    let t = tenant_server(
        &[
            common::token_entry("greedy", "greedy-secret", "client", r#"["*"]"#, ""),
            common::token_entry("polite", "polite-secret", "client", r#"["team-a"]"#, ""),
            common::token_entry(
                "tiny",
                "tiny-secret",
                "client",
                r#"["team-a"]"#,
                "max_watchers = 1",
            ),
        ],
        ServiceArgs {
            max_watchers: 10,
            max_watchers_per_token: 4,
            ..service_args()
        },
    )
    .await;
    let endpoint = t.server.endpoint();
    let mut greedy = common::bearer_client(&endpoint, "greedy-secret").await;
    // The greedy token opens as many watches as it can, over namespaces.
    let mut open = Vec::new();
    let mut refused = None;
    for i in 0..20 {
        match greedy
            .watch(proto::WatchRequest {
                namespace: format!("ns-{i}"),
                ..Default::default()
            })
            .await
        {
            Ok(stream) => open.push(stream),
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    assert_eq!(open.len(), 4, "its quota, not the replica's pool");
    let refused = refused.expect("refused past its quota");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("this token"),
        "{}",
        refused.message()
    );
    // Another token still watches.
    let mut polite = common::bearer_client(&endpoint, "polite-secret").await;
    let watch = || proto::WatchRequest {
        namespace: "team-a".into(),
        ..Default::default()
    };
    let _polite_watch = polite.watch(watch()).await.expect("another token watches");
    // A token's own quota from the tokens file.
    let mut tiny = common::bearer_client(&endpoint, "tiny-secret").await;
    let _first = tiny.watch(watch()).await.unwrap();
    let second = tiny.watch(watch()).await.unwrap_err();
    assert_eq!(second.code(), Code::ResourceExhausted, "{second:?}");
    // A watch that ends gives its place back.
    drop(open.pop());
    let mut rewatched = false;
    for _ in 0..100 {
        if greedy.watch(watch_in("ns-again")).await.is_ok() {
            rewatched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rewatched);
}

fn watch_in(namespace: &str) -> proto::WatchRequest {
    proto::WatchRequest {
        namespace: namespace.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_has_a_share_of_the_replicas_watches() {
    let (_redis, server) = server_with(ServiceArgs {
        max_watchers: 10,
        max_watchers_per_namespace: 3,
        ..service_args()
    })
    .await;
    let mut client = server.client().await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(client.watch(watch_in("busy")).await.unwrap());
    }
    let refused = client.watch(watch_in("busy")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("namespace busy"),
        "{}",
        refused.message()
    );
    let _other = client
        .watch(watch_in("calm"))
        .await
        .expect("another namespace watches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_access_to_a_namespace_cannot_lock_out_its_sessions() {
    let t = tenant_server(
        &[
            common::token_entry("outsider", "outsider-secret", "client", r#"["team-b"]"#, ""),
            common::token_entry("team-a", "team-a-secret", "client", r#"["team-a"]"#, ""),
        ],
        ServiceArgs {
            max_sessions: 10,
            max_sessions_per_token: 3,
            ..service_args()
        },
    )
    .await;
    let endpoint = t.server.endpoint();
    let mut outsider = common::bearer_client(&endpoint, "outsider-secret").await;
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..20 {
        match open_session(&mut outsider).await {
            Ok(session) => held.push(session),
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    assert_eq!(held.len(), 3);
    let refused = refused.unwrap();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("Session"),
        "{}",
        refused.message()
    );
    // team-a's token opens its session and takes its lock.
    let mut team_a = common::bearer_client(&endpoint, "team-a-secret").await;
    let (commands, mut events) = open_session(&mut team_a).await.expect("team-a opens");
    commands
        .send(proto::SessionRequest {
            command: Some(proto::session_request::Command::Acquire(
                proto::SessionAcquire {
                    request_id: 1,
                    acquire: Some(proto::AcquireRequest {
                        namespace: "team-a".into(),
                        ..acquire("deploy", "")
                    }),
                },
            )),
        })
        .await
        .unwrap();
    let mut granted = false;
    while let Some(event) = events.message().await.unwrap() {
        if let Some(proto::session_response::Event::Acquired(a)) = event.event {
            granted = a.response.unwrap().status() == proto::AcquireStatus::Acquired;
            break;
        }
    }
    assert!(granted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_token_cannot_take_the_replicas_waiter_pool() {
    let t = tenant_server(
        &[
            common::token_entry("owner", "owner-secret", "admin", r#"["*"]"#, ""),
            common::token_entry("teams", "teams-secret", "client", r#"["team*"]"#, ""),
            common::token_entry("team-a", "team-a-secret", "client", r#"["team-a"]"#, ""),
        ],
        ServiceArgs {
            max_waiters: 10,
            max_waiters_per_token: 3,
            ..service_args()
        },
    )
    .await;
    let endpoint = t.server.endpoint();
    let mut owner = common::bearer_client(&endpoint, "owner-secret").await;
    let namespaces: Vec<String> = (1..=6)
        .map(|i| format!("team-{i}"))
        .chain(["team-a".to_string()])
        .collect();
    for namespace in &namespaces {
        owner
            .acquire(proto::AcquireRequest {
                namespace: namespace.clone(),
                ..acquire("busy", "owner")
            })
            .await
            .unwrap();
    }
    // The prefix token waits in one namespace after another.
    let teams = common::bearer_client(&endpoint, "teams-secret").await;
    let mut waits = tokio::task::JoinSet::new();
    for namespace in &namespaces[..3] {
        let (mut c, namespace) = (teams.clone(), namespace.clone());
        waits.spawn(async move { c.acquire(waiting("busy", "t", &namespace)).await });
    }
    for namespace in &namespaces[..3] {
        until_waiters_bearer(&mut owner, namespace, 1).await;
    }
    let refused = teams
        .clone()
        .acquire(waiting("busy", "t", &namespaces[3]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("waiting acquires"),
        "{}",
        refused.message()
    );
    // team-a's own token still waits.
    let mut team_a = common::bearer_client(&endpoint, "team-a-secret").await;
    waits.spawn(async move { team_a.acquire(waiting("busy", "a", "team-a")).await });
    until_waiters_bearer(&mut owner, "team-a", 1).await;
    waits.abort_all();
}

async fn until_waiters_bearer(client: &mut common::BearerClient, namespace: &str, n: u32) {
    for _ in 0..500 {
        let seen = client
            .inspect(proto::InspectRequest {
                namespace: namespace.into(),
                name: "busy".into(),
            })
            .await
            .unwrap()
            .into_inner();
        if seen.waiters == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{namespace}/busy never had {n} waiter(s)");
}
