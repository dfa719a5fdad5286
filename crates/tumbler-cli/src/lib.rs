//! Client subcommands for people and shell scripts: `tumbler acquire`,
//! `release`, `extend`, `inspect`, `queue`, `list`, `reap`, `clear`,
//! `metrics`, `hold`, `elect`, `watch`, `token` and `health`, one file each, against a running
//! server. The `tumbler` binary (the root package) parses them as
//! [`ClientCommand`] with [`Globals`] and hands them to [`run`].
//!
//! Built on `tumbler-client` (stub, bearer interceptor, TLS types, back-off)
//! and `tumbler-proto` (messages, their proto3 JSON mapping, the metadata
//! keys and token digest the server uses): never on the server, whose
//! Redis and web stack it does not compile.
//!
//! They share one connection helper (`connect`: endpoints, TLS, token,
//! fail-over) and one output helper (`output`: `-o table|json|yaml`, the
//! reply as the proto3 JSON mapping Connect uses, tables). Replies go to stdout, status lines and
//! errors to stderr. A reader that closes stdout early (`| head`) ends
//! the output quietly; any other failed write is an error (exit 74).
//!
//! Exit codes (docs/cli.md, "Command-line client"): 0 done; 64 usage error;
//! 65 the server refused the input; 69 no server reachable; 70 another
//! server error; 74 the output could not be written; 75 not acquired
//! (busy or timed out); 77 not allowed (authentication, permission);
//! 79 not held (release, extend) or lost (`hold`); `hold` also 126 (the
//! command cannot run), 127 (not found) and otherwise the command's own.

/// `call!(conn, method, request)`: [`connect::Conn::call`] of one unary
/// RPC, sending a clone of `request` on each endpoint tried.
macro_rules! call {
    ($conn:expr, $method:ident, $request:expr) => {{
        let request = &$request;
        $conn.call(|mut client| {
            let request = request.clone();
            async move { client.$method(request).await }
        })
    }};
}

mod acquire;
mod clear;
pub mod connect;
mod elect;
mod extend;
mod health;
mod hold;
mod inspect;
mod list;
mod metrics;
pub mod output;
mod queue;
mod reap;
mod release;
mod signals;
mod token;
mod watch;

use std::process::ExitCode;

use clap::{Args, Subcommand};

pub use self::connect::Target;
use self::output::{Format, Output};

/// Exit codes of the client subcommands (sysexits.h values, so that
/// `hold`'s own outcomes rarely collide with its command's codes).
pub mod exit {
    /// Done: acquired, released, extended, shown.
    pub const SUCCESS: u8 = 0;
    /// A bad flag or argument, found before anything was sent.
    pub const USAGE: u8 = 64;
    /// The server refused the input (INVALID_ARGUMENT, OUT_OF_RANGE,
    /// FAILED_PRECONDITION: e.g. a limit other than the lock's).
    pub const REFUSED_INPUT: u8 = 65;
    /// No server could be reached (connection or TLS failure), or every
    /// one answered UNAVAILABLE (Redis down) or DEADLINE_EXCEEDED.
    pub const UNREACHABLE: u8 = 69;
    /// Any other error the server answered (INTERNAL, RESOURCE_EXHAUSTED, …).
    pub const SERVER_ERROR: u8 = 70;
    /// stdout could not be written (not a closed pipe: that is a quiet 0).
    pub const WRITE_FAILED: u8 = 74;
    /// Not acquired: busy (tried once) or timed out (waited).
    pub const NOT_ACQUIRED: u8 = 75;
    /// Refused as a deadlock: the wait would have closed a wait-for cycle
    /// (ABORTED, `deadlock: …` naming the cycle; decision 0077). Let go
    /// of what the holder holds, then try again.
    pub const DEADLOCK: u8 = 76;
    /// UNAUTHENTICATED or PERMISSION_DENIED.
    pub const NOT_ALLOWED: u8 = 77;
    /// Not held (release, extend), or lost while `hold` ran its command.
    pub const NOT_HELD: u8 = 79;
    /// `hold`: the command exists but cannot be executed.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `hold`: the command was not found.
    pub const NOT_FOUND: u8 = 127;
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Take a permit of a lock (exit 75 when not acquired).
    Acquire(acquire::AcquireArgs),
    /// Give a grant back (exit 79 when not held).
    Release(release::ReleaseArgs),
    /// Renew a grant's lease (exit 79 when not held: the lock was lost).
    Extend(extend::ExtendArgs),
    /// Show a lock's holders.
    Inspect(inspect::InspectArgs),
    /// Show a lock's waiting requests in grant order.
    Queue(queue::QueueArgs),
    /// List a namespace's locks (all pages, or one with --page-token).
    List(list::ListArgs),
    /// Clean up a namespace now: expired leases, dead waiters, stale entries.
    Reap(reap::ReapArgs),
    /// Admin: release every lock and drop every queue of a namespace.
    Clear(clear::ClearArgs),
    /// Per-kind counters (acquired, denied, released, …) over a time range.
    Metrics(metrics::MetricsArgs),
    /// Run a command while holding a lock, like flock(1) across machines:
    /// `tumbler hold NAME -- CMD ARGS…`; without a command, hold the lock
    /// until a signal (TERM, INT, HUP).
    Hold(hold::HoldArgs),
    /// Leader election, like `etcdctl elect`: `tumbler elect NAME VALUE`
    /// campaigns, prints when elected and leads until a signal;
    /// `-- CMD ARGS…` runs a command while leading (as `hold` does);
    /// `--listen NAME` prints the leader and every change.
    Elect(elect::ElectArgs),
    /// Print lock events as they happen (one lock, or every lock whose
    /// name starts with --prefix) until interrupted.
    Watch(watch::WatchArgs),
    /// Make a bearer token: prints the token (give it to the client) and
    /// its entry for the --auth-tokens-file (which keeps only a digest).
    Token(token::TokenArgs),
    /// Ask a server's gRPC health service: exit 0 when SERVING, 69 when
    /// not (Redis unreachable, draining) or when no server answers.
    Health(health::HealthArgs),
}

