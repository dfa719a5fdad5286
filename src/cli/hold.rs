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
//! lease, retried on other `--addr` endpoints), not through a Session
//! stream: a session's grants are released as soon as its stream breaks
//! (a network blip, the replica restarting), while the command may still
//! be running. `--session` keeps the Session way, which frees the lock at
//! once if `hold` itself is SIGKILLed.
//!
//! What no process can do: if `hold` itself is SIGKILLed, its command's
//! direct child gets SIGKILL too (parent-death signal), but processes it
//! started live on; the lease then ends on its own after `--ttl-ms`.
//! Processes that leave the group (setsid, daemons) are not waited for.

use std::io::IsTerminal as _;
use std::os::fd::AsFd as _;
use std::time::Duration;

use clap::Args;
use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::acquire::GrantArgs;
use super::connect::{Conn, Target};
use super::output::{display_name, not_acquired_line, status_line};
use super::signals::{Signals, killed_by};
use super::{Failure, Globals, LockName, exit};
use crate::proto;

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
    /// lease: freed at once if `hold` is killed, but also whenever the
    /// stream breaks (the command is then stopped, exit 79).
    #[arg(long)]
    pub session: bool,
    /// The command to run while holding the lock (it gets
    /// TUMBLER_FENCING_TOKEN, TUMBLER_SLOT and TUMBLER_HOLDER, the holder
    /// id, in its
    /// environment). Without one, the lock is held until a signal.
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
struct Held {
    grant: proto::Grant,
    lost: mpsc::Receiver<Loss>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Held {
    /// Gives the grant back (or closes the session) and waits for that.
    async fn release(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Either the grant, or the refusal to print.
enum Acquired {
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
            acquire_in_session(conn, request.clone()).await
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
    let mut held = match acquired {
        Acquired::Held(held) => held,
        Acquired::Refused(reply) => {
            status_line(&not_acquired_line(&lock, &reply));
            return Ok(args.conflict_exit_code);
        }
    };
    let grant = held.grant.clone();
    status_line(&format!(
        "HOLDING {lock} token={} slot={} holder={}",
        grant.fencing_token, grant.slot, grant.holder
    ));

    let Some((program, rest)) = args.command.split_first() else {
        // No command: hold until a signal, or until the lock is lost.
        let code = tokio::select! {
            _ = signals.recv() => exit::SUCCESS,
            Some(loss) = held.lost.recv() => {
                status_line(&format!("LOST {lock}: {}", loss.reason));
                exit::NOT_HELD
            }
        };
        held.release().await;
        return Ok(code);
    };

    let environment = [
        ("TUMBLER_FENCING_TOKEN", grant.fencing_token.to_string()),
        ("TUMBLER_SLOT", grant.slot.to_string()),
        ("TUMBLER_HOLDER", grant.holder.clone()),
    ];
    let mut group = match Group::spawn(program, rest, &environment) {
        Ok(group) => group,
        Err(e) => {
            let (code, why) = if e.kind() == std::io::ErrorKind::NotFound {
                (exit::NOT_FOUND, "command not found".to_owned())
            } else {
                (exit::CANNOT_EXECUTE, format!("cannot execute: {e}"))
            };
            status_line(&format!("tumbler hold: {program}: {why}"));
            held.release().await;
            return Ok(code);
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
    Ok(if lost { exit::NOT_HELD } else { code })
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
    }
}

// ---- Keeping the lock by renewing its lease. ----

/// Acquires with our own holder id (so a retry on another endpoint is the
/// same request), then renews the lease in a task.
async fn acquire_lease(
    mut conn: Conn,
    request: proto::AcquireRequest,
    grace: Duration,
) -> Result<Acquired, Failure> {
    let sent = Instant::now();
    let reply = call!(conn, acquire, request).await?;
    let Some(grant) = reply.grant.clone() else {
        return Ok(Acquired::Refused(reply));
    };
    let ttl = Duration::from_millis(grant.ttl_ms.max(1));
    let (lost_tx, lost) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let keeper = LeaseKeeper {
        conn,
        extend: proto::ExtendRequest {
            namespace: request.namespace.clone(),
            name: request.name.clone(),
            holder: grant.holder.clone(),
            ttl_ms: Some(grant.ttl_ms),
            fencing_token: Some(grant.fencing_token),
        },
        release: release_request(&request, Some(grant.fencing_token)),
        ttl,
        grace,
        // The lease began after the request left: ending no sooner than
        // `sent + ttl` is the safe assumption.
        deadline: sent + ttl,
        lost: lost_tx,
    };
    let task = tokio::spawn(keeper.run(stop.clone()));
    Ok(Acquired::Held(Held {
        grant,
        lost,
        stop,
        task,
    }))
}

struct LeaseKeeper {
    conn: Conn,
    extend: proto::ExtendRequest,
    release: proto::ReleaseRequest,
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
        let release = self.release.clone();
        let answer =
            tokio::time::timeout(Duration::from_secs(5), call!(self.conn, release, release)).await;
        if let Ok(Err(status)) = answer {
            status_line(&format!(
                "tumbler hold: cannot release {lock}: {}; its lease ends by itself",
                status.message()
            ));
        }
    }
}

// ---- Keeping the lock through a Session stream (`--session`). ----

async fn acquire_in_session(
    mut conn: Conn,
    request: proto::AcquireRequest,
) -> Result<Acquired, Failure> {
    use proto::session_request::Command;
    use proto::session_response::Event;
    let send = |command| proto::SessionRequest {
        command: Some(command),
    };
    let (commands, outbox) = mpsc::channel(16);
    let _ = commands
        .send(send(Command::Open(proto::SessionOpen {
            ttl_ms: request.ttl_ms,
            ..Default::default()
        })))
        .await;
    let _ = commands
        .send(send(Command::Acquire(proto::SessionAcquire {
            request_id: 1,
            acquire: Some(proto::AcquireRequest {
                holder: String::new(),
                ttl_ms: None,
                ..request
            }),
        })))
        .await;
    let mut events = conn
        .connected()
        .await?
        .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await?
        .into_inner();
    let mut keep_alive_every = Duration::from_secs(1);
    let grant = loop {
        match events.message().await?.and_then(|r| r.event) {
            Some(Event::Opened(opened)) => {
                keep_alive_every = Duration::from_millis((opened.ttl_ms / 3).max(10));
            }
            Some(Event::Acquired(acquired)) => {
                let reply = acquired.response.unwrap_or_default();
                match reply.grant.clone() {
                    Some(grant) => break grant,
                    None => return Ok(Acquired::Refused(reply)),
                }
            }
            Some(Event::Error(error)) => {
                return Err(tonic::Status::new(error.code.into(), error.message).into());
            }
            Some(_) => {}
            None => return Err(tonic::Status::unavailable("the session ended").into()),
        }
    };
    let (lost_tx, lost) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut ticker = tokio::time::interval(keep_alive_every);
            let mut ended = false;
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    _ = ticker.tick() => {
                        let _ = commands.send(send(Command::KeepAlive(proto::SessionKeepAlive {}))).await;
                    }
                    event = events.message(), if !ended => {
                        let reason = match event {
                            Ok(Some(proto::SessionResponse { event: Some(Event::Lost(lost)) })) => lost.reason,
                            Ok(Some(_)) => continue,
                            Ok(None) => "the session ended".to_owned(),
                            Err(status) => format!("the session ended: {}", status.message()),
                        };
                        ended = true;
                        let _ = lost_tx.send(Loss { reason, kill_by: None }).await;
                    }
                }
            }
            // Closing the session releases the lock.
            drop(commands);
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while let Ok(Some(_)) = events.message().await {}
            })
            .await;
        }
    });
    Ok(Acquired::Held(Held {
        grant,
        lost,
        stop,
        task,
    }))
}

