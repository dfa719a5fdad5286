//! Multi-locks through a Session stream (decision 0078): a set taken all
//! or nothing for the session, every grant of it a session grant (renewed,
//! resumed with its token, released at the end), released by `names`, and
//! ended together when one lock of it is lost. Real server, real Redis.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::session::{Session, holder_of};
use common::wait::wait_until_async;
use common::*;
use proto::lock_service_client::LockServiceClient;
use proto::session_request::Command;
use proto::session_response::Event;
use proto::{AcquireStatus, ReleaseStatus};
use tonic::transport::Channel;

/// A session's acquire of the set `names`, trying once unless `wait_ms`.
fn set(names: &[&str], wait_ms: u64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        wait_ms,
        ..Default::default()
    }
}

fn release_names(request_id: u64, name: &str, names: &[&str]) -> Command {
    Command::Release(proto::SessionRelease {
        request_id,
        namespace: String::new(),
        name: name.into(),
        names: names.iter().map(|n| (*n).to_owned()).collect(),
    })
}

/// Sends a release and reads its answer: the reply, or the error's code
/// and message.
async fn send_release(
    session: &mut Session,
    command: Command,
) -> Result<ReleaseStatus, (tonic::Code, String)> {
    session.send(command).await;
    match session.next().await {
        Some(Event::Released(released)) => Ok(released.response.unwrap().status()),
        Some(Event::Error(e)) => Err((tonic::Code::from_i32(e.code), e.message)),
        other => panic!("expected a release reply, got {other:?}"),
    }
}

/// Sends an acquire that is refused and reads the refusal.
async fn refused(
    session: &mut Session,
    request_id: u64,
    request: proto::AcquireRequest,
) -> (tonic::Code, String) {
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id,
            acquire: Some(request),
        }))
        .await;
    match session.next().await {
        Some(Event::Error(e)) => {
            assert_eq!(e.request_id, request_id);
            (tonic::Code::from_i32(e.code), e.message)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The session's tokens per name, as the reply's grants name them.
fn tokens_of(reply: &proto::AcquireResponse) -> BTreeMap<String, u64> {
    (reply.grants.iter())
        .map(|g| (g.name.clone(), g.fencing_token))
        .collect()
}

/// Each lock's holder and token as Redis has them now.
async fn held(
    client: &mut LockServiceClient<Channel>,
    names: &[&str],
) -> BTreeMap<String, (String, u64)> {
    let mut held = BTreeMap::new();
    for name in names {
        if let Some(grant) = holder_of(client, name).await {
            held.insert((*name).to_owned(), (grant.holder, grant.fencing_token));
        }
    }
    held
}

/// What `tokens` look like when `holder` holds them.
fn as_held(holder: &str, tokens: &BTreeMap<String, u64>) -> BTreeMap<String, (String, u64)> {
    (tokens.iter())
        .map(|(name, token)| (name.clone(), (holder.to_owned(), *token)))
        .collect()
}

async fn all_free(client: &LockServiceClient<Channel>, what: &str, names: &[&str]) {
    let free = || {
        let mut client = client.clone();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        async move {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            held(&mut client, &names).await.is_empty()
        }
    };
    wait_until_async(what, Duration::from_secs(5), free).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_granted_to_the_session_renewed_past_its_ttl_and_released_by_close() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 300).await;
    let reply = session.acquire(1, set(&["s-a", "s-b", "s-c"], 0)).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let names: Vec<&str> = reply.grants.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["s-a", "s-b", "s-c"], "in the request's order");
    for grant in &reply.grants {
        assert_eq!(grant.holder, session.id, "the session id holds each");
        assert_eq!(grant.ttl_ms, 300, "the lease is the session ttl");
    }
    let tokens = tokens_of(&reply);
    assert_eq!(
        reply.grant.as_ref().map(|g| g.fencing_token),
        Some(tokens["s-a"])
    );

    // Five TTLs on, every lock is still the session's, same tokens, and
    // nothing was lost on the way.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        session.keep_alive().await;
    }
    if let Ok(Ok(Some(event))) =
        tokio::time::timeout(Duration::from_millis(10), session.events.message()).await
    {
        panic!("unexpected event while holding: {event:?}");
    }
    assert_eq!(
        held(&mut client, &["s-a", "s-b", "s-c"]).await,
        as_held(&session.id, &tokens)
    );
    let again = session.acquire(2, set(&["s-a", "s-b", "s-c"], 0)).await;
    assert_eq!(
        again.status(),
        AcquireStatus::AlreadyHeld,
        "a retry gets the same set"
    );
    assert_eq!(tokens_of(&again), tokens);

    // Closing the session releases the whole set at once.
    drop(session.commands);
    while session.events.message().await.ok().flatten().is_some() {}
    all_free(
        &client,
        "closing the session releases the set",
        &["s-a", "s-b", "s-c"],
    )
    .await;
}