/// Flags every client subcommand takes, before or after its name.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Client options")]
pub struct Globals {
    /// How client subcommands print their reply.
    #[arg(
        short = 'o',
        long,
        global = true,
        value_enum,
        env = "TUMBLER_OUTPUT",
        default_value = "table"
    )]
    pub output: Format,
    /// The same as `-o json` (wins over -o).
    #[arg(long, global = true)]
    pub json: bool,
    /// The namespace to act in (default: env TUMBLER_NAMESPACE, else
    /// `default`); `token` takes it once per namespace the token may use.
    #[arg(
        short = 'n',
        long = "namespace",
        global = true,
        value_name = "NAMESPACE"
    )]
    pub namespace: Vec<String>,
}

impl Globals {
    pub fn output(&self) -> Output {
        Output {
            format: if self.json { Format::Json } else { self.output },
        }
    }

    /// The one namespace a lock subcommand acts in.
    pub fn namespace(&self) -> Result<String, Failure> {
        match self.namespace.as_slice() {
            [] => Ok(std::env::var("TUMBLER_NAMESPACE").unwrap_or_default()),
            [one] => Ok(one.clone()),
            _ => Err(Failure::usage(
                "--namespace: given more than once; this command acts in one namespace",
            )),
        }
    }
}

/// Which lock.
#[derive(Args, Debug)]
pub struct LockName {
    /// The lock's name.
    pub name: String,
}

/// Which locks: one, or a multi-lock's set (2 to 16 names, taken,
/// released and extended together; decision 0076).
#[derive(Args, Debug)]
pub struct LockNames {
    /// The lock's name; several names make a multi-lock (all or nothing).
    #[arg(required = true, num_args = 1..=16, value_name = "NAME")]
    pub names: Vec<String>,
}

impl LockNames {
    /// The request's `name` and `names`: one name goes in `name`, a set
    /// in `names` (`name` empty).
    pub fn split(self) -> (String, Vec<String>) {
        let mut names = self.names;
        if names.len() == 1 {
            (names.remove(0), Vec::new())
        } else {
            (String::new(), names)
        }
    }

    /// How a reply names them (`ns/a`, or `ns/{a, b}`).
    pub fn display(&self, namespace: &str) -> String {
        if self.names.len() == 1 {
            return output::display_name(namespace, &self.names[0]);
        }
        output::display_name(namespace, &format!("{{{}}}", self.names.join(", ")))
    }
}

/// Whose grant (`release`, `extend`).
#[derive(Args, Debug)]
pub struct GrantRef {
    /// The holder whose grant it is.
    #[arg(long)]
    pub holder: String,
    /// Only if the grant carries this fencing token.
    #[arg(long)]
    pub token: Option<u64>,
}

