//! `tumbler hold NAME -- CMD ARGS…`: run a command while holding a lock,
//! like flock(1) across machines, without ever breaking exclusion:
//!
//! - the command runs in its own process group, and the lock is released
//!   only once no process of that group remains (grandchildren and
//!   background jobs included), never merely when the direct child exits;
//! - SIGTERM, SIGINT and SIGHUP sent to `hold` are passed to the group;
//!   after `--grace-ms` the group gets SIGKILL;
//! - when the lock is lost (the server says NOT_HELD, or renewals fail
//!   until the lease is about to end) the group gets SIGTERM and SIGKILL
//!   the same way, timed so that it is dead by the time the lease may
//!   end, and `hold` exits 79;
//! - status lines go to stderr: stdout is the command's alone.
//!
//! The lock is kept by renewing its lease (Extend every third of the
//! lease, retried on other `--addr` endpoints), or with `--session`
//! through a Session stream, which frees the lock at once if `hold`
//! itself is SIGKILLed. A session whose stream ends with UNAVAILABLE (its
//! replica drains) or breaks is resumed on the next `--addr` endpoint
//! (the same one again when there is only one: a restarted server comes
//! back on its address), with backoff and jitter, until its TTL would
//! pass: the command runs on and the lock is reported lost only if the
//! resume fails. Either way, an acquire answered UNAVAILABLE (a waiting
//! one included) is sent again with the same holder, keeping its place
//! in the queue.
//!
//! What no process can do: if `hold` itself is SIGKILLed, its command's
//! direct child gets SIGKILL too (parent-death signal), but processes it
//! started live on; the lease then ends on its own after `--ttl-ms`.
//! Processes that leave the group (setsid, daemons) are not waited for.
//!
//! This file holds the flags and `run`: acquire, start the command, pass
//! signals and losses on to its group, release once the group is gone.
//! The rest, by concern: `lease.rs` (keeping the lock by renewing its
//! lease), `session.rs` and `stream.rs` (keeping it through a Session
//! stream, resumed after a cut-off), `retry.rs` (which errors are tried
//! again, backoff), `group.rs` (the command's process group, its reaper
//! and the terminal).

mod group;
pub(crate) mod lease;
mod retry;
pub(crate) mod session;
mod stream;

use std::time::Duration;

