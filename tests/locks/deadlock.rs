//! Deadlock detection among waiters (decision 0077): a wait that would
//! close a cycle in the namespace's wait-for graph is refused at once with
//! ABORTED naming the cycle, leaving no queue entry; a chain that is no
//! cycle waits as always; read/write waits are edges; a waiter whose
//! holder the server made up pays nothing; over Connect the code is
//! `aborted`. Each test has its own Redis and server.

use crate::{common, queue};

use std::time::{Duration, Instant};

use common::wait::wait_until_async;
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, LockMode};
use queue::{queue_of, spawn_wait, until_queued, wait_for};
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;

/// The wait-for registry of the default namespace.
const REGISTRY: &str = "tumbler:{default:waits}";

type Waiting = JoinHandle<Result<proto::AcquireResponse, tonic::Status>>;

async fn take(client: &mut LockServiceClient<Channel>, request: proto::AcquireRequest) {
    let reply = client.acquire(request).await.unwrap().into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
}

/// Each `(name, holder)` taken, try once.
async fn take_all(client: &mut LockServiceClient<Channel>, held: &[(&str, &str)]) {
    for (name, holder) in held {
        take(client, acquire(name, holder)).await;
    }
}

/// Each `(name, holder)` waiting (20 s) in turn, each edge in the registry
/// before the next wait begins.
async fn wait_in_turn(
    client: &LockServiceClient<Channel>,
    conn: &mut redis::aio::MultiplexedConnection,
    waiting: &[(&str, &str)],
) -> Vec<Waiting> {
    let mut waits_begun = Vec::new();
    for (name, holder) in waiting {
        waits_begun.push(spawn_wait(client.clone(), waits(name, holder)));
        until_recorded(conn, holder, true).await;
    }
    waits_begun
}

/// `holder` lets `name` go, and the wait `waiting` gets its lock: its reply.
async fn handed_to(
    client: &mut LockServiceClient<Channel>,
    (name, holder): (&str, &str),
    waiting: Waiting,
) -> proto::AcquireResponse {
    client.release(release(name, holder)).await.unwrap();
    let reply = waiting.await.unwrap().unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    reply
}

/// Waits until `holder`'s wait is (or is no longer) in the registry.
async fn until_recorded(conn: &mut redis::aio::MultiplexedConnection, holder: &str, there: bool) {
    wait_until_async(
        &format!("{holder}'s edge recorded: {there}"),
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move {
                let found: bool = redis::cmd("HEXISTS")
                    .arg(REGISTRY)
                    .arg(holder)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                found == there
            }
        },
    )
    .await;
}

/// A waiting acquire that is refused at once: its status.
async fn refused(
    client: &mut LockServiceClient<Channel>,
    request: proto::AcquireRequest,
) -> tonic::Status {
    let started = Instant::now();
    let status = client.acquire(request).await.expect_err("refused");
    // At once: its wait was 20 s.
    assert!(started.elapsed() < Duration::from_secs(5), "{status:?}");
    status
}

fn waits(name: &str, holder: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        queue_ttl_ms: Some(60_000),
        ..wait_for(name, holder, 20_000)
    }
}

#[tokio::test]
async fn a_two_party_cycle_is_refused_at_once_and_the_other_waiter_still_gets_its_lock() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    take_all(&mut client, &[("x", "a"), ("y", "b")]).await;
    // a waits for y (held by b): no cycle yet.
    let a_waits = spawn_wait(client.clone(), waits("y", "a"));
    until_queued(&mut client, "y", 1).await;
    until_recorded(&mut conn, "a", true).await;

    // b asks x (held by a): the cycle closes; b is told at once.
    let status = refused(&mut client, waits("x", "b")).await;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status.message(),
        r#"deadlock: holder "b" waits for lock "x" held by "a", "a" waits for lock "y" held by "b""#
    );
    // Nothing of the refused request stays behind.
    assert!(queue_of(&mut client, "x").await.is_empty());
    until_recorded(&mut conn, "b", false).await;

    // a still waits, and gets y when b lets it go.
    assert!(!a_waits.is_finished());
    handed_to(&mut client, ("y", "b"), a_waits).await;
    until_recorded(&mut conn, "a", false).await;
}

#[tokio::test]
async fn a_three_party_cycle_is_refused_naming_all_three() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    take_all(&mut client, &[("x", "a"), ("y", "b"), ("z", "c")]).await;
    let [a_waits, b_waits] = wait_in_turn(&client, &mut conn, &[("y", "a"), ("z", "b")])
        .await
        .try_into()
        .unwrap();

    let status = refused(&mut client, waits("x", "c")).await;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status.message(),
        r#"deadlock: holder "c" waits for lock "x" held by "a", "a" waits for lock "y" held by "b", "b" waits for lock "z" held by "c""#
    );
    assert!(queue_of(&mut client, "x").await.is_empty());
    // The others wait on: c lets z go, b gets it, lets y go, a gets it.
    handed_to(&mut client, ("z", "c"), b_waits).await;
    handed_to(&mut client, ("y", "b"), a_waits).await;
}

