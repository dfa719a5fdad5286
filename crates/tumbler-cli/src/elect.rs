//! `tumbler elect NAME VALUE`: campaign in an election, print when
//! elected, and lead until interrupted (like `etcdctl elect`); with
//! `-- CMD ARGS…`, run the command while leading, with `hold`'s process
//! group, signal passing and stop-when-lost (`hold::keep`). The
//! leadership is a lease renewed like `hold`'s (`hold::lease::keep_lease`:
//! Extend pinned to the term), resigned (Resign, pinned to the term, with
//! the secret the winning Campaign returned: decision 0082) at the end. `tumbler elect --listen NAME` prints the leader, then every
//! change, until interrupted.

use std::time::Duration;

use clap::Args;
use tokio::time::Instant;

use super::acquire::new_holder;
use super::connect::{Conn, Target};
use super::hold::session::acquire_in_session;
use super::hold::{self, Acquired, lease::keep_lease};
use super::output::{display_name, rfc3339, status_line};
use super::signals::{Signals, killed_by};
use super::{Failure, Globals, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    pub target: Target,
    /// The election's name (a lock name: the election is a fair lock of
    /// limit 1).
    pub name: String,
    /// The value shown as the leader's while this candidate leads.
    #[arg(required_unless_present = "listen")]
    pub value: Option<String>,
    /// Observe instead of campaigning: the current leader, then every
    /// change (elected, proclaimed, resigned, expired), until interrupted.
    #[arg(long, conflicts_with_all = ["value", "command"])]
    pub listen: bool,
    /// The candidate id (default: a new time-ordered id, made here so a
    /// retry on another --addr is the same candidacy).
    #[arg(long, default_value = "")]
    pub candidate: String,
    /// The leadership's lease, renewed every third of it while leading
    /// (default: the server's); how long a SIGKILLed `elect` keeps leading.
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// Give up after waiting this long to be elected (default: wait until
    /// elected, campaigning again whenever the server's longest wait ends).
    #[arg(long)]
    pub wait_ms: Option<u64>,
    /// How long the command's process group has between SIGTERM and
    /// SIGKILL (a signal passed on, or the leadership lost).
    #[arg(long, default_value_t = 10_000)]
    pub grace_ms: u64,
    /// Lead through a Session stream instead of a lease of its own: the
    /// leadership ends at once if `elect` is killed, and survives its
    /// server's restart or crash: the session is resumed on the next
    /// --addr endpoint within its TTL (--ttl-ms), same term. The candidate
    /// is then the session id.
    #[arg(long, conflicts_with = "candidate")]
    pub session: bool,
    /// The exit code when --wait-ms passes without being elected.
    #[arg(short = 'E', long, default_value_t = exit::NOT_ACQUIRED, value_name = "CODE")]
    pub conflict_exit_code: u8,
    /// The command to run while leading (it gets TUMBLER_TERM, the term as
    /// TUMBLER_FENCING_TOKEN too, and TUMBLER_CANDIDATE in its
    /// environment). Without one, lead until a signal.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

pub async fn run(args: ElectArgs, globals: &Globals) -> Result<u8, Failure> {
    if args.listen {
        return listen(args, globals).await;
    }
    let mut signals = Signals::catch().map_err(Failure::Write)?;
    let namespace = globals.namespace()?;
    let lock = display_name(&namespace, &args.name);
    let request = proto::CampaignRequest {
        namespace: namespace.clone(),
        name: args.name.clone(),
        candidate: if args.candidate.is_empty() {
            new_holder()
        } else {
            args.candidate.clone()
        },
        value: args.value.clone().unwrap_or_default(),
        ttl_ms: args.ttl_ms,
        ..Default::default()
    };
    let grace = Duration::from_millis(args.grace_ms);
    let elected = if args.session {
        campaign_in_session(&args, &request, &mut signals).await?
    } else {
        campaign_with_lease(&args, &request, &mut signals, grace).await?
    };
    let (leader, held) = match elected {
        Campaigned::Leading(leading) => *leading,
        Campaigned::Signalled(code) => return Ok(code),
        Campaigned::WaitEnded => {
            status_line(&format!("NOT ELECTED {lock}: the wait ended"));
            return Ok(args.conflict_exit_code);
        }
    };
    let line = format!(
        "ELECTED {lock} term={} candidate={} value={}",
        leader.term, leader.candidate, leader.value
    );
    if args.command.is_empty() {
        // What the caller waits for: stdout is ours when no command runs.
        globals.output().reply(&leader, || format!("{line}\n"))?;
    } else {
        status_line(&line);
    }
    let environment = [
        ("TUMBLER_TERM", leader.term.to_string()),
        ("TUMBLER_FENCING_TOKEN", leader.term.to_string()),
        ("TUMBLER_CANDIDATE", leader.candidate.clone()),
    ];
    let command = ("tumbler elect", args.command.as_slice());
    Ok(hold::keep(held, signals, &lock, command, &environment, grace).await)
}

/// How a campaign ended.
enum Campaigned {
    /// Leading, and the leadership kept (by its lease or its session).
    Leading(Box<(proto::Leadership, hold::Held)>),
    /// A signal came first: the exit code.
    Signalled(u8),
    /// `--wait-ms` passed.
    WaitEnded,
}

/// Campaigns with a lease of its own, which a task then renews.
async fn campaign_with_lease(
    args: &ElectArgs,
    request: &proto::CampaignRequest,
    signals: &mut Signals,
    grace: Duration,
) -> Result<Campaigned, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let campaigning = campaign(&mut conn, request, args.wait_ms);
    let elected = tokio::select! {
        elected = campaigning => elected?,
        signal = signals.recv() => {
            // The waiting Campaign was cancelled; a leadership that
            // landed in the same instant is given back.
            if let Ok(mut conn) = Conn::new(&args.target) {
                let release = proto::ReleaseRequest {
                    namespace: request.namespace.clone(),
                    name: request.name.clone(),
                    holder: request.candidate.clone(),
                    fencing_token: None,
                    names: Vec::new(),
                    fencing_tokens: Vec::new(),
                };
                let _ = tokio::time::timeout(Duration::from_secs(5), call!(conn, release, release)).await;
            }
            return Ok(Campaigned::Signalled(killed_by(signal)));
        }
    };
    let Some((leader, sent, secret)) = elected else {
        return Ok(Campaigned::WaitEnded);
    };
    let grant = proto::Grant {
        holder: leader.candidate.clone(),
        fencing_token: leader.term,
        slot: 1,
        acquired_at_ms: leader.elected_at_ms,
        expires_at_ms: leader.expires_at_ms,
        ttl_ms: leader.ttl_ms,
        ..Default::default()
    };
    let held = keep_lease(
        conn,
        (&request.namespace, &request.name),
        grant,
        sent,
        grace,
        Some(&secret),
    );
    Ok(Campaigned::Leading(Box::new((leader, held))))
}

