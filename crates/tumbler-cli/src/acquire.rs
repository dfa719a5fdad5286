//! `tumbler acquire`: take a permit of a lock.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{acquire_status, grant_table, not_acquired_line};
use super::{Failure, Globals, LockNames, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockNames,
    #[command(flatten)]
    pub grant: GrantArgs,
    /// How long a waiting request outlives its server (default: the server's).
    #[arg(long)]
    pub queue_ttl_ms: Option<u64>,
    /// Higher goes first in the queue (-1000..=1000).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Take any free permit at once, whoever waits (not fair).
    #[arg(long)]
    pub barging: bool,
}

/// How a grant is asked for (`acquire` and `hold`).
#[derive(Args, Debug)]
pub struct GrantArgs {
    /// Who takes the permit (empty: a new time-ordered id, printed with
    /// the grant; made here, so a retry on another --addr is the same
    /// request).
    #[arg(long, default_value = "")]
    pub holder: String,
    /// Holders allowed at once (default 1: a mutex).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Lease length (default: the server's).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// How long to wait for a permit in the server; 0 tries once.
    #[arg(long, default_value_t = 0)]
    pub wait_ms: u64,
    /// A short label for metrics ([a-z0-9_.-]).
    #[arg(long, default_value = "")]
    pub kind: String,
    /// Metadata stored with the grant, as key=value; repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub metadata: Vec<(String, String)>,
    /// Take a read permit of a read/write lock: shared with other readers,
    /// never with a writer (--limit: the most readers at once; default the
    /// server's maximum). The holder of the write permit asking --read is
    /// downgraded, keeping its grant and token.
    #[arg(long, conflicts_with = "write")]
    pub read: bool,
    /// Take the write permit of a read/write lock: alone, with no reader
    /// and no other writer. A reader asking --write is refused
    /// (FAILED_PRECONDITION): release, then ask --write.
    #[arg(long)]
    pub write: bool,
    /// With --read: take a free read permit at once even when writers wait
    /// (a stream of readers can then starve a writer).
    #[arg(long, requires = "read", conflicts_with = "write")]
    pub prefer_readers: bool,
    /// Permits of the lock's --limit to take at once (default 1): a grant of
    /// k permits holds k slots, and a request that does not fit waits in
    /// line (a big request at the head is not passed by small fair ones;
    /// --barging ones pass). Not with --read or --write.
    #[arg(long, conflicts_with_all = ["read", "write"])]
    pub permits: Option<u32>,
}

impl GrantArgs {
    /// The Acquire request these flags ask for (fair, priority 0).
    pub fn request(&self, namespace: String, name: String) -> proto::AcquireRequest {
        proto::AcquireRequest {
            namespace,
            name,
            holder: if self.holder.is_empty() {
                new_holder()
            } else {
                self.holder.clone()
            },
            limit: self.limit,
            ttl_ms: self.ttl_ms,
            kind: self.kind.clone(),
            metadata: self.metadata.iter().cloned().collect(),
            wait_ms: self.wait_ms,
            mode: self.mode() as i32,
            prefer_readers: self.prefer_readers,
            permits: self.permits,
            ..Default::default()
        }
    }

    /// The lock mode asked: READ, WRITE, or unspecified (a plain lock).
    pub fn mode(&self) -> proto::LockMode {
        if self.read {
            proto::LockMode::Read
        } else if self.write {
            proto::LockMode::Write
        } else {
            proto::LockMode::Unspecified
        }
    }
}

pub fn parse_meta(value: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{value:?}: expected KEY=VALUE"))
}

/// A holder id made on the client: the same shape as the server's.
pub fn new_holder() -> String {
    uuid::Uuid::now_v7().to_string()
}

pub async fn run(args: AcquireArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let namespace = globals.namespace()?;
    let lock = args.lock.display(&namespace);
    let (name, names) = args.lock.split();
    let request = proto::AcquireRequest {
        queue_ttl_ms: args.queue_ttl_ms,
        priority: args.priority,
        fair: args.barging.then_some(false),
        names,
        ..args.grant.request(namespace, name)
    };
    let reply = call!(conn, acquire, request).await?;
    globals.output().reply(&reply, || match &reply.grant {
        // A multi-lock: each lock's grant under its name.
        Some(_) if !reply.grants.is_empty() => {
            let mut text = format!("{} {lock}\n", acquire_status(&reply));
            let now = super::output::now_ms();
            for grant in &reply.grants {
                text += &format!("{}:\n{}\n", grant.name, grant_table(grant, now));
            }
            text
        }
        Some(grant) => format!(
            "{} {lock} (holders now: {})\n{}\n",
            acquire_status(&reply),
            reply.holders,
            grant_table(grant, super::output::now_ms())
        ),
        None => format!("{}\n", not_acquired_line(&lock, &reply)),
    })?;
    Ok(match reply.status() {
        proto::AcquireStatus::Acquired | proto::AcquireStatus::AlreadyHeld => exit::SUCCESS,
        _ => exit::NOT_ACQUIRED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_pairs() {
        assert_eq!(parse_meta("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_meta("nope").is_err());
    }

    #[derive(clap::Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        grant: GrantArgs,
    }

    fn parse(flags: &[&str]) -> Result<GrantArgs, clap::Error> {
        use clap::Parser;
        Flags::try_parse_from(std::iter::once("acquire").chain(flags.iter().copied()))
            .map(|flags| flags.grant)
    }

    #[test]
    fn read_write_flags_set_the_mode() {
        let plain = parse(&[]).unwrap().request(String::new(), "a".into());
        assert_eq!(plain.mode(), proto::LockMode::Unspecified);
        assert!(!plain.prefer_readers);
        let read = parse(&["--read", "--prefer-readers"]).unwrap();
        let read = read.request(String::new(), "a".into());
        assert_eq!(read.mode(), proto::LockMode::Read);
        assert!(read.prefer_readers);
        let write = parse(&["--write"])
            .unwrap()
            .request(String::new(), "a".into());
        assert_eq!(write.mode(), proto::LockMode::Write);
    }

    #[test]
    fn read_write_flags_that_cannot_go_together_are_refused() {
        assert!(parse(&["--read", "--write"]).is_err());
        assert!(parse(&["--prefer-readers"]).is_err());
        assert!(parse(&["--write", "--prefer-readers"]).is_err());
    }
}
