//! `tumbler extend`: renew a grant's lease.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{enum_name, grant_table, now_ms};
use super::release::SetTokens;
use super::{Failure, Globals, GrantRef, LockNames, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockNames,
    #[command(flatten)]
    pub grant: GrantRef,
    #[command(flatten)]
    pub tokens: SetTokens,
    /// The new remaining lease (default: the grant's own ttl).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
}

pub async fn run(args: ExtendArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let namespace = globals.namespace()?;
    let lock = args.lock.display(&namespace);
    let (name, names) = args.lock.split();
    let fencing_tokens = args.tokens.for_names(&names)?;
    let request = proto::ExtendRequest {
        namespace,
        name,
        holder: args.grant.holder,
        ttl_ms: args.ttl_ms,
        fencing_token: args.grant.token,
        names,
        fencing_tokens,
    };
    let reply = call!(conn, extend, request).await?;
    let status = enum_name(reply.status().as_str_name(), "EXTEND_STATUS_");
    globals.output().reply(&reply, || {
        let mut text = format!("{status} {lock} (holder {})\n", request.holder);
        if let Some(grant) = &reply.grant {
            text += &format!("{}\n", grant_table(grant, now_ms()));
        }
        text
    })?;
    Ok(match reply.status() {
        proto::ExtendStatus::Extended => exit::SUCCESS,
        _ => exit::NOT_HELD,
    })
}
