//! What a chaos client does: its operations (a plain lock, a leader's
//! term, a read or a write on a read/write lock, k permits of a
//! semaphore, a multi-lock of 2 or 3 plain locks) and their RPCs.

use tonic::transport::Channel;
use tumbler::proto::lock_service_client::LockServiceClient;

use super::TTL_MS;
use super::check::Mode;
use crate::common::proto;

/// Read/write locks, and the readers each admits at once.
pub(super) const RW_LOCKS: usize = 2;
pub(super) const READERS: u32 = 3;
/// Semaphores that weighted acquires share, and the permits of each.
pub(super) const SEMAPHORES: usize = 2;
pub(super) const PERMITS: u32 = 4;
/// A multi-lock's lease: longer than its reservation on a cluster
/// (decision 0076: at most 2 × names × the 500 ms command timeout), so a
/// part left by a failed round is told apart from a whole set.
pub(super) const SET_TTL_MS: u64 = 3_500;

/// What one operation of a client does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Acquire and release plain lock k (`chaos-k`).
    Plain,
    /// Campaign and resign in election k (`chaos-election-k`).
    Term,
    /// Acquire READ (optionally preferring readers) or WRITE on read/write
    /// lock k (`chaos-rw-k`), and release.
    Read {
        prefer: bool,
    },
    Write,
    /// Acquire `k` of the `PERMITS` permits of semaphore k
    /// (`chaos-sem-k`), fair or barging, and release.
    Permits {
        k: u32,
        barging: bool,
    },
    /// Acquire `size` (2 or 3) of the plain locks as one multi-lock, from
    /// lock k on (odd clients in the other order), and release the set.
    Multi {
        size: usize,
    },
}

impl Op {
    /// A client's `op`-th operation: every fourth a term, every fourth on
    /// a read/write lock (two reads to a write), every fourth k of a
    /// semaphore's permits (k from 1 to all of them, one in three
    /// barging), the rest on the plain locks: a single acquire, or (twice
    /// as often) a set of 2 or 3.
    pub(super) fn pick(client: usize, op: usize) -> Op {
        match op % 4 {
            0 => Op::Term,
            1 => match (client + op / 4) % 3 {
                0 => Op::Plain,
                _ => Op::Multi {
                    size: 2 + (client + op / 12) % 2,
                },
            },
            3 => Op::Permits {
                k: ((client + op / 4) % PERMITS as usize) as u32 + 1,
                barging: (client + op / 8).is_multiple_of(3),
            },
            _ => match (client + op / 4) % 3 {
                0 => Op::Write,
                n => Op::Read {
                    prefer: n == 1 && (op / 12).is_multiple_of(2),
                },
            },
        }
    }

    /// The grant's index in the checker: plain lock k is k, election k is
    /// `locks + k`, read/write lock k is `2 * locks + k`, semaphore k is
    /// `2 * locks + RW_LOCKS + k`.
    pub(super) fn index(self, locks: usize, k: usize) -> usize {
        match self {
            Op::Plain | Op::Multi { .. } => k,
            Op::Term => locks + k,
            Op::Read { .. } | Op::Write => 2 * locks + k % RW_LOCKS,
            Op::Permits { .. } => 2 * locks + RW_LOCKS + k % SEMAPHORES,
        }
    }

    /// What `grant` allows beside it: for k permits, the permits the grant
    /// says it holds (a grant seen again keeps its first weight).
    pub(super) fn mode(self, grant: &proto::Grant) -> Mode {
        match self {
            Op::Plain | Op::Term | Op::Multi { .. } => Mode::Exclusive,
            Op::Read { .. } => Mode::Read,
            Op::Write => Mode::Write,
            Op::Permits { .. } => Mode::Permits(grant.permits.max(1)),
        }
    }

    pub(super) fn verbs(self) -> (&'static str, &'static str) {
        match self {
            Op::Plain => ("acquire", "release"),
            Op::Term => ("campaign", "resign"),
            Op::Read { .. } => ("acquire READ", "release READ"),
            Op::Write => ("acquire WRITE", "release WRITE"),
            Op::Permits { .. } => ("acquire k permits", "release k permits"),
            Op::Multi { .. } => ("acquire set", "release set"),
        }
    }

