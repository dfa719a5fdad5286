//! `tumbler metrics`: per-kind counters over a time range.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{new_table, now_ms, rfc3339};
use super::{Failure, Globals, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub target: Target,
    /// How far back, in minutes (default: the last hour; at most 1440).
    #[arg(long, default_value_t = 60)]
    pub minutes: i64,
    /// Only this kind.
    #[arg(long, default_value = "")]
    pub kind: String,
    /// One row per minute and kind instead of totals per kind.
    #[arg(long)]
    pub per_minute: bool,
}

pub async fn run(args: MetricsArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let to_ms = now_ms();
    let request = proto::MetricsRequest {
        namespace: globals.namespace()?,
        from_ms: to_ms - args.minutes.max(1) * 60_000,
        to_ms,
        kind: args.kind,
    };
    let reply = call!(conn, metrics, request).await?;
    globals
        .output()
        .reply(&reply, || metrics_table(&reply, args.per_minute))?;
    Ok(exit::SUCCESS)
}

/// The counters of a metrics row, in table order.
fn counter_columns(row: &proto::MetricsRow) -> [(&'static str, u64); 10] {
    [
        ("acquired", row.acquired),
        ("denied", row.denied),
        ("timed_out", row.timed_out),
        ("released", row.released),
        ("extended", row.extended),
        ("expired", row.expired),
        ("reaped", row.reaped),
        ("cleared", row.cleared),
        ("downgraded", row.downgraded),
        ("errors", row.errors),
    ]
}

/// The per-kind table of the seed's web "Locks" tab: totals per kind (and
/// every kind together under them), or one row per minute and kind.
fn metrics_table(reply: &proto::MetricsResponse, per_minute: bool) -> String {
    let mut rows = if per_minute {
        reply.minutes.clone()
    } else {
        reply.totals.clone()
    };
    if !per_minute
        && rows.len() > 1
        && let Some(overall) = &reply.overall
    {
        rows.push(overall.clone());
    }
    let text = format!("{} → {}\n", rfc3339(reply.from_ms), rfc3339(reply.to_ms));
    if rows.is_empty() {
        return text + "no lock activity in this range\n";
    }
    let mut table = new_table();
    let mut header = vec![if per_minute { "minute" } else { "kind" }];
    if per_minute {
        header.push("kind");
    }
    header.extend(counter_columns(&rows[0]).map(|(name, _)| name));
    table.set_header(header.iter().map(|name| name.replace('_', " ")));
    for row in &rows {
        let mut cells = Vec::new();
        if per_minute {
            cells.push(rfc3339(row.minute_ms));
        }
        cells.push(row.kind.clone());
        cells.extend(counter_columns(row).map(|(_, count)| count.to_string()));
        table.add_row(cells);
    }
    text + &format!("{table}\n")
}
