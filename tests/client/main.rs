//! The Rust client (`clients/rust`, crate `tumbler-client`) against real
//! servers: in-process ones for the lock semantics, `tumbler serve`
//! processes where a server must die and come back (watchdog across a
//! restart, a session resumed on a second server).

#[path = "../common/mod.rs"]
pub mod common;
mod multi;
mod read_write;
mod session_multi;

use std::time::Duration;

use common::wait::wait_until_async;
use common::{TestServer, TumblerProcess, proto, start_redis};
use tonic_health::pb::health_check_response::ServingStatus;
use tumbler_client::{CancellationToken, Client, Error, NotAcquiredReason, SessionEvent};

async fn client_of(endpoint: &str) -> Client {
    Client::builder(endpoint)
        .namespace("rust-client")
        .connect_lazy()
        .unwrap()
}

async fn holders(client: &Client, name: &str) -> Vec<(String, u64)> {
    let info = client.inspect(name).await.unwrap();
    info.holders
        .into_iter()
        .filter_map(|h| h.grant)
        .map(|g| (g.holder, g.fencing_token))
        .collect()
}

async fn queued(client: &Client, name: &str) -> Vec<String> {
    let queue = client.queue(name).await.unwrap();
    queue.requests.into_iter().map(|r| r.holder).collect()
}

/// Waits (5 s at most) until nobody holds `name`.
async fn until_unheld(client: &Client, name: &str, what: &str) {
    let unheld = || async { holders(client, name).await.is_empty() };
    wait_until_async(what, Duration::from_secs(5), unheld).await;
}

