//! `tumbler reap`: clean up a namespace now.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::print_counts;
use super::{Failure, Globals, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ReapArgs {
    #[command(flatten)]
    pub target: Target,
    /// Also drop grants and waiting requests older than this (ms).
    #[arg(long)]
    pub older_than_ms: Option<u64>,
}

pub async fn run(args: ReapArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let request = proto::ReapRequest {
        namespace: globals.namespace()?,
        older_than_ms: args.older_than_ms,
    };
    let reply = call!(conn, reap, request).await?;
    let counts = [
        ("expired_holders", reply.expired_holders),
        ("dead_waiters", reply.dead_waiters),
        ("stale_index_entries", reply.stale_index_entries),
        ("old_grants", reply.old_grants),
        ("old_waiters", reply.old_waiters),
        ("locks_visited", reply.locks_visited),
    ];
    print_counts(globals.output(), &reply, &counts)?;
    Ok(exit::SUCCESS)
}