/// All or nothing against another holder of one name: trying once takes
/// nothing; waiting holds nothing until the whole set is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_held_member_takes_nothing_and_a_waiting_one_gets_all_when_it_frees() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let other = client
        .acquire(acquire("m-b", "other"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.status(), AcquireStatus::Acquired);
    let mut session = Session::open(&mut client, 5_000).await;

    let busy = session.acquire(1, set(&["m-a", "m-b"], 0)).await;
    assert_eq!(busy.status(), AcquireStatus::NotAcquired);
    assert_eq!(busy.reason(), proto::NotAcquiredReason::Busy);
    assert!(busy.grants.is_empty());
    assert!(
        holder_of(&mut client, "m-a").await.is_none(),
        "nothing of the set taken"
    );

    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 2,
            acquire: Some(set(&["m-a", "m-b"], 10_000)),
        }))
        .await;
    // While it waits (its wake-up place in m-b's queue) it holds nothing.
    let waiting = || {
        let mut client = client.clone();
        async move {
            let queue = proto::QueueRequest {
                name: "m-b".into(),
                ..Default::default()
            };
            client.queue(queue).await.unwrap().into_inner().waiters == 1
        }
    };
    wait_until_async("the set waits", Duration::from_secs(5), waiting).await;
    assert!(
        holder_of(&mut client, "m-a").await.is_none(),
        "a waiting set holds nothing"
    );
    client.release(release("m-b", "other")).await.unwrap();
    let reply = match session.next().await {
        Some(Event::Acquired(a)) if a.request_id == 2 => a.response.unwrap(),
        other => panic!("expected the set, got {other:?}"),
    };
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    assert_eq!(
        held(&mut client, &["m-a", "m-b"]).await,
        as_held(&session.id, &tokens_of(&reply))
    );
}

/// Killed stream, resumed on a second server: the set comes back with the
/// same tokens, renewed there; a release of it by `names` from the new
/// stream frees every lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_resumed_on_another_server_keeps_its_tokens_and_is_released_by_names() {
    let a = TestServer::new().start().await;
    let b = TestServer::new().redis(a.redis_url()).start().await;
    let proxy = common::proxy::CuttableProxy::start(a.addr).await;
    let mut through_proxy = LockServiceClient::connect(proxy.endpoint()).await.unwrap();
    let mut on_b = b.client().await;
    let names = ["r-a", "r-b", "r-c"];

    let mut session = Session::open(&mut through_proxy, 1_000).await;
    let tokens = tokens_of(&session.acquire(1, set(&names, 0)).await);
    proxy.cut();
    let (mut resumed, opened) = Session::resume(&mut on_b, &session.id, &session.secret)
        .await
        .expect("resumed at once on the second server");
    let kept: BTreeMap<String, u64> = (opened.grants.iter())
        .map(|g| (g.name.clone(), g.fencing_token))
        .collect();
    assert_eq!(kept, tokens, "the set's grants, same tokens");
    assert!(opened.lost.is_empty(), "{opened:?}");
    // Renewed by B well past the old lease.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        resumed.keep_alive().await;
    }
    assert_eq!(held(&mut on_b, &names).await, as_held(&session.id, &tokens));

    // The set is still one on B: one lock of it alone is refused, and so
    // is a part; the whole set by `names` is released.
    let (code, message) = send_release(&mut resumed, release_names(2, "r-a", &[]))
        .await
        .unwrap_err();
    assert_eq!(code, tonic::Code::FailedPrecondition, "{message}");
    assert!(message.starts_with("name:"), "{message}");
    let (code, message) =
        (send_release(&mut resumed, release_names(3, "", &["r-a", "r-b"])).await).unwrap_err();
    assert_eq!(code, tonic::Code::FailedPrecondition, "{message}");
    assert!(message.starts_with("names:"), "{message}");
    assert_eq!(
        held(&mut on_b, &names).await.len(),
        3,
        "refusals change nothing"
    );
    let status = send_release(&mut resumed, release_names(4, "", &names)).await;
    assert_eq!(status, Ok(ReleaseStatus::Released));
    assert!(held(&mut on_b, &names).await.is_empty());
    let status = send_release(&mut resumed, release_names(5, "", &names)).await;
    assert_eq!(status, Ok(ReleaseStatus::NotHeld), "released already");
    drop(session);
}

