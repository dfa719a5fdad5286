//! The one watch of a caller's access that every call that lasts keeps
//! while it runs: a waiting Acquire (one lock or a set), a Campaign, a
//! Watch or Observe stream, a Session. The token may be revoked or expire,
//! or lose the namespace, while the call waits; then the call ends with
//! the status that says so (UNAUTHENTICATED, PERMISSION_DENIED), and a
//! wait is stopped at a safe point first. With auth off nothing changes,
//! and a try-once call keeps no watch at all.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::auth::LiveAccess;
use crate::engine::Namespace;

/// Waits until the caller's access may have changed (the tokens file
/// reloaded, the token's expiry come) and looks it up again: the status
/// to end on when its token was revoked or has expired.
pub async fn changed(live: &mut LiveAccess) -> Result<(), Status> {
    live.changed().await;
    live.recheck()
}

/// Resolves, with the status to end on, once the caller may no longer act
/// on `namespace` (never, with auth off).
pub async fn lost(live: &mut LiveAccess, namespace: &Namespace) -> Status {
    loop {
        let still = changed(live)
            .await
            .and_then(|()| live.access().act(namespace));
        if let Err(status) = still {
            return status;
        }
    }
}

/// Runs `work`, a wait that stops at a safe point once `stop` is
/// cancelled, while the caller may act on `namespace`: its outcome, and
/// the status to answer instead when the access ended meanwhile (the work
/// was stopped, and still ran to its end, so a grant it made can be given
/// back). Without `live` (a try-once call, auth off) the work just runs.
pub async fn while_permitted<T>(
    live: Option<&mut LiveAccess>,
    namespace: &Namespace,
    stop: &CancellationToken,
    work: impl Future<Output = T>,
) -> (T, Option<Status>) {
    let Some(live) = live else {
        return (work.await, None);
    };
    tokio::pin!(work);
    tokio::select! {
        outcome = &mut work => (outcome, None),
        status = lost(live, namespace) => {
            stop.cancel();
            (work.await, Some(status))
        }
    }
}
