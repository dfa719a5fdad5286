//! `tumbler release`: give a grant back.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::enum_name;
use super::{Failure, Globals, GrantRef, LockNames, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockNames,
    #[command(flatten)]
    pub grant: GrantRef,
}

pub async fn run(args: ReleaseArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let namespace = globals.namespace()?;
    let lock = args.lock.display(&namespace);
    let (name, names) = args.lock.split();
    let request = proto::ReleaseRequest {
        namespace,
        name,
        holder: args.grant.holder,
        fencing_token: args.grant.token,
        names,
        fencing_tokens: Vec::new(),
    };
    let reply = call!(conn, release, request).await?;
    let status = enum_name(reply.status().as_str_name(), "RELEASE_STATUS_");
    globals.output().reply(&reply, || {
        format!("{status} {lock} (holder {})\n", request.holder)
    })?;
    Ok(match reply.status() {
        proto::ReleaseStatus::Released => exit::SUCCESS,
        _ => exit::NOT_HELD,
    })
}