/// Resumed on a second server while the old stream still lives: the old
/// stream can neither take the set again nor release it (both refused in
/// Redis; it ends ABORTED), and the set stays the new stream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_stream_cannot_act_on_the_set_the_new_one_holds() {
    let a = TestServer::new().start().await;
    let b = TestServer::new().redis(a.redis_url()).start().await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;
    let names = ["t-a", "t-b"];
    let mut old = Session::open(&mut on_a, 5_000).await;
    let tokens = tokens_of(&old.acquire(1, set(&names, 0)).await);
    let (_new, opened) = Session::resume(&mut on_b, &old.id, &old.secret)
        .await
        .expect("resumed while the old stream lives");
    assert_eq!(opened.grants.len(), 2, "{opened:?}");

    old.send(Command::Acquire(proto::SessionAcquire {
        request_id: 2,
        acquire: Some(set(&names, 0)),
    }))
    .await;
    let refusal = loop {
        match old.next().await {
            Some(Event::Error(e)) if e.request_id == 2 => break e,
            Some(Event::Acquired(a)) => panic!("the old stream took the set again: {a:?}"),
            _ => {}
        }
    };
    assert_eq!(refusal.code, tonic::Code::Aborted as i32, "{refusal:?}");
    let (_, status) = old.until_ended().await;
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert_eq!(held(&mut on_b, &names).await, as_held(&old.id, &tokens));

    // A release by names from a stream of the old epoch is refused too:
    // a second stale stream, resumed and then superseded.
    let (mut stale, _) = Session::resume(&mut on_a, &old.id, &old.secret)
        .await
        .unwrap();
    let (_newest, opened) = Session::resume(&mut on_b, &old.id, &old.secret)
        .await
        .unwrap();
    assert_eq!(opened.grants.len(), 2, "{opened:?}");
    let refused = send_release(&mut stale, release_names(3, "", &names)).await;
    assert_eq!(refused.map_err(|(code, _)| code), Err(tonic::Code::Aborted));
    assert_eq!(held(&mut on_b, &names).await, as_held(&old.id, &tokens));
}

/// A lock of the set lost (here deleted behind the session's back, as
/// Redis losing it would): the rest is released too and the client is
/// told `lost` for each, so no part of the set outlives the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_member_releases_the_rest_of_its_set_with_grant_lost_for_each() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 600).await;
    let names = ["l-a", "l-b", "l-c"];
    let tokens = tokens_of(&session.acquire(1, set(&names, 0)).await);
    // A single grant of the same session is not part of the set.
    let single = session.acquire(2, acquire("l-alone", "")).await;
    assert_eq!(single.status(), AcquireStatus::Acquired);

    assert!(tokens.contains_key("l-b"));
    lose_lock(server.redis_url(), "l-b").await;

    let mut lost = BTreeMap::new();
    while lost.len() < 3 {
        match session.next().await {
            Some(Event::Lost(grant)) => {
                assert_eq!(
                    Some(&grant.fencing_token),
                    tokens.get(&grant.name),
                    "{grant:?}"
                );
                lost.insert(grant.name, grant.reason);
            }
            other => panic!("expected lost events, got {other:?}"),
        }
    }
    assert_eq!(lost["l-b"], "not held");
    assert_eq!(lost["l-a"], "set broken");
    assert_eq!(lost["l-c"], "set broken");
    all_free(&client, "the rest of a broken set is released", &names).await;
    // The session and its single grant go on.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        session.keep_alive().await;
    }
    let alone = holder_of(&mut client, "l-alone").await.expect("kept");
    assert_eq!(alone.holder, session.id);
}