    /// The name of lock k for this operation (not an election's).
    pub(super) fn name(self, lock: usize) -> String {
        match self {
            Op::Plain | Op::Term | Op::Multi { .. } => format!("chaos-{lock}"),
            Op::Read { .. } | Op::Write => format!("chaos-rw-{}", lock % RW_LOCKS),
            Op::Permits { .. } => format!("chaos-sem-{}", lock % SEMAPHORES),
        }
    }

    /// The Acquire of lock k for this operation (not an election's): a
    /// plain lock; a read/write lock of `READERS` readers (the mode and
    /// `prefer_readers`); k of a semaphore's `PERMITS`.
    pub(super) fn request(self, lock: usize, holder: &str) -> proto::AcquireRequest {
        let mut request = proto::AcquireRequest {
            name: self.name(lock),
            holder: holder.to_owned(),
            ttl_ms: Some(TTL_MS),
            wait_ms: 1_000,
            ..Default::default()
        };
        match self {
            Op::Plain | Op::Term | Op::Multi { .. } => {}
            Op::Read { prefer } => {
                request.set_mode(proto::LockMode::Read);
                request.prefer_readers = prefer;
                request.limit = Some(READERS);
            }
            Op::Write => {
                request.set_mode(proto::LockMode::Write);
                request.limit = Some(READERS);
            }
            Op::Permits { k, barging } => {
                request.limit = Some(PERMITS);
                request.permits = Some(k);
                request.fair = barging.then_some(false);
            }
        }
        request
    }
}

/// Sends `request`: the grant when granted (or held already).
pub(super) async fn acquire(
    rpc: &mut LockServiceClient<Channel>,
    request: proto::AcquireRequest,
) -> Result<Option<proto::Grant>, tonic::Status> {
    let reply = rpc.acquire(request).await?.into_inner();
    let granted = matches!(
        reply.status(),
        proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld
    );
    Ok(reply.grant.filter(|_| granted))
}

pub(super) async fn release(
    rpc: &mut LockServiceClient<Channel>,
    name: &str,
    holder: &str,
    token: u64,
) -> Result<(), tonic::Status> {
    rpc.release(proto::ReleaseRequest {
        name: name.to_owned(),
        holder: holder.to_owned(),
        fencing_token: Some(token),
        ..Default::default()
    })
    .await
    .map(|_| ())
}

/// The secrets the winning campaigns were told, by election, candidate
/// and term: Resign needs one (decision 0082).
static SECRETS: std::sync::Mutex<Vec<(Told, String)>> = std::sync::Mutex::new(Vec::new());

/// An election, a candidate and its term.
type Told = (usize, String, u64);

/// Campaigns in election `lock`: the term when elected.
pub(super) async fn campaign(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    candidate: &str,
) -> Result<Option<u64>, tonic::Status> {
    let reply = rpc
        .campaign(proto::CampaignRequest {
            name: format!("chaos-election-{lock}"),
            candidate: candidate.to_owned(),
            value: candidate.to_owned(),
            ttl_ms: Some(TTL_MS),
            wait_ms: Some(1_000),
            ..Default::default()
        })
        .await?
        .into_inner();
    let term = reply
        .leader
        .filter(|_| reply.elected)
        .map(|leader| leader.term);
    if let Some(term) = term {
        let mut secrets = SECRETS.lock().unwrap();
        secrets.retain(|((l, c, _), _)| (*l, c.as_str()) != (lock, candidate));
        secrets.push(((lock, candidate.to_owned(), term), reply.secret));
    }
    Ok(term)
}

pub(super) async fn resign(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    candidate: &str,
    term: u64,
) -> Result<(), tonic::Status> {
    let secret = (SECRETS.lock().unwrap().iter())
        .find(|((l, c, t), _)| (*l, c.as_str(), *t) == (lock, candidate, term))
        .map(|(_, secret)| secret.clone())
        .unwrap_or_default();
    rpc.resign(proto::ResignRequest {
        name: format!("chaos-election-{lock}"),
        candidate: candidate.to_owned(),
        term,
        secret,
        ..Default::default()
    })
    .await
    .map(|_| ())
}