#[tokio::test]
async fn a_chain_that_is_no_cycle_is_never_refused() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    // a waits for b, b waits for c, c holds only.
    take_all(&mut client, &[("y", "b"), ("z", "c")]).await;
    let [a_waits, b_waits] = wait_in_turn(&client, &mut conn, &[("y", "a"), ("z", "b")])
        .await
        .try_into()
        .unwrap();
    // A semaphore another of whose holders may free a permit: c waiting
    // on it behind b is no cycle either (b alone does not keep c out).
    let sem = |holder: &str| proto::AcquireRequest {
        limit: Some(2),
        ..acquire("s", holder)
    };
    take(&mut client, sem("b")).await;
    take(&mut client, sem("d")).await;
    let c_waits = spawn_wait(
        client.clone(),
        proto::AcquireRequest {
            limit: Some(2),
            ..waits("s", "c")
        },
    );
    until_queued(&mut client, "s", 1).await;

    assert!(!a_waits.is_finished() && !b_waits.is_finished() && !c_waits.is_finished());
    handed_to(&mut client, ("s", "d"), c_waits).await;
    handed_to(&mut client, ("z", "c"), b_waits).await;
    handed_to(&mut client, ("y", "b"), a_waits).await;
}

#[tokio::test]
async fn a_reader_and_a_writer_waiting_for_each_other_are_a_cycle() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    let rw = |name: &str, holder: &str, mode: LockMode| proto::AcquireRequest {
        mode: mode as i32,
        limit: Some(3),
        ..acquire(name, holder)
    };
    let waiting = |request: proto::AcquireRequest| proto::AcquireRequest {
        wait_ms: 20_000,
        queue_ttl_ms: Some(60_000),
        ..request
    };
    // r reads doc-1; w writes doc-2.
    take(&mut client, rw("doc-1", "r", LockMode::Read)).await;
    take(&mut client, rw("doc-2", "w", LockMode::Write)).await;
    // r wants to read doc-2: it waits for the writer.
    let r_waits = spawn_wait(client.clone(), waiting(rw("doc-2", "r", LockMode::Read)));
    until_recorded(&mut conn, "r", true).await;
    // w wants to write doc-1: it waits for the reader, which waits for it.
    let status = refused(&mut client, waiting(rw("doc-1", "w", LockMode::Write))).await;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(
        status
            .message()
            .contains(r#""w" waits for lock "doc-1" held by "r""#),
        "{status:?}"
    );
    assert!(queue_of(&mut client, "doc-1").await.is_empty());
    handed_to(&mut client, ("doc-2", "w"), r_waits).await;
}

/// The Redis work of one waiting acquire that times out: function calls
/// (FCALL, FCALL_RO) and every command (those the functions ran too).
async fn calls_of_a_wait(
    client: &mut LockServiceClient<Channel>,
    conn: &mut redis::aio::MultiplexedConnection,
    holder: &str,
) -> (u64, u64, u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
    let reply = client
        .acquire(wait_for("x", holder, 300))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::NotAcquired, "{reply:?}");
    // The edge's removal runs after the answer.
    if !holder.is_empty() {
        until_recorded(conn, holder, false).await;
    }
    let calls = command_calls(conn).await;
    let count = |name: &str| calls.get(name).copied().unwrap_or(0);
    // What this test itself sent: the reset, HEXISTS probes, INFO.
    let own = ["config|resetstat", "hexists", "info"];
    let commands = (calls.iter())
        .filter(|(name, _)| !own.contains(&name.as_str()))
        .map(|(_, n)| n)
        .sum();
    eprintln!("holder {holder:?}: {calls:?}");
    (count("fcall"), count("fcall_ro"), commands)
}

