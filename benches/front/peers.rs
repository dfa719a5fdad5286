//! The front bench's peer table: one client uncontended (every target but
//! the padded yardstick) and clients waiting on one lock (every target
//! that can wait), then the four figures per path side by side, and
//! tumbler ÷ ZooKeeper when ZooKeeper ran.

use super::*;

/// Prints the peer table after the main one (`results`: its rows).
pub(crate) async fn peer_table(
    targets: &[Arc<Target>],
    results: &[(Arc<Target>, Measured)],
    (clients, hot): (usize, usize),
    timing: (Duration, Duration, u64),
    redis: &mut redis::aio::MultiplexedConnection,
) {
    let find = |kind: Kind| results.iter().position(|(t, _)| t.kind == kind);
    // The peer table: 1 client uncontended (every target but the
    // padded yardstick), and clients waiting on one lock (every target
    // that can wait).
    let single_targets: Vec<Arc<Target>> = (targets.iter())
        .filter(|t| t.kind != Kind::Padded)
        .cloned()
        .collect();
    let hot_targets: Vec<Arc<Target>> = (single_targets.iter())
        .filter(|t| t.kind != Kind::Yardstick)
        .cloned()
        .collect();
    let one = Scenario {
        clients: 1,
        one_lock: false,
    };
    let single = rounds_of(&single_targets, one, timing, redis).await;
    let one_lock = Scenario {
        clients: hot,
        one_lock: true,
    };
    let contended = rounds_of(&hot_targets, one_lock, timing, redis).await;
    println!();
    println!(
        "Peer table: 1 client, uncontended try-once pairs; {hot} clients on one lock, each waiting in Acquire and releasing as soon as it is granted (grants/s; the wait is the acquire's latency); same rounds and windows as above"
    );
    println!();
    println!(
        "| path | 1 client pairs/s | 1 client acquire p50 µs | p99 µs | {hot} on one lock: grants/s | wait p50 µs | wait p99 µs | server CPU µs/grant | Redis CPU µs/grant | machine idle |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let hot_of = |kind: Kind| {
        let i = hot_targets.iter().position(|t| t.kind == kind)?;
        Some(&contended[i].0)
    };
    for (target, (m, _)) in single_targets.iter().zip(&single) {
        let hot_cells = match hot_of(target.kind) {
            Some(h) => format!(
                "{:.0} | {} | {} | {:.1} | {:.1} | {:.0} %",
                h.rate(),
                h.latency.value_at_quantile(0.5),
                h.latency.value_at_quantile(0.99),
                h.server_us(),
                h.redis_us(),
                h.idle * 100.0
            ),
            None => "– | – | – | – | – | –".to_owned(),
        };
        println!(
            "| {} | {:.0} | {} | {} | {hot_cells} |",
            target.label,
            m.rate(),
            m.latency.value_at_quantile(0.5),
            m.latency.value_at_quantile(0.99),
        );
    }
    // The summary: the four figures per path, side by side.
    let columns: Vec<(Kind, &str)> = [
        (Kind::Tumbler, "tumbler"),
        (Kind::ZooKeeper, "ZooKeeper"),
        (Kind::Etcd, "etcd"),
        (Kind::Yardstick, "bare tonic front over plain Lua"),
    ]
    .into_iter()
    .filter(|(kind, _)| find(*kind).is_some())
    .collect();
    let single_of = |kind: Kind| {
        let i = single_targets.iter().position(|t| t.kind == kind)?;
        Some(&single[i].0)
    };
    let main_of = |kind: Kind| &results[find(kind).unwrap()].1;
    println!();
    let heads: Vec<&str> = columns.iter().map(|(_, head)| *head).collect();
    println!("| path (same run) | {} |", heads.join(" | "));
    println!("| --- |{}", " ---: |".repeat(columns.len()));
    let row = |label: String, cell: &dyn Fn(Kind) -> String| {
        let cells: Vec<String> = columns.iter().map(|(kind, _)| cell(*kind)).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    row(format!("{clients} clients, uncontended pairs/s"), &|k| {
        format!("{:.0}", main_of(k).rate())
    });
    row(
        "server CPU µs per pair (tumbler's and the front's include Redis)".to_owned(),
        &|k| format!("{:.0}", whole_us(k, main_of(k))),
    );
    row(format!("{hot} clients on one lock, grants/s"), &|k| {
        hot_of(k).map_or("–".to_owned(), |h| format!("{:.0}", h.rate()))
    });
    row("1 client, acquire p50 µs".to_owned(), &|k| {
        single_of(k).map_or("–".to_owned(), |m| {
            m.latency.value_at_quantile(0.5).to_string()
        })
    });
    if find(Kind::ZooKeeper).is_some() {
        let (t, z) = (Kind::Tumbler, Kind::ZooKeeper);
        let p50 = |k| single_of(k).unwrap().latency.value_at_quantile(0.5) as f64;
        println!();
        println!("| tumbler ÷ ZooKeeper (same run) | ratio |");
        println!("| --- | ---: |");
        println!(
            "| {clients} clients, uncontended pairs/s (above 1: tumbler ahead) | {:.2} |",
            main_of(t).rate() / main_of(z).rate()
        );
        println!(
            "| server CPU per pair, tumbler + Redis ÷ ZooKeeper's JVM (below 1: tumbler cheaper) | {:.2} |",
            whole_us(t, main_of(t)) / whole_us(z, main_of(z))
        );
        println!(
            "| {hot} clients on one lock, grants/s (above 1: tumbler ahead) | {:.2} |",
            hot_of(t).unwrap().rate() / hot_of(z).unwrap().rate()
        );
        println!(
            "| 1 client, acquire p50 (below 1: tumbler faster) | {:.2} |",
            p50(t) / p50(z).max(1.0)
        );
    }
}
