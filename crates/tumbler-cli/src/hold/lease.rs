//! `hold` without `--session`: the lock is kept by renewing its lease.
//! The acquire is sent again with the same holder while servers answer
//! UNAVAILABLE; a task extends the lease every third of its TTL, retries
//! on other endpoints when that fails, reports the loss in time for the
//! command to be stopped before the lease may end, and releases at the end.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::retry::{Backoff, RETRY_BUDGET, retryable};
use super::{Acquired, Held, Loss};
use crate::Failure;
use crate::connect::Conn;
use crate::output::{display_name, status_line};
use tumbler_proto as proto;

/// Acquires with our own holder id (so a retry on another endpoint is the
/// same request), then renews the lease in a task.
pub(super) async fn acquire_lease(
    mut conn: Conn,
    request: proto::AcquireRequest,
    grace: Duration,
) -> Result<Acquired, Failure> {
    let (reply, sent) = acquire_retrying(&mut conn, &request).await?;
    let Some(grant) = reply.grant.clone() else {
        return Ok(Acquired::Refused(reply));
    };
    Ok(Acquired::Held(keep_lease(
        conn,
        (&request.namespace, &request.name),
        grant,
        sent,
        grace,
        None,
    )))
}

/// Renews a granted lease in a task (every third of it, failing over
/// across endpoints) until `Held::release`, which gives it back pinned to
/// its token; `sent` is when the request that made it left. Also keeps a
/// leadership (`elect`): the grant of an election's lock, given back with
/// Resign and the secret its winning Campaign returned (`secret`).
pub(crate) fn keep_lease(
    conn: Conn,
    (namespace, name): (&str, &str),
    grant: proto::Grant,
    sent: Instant,
    grace: Duration,
    secret: Option<&str>,
) -> Held {
    let ttl = Duration::from_millis(grant.ttl_ms.max(1));
    let (lost_tx, lost) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let keeper = LeaseKeeper {
        conn,
        extend: proto::ExtendRequest {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            holder: grant.holder.clone(),
            ttl_ms: Some(grant.ttl_ms),
            fencing_token: Some(grant.fencing_token),
            names: Vec::new(),
            fencing_tokens: Vec::new(),
        },
        release: proto::ReleaseRequest {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            holder: grant.holder.clone(),
            fencing_token: Some(grant.fencing_token),
            names: Vec::new(),
            fencing_tokens: Vec::new(),
        },
        resign: secret.map(|secret| proto::ResignRequest {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            candidate: grant.holder.clone(),
            term: grant.fencing_token,
            secret: secret.to_owned(),
        }),
        ttl,
        grace,
        // The lease began after the request left: ending no sooner than
        // `sent + ttl` is the safe assumption.
        deadline: sent + ttl,
        lost: lost_tx,
    };
    let task = tokio::spawn(keeper.run(stop.clone()));
    Held {
        grant,
        lost,
        stop,
        task,
    }
}

/// Sends the acquire, and sends it again with the same holder while the
/// servers answer UNAVAILABLE (with backoff, on the next endpoint), until
/// the wait is over or at least `RETRY_BUDGET` passed: a waiter keeps its
/// place in the queue, and a grant whose answer was lost comes back as
/// ALREADY_HELD. Returns the reply, and the earliest time its grant's
/// lease may have begun.
async fn acquire_retrying(
    conn: &mut Conn,
    request: &proto::AcquireRequest,
) -> Result<(proto::AcquireResponse, Instant), tonic::Status> {
    let started = Instant::now();
    let wait_until = started + Duration::from_millis(request.wait_ms);
    let retry_until = wait_until.max(started + RETRY_BUDGET);
    let mut backoff = Backoff::new();
    // An attempt whose answer was lost may have been granted.
    let mut first_unanswered: Option<Instant> = None;
    loop {
        let sent = Instant::now();
        let attempt = proto::AcquireRequest {
            wait_ms: wait_until.saturating_duration_since(sent).as_millis() as u64,
            ..request.clone()
        };
        match call!(conn, acquire, attempt).await {
            Ok(reply) => return Ok((reply, first_unanswered.unwrap_or(sent))),
            Err(status) if retryable(&status) && Instant::now() < retry_until => {
                if first_unanswered.is_none() {
                    status_line(&format!(
                        "tumbler hold: {}; trying again with the same holder",
                        status.message()
                    ));
                }
                first_unanswered.get_or_insert(sent);
                conn.skip();
                tokio::time::sleep(backoff.next()).await;
            }
            Err(status) => return Err(status),
        }
    }
}

struct LeaseKeeper {
    conn: Conn,
    extend: proto::ExtendRequest,
    release: proto::ReleaseRequest,
    /// A leadership's Resign (it needs the secret; a Release is refused).
    resign: Option<proto::ResignRequest>,
    ttl: Duration,
    grace: Duration,
    /// The lease ends no sooner than this (local monotonic clock).
    deadline: Instant,
    lost: mpsc::Sender<Loss>,
}

impl LeaseKeeper {
    async fn run(mut self, stop: CancellationToken) {
        let rpc_timeout = (self.ttl / 3).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let retry_every = (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let lock = display_name(&self.extend.namespace, &self.extend.name);
        let mut failing = false;
        let mut reported = false;
        loop {
            let next = if failing {
                Instant::now() + retry_every
            } else {
                // A third of the way into the lease.
                self.deadline - self.ttl * 2 / 3
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = tokio::time::sleep_until(next) => {}
            }
            let sent = Instant::now();
            let extend = self.extend.clone();
            let answer = tokio::time::timeout(rpc_timeout, call!(self.conn, extend, extend)).await;
            let error = match answer {
                Ok(Ok(reply)) if reply.status() == proto::ExtendStatus::Extended => {
                    self.deadline = sent + self.ttl;
                    if failing {
                        status_line(&format!("tumbler hold: renewed {lock} again"));
                    }
                    failing = false;
                    continue;
                }
                Ok(Ok(_)) => {
                    let _ = self
                        .lost
                        .send(Loss {
                            reason: "not held any more (expired, reaped or cleared)".into(),
                            kill_by: None,
                        })
                        .await;
                    // Nothing left to renew or give back.
                    stop.cancelled().await;
                    return;
                }
                Ok(Err(status)) => status.message().to_owned(),
                Err(_) => {
                    self.conn.skip();
                    format!(
                        "no answer within {}",
                        humantime::format_duration(rpc_timeout)
                    )
                }
            };
            let left = self.deadline.saturating_duration_since(Instant::now());
            if !failing {
                status_line(&format!(
                    "tumbler hold: cannot renew {lock}: {error}; retrying (the lease ends within {})",
                    humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
                ));
            }
            failing = true;
            if !reported && left <= self.grace {
                reported = true;
                let margin = (self.ttl / 20).min(Duration::from_millis(250));
                let _ = self
                    .lost
                    .send(Loss {
                        reason: format!("cannot renew the lease ({error}) before it ends"),
                        kill_by: Some(self.deadline - margin),
                    })
                    .await;
            }
        }
        let answer = match self.resign.clone() {
            Some(resign) => {
                tokio::time::timeout(Duration::from_secs(5), call!(self.conn, resign, resign))
                    .await
                    .map(|reply| reply.map(drop))
            }
            None => {
                let release = self.release.clone();
                tokio::time::timeout(Duration::from_secs(5), call!(self.conn, release, release))
                    .await
                    .map(|reply| reply.map(drop))
            }
        };
        if let Ok(Err(status)) = answer {
            status_line(&format!(
                "tumbler hold: cannot release {lock}: {}; its lease ends by itself",
                status.message()
            ));
        }
    }
}
