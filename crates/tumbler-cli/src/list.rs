//! `tumbler list`: a namespace's locks.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{lock_mode, new_table, now_ms, when};
use super::{Failure, Globals, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub target: Target,
    /// Only names that start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Only locks with waiting requests.
    #[arg(long)]
    pub waiting: bool,
    /// Locks per page (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub page_size: u32,
    /// Fetch only this page (from a previous reply); default: every page.
    #[arg(long)]
    pub page_token: Option<String>,
}

pub async fn run(args: ListArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let namespace = globals.namespace()?;
    let single_page = args.page_token.is_some();
    let mut token = args.page_token.unwrap_or_default();
    let mut locks = Vec::new();
    let (next, now) = loop {
        let request = proto::ListRequest {
            namespace: namespace.clone(),
            prefix: args.prefix.clone(),
            page_size: args.page_size,
            page_token: token,
            only_waiting: args.waiting,
        };
        let page = call!(conn, list, request).await?;
        locks.extend(page.locks);
        if single_page || page.next_page_token.is_empty() {
            break (page.next_page_token, page.now_ms);
        }
        token = page.next_page_token;
    };
    // Every page fetched, as one ListResponse (the last page's clock).
    let reply = proto::ListResponse {
        locks,
        next_page_token: next,
        now_ms: now,
    };
    globals
        .output()
        .reply(&reply, || list_table(&reply.locks, &reply.next_page_token))?;
    Ok(exit::SUCCESS)
}

fn list_table(locks: &[proto::LockSummary], next: &str) -> String {
    let now = now_ms();
    let mut table = new_table();
    // A mode column only when the page has a read/write lock (empty for
    // its plain ones).
    let modes = locks.iter().any(|lock| lock_mode(lock.mode()).is_some());
    let mut header = vec!["name", "holders", "limit", "waiters", "next expiry"];
    if modes {
        header.insert(1, "mode");
    }
    table.set_header(header);
    for lock in locks {
        let expiry = if lock.next_expiry_at_ms > 0 {
            when(lock.next_expiry_at_ms, now)
        } else {
            "-".to_owned()
        };
        let mut row = vec![
            lock.name.clone(),
            lock.holders.to_string(),
            lock.limit.to_string(),
            lock.waiters.to_string(),
            expiry,
        ];
        if modes {
            row.insert(1, lock_mode(lock.mode()).unwrap_or("").to_owned());
        }
        table.add_row(row);
    }
    let mut text = format!("{} lock(s)\n", locks.len());
    if !locks.is_empty() {
        text += &format!("{table}\n");
    }
    if !next.is_empty() {
        text += &format!("next page: --page-token {next}\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(name: &str, mode: proto::LockMode) -> proto::LockSummary {
        proto::LockSummary {
            name: name.into(),
            holders: 1,
            limit: 1,
            mode: mode as i32,
            ..Default::default()
        }
    }

    #[test]
    fn a_mode_column_only_beside_a_read_write_lock() {
        let plain = list_table(&[summary("p", proto::LockMode::Unspecified)], "");
        assert!(!plain.contains("mode"), "{plain}");
        let mixed = list_table(
            &[
                summary("p", proto::LockMode::Unspecified),
                summary("rw", proto::LockMode::Write),
            ],
            "",
        );
        assert!(mixed.contains("mode"), "{mixed}");
        let row = mixed
            .lines()
            .find(|l| l.contains(" rw "))
            .unwrap_or_default();
        assert!(row.contains("write"), "{mixed}");
    }
}