/// `--session`: campaigns through a Session stream (`hold --session`'s,
/// resumed on the next endpoint when cut off); the candidate is the
/// session id. Without `--wait-ms`, campaigns again whenever the server's
/// longest wait ends.
async fn campaign_in_session(
    args: &ElectArgs,
    request: &proto::CampaignRequest,
    signals: &mut Signals,
) -> Result<Campaigned, Failure> {
    let acquire = proto::AcquireRequest {
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        ttl_ms: request.ttl_ms,
        wait_ms: args.wait_ms.unwrap_or(0),
        ..Default::default()
    };
    loop {
        let conn = Conn::new(&args.target)?;
        let campaigning = acquire_in_session(conn, acquire.clone(), Some(&request.value));
        // A signal drops the stream: the server ends the session and
        // gives back whatever it held.
        let acquired = tokio::select! {
            acquired = campaigning => acquired?,
            signal = signals.recv() => return Ok(Campaigned::Signalled(killed_by(signal))),
        };
        match acquired {
            Acquired::Held(held) => {
                let grant = held.grant().clone();
                let leader = proto::Leadership {
                    namespace: request.namespace.clone(),
                    name: request.name.clone(),
                    candidate: grant.holder.clone(),
                    term: grant.fencing_token,
                    value: grant.metadata.get("").cloned().unwrap_or_default(),
                    elected_at_ms: grant.acquired_at_ms,
                    expires_at_ms: grant.expires_at_ms,
                    ttl_ms: grant.ttl_ms,
                };
                return Ok(Campaigned::Leading(Box::new((leader, held))));
            }
            Acquired::Refused(_) if args.wait_ms.is_some() => return Ok(Campaigned::WaitEnded),
            Acquired::Refused(_) => {}
        }
    }
}

