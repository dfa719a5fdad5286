//! A session resumed on another stream while its old stream still lives:
//! the old stream can neither keep, renew nor release what the new one
//! holds (every function a session's stream calls checks its epoch in
//! Redis), and of two resumes at once exactly one serves the session.
//! Real replicas (two servers on one Redis), real streams.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::session::{Session, holder_of};
use common::*;
use proto::AcquireStatus;
use proto::lock_service_client::LockServiceClient;
use proto::session_request::Command;
use proto::session_response::Event;
use tonic::transport::Channel;

fn release_command(request_id: u64, name: &str) -> Command {
    Command::Release(proto::SessionRelease {
        request_id,
        namespace: String::new(),
        name: name.into(),
        names: Vec::new(),
    })
}

fn acquire_command(request_id: u64, name: &str) -> Command {
    Command::Acquire(proto::SessionAcquire {
        request_id,
        acquire: Some(acquire(name, "")),
    })
}

/// Two replicas on one Redis.
async fn two_replicas() -> (TestServer, TestServer) {
    let a = TestServer::new().start().await;
    let b = TestServer::new().redis(a.redis_url()).start().await;
    (a, b)
}

/// What a stream answered to its commands until it ended: the replies
/// (request id → the event) and how it ended.
async fn answers_until_end(session: &mut Session) -> (BTreeMap<u64, Event>, tonic::Status) {
    let mut answers = BTreeMap::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), session.events.message())
            .await
            .expect("the stream answers within 10 s");
        match next {
            Ok(Some(proto::SessionResponse { event: Some(event) })) => {
                let id = match &event {
                    Event::Acquired(a) => a.request_id,
                    Event::Released(r) => r.request_id,
                    Event::Error(e) => e.request_id,
                    _ => continue,
                };
                answers.insert(id, event);
            }
            Ok(Some(_)) => {}
            Ok(None) => return (answers, tonic::Status::ok("")),
            Err(status) => return (answers, status),
        }
    }
}

/// The grants a session holds (by lock name) as Redis has them.
async fn held_by(
    client: &mut LockServiceClient<Channel>,
    session: &str,
    names: &[&str],
) -> BTreeMap<String, u64> {
    let mut held = BTreeMap::new();
    for name in names {
        if let Some(grant) = holder_of(client, name).await
            && grant.holder == session
        {
            held.insert((*name).to_owned(), grant.fencing_token);
        }
    }
    held
}

