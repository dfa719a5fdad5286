//! `tumbler inspect`: a lock's holders.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{display_name, lock_mode, metadata_text, new_table, when};
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

/// The lock's summary line, then its holders; a read/write lock's line
/// says its mode (`read`: readers hold it or wait for it, `write`: its
/// writer holds it) and its table each holder's.
fn inspect_table(reply: &proto::InspectResponse) -> String {
    let lock = display_name(&reply.namespace, &reply.name);
    if reply.holders.is_empty() && reply.waiters == 0 {
        // A free lock has no limit of its own (the next Acquire sets it).
        return format!("{lock}: free (nobody holds it or waits for it)\n");
    }
    let mode = lock_mode(reply.mode());
    // Weighted grants (decision 75): the permits in use beside the holders.
    let weighted = (reply.holders.iter())
        .any(|holder| holder.grant.as_ref().is_some_and(|grant| grant.permits > 1));
    let text = format!(
        "{lock}: {} holder(s){}, limit {}, {} waiting{}\n",
        reply.holders.len(),
        if weighted {
            format!(" holding {} permits", reply.permits_in_use)
        } else {
            String::new()
        },
        reply.limit,
        reply.waiters,
        mode.map(|mode| format!(", {mode} mode"))
            .unwrap_or_default()
    );
    if reply.holders.is_empty() {
        return text;
    }
    let mut table = new_table();
    let mut header = vec![
        "slot", "holder", "token", "acquired", "expires", "kind", "metadata",
    ];
    if mode.is_some() {
        header.insert(2, "mode");
    }
    table.set_header(header);
    for holder in &reply.holders {
        let Some(grant) = &holder.grant else { continue };
        let slots: Vec<String> = grant.slots.iter().map(u32::to_string).collect();
        let mut row = vec![
            if slots.len() > 1 {
                slots.join(",")
            } else {
                grant.slot.to_string()
            },
            grant.holder.clone(),
            grant.fencing_token.to_string(),
            when(grant.acquired_at_ms, reply.now_ms),
            when(grant.expires_at_ms, reply.now_ms),
            grant.kind.clone(),
            metadata_text(&grant.metadata),
        ];
        if mode.is_some() {
            row.insert(2, lock_mode(grant.mode()).unwrap_or("").to_owned());
        }
        table.add_row(row);
    }
    text + &format!("{table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(holder: &str, mode: proto::LockMode) -> proto::HolderInfo {
        proto::HolderInfo {
            grant: Some(proto::Grant {
                holder: holder.into(),
                slot: 1,
                mode: mode as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_read_write_lock_shows_its_mode_and_each_holders() {
        let reply = proto::InspectResponse {
            name: "r".into(),
            limit: 8,
            mode: proto::LockMode::Read as i32,
            holders: vec![
                holder("a", proto::LockMode::Read),
                holder("b", proto::LockMode::Read),
            ],
            ..Default::default()
        };
        let text = inspect_table(&reply);
        assert!(
            text.starts_with("r: 2 holder(s), limit 8, 0 waiting, read mode\n"),
            "{text}"
        );
        assert!(text.contains("mode"), "{text}");
        assert_eq!(text.matches("read").count(), 3, "{text}");
    }

    #[test]
    fn a_free_lock_says_so_with_no_limit() {
        let reply = proto::InspectResponse {
            name: "f".into(),
            ..Default::default()
        };
        assert_eq!(
            inspect_table(&reply),
            "f: free (nobody holds it or waits for it)\n"
        );
    }

    #[test]
    fn a_plain_lock_shows_no_mode() {
        let reply = proto::InspectResponse {
            name: "m".into(),
            limit: 1,
            holders: vec![holder("a", proto::LockMode::Unspecified)],
            ..Default::default()
        };
        let text = inspect_table(&reply);
        assert!(
            text.starts_with("m: 1 holder(s), limit 1, 0 waiting\n"),
            "{text}"
        );
        assert!(!text.contains("mode"), "{text}");
    }
}