/// Campaigns until elected (or until `wait_ms`, when given): sent again
/// with the same candidate when a server's longest wait ends, and on the
/// next endpoint while servers answer UNAVAILABLE. Returns the leadership
/// and the earliest moment its lease may have begun (None: not elected).
async fn campaign(
    conn: &mut Conn,
    request: &proto::CampaignRequest,
    wait_ms: Option<u64>,
) -> Result<Option<(proto::Leadership, Instant, String)>, Failure> {
    let until = wait_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let mut first_unanswered: Option<Instant> = None;
    let mut pause = Duration::from_millis(50);
    loop {
        let sent = Instant::now();
        let attempt = proto::CampaignRequest {
            wait_ms: until.map(|at| at.saturating_duration_since(sent).as_millis() as u64),
            ..request.clone()
        };
        match call!(conn, campaign, attempt).await {
            Ok(reply) if reply.elected => {
                let leader = reply.leader.unwrap_or_default();
                return Ok(Some((
                    leader,
                    first_unanswered.unwrap_or(sent),
                    reply.secret,
                )));
            }
            Ok(_) if until.is_some_and(|at| Instant::now() >= at) => return Ok(None),
            Ok(_) => {}
            Err(status) if retryable(&status) => {
                if first_unanswered.is_none() {
                    status_line(&format!(
                        "tumbler elect: {}; trying again with the same candidate",
                        status.message()
                    ));
                }
                first_unanswered.get_or_insert(sent);
                conn.skip();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(status) => return Err(status.into()),
        }
    }
}

/// The server is draining or restarting, or the connection broke: the
/// same campaign goes to the next endpoint.
fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    )
}

/// `--listen`: Observe, one line per change, until a signal; a stream
/// the server ends is opened again (on the next --addr).
async fn listen(args: ElectArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut signals = Signals::catch().map_err(Failure::Write)?;
    let mut conn = Conn::new(&args.target)?;
    let request = proto::LeaderRequest {
        namespace: globals.namespace()?,
        name: args.name.clone(),
    };
    let lock = display_name(&request.namespace, &request.name);
    let out = globals.output();
    loop {
        let mut changes = tokio::select! {
            opened = call!(conn, observe, request) => opened?,
            signal = signals.recv() => return Ok(killed_by(signal)),
        };
        status_line(&format!("OBSERVING {lock} on {}", conn.endpoint()));
        let ended = loop {
            let change = tokio::select! {
                change = changes.message() => change,
                signal = signals.recv() => return Ok(killed_by(signal)),
            };
            match change {
                Ok(Some(change)) => match out.item(&change, || change_line(&lock, &change)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
                    Err(e) => return Err(Failure::Write(e)),
                },
                Ok(None) => break "the server ended the stream".to_owned(),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    break status.message().to_owned();
                }
                Err(status) => return Err(status.into()),
            }
        };
        status_line(&format!("observe interrupted ({ended}); opening it again"));
        conn.skip();
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            signal = signals.recv() => return Ok(killed_by(signal)),
        }
    }
}

/// `2026-11-26T10:00:00.000Z elected default/db term=… candidate=… value=…`,
/// or `… resigned default/db term=… (no leader)`.
fn change_line(lock: &str, change: &proto::LeaderChange) -> String {
    let mut line = format!("{} {} {lock}", rfc3339(change.at_ms), change.event);
    match &change.leader {
        Some(l) => {
            line += &format!(
                " term={} candidate={} value={}",
                l.term, l.candidate, l.value
            )
        }
        None => {
            if change.ended_term > 0 {
                line += &format!(" term={}", change.ended_term);
            }
            line += " (no leader)";
        }
    }
    line + "\n"
}