/// Waits (2 s at most) until nobody waits for `name`.
async fn until_unqueued(client: &Client, name: &str, what: &str) {
    let unqueued = || async { queued(client, name).await.is_empty() };
    wait_until_async(what, Duration::from_secs(2), unqueued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_acquires_releases_and_releases_on_drop() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;

    let lock = client
        .lock("guard")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert!(lock.fencing_token() > 0);
    assert_eq!(lock.slot(), 1);
    assert!(
        lock.holder().starts_with("rust-"),
        "a client-made holder: {}",
        lock.holder()
    );
    assert_eq!(
        holders(&client, "guard").await,
        vec![(lock.holder().to_owned(), lock.fencing_token())]
    );
    assert!(lock.release().await.unwrap(), "released while held");
    assert!(holders(&client, "guard").await.is_empty());

    let dropped = client
        .lock("guard")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    drop(dropped);
    until_unheld(&client, "guard", "the dropped guard's release").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_waits_in_the_queue_and_fencing_tokens_rise() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let first = client
        .lock("contended")
        .holder("first")
        .acquire()
        .await
        .unwrap();

    let busy = client
        .lock("contended")
        .holder("other")
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            busy,
            Error::NotAcquired {
                reason: NotAcquiredReason::Busy,
                holders: 1,
                ..
            }
        ),
        "{busy:?}"
    );
    let timed_out = client
        .lock("contended")
        .holder("other")
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(timed_out.is_timeout(), "{timed_out:?}");

    let waiter = tokio::spawn(
        client
            .lock("contended")
            .holder("second")
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    wait_until_async(
        "the second holder waits",
        Duration::from_secs(5),
        || async { queued(&client, "contended").await == ["second"] },
    )
    .await;
    let first_token = first.fencing_token();
    assert!(first.release().await.unwrap());
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(second.holder(), "second");
    assert!(
        second.fencing_token() > first_token,
        "tokens rise across grants"
    );
    second.release().await.unwrap();
    let third = client.lock("contended").acquire().await.unwrap();
    assert!(third.fencing_token() > first_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_holder_gets_the_same_grant() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let once = client
        .lock("retry")
        .holder("worker-7")
        .limit(2)
        .acquire()
        .await
        .unwrap();
    let again = client
        .lock("retry")
        .holder("worker-7")
        .limit(2)
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        (once.fencing_token(), once.slot()),
        (again.fencing_token(), again.slot())
    );
    assert_eq!(
        holders(&client, "retry").await.len(),
        1,
        "one permit, not two"
    );
    again.forget();
    assert!(once.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error_naming_the_field() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    match client.lock("bad").priority(5000).acquire().await {
        Err(Error::InvalidArgument { message }) => {
            assert!(message.starts_with("priority"), "{message}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_lease_alive_across_several_ttls() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let lock = client
        .lock("kept")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!lock.is_lost());
    assert_eq!(
        holders(&client, "kept").await,
        vec![(lock.holder().to_owned(), lock.fencing_token())]
    );
    let other = client.lock("kept").acquire().await.unwrap_err();
    assert!(other.is_busy(), "{other:?}");

    // Without the watchdog the same lease runs out.
    let unwatched = client
        .lock("unwatched")
        .ttl(Duration::from_millis(300))
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    until_unheld(&client, "unwatched", "the unwatched lease ends").await;
    unwatched.forget();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_resolves_when_the_grant_is_taken_away() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let lock = client
        .lock("taken")
        .ttl(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    let lost = lock.lost();
    client
        .stub()
        .clear(proto::ClearRequest {
            namespace: "rust-client".into(),
        })
        .await
        .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(2), lost)
        .await
        .expect("lost() within a renewal");
    match error {
        Error::LockLost {
            reason,
            fencing_token,
            ..
        } => {
            assert_eq!(reason, "not held");
            assert_eq!(fencing_token, lock.fencing_token());
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
    assert!(lock.is_lost());

    // run(): the body is dropped and the result is LockLost.
    let holder = "runner";
    let body = client
        .lock("taken-run")
        .holder(holder)
        .ttl(Duration::from_millis(900))
        .run(async |_| {
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
    let force = async {
        wait_until_async("the runner holds", Duration::from_secs(5), || async {
            !holders(&client, "taken-run").await.is_empty()
        })
        .await;
        client.release("taken-run", holder, None).await.unwrap();
    };
    let (result, ()) =
        tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(body, force) })
            .await
            .expect("run() ends when the grant is lost");
    assert!(matches!(result, Err(Error::LockLost { .. })), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_rides_out_a_server_restart() {
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let mut server = TumblerProcess::spawn_at(&redis.url(), port, &[]);
    common::wait_for_health(&server.endpoint, ServingStatus::Serving).await;
    let client = client_of(&server.endpoint).await;
    let lock = client
        .lock("restarted")
        .ttl(Duration::from_millis(3000))
        .acquire()
        .await
        .unwrap();
    let token = lock.fencing_token();

    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(1200)).await; // over a third of the lease: a renewal fails
    let again = TumblerProcess::spawn_at(&redis.url(), port, &[]);
    common::wait_for_health(&again.endpoint, ServingStatus::Serving).await;
    tokio::time::sleep(Duration::from_millis(3500)).await; // past the first lease's end
    assert!(!lock.is_lost(), "the lease survived the restart");
    assert_eq!(
        holders(&client, "restarted").await,
        vec![(lock.holder().to_owned(), token)]
    );
    assert!(lock.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_on_a_second_server_with_its_grants_and_tokens() {
    let redis = start_redis();
    let mut first = TumblerProcess::start(&redis.url(), &[]).await;
    let second = TumblerProcess::start(&redis.url(), &[]).await;
    let (one, two) = (
        client_of(&first.endpoint).await,
        client_of(&second.endpoint).await,
    );
    let session = one
        .session()
        .ttl(Duration::from_secs(5))
        .fallback(two.clone())
        .open()
        .await
        .unwrap();
    let mut events = session.events();
    let grant = session.acquire("sessioned", Duration::ZERO).await.unwrap();
    assert!(grant.fencing_token > 0);
    assert_eq!(
        holders(&two, "sessioned").await,
        vec![(session.id().id.clone(), grant.fencing_token)]
    );

    first.kill();
    let resumed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let SessionEvent::Resumed { endpoint, grants } = events.recv().await.unwrap() {
                return (endpoint, grants);
            }
        }
    })
    .await
    .expect("resumed within the TTL");
    assert_eq!(resumed.0, second.endpoint);
    assert_eq!(resumed.1.len(), 1);
    assert_eq!(
        resumed.1[0].fencing_token, grant.fencing_token,
        "same token after the resume"
    );
    // Kept, and renewed by the second server past the session's TTL.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        holders(&two, "sessioned").await,
        vec![(session.id().id.clone(), grant.fencing_token)]
    );
    // Commands go on over the resumed stream.
    let more = session
        .acquire("sessioned-2", Duration::ZERO)
        .await
        .unwrap();
    assert!(more.fencing_token > 0);
    assert!(session.release("sessioned").await.unwrap());
    session.close().await.unwrap();
    until_unheld(
        &two,
        "sessioned-2",
        "the closed session's grants are released",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_or_dropping_an_acquire_leaves_the_queue() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let blocker = client
        .lock("queued")
        .holder("blocker")
        .acquire()
        .await
        .unwrap();

    let token = CancellationToken::new();
    let waiting = tokio::spawn(
        client
            .lock("queued")
            .holder("cancelled")
            .wait(Duration::from_secs(20))
            .cancel_on(token.clone())
            .acquire(),
    );
    wait_until_async("the waiter queues", Duration::from_secs(5), || async {
        queued(&client, "queued").await == ["cancelled"]
    })
    .await;
    token.cancel();
    assert!(matches!(waiting.await.unwrap(), Err(Error::Cancelled)));
    until_unqueued(&client, "queued", "the cancelled waiter leaves the queue").await;

    // Dropping the future does the same.
    let dropped = client
        .lock("queued")
        .holder("dropped")
        .wait(Duration::from_secs(20))
        .acquire();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), dropped)
            .await
            .is_err()
    );
    until_unqueued(&client, "queued", "the dropped waiter leaves the queue").await;

    // A session's dropped acquire too.
    let session = client
        .session()
        .ttl(Duration::from_secs(5))
        .open()
        .await
        .unwrap();
    let id = session.id().id.clone();
    let waiting = session.acquire("queued", Duration::from_secs(20));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err()
    );
    wait_until_async(
        "the session's dropped waiter leaves the queue",
        Duration::from_secs(2),
        || async { !queued(&client, "queued").await.contains(&id) },
    )
    .await;
    assert!(blocker.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        holders(&client, "queued").await.is_empty(),
        "no ghost waiter was granted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_server_is_killed_retries_with_the_same_holder() {
    let redis = start_redis();
    let port = tumbler::dev::free_port().unwrap();
    let mut server = TumblerProcess::spawn_at(&redis.url(), port, &[]);
    common::wait_for_health(&server.endpoint, ServingStatus::Serving).await;
    let client = client_of(&server.endpoint).await;
    let blocker = client
        .lock("killed")
        .holder("blocker")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        client
            .lock("killed")
            .holder("waiter")
            .wait(Duration::from_secs(15))
            .acquire(),
    );
    wait_until_async("the waiter queues", Duration::from_secs(5), || async {
        queued(&client, "killed").await == ["waiter"]
    })
    .await;

    server.kill(); // the waiting call is cut with its connection
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = TumblerProcess::spawn_at(&redis.url(), port, &[]);
    common::wait_for_health(&again.endpoint, ServingStatus::Serving).await;
    assert!(blocker.release().await.unwrap());
    let granted = waiter.await.unwrap().expect("the retried wait is granted");
    assert_eq!(granted.holder(), "waiter");
    assert_eq!(
        holders(&client, "killed").await.len(),
        1,
        "one permit for the retried request"
    );
}

/// The next leader change, within 5 s.
async fn next_change(
    changes: &mut (
             impl tokio_stream::Stream<Item = tumbler_client::Result<proto::LeaderChange>> + Unpin
         ),
) -> proto::LeaderChange {
    use tokio_stream::StreamExt;
    tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("a change within 5 s")
        .expect("the stream goes on")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_elects_in_order_proclaims_is_observed_and_resigns_on_drop() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let election = client.election("rust-election").ttl(Duration::from_secs(3));
    let mut changes = Box::pin(election.observe().await.unwrap());
    let first = next_change(&mut changes).await;
    assert_eq!((first.event.as_str(), first.leader), ("current", None));

    let mut a = election
        .clone()
        .candidate("a")
        .campaign("a:1")
        .await
        .unwrap();
    assert_eq!((a.candidate(), a.value()), ("a", "a:1"));
    let shown = election.leader().await.unwrap().unwrap();
    assert_eq!((shown.candidate.as_str(), shown.term), ("a", a.term()));
    // b waits in line meanwhile.
    let b_election = election.clone().candidate("b");
    let b = tokio::spawn(async move { b_election.campaign("b:1").await });
    wait_until_async("b waits", Duration::from_secs(10), || {
        let client = client.clone();
        async move { client.inspect("rust-election").await.unwrap().waiters == 1 }
    })
    .await;
    a.proclaim("a:2").await.unwrap();
    assert_eq!(a.value(), "a:2");
    assert_eq!(election.leader().await.unwrap().unwrap().value, "a:2");
    // Dropping the guard resigns: b is elected at once, with a higher term.
    let term_a = a.term();
    drop(a);
    let b = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .expect("b elected at once")
        .unwrap()
        .unwrap();
    assert!(b.term() > term_a);
    // The observer saw it all, in order (events are published once the
    // server knows the namespace is watched: it is, from the start here).
    let mut events = Vec::new();
    while events.last().map(|(e, _): &(String, u64)| e.as_str()) != Some("elected")
        || events.len() < 2
    {
        let change = next_change(&mut changes).await;
        let term = change.leader.as_ref().map_or(change.ended_term, |l| l.term);
        events.push((change.event, term));
    }
    assert!(
        events.contains(&("proclaimed".into(), term_a)),
        "{events:?}"
    );
    assert!(events.contains(&("resigned".into(), term_a)), "{events:?}");
    assert_eq!(events.last().unwrap(), &("elected".to_owned(), b.term()));
    assert!(b.resign().await.unwrap());
    assert_eq!(election.leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_server_dies_is_told_lost_and_the_next_is_elected_with_a_higher_term() {
    let redis = start_redis();
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut doomed = TumblerProcess::start(&redis.url(), &[]).await;
    let leader = client_of(&doomed.endpoint)
        .await
        .election("rust-lapse")
        .ttl(Duration::from_millis(1_000))
        .campaign("doomed")
        .await
        .unwrap();
    let lost = leader.lost();
    let next = client_of(&staying.endpoint()).await.election("rust-lapse");
    let waiting = tokio::spawn(async move { next.campaign("alive").await });
    doomed.kill();
    // Renewals fail until the lease ends: lost, then the next candidate
    // is elected (never both within the lease).
    let lost = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("told lost within the lease and a little");
    assert!(matches!(lost, Error::LockLost { .. }), "{lost:?}");
    assert!(leader.is_lost());
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the next candidate is elected")
        .unwrap()
        .unwrap();
    assert!(next.term() > leader.term());
    assert_eq!(next.value(), "alive");
}