#[tokio::test]
async fn a_waiter_whose_holder_the_server_made_pays_nothing_and_a_named_one_four_calls_once_due() {
    // Group commit off (each function call is one FCALL) and no health
    // tick (it calls functions too) while counting.
    let server = TestServer::new()
        .args(tumbler::config::ServiceArgs {
            health_interval_ms: 60_000,
            no_group_commit: true,
            ..service_args()
        })
        .start()
        .await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    take(&mut client, acquire("x", "owner")).await;
    // A holder the server makes up: the acquire that queues and the
    // dequeue at its timeout, as before detection existed.
    let (fcall, fcall_ro, plain) = calls_of_a_wait(&mut client, &mut conn, "").await;
    assert_eq!((fcall, fcall_ro), (2, 0));
    // A named holder may hold other locks. Still waiting when its check is
    // due (a tenth of its wait, at least 50 ms: 300 ms here), it pays four
    // calls more: one more attempt (a permit may have freed), the lock's
    // holders read, the edge recorded and walked, the edge removed. (A wait
    // that ends sooner pays nothing: `handover::a_contended_grant_costs_two_function_calls`
    // loops named holders on one lock at two calls per grant.)
    let (fcall, fcall_ro, named) = calls_of_a_wait(&mut client, &mut conn, "named").await;
    assert_eq!((fcall, fcall_ro), (6, 0));
    eprintln!("commands per wait: {plain} (server-made holder), {named} (named holder)");
    // The detection's own cost (decisions 0077 and 0081, docs/benchmarks/notebook.md):
    // 3 FCALLs and the 20 commands they run (blockers' bounded read of the
    // lock, HMGET and HSCAN; wait_for's HRANDFIELD, the budget's HGET and
    // HSTRLEN, HSET, PTTL, PEXPIRE and HGETs of the edges it sweeps and
    // walks; wait_end's HGET, the budget's HGET and HSTRLEN, HDEL, HLEN
    // and the DEL of the emptied registry; Redis' clock), and the attempt
    // before it, 6 (a queued acquire's refresh of its place: its new
    // liveness deadline written with its record in the lock's hash, layout
    // v4). A wait that ends within its queue TTL renews nothing.
    assert_eq!(named - plain, 20 + 6, "{plain} {named}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_json_answers_a_deadlock_as_aborted_and_the_metric_counts_it() {
    // Its own process: the metric is the process's.
    let redis = start_redis();
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], tumbler::dev::free_port().unwrap()));
    let listen = format!("--http-listen={http}");
    let server = TumblerProcess::start(&redis.url(), &[&listen]).await;
    let mut client = server.client().await;
    let mut conn = redis_conn(&redis.url()).await;
    take_all(&mut client, &[("x", "a"), ("y", "b")]).await;
    let _a_waits = wait_in_turn(&client, &mut conn, &[("y", "a")]).await;
    let addr = server
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let (status, reply) = http::http(
        addr,
        "POST",
        "/tumbler.v1.LockService/Acquire",
        &[("content-type", "application/json")],
        r#"{"name":"x","holder":"b","waitMs":"20000"}"#,
    )
    .await;
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(
        (status, reply["code"].as_str()),
        (409, Some("aborted")),
        "{reply}"
    );
    assert!(
        reply["message"].as_str().unwrap().starts_with("deadlock: "),
        "{reply}"
    );
    let page = http::scrape(http).await;
    let refused = http::sample(
        &page,
        "tumbler_acquire_outcomes_total",
        &[("kind", "default"), ("outcome", "deadlock")],
    );
    assert_eq!(refused, Some(1.0), "{page}");
}

#[tokio::test]
async fn a_sessions_wait_that_closes_a_cycle_is_refused_and_the_session_goes_on() {
    use common::session::Session;
    use proto::session_request::Command;
    use proto::session_response::Event;

    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    let mut session = Session::open(&mut client, 30_000).await;
    // The session holds x; b holds y and waits for x.
    let reply = session.acquire(1, acquire("x", "")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    take(&mut client, acquire("y", "b")).await;
    let [b_waits] = wait_in_turn(&client, &mut conn, &[("x", "b")])
        .await
        .try_into()
        .unwrap();

    // The session asks y: refused at once, as its command's error.
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 2,
            acquire: Some(waits("y", "")),
        }))
        .await;
    let Some(Event::Error(error)) = session.next().await else {
        panic!("expected the command's error");
    };
    assert_eq!((error.request_id, error.code), (2, Code::Aborted as i32));
    let id = &session.id;
    assert_eq!(
        error.message,
        format!(
            r#"deadlock: holder "{id}" waits for lock "y" held by "b", "b" waits for lock "x" held by "{id}""#
        )
    );
    assert!(queue_of(&mut client, "y").await.is_empty());
    // The session goes on: it releases x, and b gets it.
    session
        .send(Command::Release(proto::SessionRelease {
            request_id: 3,
            name: "x".into(),
            names: Vec::new(),
            ..Default::default()
        }))
        .await;
    let reply = b_waits.await.unwrap().unwrap();
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
}

#[tokio::test]
async fn a_multi_locks_wait_is_an_edge_of_the_graph() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut conn = redis_conn(server.redis_url()).await;
    take_all(&mut client, &[("x", "a"), ("y", "b")]).await;
    // a waits for the set {y, z} (holding none of it): it waits for b.
    let a_waits = spawn_wait(
        client.clone(),
        proto::AcquireRequest {
            name: String::new(),
            names: vec!["y".into(), "z".into()],
            ..waits("", "a")
        },
    );
    until_recorded(&mut conn, "a", true).await;
    // b asks x, held by a: the cycle closes.
    let status = refused(&mut client, waits("x", "b")).await;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status.message(),
        r#"deadlock: holder "b" waits for lock "x" held by "a", "a" waits for lock "y" held by "b""#
    );
    let reply = handed_to(&mut client, ("y", "b"), a_waits).await;
    assert_eq!(reply.grants.len(), 2, "{reply:?}");
}
