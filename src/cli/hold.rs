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
    /// lease: freed at once if `hold` is killed. A stream cut off by a
    /// draining or restarting server is resumed on the next --addr
    /// endpoint within the session TTL (--ttl-ms); only if that fails is
    /// the command stopped (exit 79).
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
    let (reply, sent) = acquire_retrying(&mut conn, &request).await?;
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

/// A Session stream: the commands sent on it and the events it brings.
struct Stream {
    commands: mpsc::Sender<proto::SessionRequest>,
    events: tonic::Streaming<proto::SessionResponse>,
}

fn session_command(command: proto::session_request::Command) -> proto::SessionRequest {
    proto::SessionRequest {
        command: Some(command),
    }
}

impl Stream {
    /// Opens (or resumes) a session on the endpoint in use.
    async fn open(
        conn: &mut Conn,
        open: proto::SessionOpen,
    ) -> Result<(Stream, proto::SessionOpened), tonic::Status> {
        use proto::session_response::Event;
        let (commands, outbox) = mpsc::channel(16);
        let _ = commands
            .send(session_command(proto::session_request::Command::Open(open)))
            .await;
        let mut events = conn
            .connected()
            .await?
            .session(tokio_stream::wrappers::ReceiverStream::new(outbox))
            .await?
            .into_inner();
        match events.message().await?.and_then(|r| r.event) {
            Some(Event::Opened(opened)) => Ok((Stream { commands, events }, opened)),
            Some(Event::Error(error)) => Err(tonic::Status::new(error.code.into(), error.message)),
            _ => Err(tonic::Status::unavailable(
                "the session ended before it opened",
            )),
        }
    }

    /// Opens (or resumes) a session, on the next endpoint after each
    /// UNAVAILABLE or broken connection, with backoff, until `until`.
    async fn open_retrying(
        conn: &mut Conn,
        open: &proto::SessionOpen,
        until: Instant,
    ) -> Result<(Stream, proto::SessionOpened), tonic::Status> {
        let mut backoff = Backoff::new();
        loop {
            let status =
                match tokio::time::timeout(OPEN_WITHIN, Stream::open(conn, open.clone())).await {
                    Ok(Ok(opened)) => return Ok(opened),
                    Ok(Err(status)) if !retryable(&status) => return Err(status),
                    Ok(Err(status)) => status,
                    Err(_) => tonic::Status::unavailable(format!(
                        "{}: no answer within {}",
                        conn.endpoint(),
                        humantime::format_duration(OPEN_WITHIN)
                    )),
                };
            conn.skip();
            let pause = backoff.next();
            if Instant::now() + pause >= until {
                return Err(status);
            }
            tokio::time::sleep(pause).await;
        }
    }

    async fn keep_alive(&self) {
        let _ = self
            .commands
            .send(session_command(proto::session_request::Command::KeepAlive(
                proto::SessionKeepAlive {},
            )))
            .await;
    }

    /// Closes the session (releasing its grants) and waits a moment for
    /// the server to end the stream.
    async fn close(self) {
        let Stream {
            commands,
            mut events,
        } = self;
        drop(commands);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(_)) = events.message().await {}
        })
        .await;
    }
}

/// The session's id and resume secret.
#[derive(Clone)]
struct Resume {
    open: proto::SessionOpen,
    ttl: Duration,
}

impl Resume {
    fn of(opened: &proto::SessionOpened) -> Resume {
        Resume {
            open: proto::SessionOpen {
                resume: Some(proto::SessionResume {
                    session_id: opened.session_id.clone(),
                    secret: opened.resume_secret.clone(),
                }),
                ..Default::default()
            },
            ttl: Duration::from_millis(opened.ttl_ms.max(1)),
        }
    }
}

