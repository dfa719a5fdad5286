//! `tumbler clear`: admin: release every lock of a namespace.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::print_counts;
use super::{Failure, Globals, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ClearArgs {
    #[command(flatten)]
    pub target: Target,
    /// Required: clearing releases locks that others hold.
    #[arg(long)]
    pub yes: bool,
}

pub async fn run(args: ClearArgs, globals: &Globals) -> Result<u8, Failure> {
    if !args.yes {
        return Err(Failure::usage(
            "clear releases every lock of the namespace, held by others too: add --yes",
        ));
    }
    let mut conn = Conn::new(&args.target)?;
    let request = proto::ClearRequest {
        namespace: globals.namespace()?,
    };
    let reply = match call!(conn, clear, request).await {
        Ok(reply) => reply,
        Err(status) => {
            // Interrupted partway: show what was cleared (a rerun finishes
            // the job), then fail with the server's error.
            if let Some(cleared) = interrupted(&status) {
                print_cleared(globals, &cleared)?;
            }
            return Err(status.into());
        }
    };
    print_cleared(globals, &reply)?;
    Ok(exit::SUCCESS)
}

fn print_cleared(globals: &Globals, reply: &proto::ClearResponse) -> Result<(), Failure> {
    let counts = [
        ("locks_cleared", reply.locks_cleared),
        ("grants_released", reply.grants_released),
        ("requests_dropped", reply.requests_dropped),
    ];
    print_counts(globals.output(), reply, &counts)
}

/// What an interrupted Clear cleared, from its status' trailers.
fn interrupted(status: &tonic::Status) -> Option<proto::ClearResponse> {
    use proto::metadata::{CLEARED_GRANTS, CLEARED_LOCKS, CLEARED_REQUESTS};
    let number =
        |key: &str| -> Option<u64> { status.metadata().get(key)?.to_str().ok()?.parse().ok() };
    Some(proto::ClearResponse {
        locks_cleared: number(CLEARED_LOCKS)?,
        grants_released: number(CLEARED_GRANTS)?,
        requests_dropped: number(CLEARED_REQUESTS)?,
    })
}
