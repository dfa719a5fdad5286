//! The chaos clients' multi-locks and observers (invariant 15): a set of 2
//! or 3 of the plain locks taken as one multi-lock, held briefly and
//! released as a set; an Inspect of one plain lock recording who holds it
//! with which token and lease. What they record is checked by `sets.rs`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tumbler::proto::lock_service_client::LockServiceClient;

use super::check::{Grant, Mode};
use super::ops::SET_TTL_MS;
use super::sets::{Attempt, History, Peek, Seen, Set};
use crate::common::proto;

/// How long a set (and a single acquire) waits.
pub(super) const WAIT_MS: u64 = 1_000;

/// What the clients share: the grants, the sets' history, the errors seen.
#[derive(Clone)]
pub(super) struct Log {
    pub(super) grants: Arc<Mutex<Vec<Grant>>>,
    pub(super) history: Arc<Mutex<History>>,
    pub(super) errors: Arc<Mutex<BTreeMap<String, usize>>>,
    /// `CHAOS_MISSET_SETS=1`: each set is recorded as standing from when it
    /// was sent rather than when ACQUIRED arrived, i.e. the checker is told
    /// a set is whole during its round. The checker must then find partial
    /// sets (the proof that it can fail).
    pub(super) misset: bool,
}

impl Log {
    pub(super) fn error(&self, verb: &str, status: &tonic::Status) {
        *(self.errors.lock().unwrap())
            .entry(format!("{verb} {:?}", status.code()))
            .or_default() += 1;
    }

    /// An attempt on plain locks `locks` not answered with a grant.
    pub(super) fn attempt(&self, client: usize, locks: Vec<usize>, sent: Instant, ttl_ms: u64) {
        self.history.lock().unwrap().attempts.push(Attempt {
            client,
            locks,
            sent,
            answered: Instant::now(),
            wait: Duration::from_millis(WAIT_MS),
            ttl: Duration::from_millis(ttl_ms),
        });
    }
}

/// The plain locks of client `client`'s `op`-th operation, a set of
/// `size`: from lock `first` on, in the other order for odd clients (so
/// overlapping sets are asked in opposite orders).
fn members(client: usize, first: usize, size: usize, locks: usize) -> Vec<usize> {
    let mut members: Vec<usize> = (0..size).map(|i| (first + i) % locks).collect();
    if client % 2 == 1 {
        members.reverse();
    }
    members
}

/// Takes a set of `size` plain locks from `first` on, holds it briefly
/// and releases it; records what happened in `log`.
pub(super) async fn take_set(
    rpc: &mut LockServiceClient<Channel>,
    (client, op, first, size, locks): (usize, usize, usize, usize, usize),
    log: &Log,
) {
    let members = members(client, first, size.min(locks), locks);
    let holder = format!("client-{client}");
    let names: Vec<String> = members.iter().map(|k| format!("chaos-{k}")).collect();
    let request = proto::AcquireRequest {
        names: names.clone(),
        holder: holder.clone(),
        ttl_ms: Some(SET_TTL_MS),
        wait_ms: WAIT_MS,
        ..Default::default()
    };
    let sent = Instant::now();
    let reply = rpc.acquire(request).await;
    let answered = Instant::now();
    log.attempt(client, members.clone(), sent, SET_TTL_MS);
    let (grants, already) = match reply.map(|r| r.into_inner()) {
        Ok(reply)
            if matches!(
                reply.status(),
                proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld
            ) =>
        {
            let already = reply.status() == proto::AcquireStatus::AlreadyHeld;
            (reply.grants, already)
        }
        Ok(_) => return,
        Err(status) => {
            log.error("acquire set", &status);
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    assert_eq!(
        grants.iter().map(|g| &g.name).collect::<Vec<_>>(),
        names.iter().collect::<Vec<_>>(),
        "a granted set answers one grant per name, in order"
    );
    let lease_end = sent + Duration::from_millis(SET_TTL_MS);
    // The set is relied on for what the answer promises of its shortest
    // lease: from its newest grant to its earliest expiry (a lock its
    // holder held already comes back with what remains of its lease, as a
    // single ALREADY_HELD does), counted from the sending.
    let newest = grants.iter().map(|g| g.acquired_at_ms).max().unwrap_or(0);
    let earliest = grants.iter().map(|g| g.expires_at_ms).min().unwrap_or(0);
    // A set held already in full (an earlier attempt of this holder whose
    // answer was lost: the holder is the client's) comes back unchanged,
    // with what remains of its leases; the answer carries no Redis clock
    // to count that remainder from, so nothing of it is relied on.
    let promised = if already {
        0
    } else {
        (earliest - newest).clamp(0, SET_TTL_MS as i64) as u64
    };
    if !already && promised + 100 < SET_TTL_MS {
        log.history.lock().unwrap().short += 1;
    }
    let relied_end = sent + Duration::from_millis(promised);
    // Held a little longer than a single grant, so that observers see it.
    tokio::time::sleep(Duration::from_millis(50 + ((client * 7 + op) % 30) as u64)).await;
    let releasing = Instant::now();
    let released = rpc
        .release(proto::ReleaseRequest {
            names,
            holder,
            ..Default::default()
        })
        .await;
    if let Err(status) = released {
        log.error("release set", &status);
        tokio::time::sleep_until(lease_end.into()).await;
    }
    if answered >= relied_end {
        return;
    }
    let end = releasing.min(relied_end);
    let tokens: Vec<(usize, u64)> = (members.iter().copied())
        .zip(grants.iter().map(|g| g.fencing_token))
        .collect();
    log.grants
        .lock()
        .unwrap()
        .extend(tokens.iter().map(|&(lock, token)| Grant {
            lock,
            mode: Mode::Exclusive,
            token,
            start: answered,
            end,
            client,
        }));
    log.history.lock().unwrap().sets.push(Set {
        client,
        members: tokens,
        start: if log.misset { sent } else { answered },
        end,
    });
}

/// Observers beside the clients, one per plain lock (a stalled node
/// delays only its own): until `stop`, each inspects its lock through
/// each replica in turn.
pub(super) async fn observe(
    channels: Vec<Channel>,
    locks: usize,
    log: Log,
    stop: tokio_util::sync::CancellationToken,
) {
    let observers = (0..locks).map(|lock| {
        let (channels, log, stop) = (channels.clone(), log.clone(), stop.clone());
        async move {
            let mut round = 0;
            while !stop.is_cancelled() {
                round += 1;
                let rpc = LockServiceClient::new(channels[round % channels.len()].clone());
                peek(rpc, lock, &log).await;
            }
        }
    });
    futures::future::join_all(observers).await;
}

/// Inspects plain lock `lock` and records its holders.
async fn peek(mut rpc: LockServiceClient<Channel>, lock: usize, log: &Log) {
    let sent = Instant::now();
    let mut request = tonic::Request::new(proto::InspectRequest {
        name: format!("chaos-{lock}"),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(1));
    let reply = rpc.inspect(request).await;
    let answered = Instant::now();
    let state = match reply {
        Ok(reply) => reply.into_inner(),
        Err(status) => {
            log.error("inspect", &status);
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    let holders = (state.holders.into_iter())
        .filter_map(|h| h.grant)
        .filter_map(|g| {
            Some(Seen {
                client: g.holder.strip_prefix("client-")?.parse().ok()?,
                token: g.fencing_token,
                lease: Duration::from_millis((g.expires_at_ms - g.acquired_at_ms).max(0) as u64),
            })
        })
        .collect();
    log.history.lock().unwrap().peeks.push(Peek {
        lock,
        sent,
        answered,
        holders,
    });
}
