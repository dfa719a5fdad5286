//! Multi-locks through the Rust client (`Client::lock_all` → `LockSet`):
//! all or nothing against a holder of one of the names (the set waits
//! holding nothing, then gets every lock once it frees), a fencing token
//! per name, one release of the whole set on drop, and the watchdog
//! keeping a short-lease set alive past several leases until a lock of it
//! is taken away (then `lost()` resolves and the rest is released), and a
//! cancelled wait leaving the server. A set's release and extend are
//! pinned to its tokens: they never touch the set its holder took again.

use std::time::Duration;

use super::{client_of, holders};
use crate::common::wait::wait_until_async;
use crate::common::{TestServer, proto};
use tokio::time::Instant;
use tumbler_client::{CancellationToken, Client, Error, NotAcquiredReason};

async fn all_free(client: &Client, names: &[&str]) -> bool {
    for name in names {
        if !holders(client, name).await.is_empty() {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_all_or_nothing_and_waits_holding_nothing() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let names = ["set-a", "set-b", "set-c"];
    let solo = client
        .lock("set-b")
        .holder("solo")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();

    let busy = client
        .lock_all(names)
        .holder("set")
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &busy,
            Error::NotAcquired { name, reason: NotAcquiredReason::Busy, .. }
                if name == "set-a,set-b,set-c"
        ),
        "{busy:?}"
    );
    assert!(
        all_free(&client, &["set-a", "set-c"]).await,
        "no part taken"
    );

    let waiter = tokio::spawn(
        client
            .lock_all(names)
            .holder("set")
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(20))
            .acquire(),
    );
    wait_until_async(
        "the set waits in the server",
        Duration::from_secs(10),
        || async { client.inspect("set-b").await.unwrap().waiters > 0 },
    )
    .await;
    assert!(!waiter.is_finished(), "the set waits while set-b is held");
    assert!(
        all_free(&client, &["set-a", "set-c"]).await,
        "waiting holds nothing"
    );

    assert!(solo.release().await.unwrap());
    let set = waiter
        .await
        .unwrap()
        .expect("the whole set once set-b frees");
    assert_eq!(set.holder(), "set");
    for name in names {
        assert_eq!(
            holders(&client, name).await,
            vec![("set".to_owned(), set.fencing_token(name).unwrap())],
            "{name} held by the set"
        );
    }
    assert!(set.release().await.unwrap(), "released while held");
    assert!(all_free(&client, &names).await, "every lock released");
}

