//! `tumbler queue`: a lock's waiting requests in grant order.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{display_name, lock_mode, new_table, when};
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

/// `fair` or `barging`, then the lock mode asked for a read/write lock:
/// `fair write`, `barging read` (a reader with prefer_readers).
fn order_and_mode(request: &proto::QueuedRequest) -> String {
    let order = if request.fair { "fair" } else { "barging" };
    match lock_mode(request.mode()) {
        Some(mode) => format!("{order} {mode}"),
        None => order.to_owned(),
    }
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
            order_and_mode(request),
            when(request.enqueued_at_ms, reply.now_ms),
            when(request.wait_deadline_ms, reply.now_ms),
        ]);
    }
    text + &format!("{table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiters_order_then_its_lock_mode() {
        let waiter = |fair, mode: proto::LockMode| proto::QueuedRequest {
            fair,
            mode: mode as i32,
            ..Default::default()
        };
        assert_eq!(
            order_and_mode(&waiter(true, proto::LockMode::Unspecified)),
            "fair"
        );
        assert_eq!(
            order_and_mode(&waiter(false, proto::LockMode::Unspecified)),
            "barging"
        );
        assert_eq!(
            order_and_mode(&waiter(true, proto::LockMode::Write)),
            "fair write"
        );
        assert_eq!(
            order_and_mode(&waiter(false, proto::LockMode::Read)),
            "barging read"
        );
    }
}