// ---- The command's process group. ----

/// The command, leader of its own process group.
struct Group {
    pgid: Pid,
    /// The direct child's exit code (128 + N when killed by signal N).
    exit: oneshot::Receiver<u8>,
}

impl Group {
    fn spawn(
        program: &str,
        args: &[String],
        environment: &[(&str, String)],
    ) -> std::io::Result<Group> {
        use std::os::unix::process::CommandExt as _;
        // Orphaned descendants become our children, so the reaper below
        // collects them: a zombie would otherwise keep the group alive
        // wherever PID 1 does not reap.
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let parent = nix::unistd::getpid();
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .envs(environment.iter().map(|(k, v)| (*k, v)))
            .process_group(0);
        // SAFETY: only async-signal-safe calls (prctl, getppid, kill)
        // between fork and exec. The parent-death signal follows the
        // thread that forks: this runs on the main thread (the CLI's
        // future is `block_on`'s, never a spawned task), which lives as
        // long as the process.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                if nix::unistd::getppid() != parent {
                    // The parent died before the line above.
                    let _ = nix::sys::signal::raise(Signal::SIGKILL);
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let pid = Pid::from_raw(child.id() as i32);
        let (sender, exit) = oneshot::channel();
        std::thread::Builder::new()
            .name("hold-reaper".into())
            .spawn(move || reap(pid, sender))?;
        Ok(Group { pgid: pid, exit })
    }

    fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }

    /// No process of the group is left (zombies count until reaped).
    fn gone(&self) -> bool {
        matches!(killpg(self.pgid, None), Err(Errno::ESRCH))
    }
}

/// Waits for every child of this process (the command, and the orphans it
/// leaves to us as subreaper), reporting the command's status.
fn reap(child: Pid, sender: oneshot::Sender<u8>) {
    let mut sender = Some(sender);
    loop {
        let code = match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => code.clamp(0, 255) as u8,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == child => killed_by(signal),
            Ok(_) | Err(Errno::EINTR) => continue,
            // No child at the moment: an orphan may still come.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if let Some(sender) = sender.take() {
            let _ = sender.send(code);
        }
    }
}

/// The terminal, handed to the command's group while it runs, so that an
/// interactive command can read it (a background group reading its
/// terminal is stopped) and Ctrl-C reaches the command directly. Only
/// when `hold` is in the foreground with stdin and stdout on the
/// terminal: in a pipeline (`hold … | less`) the terminal stays with the
/// pipeline's other commands.
struct Terminal {
    ours: Pid,
}

impl Terminal {
    fn hand_to(group: Pid) -> Option<Terminal> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() || !std::io::stdout().is_terminal() {
            return None;
        }
        let ours = nix::unistd::tcgetpgrp(stdin.as_fd()).ok()?;
        if ours != nix::unistd::getpgrp() {
            return None;
        }
        nix::unistd::tcsetpgrp(stdin.as_fd(), group).ok()?;
        // Stopped if it read the terminal before it was its own.
        let _ = killpg(group, Signal::SIGCONT);
        Some(Terminal { ours })
    }

    /// Takes the terminal back; from a background group that needs
    /// SIGTTOU blocked (or the kernel stops us).
    fn restore(self) {
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None);
        let _ = nix::unistd::tcsetpgrp(std::io::stdin().as_fd(), self.ours);
        let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou), None);
    }
}