fn set_token(tokens: &[(String, u64)], name: &str) -> u64 {
    tokens.iter().find(|(n, _)| n == name).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_name_and_the_set_is_released_on_drop() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let names = ["tok-x", "tok-y"];
    let set = client
        .lock_all(names)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert!(set.holder().starts_with("rust-"), "{}", set.holder());
    assert_eq!(set.names(), names);
    let granted: Vec<&str> = set.grants().iter().map(|g| g.name.as_str()).collect();
    assert_eq!(granted, names, "one grant per name in the order asked");
    assert_eq!(set.fencing_token("tok-z"), None);
    let set_tokens: Vec<(String, u64)> = (set.grants().iter())
        .map(|g| (g.name.clone(), g.fencing_token))
        .collect();
    for (name, grant) in names.iter().zip(set.grants()) {
        assert_eq!(set.fencing_token(name), Some(grant.fencing_token));
        assert_eq!(
            holders(&client, name).await,
            vec![(set.holder().to_owned(), grant.fencing_token)],
            "{name}'s own grant"
        );
    }

    // The same holder again (a retry): the same grants, not new ones.
    let again = client
        .lock_all(names)
        .holder(set.holder())
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.grants(), set.grants(), "a retry is the same request");

    drop(again);
    wait_until_async(
        "the dropped set's release",
        Duration::from_secs(5),
        || async { all_free(&client, &names).await },
    )
    .await;
    assert!(!set.release().await.unwrap(), "released once, as a set");

    // Taken again: each lock's token is above its last one.
    let next = client.lock_all(names).acquire().await.unwrap();
    for name in names {
        let (old, new) = (
            set_token(&set_tokens, name),
            next.fencing_token(name).unwrap(),
        );
        assert!(new > old, "{name}: {old} then {new}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_short_lease_set_until_a_lock_of_it_is_taken() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let names = ["dog-1", "dog-2", "dog-3"];
    let ttl = Duration::from_millis(600);
    let set = client.lock_all(names).ttl(ttl).acquire().await.unwrap();

    // Five leases: each poll finds every lock still held by the set.
    let started = Instant::now();
    wait_until_async(
        "five leases have passed",
        Duration::from_secs(30),
        || async {
            for name in names {
                assert_eq!(
                    holders(&client, name).await,
                    vec![(set.holder().to_owned(), set.fencing_token(name).unwrap())],
                    "{name} held after {:?}",
                    started.elapsed()
                );
            }
            started.elapsed() > ttl * 5
        },
    )
    .await;
    assert!(!set.is_lost());

    // Taken away behind its back: the next renewal answers NOT_HELD.
    let token = set.fencing_token("dog-2").unwrap();
    assert!(
        client
            .release("dog-2", set.holder(), Some(token))
            .await
            .unwrap()
    );
    let lost = tokio::time::timeout(Duration::from_secs(10), set.lost())
        .await
        .expect("lost() resolves after the next renewal");
    assert!(matches!(lost, Error::LockLost { .. }), "{lost:?}");
    assert!(set.is_lost());
    assert!(
        all_free(&client, &names).await,
        "a broken set is released whole"
    );
    assert!(!set.release().await.unwrap(), "nothing was held any more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_waiting_set_ends_its_wait_in_the_server() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let _solo = client
        .lock("cancel-b")
        .holder("solo")
        .acquire()
        .await
        .unwrap();
    let token = CancellationToken::new();
    let waiter = tokio::spawn(
        client
            .lock_all(["cancel-a", "cancel-b"])
            .wait(Duration::from_secs(20))
            .cancel_on(token.clone())
            .acquire(),
    );
    wait_until_async("the set waits", Duration::from_secs(10), || async {
        client.inspect("cancel-b").await.unwrap().waiters > 0
    })
    .await;

    token.cancel();
    let cancelled = waiter.await.unwrap().unwrap_err();
    assert!(matches!(cancelled, Error::Cancelled), "{cancelled:?}");
    wait_until_async(
        "the wait ends in the server",
        Duration::from_secs(10),
        || async { client.inspect("cancel-b").await.unwrap().waiters == 0 },
    )
    .await;
    assert!(all_free(&client, &["cancel-a"]).await, "nothing taken");
}

/// A `LockSet` whose holder released the set and took it again behind its
/// back (raw gRPC, the same holder id): its extend is answered lost and
/// its release not held, and the newer set stays whole with its tokens
/// (each lock of the guard's calls pinned to the guard's token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sets_release_and_extend_never_touch_the_set_taken_again() {
    let server = TestServer::new().start().await;
    let client = client_of(&server.endpoint()).await;
    let names = ["pin-a", "pin-b"];
    let set = client
        .lock_all(names)
        .holder("pinned")
        .ttl(Duration::from_secs(30))
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    let mut raw = server.client().await;
    let of = || names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let released = raw
        .release(proto::ReleaseRequest {
            namespace: client.namespace().into(),
            names: of(),
            holder: "pinned".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), proto::ReleaseStatus::Released);
    let again = raw
        .acquire(proto::AcquireRequest {
            namespace: client.namespace().into(),
            names: of(),
            holder: "pinned".into(),
            ttl_ms: Some(30_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.status(), proto::AcquireStatus::Acquired, "{again:?}");
    let newer: Vec<(String, u64)> = (again.grants.iter())
        .map(|g| ("pinned".to_owned(), g.fencing_token))
        .collect();

    let extended = set.extend(Some(Duration::from_secs(60))).await;
    assert!(
        matches!(extended, Err(Error::LockLost { .. })),
        "{extended:?}"
    );
    assert!(!set.release().await.unwrap(), "the guard's set is not held");
    for (name, grant) in names.iter().zip(&newer) {
        assert_eq!(holders(&client, name).await, vec![grant.clone()], "{name}");
    }
}
