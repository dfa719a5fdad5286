//! `tumbler queue`: a lock's waiting requests in grant order.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{display_name, new_table, when};
use super::{Failure, Globals, LockName, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct QueueArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockName,
    /// How many requests to show from the head (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub max_entries: u32,
}

pub async fn run(args: QueueArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let request = proto::QueueRequest {
        namespace: globals.namespace()?,
        name: args.lock.name,
        max_entries: args.max_entries,
    };
    let reply = call!(conn, queue, request).await?;
    globals.output().reply(&reply, || queue_table(&reply))?;
    Ok(exit::SUCCESS)
}

fn queue_table(reply: &proto::QueueResponse) -> String {
    let lock = display_name(&reply.namespace, &reply.name);
    let text = format!("{lock}: {} waiting\n", reply.waiters);
    if reply.requests.is_empty() {
        return text;
    }
    let mut table = new_table();
    table.set_header([
        "position",
        "holder",
        "priority",
        "mode",
        "enqueued",
        "waits until",
    ]);
    for request in &reply.requests {
        table.add_row([
            request.position.to_string(),
            request.holder.clone(),
            request.priority.to_string(),
            if request.fair { "fair" } else { "barging" }.to_owned(),
            when(request.enqueued_at_ms, reply.now_ms),
            when(request.wait_deadline_ms, reply.now_ms),
        ]);
    }
    text + &format!("{table}\n")
}
