//! `tumbler clear`: admin: release every lock of a namespace.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::print_counts;
use super::{Failure, Globals, exit};
use crate::proto;

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
    let reply = call!(conn, clear, request).await?;
    let counts = [
        ("locks_cleared", reply.locks_cleared),
        ("grants_released", reply.grants_released),
        ("requests_dropped", reply.requests_dropped),
    ];
    print_counts(globals.output(), &counts)?;
    Ok(exit::SUCCESS)
}
