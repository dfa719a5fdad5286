//! `tumbler inspect`: a lock's holders.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{display_name, metadata_text, new_table, when};
use super::{Failure, Globals, LockName, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
}

pub async fn run(args: InspectArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let request = proto::InspectRequest {
        namespace: globals.namespace()?,
        name: args.lock.name,
    };
    let reply = call!(conn, inspect, request).await?;
    globals.output().reply(&reply, || inspect_table(&reply))?;
    Ok(exit::SUCCESS)
}

fn inspect_table(reply: &proto::InspectResponse) -> String {
    let lock = display_name(&reply.namespace, &reply.name);
    let text = format!(
        "{lock}: {} holder(s), limit {}, {} waiting\n",
        reply.holders.len(),
        reply.limit,
        reply.waiters
    );
    if reply.holders.is_empty() {
        return text;
    }
    let mut table = new_table();
    table.set_header([
        "slot", "holder", "token", "acquired", "expires", "kind", "metadata",
    ]);
    for holder in &reply.holders {
        let Some(grant) = &holder.grant else { continue };
        table.add_row([
            grant.slot.to_string(),
            grant.holder.clone(),
            grant.fencing_token.to_string(),
            when(grant.acquired_at_ms, reply.now_ms),
            when(grant.expires_at_ms, reply.now_ms),
            grant.kind.clone(),
            metadata_text(&grant.metadata),
        ]);
    }
    text + &format!("{table}\n")
}