/// Why a subcommand stopped short: mapped to one exit code and one line
/// on stderr (what [`run`] and [`report`] print).
#[derive(Debug)]
pub enum Failure {
    /// The server's answer, or no answer (UNAVAILABLE).
    Status(tonic::Status),
    /// A flag or argument that cannot work, found before sending.
    Usage(String),
    /// stdout could not be written.
    Write(std::io::Error),
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::Usage(message.into())
    }

    /// What is printed after `error: `.
    pub fn message(&self) -> String {
        match self {
            Failure::Status(status) => format!(
                "{}: {}",
                tumbler_proto::metadata::code_name(status.code()),
                with_causes(status.message(), std::error::Error::source(status))
            ),
            Failure::Usage(message) => message.clone(),
            Failure::Write(e) => format!("cannot write the output: {e}"),
        }
    }

    pub fn code(&self) -> u8 {
        use tonic::Code;
        match self {
            // Not the server's answer but the connection's failure (a TLS
            // alert, a connection closed): tonic reports it with the
            // transport error as its source, as UNKNOWN or CANCELLED.
            Failure::Status(status) if std::error::Error::source(status).is_some() => {
                exit::UNREACHABLE
            }
            Failure::Status(status) => match status.code() {
                Code::Unavailable | Code::DeadlineExceeded => exit::UNREACHABLE,
                Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                    exit::REFUSED_INPUT
                }
                Code::Unauthenticated | Code::PermissionDenied => exit::NOT_ALLOWED,
                Code::Aborted if status.message().starts_with("deadlock: ") => exit::DEADLOCK,
                _ => exit::SERVER_ERROR,
            },
            Failure::Usage(_) => exit::USAGE,
            Failure::Write(_) => exit::WRITE_FAILED,
        }
    }

    /// Prints the error on stderr and returns its exit code; a closed
    /// pipe is no error (the reader had what it wanted).
    fn report(self) -> u8 {
        if let Failure::Write(e) = &self
            && e.kind() == std::io::ErrorKind::BrokenPipe
        {
            return exit::SUCCESS;
        }
        output::status_line(&format!("error: {}", self.message()));
        self.code()
    }
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Failure {
        Failure::Status(status)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Write(e)
    }
}

/// Runs one client subcommand and returns its exit code.
pub async fn run(globals: Globals, command: ClientCommand) -> ExitCode {
    let globals = &globals;
    let ran = match command {
        ClientCommand::Acquire(args) => acquire::run(args, globals).await,
        ClientCommand::Release(args) => release::run(args, globals).await,
        ClientCommand::Extend(args) => extend::run(args, globals).await,
        ClientCommand::Inspect(args) => inspect::run(args, globals).await,
        ClientCommand::Queue(args) => queue::run(args, globals).await,
        ClientCommand::List(args) => list::run(args, globals).await,
        ClientCommand::Reap(args) => reap::run(args, globals).await,
        ClientCommand::Clear(args) => clear::run(args, globals).await,
        ClientCommand::Metrics(args) => metrics::run(args, globals).await,
        ClientCommand::Hold(args) => hold::run(args, globals).await,
        ClientCommand::Elect(args) => elect::run(args, globals).await,
        ClientCommand::Watch(args) => watch::run(args, globals).await,
        ClientCommand::Token(args) => token::run(args, globals),
        ClientCommand::Health(args) => health::run(args, globals).await,
    };
    ExitCode::from(ran.unwrap_or_else(|failure| failure.report()))
}

/// Prints a usage error the way subcommands do and returns its code (for
/// `main`, e.g. a completion script that cannot be written).
pub fn report(failure: Failure) -> ExitCode {
    ExitCode::from(failure.report())
}

/// `message`, followed by the causes below it that it does not already
/// end with (a transport error's own text is generic: "transport error").
fn with_causes(message: &str, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = message.to_owned();
    while let Some(inner) = source {
        let cause = inner.to_string();
        if !text.ends_with(&cause) {
            text = format!("{text}: {cause}");
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadlock_exits_76_and_other_aborts_70() {
        let deadlock = Failure::Status(tonic::Status::aborted(
            r#"deadlock: holder "b" waits for lock "x" held by "a", "a" waits for lock "y" held by "b""#,
        ));
        assert_eq!(deadlock.code(), exit::DEADLOCK);
        assert!(
            deadlock.message().starts_with("ABORTED: deadlock: "),
            "{}",
            deadlock.message()
        );
        let other = Failure::Status(tonic::Status::aborted("moved"));
        assert_eq!(other.code(), exit::SERVER_ERROR);
    }
}