/// A set broken while its session is suspended (its replica drained):
/// the resume reports every lock of it lost and releases the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_does_not_keep_part_of_a_set() {
    let redis = start_redis();
    let mut leaving = TestServer::new().redis(&redis.url()).start().await;
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut near = leaving.client().await;
    let mut far = staying.client().await;
    let names = ["p-a", "p-b"];
    let mut session = Session::open(&mut near, 5_000).await;
    let tokens = tokens_of(&session.acquire(1, set(&names, 0)).await);
    leaving.begin_shutdown();
    let (lost, status) = session.until_ended().await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(lost.is_empty(), "a drain loses nothing: {lost:?}");

    lose_lock(&redis.url(), "p-a").await;
    let (_resumed, opened) = Session::resume(&mut far, &session.id, &session.secret)
        .await
        .unwrap();
    assert!(opened.grants.is_empty(), "{opened:?}");
    let lost: BTreeMap<String, (String, u64)> = (opened.lost.iter())
        .map(|l| (l.name.clone(), (l.reason.clone(), l.fencing_token)))
        .collect();
    let expected = BTreeMap::from([
        ("p-a".to_owned(), ("not held".to_owned(), tokens["p-a"])),
        ("p-b".to_owned(), ("set broken".to_owned(), tokens["p-b"])),
    ]);
    assert_eq!(lost, expected);
    assert!(
        holder_of(&mut far, "p-b").await.is_none(),
        "the rest released"
    );
}

/// Commands on a set's locks keep their order: a release by `names` sent
/// right behind the acquire is answered after it and releases the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_set_sent_behind_its_acquire_waits_for_it() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 5_000).await;
    let names = ["o-a", "o-b"];
    session
        .send(Command::Acquire(proto::SessionAcquire {
            request_id: 1,
            acquire: Some(set(&names, 0)),
        }))
        .await;
    session.send(release_names(2, "", &names)).await;
    match session.next().await {
        Some(Event::Acquired(a)) => {
            assert_eq!(a.request_id, 1);
            assert_eq!(a.response.unwrap().status(), AcquireStatus::Acquired);
        }
        other => panic!("the acquire answers first, got {other:?}"),
    }
    match session.next().await {
        Some(Event::Released(r)) => {
            assert_eq!(r.request_id, 2);
            assert_eq!(r.response.unwrap().status(), ReleaseStatus::Released);
        }
        other => panic!("then the release, got {other:?}"),
    }
    assert!(held(&mut client, &names).await.is_empty());
}

