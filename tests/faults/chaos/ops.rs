//! What a chaos client does: its operations (a plain lock, a leader's
//! term, a read or a write on a read/write lock) and their RPCs.

use tonic::transport::Channel;
use tumbler::proto::lock_service_client::LockServiceClient;

use super::TTL_MS;
use super::check::Mode;
use crate::common::proto;

/// Read/write locks, and the readers each admits at once.
pub(super) const RW_LOCKS: usize = 2;
pub(super) const READERS: u32 = 3;

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
}

impl Op {
    /// A client's `op`-th operation: every third a term, every third on a
    /// read/write lock (two reads to a write), the rest plain.
    pub(super) fn pick(client: usize, op: usize) -> Op {
        match op % 3 {
            0 => Op::Term,
            1 => Op::Plain,
            _ => match (client + op / 3) % 3 {
                0 => Op::Write,
                n => Op::Read {
                    prefer: n == 1 && (op / 9).is_multiple_of(2),
                },
            },
        }
    }

    /// The grant's index in the checker: plain lock k is k, election k is
    /// `locks + k`, read/write lock k is `2 * locks + k`.
    pub(super) fn index(self, locks: usize, k: usize) -> usize {
        match self {
            Op::Plain => k,
            Op::Term => locks + k,
            Op::Read { .. } | Op::Write => 2 * locks + k % RW_LOCKS,
        }
    }

    pub(super) fn mode(self) -> Mode {
        match self {
            Op::Plain | Op::Term => Mode::Exclusive,
            Op::Read { .. } => Mode::Read,
            Op::Write => Mode::Write,
        }
    }

    pub(super) fn verbs(self) -> (&'static str, &'static str) {
        match self {
            Op::Plain => ("acquire", "release"),
            Op::Term => ("campaign", "resign"),
            Op::Read { .. } => ("acquire READ", "release READ"),
            Op::Write => ("acquire WRITE", "release WRITE"),
        }
    }
}

pub(super) fn plain_name(lock: usize) -> String {
    format!("chaos-{lock}")
}

pub(super) fn rw_name(lock: usize) -> String {
    format!("chaos-rw-{}", lock % RW_LOCKS)
}

/// Acquires lock `name` (a plain lock, or with `mode` a read/write lock
/// of `READERS` readers: the mode and `prefer_readers`): its fencing
/// token when granted.
pub(super) async fn acquire(
    rpc: &mut LockServiceClient<Channel>,
    name: &str,
    holder: &str,
    mode: Option<(proto::LockMode, bool)>,
) -> Result<Option<u64>, tonic::Status> {
    let mut request = proto::AcquireRequest {
        name: name.to_owned(),
        holder: holder.to_owned(),
        ttl_ms: Some(TTL_MS),
        wait_ms: 1_000,
        ..Default::default()
    };
    if let Some((mode, prefer_readers)) = mode {
        request.set_mode(mode);
        request.prefer_readers = prefer_readers;
        request.limit = Some(READERS);
    }
    let reply = rpc.acquire(request).await?.into_inner();
    let granted = matches!(
        reply.status(),
        proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld
    );
    Ok(reply.grant.filter(|_| granted).map(|g| g.fencing_token))
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
    Ok(reply
        .leader
        .filter(|_| reply.elected)
        .map(|leader| leader.term))
}

pub(super) async fn resign(
    rpc: &mut LockServiceClient<Channel>,
    lock: usize,
    candidate: &str,
    term: u64,
) -> Result<(), tonic::Status> {
    rpc.resign(proto::ResignRequest {
        name: format!("chaos-election-{lock}"),
        candidate: candidate.to_owned(),
        term,
        ..Default::default()
    })
    .await
    .map(|_| ())
}