use clap::Args;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::group::{Group, Terminal};
use self::lease::acquire_lease;
use self::session::acquire_in_session;
use super::acquire::GrantArgs;
use super::connect::{Conn, Target};
use super::output::{display_name, lock_mode, not_acquired_line, status_line};
use super::signals::{Signals, killed_by};
use super::{Failure, Globals, LockName, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct HoldArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// What the lock is asked with. The lease (--ttl-ms) is renewed every
    /// third of it while the command runs, and is how long the lock
    /// outlives a `hold` that is SIGKILLed.
    #[command(flatten)]
    pub grant: GrantArgs,
    /// How long the command's process group has between SIGTERM (a signal
    /// passed on, or the lock lost) and SIGKILL.
    #[arg(long, default_value_t = 10_000)]
    pub grace_ms: u64,
    /// The exit code when the lock is busy or the wait times out (like
    /// flock -E).
    #[arg(short = 'E', long, default_value_t = exit::NOT_ACQUIRED, value_name = "CODE")]
    pub conflict_exit_code: u8,
    /// Keep the lock through a Session stream instead of renewing its
    /// lease: freed at once if `hold` is killed. A stream cut off by a
    /// draining or restarting server is resumed on the next --addr
    /// endpoint within the session TTL (--ttl-ms); only if that fails is
    /// the command stopped (exit 79).
    #[arg(long)]
    pub session: bool,
    /// The command to run while holding the lock (it gets
    /// TUMBLER_FENCING_TOKEN, TUMBLER_SLOT and TUMBLER_HOLDER, the holder
    /// id, in its environment; with --read or --write also
    /// TUMBLER_LOCK_MODE, `read` or `write`). Without one, the lock is held until a signal.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The lock was lost, or is about to be.
struct Loss {
    reason: String,
    /// When the lease may end: the group must be dead by then.
    kill_by: Option<Instant>,
}

/// A held grant and the task that keeps it: it reports a loss on `lost`,
/// and once `stop` is cancelled it gives the grant back and ends.
pub(crate) struct Held {
    grant: proto::Grant,
    lost: mpsc::Receiver<Loss>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Held {
    /// The grant as it was made.
    pub(crate) fn grant(&self) -> &proto::Grant {
        &self.grant
    }

    /// Gives the grant back (or closes the session) and waits for that.
    async fn release(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Either the grant, or the refusal to print.
pub(crate) enum Acquired {
    Held(Held),
    Refused(proto::AcquireResponse),
}

pub async fn run(args: HoldArgs, globals: &Globals) -> Result<u8, Failure> {
    // Caught from the start: a signal while waiting for the lock ends the
    // wait (and gives back a grant that may have landed meanwhile).
    let mut signals = Signals::catch().map_err(|e| {
        Failure::Status(tonic::Status::internal(format!(
            "cannot catch signals: {e}"
        )))
    })?;
    let namespace = globals.namespace()?;
    let lock = display_name(&namespace, &args.lock.name);
    let request = args.grant.request(namespace, args.lock.name.clone());
    let grace = Duration::from_millis(args.grace_ms);
    let conn = Conn::new(&args.target)?;
    let acquiring = async {
        if args.session {
            acquire_in_session(conn, request.clone(), None).await
        } else {
            acquire_lease(conn, request.clone(), grace).await
        }
    };
    let acquired = tokio::select! {
        acquired = acquiring => acquired?,
        signal = signals.recv() => {
            if !args.session {
                // The waiting Acquire was cancelled; a grant that landed
                // in the same instant is given back.
                if let Ok(mut conn) = Conn::new(&args.target) {
                    let release = release_request(&request, None);
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        call!(conn, release, release),
                    )
                    .await;
                }
            }
            return Ok(killed_by(signal));
        }
    };
    let held = match acquired {
        Acquired::Held(held) => held,
        Acquired::Refused(reply) => {
            status_line(&not_acquired_line(&lock, &reply));
            return Ok(args.conflict_exit_code);
        }
    };
    let grant = held.grant.clone();
    let mode = lock_mode(grant.mode());
    status_line(&format!(
        "HOLDING {lock} token={} slot={} holder={}{}",
        grant.fencing_token,
        grant.slot,
        grant.holder,
        mode.map(|mode| format!(" mode={mode}")).unwrap_or_default()
    ));
    let mut environment = vec![
        ("TUMBLER_FENCING_TOKEN", grant.fencing_token.to_string()),
        ("TUMBLER_SLOT", grant.slot.to_string()),
        ("TUMBLER_HOLDER", grant.holder.clone()),
    ];
    if let Some(mode) = mode {
        environment.push(("TUMBLER_LOCK_MODE", mode.to_owned()));
    }
    let command = ("tumbler hold", args.command.as_slice());
    Ok(keep(held, signals, &lock, command, &environment, grace).await)
}

/// Keeps `held` while `command` runs (in its own process group, with
/// `environment` added; signals passed on, stopped in time when the grant
/// is lost), or without a command until a signal or the loss; gives the
/// grant back once no process of the group is left. Returns the exit
/// code. Shared by `hold` and `elect`; `who` names the subcommand in its
/// status lines.
pub(crate) async fn keep(
    mut held: Held,
    mut signals: Signals,
    lock: &str,
    (who, command): (&str, &[String]),
    environment: &[(&str, String)],
    grace: Duration,
) -> u8 {
    let Some((program, rest)) = command.split_first() else {
        // No command: hold until a signal, or until the lock is lost.
        let code = tokio::select! {
            _ = signals.recv() => exit::SUCCESS,
            Some(loss) = held.lost.recv() => {
                status_line(&format!("LOST {lock}: {}", loss.reason));
                exit::NOT_HELD
            }
        };
        held.release().await;
        return code;
    };

    let mut group = match Group::spawn(program, rest, environment) {
        Ok(group) => group,
        Err(e) => {
            let (code, why) = if e.kind() == std::io::ErrorKind::NotFound {
                (exit::NOT_FOUND, "command not found".to_owned())
            } else {
                (exit::CANNOT_EXECUTE, format!("cannot execute: {e}"))
            };
            status_line(&format!("{who}: {program}: {why}"));
            held.release().await;
            return code;
        }
    };
    let terminal = Terminal::hand_to(group.pgid);

    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut lost = false;
    let mut status: Option<u8> = None;
    let mut poll = tokio::time::interval(Duration::from_millis(20));
    let code = loop {
        if let Some(code) = status
            && group.gone()
        {
            break code;
        }
        tokio::select! {
            signal = signals.recv() => {
                group.signal(signal);
                kill_at.get_or_insert(Instant::now() + grace);
            }
            Some(loss) = held.lost.recv(), if !lost => {
                lost = true;
                status_line(&format!(
                    "LOST {lock}: {}; stopping the command (SIGTERM, SIGKILL after {})",
                    loss.reason,
                    humantime::format_duration(grace)
                ));
                group.signal(Signal::SIGTERM);
                let by = loss
                    .kill_by
                    .map_or(Instant::now() + grace, |by| by.min(Instant::now() + grace));
                kill_at = Some(kill_at.map_or(by, |at| at.min(by)));
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)),
                if kill_at.is_some() && !killed =>
            {
                killed = true;
                group.signal(Signal::SIGKILL);
            }
            code = &mut group.exit, if status.is_none() => {
                // The reaper thread never drops its sender before sending.
                status = Some(code.unwrap_or(exit::CANNOT_EXECUTE));
            }
            _ = poll.tick(), if status.is_some() => {}
        }
    };
    if let Some(terminal) = terminal {
        terminal.restore();
    }
    // Only now is no process of the group left: the lock may go.
    held.release().await;
    if lost { exit::NOT_HELD } else { code }
}

fn release_request(
    acquire: &proto::AcquireRequest,
    fencing_token: Option<u64>,
) -> proto::ReleaseRequest {
    proto::ReleaseRequest {
        namespace: acquire.namespace.clone(),
        name: acquire.name.clone(),
        holder: acquire.holder.clone(),
        fencing_token,
        names: Vec::new(),
        fencing_tokens: Vec::new(),
    }
}