/// Acquires through a Session. When the stream ends with UNAVAILABLE or
/// breaks while waiting (a replica draining or restarting), the session
/// is resumed on the next endpoint and the same acquire sent again: its
/// holder is the session id, so it takes its place in the queue back.
async fn acquire_in_session(
    mut conn: Conn,
    request: proto::AcquireRequest,
) -> Result<Acquired, Failure> {
    use proto::session_response::Event;
    let acquire = proto::AcquireRequest {
        holder: String::new(),
        ttl_ms: None,
        ..request.clone()
    };
    let fresh = proto::SessionOpen {
        ttl_ms: request.ttl_ms,
        ..Default::default()
    };
    let started = Instant::now();
    let wait_until = started + Duration::from_millis(request.wait_ms);
    let retry_until = wait_until.max(started + RETRY_BUDGET);
    let mut resume: Option<Resume> = None;
    let mut request_id = 0;
    let mut backoff = Backoff::new();
    loop {
        let open = resume.as_ref().map_or(&fresh, |resume| &resume.open);
        let (mut stream, opened) = match Stream::open_retrying(&mut conn, open, retry_until).await {
            Ok(opened) => opened,
            // The session (which held nothing yet) is over: a new one.
            Err(status) if status.code() == tonic::Code::NotFound && resume.is_some() => {
                resume = None;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        resume = Some(Resume::of(&opened));
        let keep_alive_every = Duration::from_millis((opened.ttl_ms / 3).max(10));
        request_id += 1;
        let _ = stream
            .commands
            .send(session_command(proto::session_request::Command::Acquire(
                proto::SessionAcquire {
                    request_id,
                    acquire: Some(proto::AcquireRequest {
                        wait_ms: wait_until
                            .saturating_duration_since(Instant::now())
                            .as_millis() as u64,
                        ..acquire.clone()
                    }),
                },
            )))
            .await;
        let mut ticker = tokio::time::interval(keep_alive_every);
        let ended = loop {
            tokio::select! {
                _ = ticker.tick() => stream.keep_alive().await,
                event = stream.events.message() => match event {
                    Ok(Some(proto::SessionResponse { event: Some(Event::Acquired(acquired)) }))
                        if acquired.request_id == request_id =>
                    {
                        let reply = acquired.response.unwrap_or_default();
                        return Ok(match reply.grant.clone() {
                            Some(grant) => Acquired::Held(keep_session(
                                conn,
                                stream,
                                resume.expect("opened"),
                                acquire,
                                grant,
                                keep_alive_every,
                            )),
                            None => {
                                stream.close().await;
                                Acquired::Refused(reply)
                            }
                        });
                    }
                    Ok(Some(proto::SessionResponse { event: Some(Event::Error(error)) })) => {
                        // A draining replica answers the waiting acquire
                        // UNAVAILABLE, keeping its place for a retry.
                        let status = tonic::Status::new(error.code.into(), error.message);
                        if retryable(&status) {
                            break status;
                        }
                        return Err(status.into());
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(tonic::Status::unavailable("the session ended").into());
                    }
                    Err(status) if retryable(&status) => break status,
                    Err(status) => return Err(status.into()),
                },
            }
        };
        if Instant::now() >= retry_until {
            return Err(ended.into());
        }
        conn.skip();
        tokio::time::sleep(backoff.next()).await;
    }
}

/// Keeps the session alive in a task; when its stream ends with
/// UNAVAILABLE or breaks, resumes it on the next endpoint (backoff and
/// jitter) until its TTL would pass: the grant is reported lost only when
/// the server says so (a `lost` event, the session over or the grant gone
/// on resume) or no endpoint took the session back in time.
fn keep_session(
    mut conn: Conn,
    stream: Stream,
    resume: Resume,
    acquire: proto::AcquireRequest,
    grant: proto::Grant,
    keep_alive_every: Duration,
) -> Held {
    use proto::session_response::Event;
    let (lost_tx, lost) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let lock = display_name(&acquire.namespace, &acquire.name);
    // An empty namespace is the server's default one.
    let ours = move |namespace: &str, name: &str| {
        name == acquire.name && (namespace == acquire.namespace || acquire.namespace.is_empty())
    };
    let task = tokio::spawn({
        let stop = stop.clone();
        let token = grant.fencing_token;
        async move {
            let mut stream = Some(stream);
            let mut ticker = tokio::time::interval(keep_alive_every);
            let report = |reason: String| {
                let lost_tx = lost_tx.clone();
                async move {
                    let _ = lost_tx
                        .send(Loss {
                            reason,
                            kill_by: None,
                        })
                        .await;
                }
            };
            loop {
                let Some(live) = stream.as_mut() else {
                    // Lost: nothing left to keep.
                    stop.cancelled().await;
                    return;
                };
                let ended = tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    _ = ticker.tick() => {
                        live.keep_alive().await;
                        continue;
                    }
                    event = live.events.message() => match event {
                        Ok(Some(proto::SessionResponse { event: Some(Event::Lost(gone)) }))
                            if ours(&gone.namespace, &gone.name) =>
                        {
                            stream = None;
                            report(gone.reason).await;
                            continue;
                        }
                        Ok(Some(_)) => continue,
                        Ok(None) => {
                            stream = None;
                            report("the server closed the session".into()).await;
                            continue;
                        }
                        Err(status) if retryable(&status) => status,
                        Err(status) => {
                            stream = None;
                            report(format!("the session ended: {}", status.message())).await;
                            continue;
                        }
                    },
                };
                // The replica drains, restarts or cannot be reached: the
                // session's grants live on for its TTL, resumable anywhere.
                stream = None;
                // The server renews a third of a TTL apart, so the lease
                // has at least two thirds of a TTL left when the stream
                // ends: a resume that takes longer might find the lock
                // gone while the command still runs, so stop trying then.
                let until = Instant::now() + resume.ttl * 2 / 3;
                status_line(&format!(
                    "tumbler hold: the session of {lock} was cut off ({}: {}); resuming it",
                    conn.endpoint(),
                    ended.message()
                ));
                conn.skip();
                let resumed = tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    resumed = Stream::open_retrying(&mut conn, &resume.open, until) => resumed,
                };
                match resumed {
                    Ok((live, opened))
                        if opened
                            .grants
                            .iter()
                            .any(|g| ours(&g.namespace, &g.name) && g.fencing_token == token) =>
                    {
                        status_line(&format!(
                            "tumbler hold: resumed the session of {lock} on {}",
                            conn.endpoint()
                        ));
                        stream = Some(live);
                        ticker.reset();
                    }
                    Ok((live, _)) => {
                        live.close().await;
                        report("the grant was gone when the session was resumed".into()).await;
                    }
                    Err(status) => {
                        report(format!("cannot resume the session: {}", status.message())).await;
                    }
                }
            }
            // Closing the session releases the lock; cut off, the session
            // is resumed just to be closed (or its TTL ends it).
            let live = match stream {
                Some(live) => Some(live),
                None => {
                    Stream::open_retrying(&mut conn, &resume.open, Instant::now() + OPEN_WITHIN)
                        .await
                        .ok()
                        .map(|(live, _)| live)
                }
            };
            if let Some(live) = live {
                live.close().await;
            }
        }
    });
    Held {
        grant,
        lost,
        stop,
        task,
    }
}

// ---- Riding out a restart of the server. ----

/// How long an acquire keeps retrying UNAVAILABLE past its wait (a try-once
/// `hold`, or a wait that ends while the servers restart).
const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// How long an open or resume may take on one endpoint.
const OPEN_WITHIN: Duration = Duration::from_secs(5);

/// Errors after which the same request goes to the next endpoint: the
/// server is draining or restarting, or the connection broke.
fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    )
}

/// Exponential backoff (50 ms doubling to 1 s) with full jitter in its
/// upper half, so that the clients of a restarted replica do not all come
/// back in the same instant.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(50))
    }

    fn next(&mut self) -> Duration {
        let base = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
        let jitter = getrandom::u32().unwrap_or(0) % 1000;
        base / 2 + base / 2 * jitter / 1000
    }
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