/// Bad sets are refused naming the field, and the session goes on.
#[tokio::test]
async fn a_session_set_is_validated_as_the_acquire_rpcs() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let mut session = Session::open(&mut client, 5_000).await;

    let (code, message) = refused(&mut session, 1, set(&["v-a", "v-a"], 0)).await;
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.starts_with("names[1]"), "{message}");
    let both = proto::AcquireRequest {
        name: "v-x".into(),
        ..set(&["v-a", "v-b"], 0)
    };
    let (code, message) = refused(&mut session, 2, both).await;
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.starts_with("name:"), "{message}");
    let (code, message) = refused(&mut session, 3, set(&["v-a"], 0)).await;
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.starts_with("names"), "{message}");
    let read = proto::AcquireRequest {
        mode: proto::LockMode::Read as i32,
        ..set(&["v-a", "v-b"], 0)
    };
    let (code, message) = refused(&mut session, 4, read).await;
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.starts_with("mode"), "{message}");

    // Release by names: the same rules.
    let (code, message) =
        (send_release(&mut session, release_names(5, "", &["v-a", "v-a"])).await).unwrap_err();
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.starts_with("names[1]"), "{message}");
    let (code, message) =
        (send_release(&mut session, release_names(6, "v-x", &["v-a", "v-b"])).await).unwrap_err();
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.starts_with("name:"), "{message}");

    // A lock belongs to one set at a time: a set naming a lock the
    // session holds alone, or in another set, is refused.
    session.acquire(7, acquire("v-alone", "")).await;
    let (code, message) = refused(&mut session, 8, set(&["v-alone", "v-b"], 0)).await;
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(message.starts_with("names:"), "{message}");
    let first = session.acquire(9, set(&["v-a", "v-b"], 0)).await;
    assert_eq!(first.status(), AcquireStatus::Acquired);
    let (code, message) = refused(&mut session, 10, set(&["v-b", "v-c"], 0)).await;
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(message.starts_with("names:"), "{message}");
    assert!(
        holder_of(&mut client, "v-c").await.is_none(),
        "refused: nothing taken"
    );
    // A single acquire of a set's lock is the same grant (idempotent) and
    // leaves it in its set.
    let one = session.acquire(11, acquire("v-a", "")).await;
    assert_eq!(one.status(), AcquireStatus::AlreadyHeld);
    let (code, _) = send_release(&mut session, release_names(12, "v-a", &[]))
        .await
        .unwrap_err();
    assert_eq!(code, tonic::Code::FailedPrecondition);
}

/// What a session's single lock costs in Redis is what it cost before sets
/// came to sessions: per acquire and release, two function calls for the
/// lock and two notes of the record, and the same commands inside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_session_grant_costs_what_it_did() {
    let (_redis, _server, mut client, mut conn) = counting_server().await;
    let mut session = Session::open(&mut client, 30_000).await;
    session.acquire(1, acquire("warm", "")).await;
    assert_eq!(
        send_release(&mut session, release_names(2, "warm", &[])).await,
        Ok(ReleaseStatus::Released)
    );
    let before = command_calls(&mut conn).await;
    for i in 0..50 {
        let name = format!("plain-{i}");
        let reply = session.acquire(10 + 2 * i, acquire(&name, "")).await;
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        let released = send_release(&mut session, release_names(11 + 2 * i, &name, &[])).await;
        assert_eq!(released, Ok(ReleaseStatus::Released));
    }
    let after = command_calls(&mut conn).await;
    let delta = |wanted: &dyn Fn(&str) -> bool| -> u64 {
        (after.iter())
            .filter(|(name, _)| wanted(name))
            .map(|(name, calls)| calls - before.get(name).copied().unwrap_or(0))
            .sum()
    };
    let functions = delta(&|name| name.starts_with("fcall"));
    let inside = delta(&|name| !name.starts_with("fcall") && !["info", "config"].contains(&name));
    assert_eq!(functions, 4 * 50, "{after:?}");
    // 12 per pair: the lock's acquire and release, and the record's two
    // notes (HGET and HSET / HDEL each), as with the one-grant note.
    assert_eq!(inside, 12 * 50, "{after:?}");

    // A set of three: one call takes it, one note names it; its release
    // is a call per lock and one note.
    let before = command_calls(&mut conn).await;
    for i in 0..20 {
        let names = [0, 1, 2].map(|k| format!("set-{i}-{k}"));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let reply = session.acquire(200 + 2 * i, set(&names, 0)).await;
        assert_eq!(reply.status(), AcquireStatus::Acquired);
        let released = send_release(&mut session, release_names(201 + 2 * i, "", &names)).await;
        assert_eq!(released, Ok(ReleaseStatus::Released));
    }
    let after_sets = command_calls(&mut conn).await;
    let functions: u64 = (after_sets.iter())
        .filter(|(name, _)| name.starts_with("fcall"))
        .map(|(name, calls)| calls - before.get(name).copied().unwrap_or(0))
        .sum();
    assert_eq!(functions, 6 * 20, "{after_sets:?}");
}