/// The reported case: S on replica A holds L1 and L2 and is resumed on B
/// while A's stream lives. A's stream then re-acquires L1 and releases L2:
/// both are refused in Redis, A's stream ends ABORTED, and B's grants are
/// untouched (an intruder finds both taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_stream_can_neither_reacquire_nor_release_the_new_streams_grants() {
    let (a, b) = two_replicas().await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;
    let mut old = Session::open(&mut on_a, 5_000).await;
    let mut tokens = BTreeMap::new();
    for (id, name) in [(1, "l1"), (2, "l2")] {
        let grant = old.acquire(id, acquire(name, "")).await.grant.unwrap();
        tokens.insert(name.to_owned(), grant.fencing_token);
    }

    let (_new, opened) = Session::resume(&mut on_b, &old.id, &old.secret)
        .await
        .expect("resumed while the old stream lives");
    assert_eq!(opened.grants.len(), 2, "{opened:?}");

    // The old stream acts on both, back to back.
    old.send(acquire_command(3, "l1")).await;
    old.send(release_command(4, "l2")).await;
    let (answers, status) = answers_until_end(&mut old).await;
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    for (id, event) in &answers {
        assert!(
            !matches!(event, Event::Acquired(_) | Event::Released(_)),
            "command {id} of the superseded stream was applied: {event:?}"
        );
    }

    // Both grants are the new stream's, as they were, renewed by B.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(held_by(&mut on_a, &old.id, &["l1", "l2"]).await, tokens);
    for name in ["l1", "l2"] {
        let intruder = on_a
            .acquire(acquire(name, "intruder"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(intruder.status(), AcquireStatus::NotAcquired, "{name}");
    }
}

/// The other order: the old stream releases first (no acquire before it
/// to end it). Refused in Redis; the grant stays the new stream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_streams_release_is_refused_and_ends_it() {
    let (a, b) = two_replicas().await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;
    let mut old = Session::open(&mut on_a, 5_000).await;
    let token = old
        .acquire(1, acquire("only", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;
    let (mut new, _) = Session::resume(&mut on_b, &old.id, &old.secret)
        .await
        .unwrap();

    old.send(release_command(2, "only")).await;
    let (answers, status) = answers_until_end(&mut old).await;
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    match answers.get(&2) {
        Some(Event::Error(e)) => assert_eq!(e.code, tonic::Code::Aborted as i32, "{e:?}"),
        other => panic!("the release was answered {other:?}"),
    }
    assert_eq!(
        held_by(&mut on_b, &old.id, &["only"]).await.get("only"),
        Some(&token)
    );
    // The new stream still acts on it: its own release frees it.
    new.send(release_command(3, "only")).await;
    match new.next().await {
        Some(Event::Released(r)) => {
            assert_eq!(r.response.unwrap().status(), proto::ReleaseStatus::Released)
        }
        other => panic!("{other:?}"),
    }
    assert!(holder_of(&mut on_b, "only").await.is_none());
}

/// A superseded stream that only renews (no commands) stops at its next
/// renewal or touch, ABORTED, and reports nothing lost: the grants live on
/// with the new stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_stream_that_only_renews_ends_aborted_without_losing_anything() {
    let (a, b) = two_replicas().await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;
    let mut old = Session::open(&mut on_a, 600).await;
    let token = old
        .acquire(1, acquire("renewed", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;
    let (new, _) = Session::resume(&mut on_b, &old.id, &old.secret)
        .await
        .unwrap();
    let keep_new_alive = tokio::spawn(async move {
        for _ in 0..10 {
            new.keep_alive().await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        new
    });
    let (lost, status) = old.until_ended().await;
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(lost.is_empty(), "{lost:?}");
    let _new = keep_new_alive.await.unwrap();
    let held = holder_of(&mut on_b, "renewed").await.expect("still held");
    assert_eq!(
        (held.holder.as_str(), held.fencing_token),
        (old.id.as_str(), token)
    );
}

/// Two clients resume one session at once, on two replicas, many times
/// over: whichever interleaving happens, at most one stream serves the
/// session afterwards, and the other one's commands (a re-acquire, a
/// release) never touch the grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_resumes_one_serves_and_the_other_touches_nothing() {
    let (a, b) = two_replicas().await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;
    let (mut both_opened, mut one_refused) = (0, 0);
    for round in 0..12 {
        let names = [format!("c{round}-1"), format!("c{round}-2")];
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut first = Session::open(&mut on_a, 5_000).await;
        let mut tokens = BTreeMap::new();
        for (id, name) in names.iter().enumerate() {
            let grant = first
                .acquire(id as u64 + 1, acquire(name, ""))
                .await
                .grant
                .unwrap();
            tokens.insert((*name).to_owned(), grant.fencing_token);
        }
        // The first stream goes away without closing (its grants kept).
        let (id, secret) = (first.id.clone(), first.secret.clone());
        drop(first);

        let (x, y) = tokio::join!(
            Session::resume(&mut on_a, &id, &secret),
            Session::resume(&mut on_b, &id, &secret),
        );
        let statuses: Vec<String> = [&x, &y]
            .iter()
            .map(|r| match r {
                Ok(_) => "opened".to_owned(),
                Err(status) => format!("{status:?}"),
            })
            .collect();
        let mut opened: Vec<Session> = [x, y]
            .into_iter()
            .filter_map(|r| match r {
                Ok((session, _)) => Some(session),
                Err(status) => {
                    assert!(
                        matches!(status.code(), tonic::Code::Aborted | tonic::Code::NotFound),
                        "{status:?}"
                    );
                    None
                }
            })
            .collect();
        match opened.len() {
            2 => both_opened += 1,
            1 => one_refused += 1,
            n => panic!("round {round}: {n} resumes opened: {statuses:?}"),
        }
        // Every stream that opened re-acquires the first lock and releases
        // the second: only the one that serves the session may.
        for session in &opened {
            session.send(acquire_command(10, names[0])).await;
        }
        let mut serving = Vec::new();
        for (i, session) in opened.iter_mut().enumerate() {
            match session.next().await {
                Some(Event::Acquired(reply)) => {
                    let reply = reply.response.unwrap();
                    assert_eq!(reply.status(), AcquireStatus::AlreadyHeld, "round {round}");
                    assert_eq!(reply.grant.unwrap().fencing_token, tokens[names[0]]);
                    serving.push(i);
                }
                Some(Event::Error(e)) => assert_eq!(e.code, tonic::Code::Aborted as i32, "{e:?}"),
                None => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(
            serving.len(),
            1,
            "round {round}: streams serving: {serving:?}"
        );
        assert_eq!(
            held_by(&mut on_a, &id, &names).await,
            tokens,
            "round {round}"
        );
        // The one that serves releases; the grant goes.
        let server = &mut opened[serving[0]];
        server.send(release_command(11, names[1])).await;
        assert!(matches!(server.next().await, Some(Event::Released(_))));
        assert!(holder_of(&mut on_a, names[1]).await.is_none());
        assert!(holder_of(&mut on_a, names[0]).await.is_some());
    }
    eprintln!("concurrent resumes: both opened {both_opened}, one refused {one_refused}");
}

/// One step of the two streams of a session, in a random interleaving.
#[derive(Clone, Debug)]
enum Step {
    /// The superseded stream sends a command (its answer is not awaited:
    /// it runs concurrently with what follows).
    Old(Op),
    /// The stream that serves the session sends a command and awaits it.
    New(Op),
    Pause(u64),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire(usize),
    Release(usize),
    KeepAlive,
}

const NAMES: [&str; 4] = ["p0", "p1", "p2", "p3"];

fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let op = prop_oneof![
        (0..NAMES.len()).prop_map(Op::Acquire),
        (0..NAMES.len()).prop_map(Op::Release),
        Just(Op::KeepAlive),
    ];
    prop_oneof![
        3 => op.clone().prop_map(Step::Old),
        3 => op.prop_map(Step::New),
        1 => (0u64..30).prop_map(Step::Pause),
    ]
}

fn command(request_id: u64, op: Op, namespace: &str) -> Command {
    match op {
        Op::Acquire(i) => Command::Acquire(proto::SessionAcquire {
            request_id,
            acquire: Some(proto::AcquireRequest {
                namespace: namespace.into(),
                ..acquire(NAMES[i], "")
            }),
        }),
        Op::Release(i) => Command::Release(proto::SessionRelease {
            request_id,
            namespace: namespace.into(),
            name: NAMES[i].into(),
            names: Vec::new(),
        }),
        Op::KeepAlive => Command::KeepAlive(proto::SessionKeepAlive {}),
    }
}

/// Random interleavings of a superseded stream and the stream that resumed
/// its session: whatever the old one sends, and whenever, the new one's
/// view holds in Redis (every grant it was told of is the session's, with
/// its token; every lock it released or never got is not the session's
/// once the old stream is gone), and the old stream is never told of a
/// grant or a release it made.
#[test]
fn two_streams_of_one_session_never_undo_each_other() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (a, b, on_a, on_b) = rt.block_on(async {
        let (a, b) = two_replicas().await;
        let (on_a, on_b) = (a.client().await, b.client().await);
        (a, b, on_a, on_b)
    });
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU32::new(0);
    let outcome = runner.run(&proptest::collection::vec(any_step(), 1..14), |steps| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let namespace = format!("interleave-{case}");
        let (mut on_a, mut on_b) = (on_a.clone(), on_b.clone());
        let checked: Result<(), String> = rt.block_on(async {
            // The old stream holds p0 and p1; the session is resumed.
            let mut old = Session::open(&mut on_a, 5_000).await;
            let mut held = BTreeMap::new();
            for (id, name) in (1..).zip(&NAMES[..2]) {
                let reply = old
                    .acquire(
                        id,
                        proto::AcquireRequest {
                            namespace: namespace.clone(),
                            ..acquire(name, "")
                        },
                    )
                    .await;
                held.insert((*name).to_owned(), reply.grant.unwrap().fencing_token);
            }
            let (mut new, _) = Session::resume(&mut on_b, &old.id, &old.secret)
                .await
                .unwrap();
            let mut old_events =
                std::mem::replace(&mut old.events, new_placeholder_stream(&mut on_b).await);
            let old_answers = tokio::spawn(async move {
                let mut applied = Vec::new();
                while let Ok(Ok(Some(message))) =
                    tokio::time::timeout(Duration::from_secs(10), old_events.message()).await
                {
                    match message.event {
                        Some(Event::Acquired(a))
                            if a.response.as_ref().is_some_and(|r| r.grant.is_some()) =>
                        {
                            applied.push(format!("{a:?}"))
                        }
                        Some(Event::Released(r))
                            if r.response
                                .as_ref()
                                .is_some_and(|r| r.status() == proto::ReleaseStatus::Released) =>
                        {
                            applied.push(format!("{r:?}"))
                        }
                        _ => {}
                    }
                }
                applied
            });

            let mut id = 100;
            let mut old_acquired = std::collections::BTreeSet::new();
            for step in &steps {
                id += 1;
                match *step {
                    Step::Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    Step::Old(op) => {
                        if let Op::Acquire(i) = op {
                            old_acquired.insert(i);
                        }
                        let _ = old
                            .commands
                            .send(proto::SessionRequest {
                                command: Some(command(id, op, &namespace)),
                            })
                            .await;
                    }
                    Step::New(op) => {
                        new.send(command(id, op, &namespace)).await;
                        match op {
                            Op::KeepAlive => {}
                            Op::Acquire(i) => match new.next().await {
                                Some(Event::Acquired(reply)) => {
                                    let reply = reply.response.unwrap();
                                    let told = format!("{step:?}: no grant: {reply:?}");
                                    let grant = reply.grant.ok_or(told)?;
                                    if let Some(token) = held.get(NAMES[i])
                                        && *token != grant.fencing_token
                                    {
                                        return Err(format!(
                                            "{step:?}: token {} for a grant held as {token}",
                                            grant.fencing_token
                                        ));
                                    }
                                    held.insert(NAMES[i].to_owned(), grant.fencing_token);
                                }
                                other => return Err(format!("{step:?}: {other:?}")),
                            },
                            Op::Release(i) => match new.next().await {
                                Some(Event::Released(reply)) => {
                                    let released = reply.response.unwrap().status()
                                        == proto::ReleaseStatus::Released;
                                    let was_held = held.remove(NAMES[i]).is_some();
                                    // A grant the old stream made in passing
                                    // (before it learnt it was superseded) is
                                    // the session's too: the serving stream
                                    // may release it.
                                    let old_made = old_acquired.contains(&i);
                                    if was_held != released && !(released && old_made) {
                                        return Err(format!(
                                            "{step:?}: released {released}, held before: {held:?}"
                                        ));
                                    }
                                }
                                other => return Err(format!("{step:?}: {other:?}")),
                            },
                        }
                        // The new stream's view holds in Redis after each of its steps.
                        for (name, token) in &held {
                            let seen = on_a
                                .inspect(proto::InspectRequest {
                                    namespace: namespace.clone(),
                                    name: name.clone(),
                                })
                                .await
                                .unwrap()
                                .into_inner();
                            let mine = seen
                                .holders
                                .iter()
                                .filter_map(|h| h.grant.as_ref())
                                .any(|g| g.holder == old.id && g.fencing_token == *token);
                            if !mine {
                                return Err(format!(
                                    "after {step:?}: {name} is not the session's: {seen:?}"
                                ));
                            }
                        }
                    }
                }
            }
            // The old stream goes; once it has, Redis holds exactly the new
            // stream's view.
            drop(old);
            let applied = old_answers.await.unwrap();
            if !applied.is_empty() {
                return Err(format!(
                    "the superseded stream was told of changes: {applied:?}"
                ));
            }
            let names: Vec<&str> = NAMES.to_vec();
            let mut found = BTreeMap::new();
            for name in &names {
                let seen = on_a
                    .inspect(proto::InspectRequest {
                        namespace: namespace.clone(),
                        name: (*name).into(),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                if let Some(g) = seen
                    .holders
                    .iter()
                    .filter_map(|h| h.grant.as_ref())
                    .find(|g| g.holder == new.id)
                {
                    found.insert((*name).to_owned(), g.fencing_token);
                }
            }
            if found != held {
                return Err(format!(
                    "Redis holds {found:?}, the serving stream believes {held:?}"
                ));
            }
            // The new stream closes: everything goes.
            let (closed, _) = tokio::sync::mpsc::channel(1);
            drop(std::mem::replace(&mut new.commands, closed));
            let (_, status) = new.until_ended().await;
            if status.code() != tonic::Code::Ok {
                return Err(format!("the serving stream ended {status:?}"));
            }
            Ok(())
        });
        checked.map_err(TestCaseError::fail)
    });
    drop((a, b));
    if let Err(err) = outcome {
        panic!("{err}");
    }
}

/// A stream to stand in for one taken out of a `Session` (never read).
async fn new_placeholder_stream(
    client: &mut LockServiceClient<Channel>,
) -> tonic::Streaming<proto::SessionResponse> {
    Session::open(client, 1_000).await.events
}
