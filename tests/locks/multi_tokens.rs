//! A multi-lock's Release and Extend pinned to each lock's fencing token
//! (`fencing_tokens`, decision 0079): a late release of an old set never
//! touches the holder's newer set (SAFETY.md, finding 10).

use crate::{common, multi, read_write};

use common::*;
use multi::{extend_set, release_set, set};
use proto::lock_service_client::LockServiceClient;
use proto::{AcquireStatus, ExtendStatus, ReleaseStatus};
use read_write::{ask, inspected};
use tonic::transport::Channel;

/// Takes the set `names` for `holder` (a new grant) and answers its grants
/// in the order of `names`.
async fn taken(
    client: &mut LockServiceClient<Channel>,
    names: &[&str],
    holder: &str,
) -> Vec<proto::Grant> {
    let reply = ask(client, set(names, holder)).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    reply.grants
}

fn tokens(grants: &[proto::Grant]) -> Vec<u64> {
    grants.iter().map(|g| g.fencing_token).collect()
}

async fn release_pinned(
    client: &mut LockServiceClient<Channel>,
    names: &[&str],
    holder: &str,
    tokens: Vec<u64>,
) -> ReleaseStatus {
    let request = proto::ReleaseRequest {
        fencing_tokens: tokens,
        ..release_set(names, holder)
    };
    client.release(request).await.unwrap().into_inner().status()
}

async fn extend_pinned(
    client: &mut LockServiceClient<Channel>,
    names: &[&str],
    holder: &str,
    tokens: Vec<u64>,
) -> proto::ExtendResponse {
    let request = proto::ExtendRequest {
        fencing_tokens: tokens,
        ..extend_set(names, holder, 60_000)
    };
    client.extend(request).await.unwrap().into_inner()
}

/// The grants of `name` now (Inspect): (holder, token, expiry) each.
async fn grants_of(client: &mut LockServiceClient<Channel>, name: &str) -> Vec<(String, u64, i64)> {
    (inspected(client, name).await.holders.into_iter())
        .map(|h| h.grant.unwrap())
        .map(|g| (g.holder, g.fencing_token, g.expires_at_ms))
        .collect()
}

/// Finding 10: the holder releases its set, takes it again, and the
/// release of the first set lands late (an orphaned call, a retry). It is
/// answered NOT_HELD and the newer set stays whole, each lock with its
/// newer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_of_an_old_set_leaves_the_newer_set_whole() {
    let server = TestServer::new().shards(4).start().await;
    let mut client = server.client().await;
    let names = ["fa", "fb"];
    let first = tokens(&taken(&mut client, &names, "h").await);
    let released = release_pinned(&mut client, &names, "h", first.clone()).await;
    assert_eq!(released, ReleaseStatus::Released);
    let second = tokens(&taken(&mut client, &names, "h").await);
    assert!(second.iter().zip(&first).all(|(new, old)| new > old));

    let late = release_pinned(&mut client, &names, "h", first).await;
    assert_eq!(late, ReleaseStatus::NotHeld);
    for (name, token) in names.iter().zip(&second) {
        let held: Vec<(String, u64)> = (grants_of(&mut client, name).await.into_iter())
            .map(|(holder, token, _)| (holder, token))
            .collect();
        assert_eq!(held, [("h".to_owned(), *token)], "{name}");
    }
}

/// Tokens that match for one lock and not the other: the matching lock is
/// released (a broken old set is of no use), the other left alone, and
/// the answer is NOT_HELD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_matching_release_lets_go_of_the_match_and_leaves_the_rest() {
    let server = TestServer::new().start().await;
    let mut client = server.client().await;
    let names = ["pa", "pb"];
    let old = tokens(&taken(&mut client, &names, "h").await);
    // pb let go and taken again alone by the same holder: a newer token.
    let_go_pinned(&mut client, "pb", old[1]).await;
    let reply = ask(&mut client, acquire("pb", "h")).await;
    assert_eq!(reply.status(), AcquireStatus::Acquired, "{reply:?}");
    let newer = reply.grant.unwrap().fencing_token;
    assert!(newer > old[1]);

    let answer = release_pinned(&mut client, &names, "h", old).await;
    assert_eq!(answer, ReleaseStatus::NotHeld);
    assert!(grants_of(&mut client, "pa").await.is_empty());
    let pb = grants_of(&mut client, "pb").await;
    assert_eq!(pb.len(), 1, "{pb:?}");
    assert_eq!((pb[0].0.as_str(), pb[0].1), ("h", newer));
}

async fn let_go_pinned(client: &mut LockServiceClient<Channel>, name: &str, token: u64) {
    let request = proto::ReleaseRequest {
        fencing_token: Some(token),
        ..release(name, "h")
    };
    let reply = client.release(request).await.unwrap().into_inner();
    assert_eq!(reply.status(), ReleaseStatus::Released);
}

/// An Extend with the old set's tokens after the holder took the set
/// again: NOT_HELD, and the newer set is neither released nor extended
/// (its expiries unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_with_stale_tokens_leaves_the_newer_set_as_it_was() {
    let server = TestServer::new().shards(4).start().await;
    let mut client = server.client().await;
    let names = ["sa", "sb", "sc"];
    let first = tokens(&taken(&mut client, &names, "h").await);
    assert_eq!(
        release_pinned(&mut client, &names, "h", first.clone()).await,
        ReleaseStatus::Released
    );
    let second = tokens(&taken(&mut client, &names, "h").await);
    let mut before = Vec::new();
    for name in names {
        before.push(grants_of(&mut client, name).await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;

    let reply = extend_pinned(&mut client, &names, "h", first).await;
    assert_eq!(reply.status(), ExtendStatus::NotHeld, "{reply:?}");
    assert_eq!(reply.grant, None);
    for ((name, was), token) in names.iter().zip(before).zip(&second) {
        let now = grants_of(&mut client, name).await;
        assert_eq!(now, was, "{name}: neither released nor extended");
        assert_eq!(now[0].1, *token);
    }
}

/// An Extend with the set's own tokens extends every lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_with_the_sets_tokens_extends_it() {
    let server = TestServer::new().shards(4).start().await;
    let mut client = server.client().await;
    let names = ["xa", "xb"];
    let grants = taken(&mut client, &names, "h").await;
    let reply = extend_pinned(&mut client, &names, "h", tokens(&grants)).await;
    assert_eq!(reply.status(), ExtendStatus::Extended, "{reply:?}");
    let earliest = reply.grant.unwrap().expires_at_ms;
    for (name, grant) in names.iter().zip(&grants) {
        let now = grants_of(&mut client, name).await;
        assert_eq!(now.len(), 1, "{now:?}");
        assert_eq!(now[0].1, grant.fencing_token);
        assert!(now[0].2 >= earliest && now[0].2 > grant.expires_at_ms);
    }
}

/// A Release with the set's own tokens releases it whole, and nothing of
/// it is left in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_the_sets_tokens_releases_it_and_leaves_no_keys() {
    let server = TestServer::new().shards(4).start().await;
    let mut client = server.client().await;
    let names = ["ra", "rb", "rc"];
    let grants = taken(&mut client, &names, "h").await;
    let released = release_pinned(&mut client, &names, "h", tokens(&grants)).await;
    assert_eq!(released, ReleaseStatus::Released);
    for name in names {
        assert!(grants_of(&mut client, name).await.is_empty(), "{name}");
    }
    let mut redis = redis_conn(server.redis_url()).await;
    assert!(scan_keys(&mut redis, "tumbler:*:l:*").await.is_empty());
}
