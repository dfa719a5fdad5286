//! What the capacity bench prints: the rate and CPU per operation of
//! each window, and the sizing model built on them (docs/operating.md,
//! "Sizing").

use super::*;

pub(crate) fn print_rows(rows: &[Row]) {
    println!(
        "\n### Rate and CPU per operation (µs of CPU per unit; cores = CPU seconds per second)\n"
    );
    println!(
        "| Redis | workload | tumbler replicas | clients | units/s | tumbler µs/unit (all replicas) | Redis masters µs/unit | Redis replicas µs/unit | load generator µs/unit | all of ours µs/unit | others' load, cores | idle, cores |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows.iter().filter(|r| r.ops() > 0.0) {
        println!(
            "| {} | {} ({}) | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            r.topology,
            r.workload,
            r.unit(),
            r.tumbler.len(),
            r.clients,
            r.rate(),
            r.per_op(r.tumbler_all()),
            r.per_op(r.masters()),
            r.per_op(r.redis_replicas()),
            r.per_op(r.client),
            r.per_op(r.ours()),
            r.others_cores(),
            r.idle_cores(),
        );
    }
    println!("\n### Per process (each row's window)\n");
    println!(
        "| Redis | workload | process | cores busy | µs per unit (all units) | units it served | µs per unit it served | FCALLs per unit | PUBLISHes per unit | subscribers |"
    );
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        for (label, role, cpu, fcalls, publishes, subscribers) in &r.redis {
            println!(
                "| {} | {} | redis {label} ({role}) | {:.2} | {} | – | – | {} | {} | {subscribers} |",
                r.topology,
                r.workload,
                cpu.as_secs_f64() / r.secs,
                r.per_op_text(*cpu),
                per_unit(*fcalls, r.ops()),
                per_unit(*publishes, r.ops()),
            );
        }
        for (i, cpu) in r.tumbler.iter().enumerate() {
            let served = r.ops_by_replica[i];
            println!(
                "| {} | {} | tumbler replica {} | {:.2} | {} | {:.0} | {} | – | – | – |",
                r.topology,
                r.workload,
                i + 1,
                cpu.as_secs_f64() / r.secs,
                r.per_op_text(*cpu),
                served,
                if served > 0.0 {
                    format!("{:.1}", us(*cpu) / served)
                } else {
                    "(no clients)".into()
                },
            );
        }
        println!(
            "| {} | {} | load generator (this process) | {:.2} | {} | – | – | – | – | – |",
            r.topology,
            r.workload,
            r.client.as_secs_f64() / r.secs,
            r.per_op_text(r.client),
        );
    }
}

/// Calls per unit for a table ("–" for the window with no load).
fn per_unit(calls: u64, units: f64) -> String {
    if units > 0.0 {
        format!("{:.2}", calls as f64 / units)
    } else {
        "–".into()
    }
}

/// Units one core does at `us` µs of CPU each ("–" when nothing was
/// measured: a window shorter than the clock's tick).
fn per_core(us: f64) -> String {
    if us > 0.0 {
        format!("{:.0}", 1e6 / us)
    } else {
        "–".into()
    }
}

/// The sizing figures and the check of the model's prediction.
pub(crate) fn print_model(rows: &[Row], target: f64) {
    let find = |topology: &str, workload: &str, replicas: usize| {
        rows.iter().find(|r| {
            r.topology == topology && r.workload == workload && r.tumbler.len() == replicas
        })
    };
    let Some(pairs) = rows.iter().find(|r| r.workload == "pairs") else {
        return;
    };
    let topo = pairs.topology;
    let idle = find(topo, "idle", pairs.tumbler.len());
    println!("\n### The model ({topo}, from the rows above)\n");
    println!("| figure | value |");
    println!("| --- | ---: |");
    let redis_us = pairs.per_op(pairs.masters());
    let tumbler_us = pairs.per_op(pairs.tumbler_all());
    let replica_us = pairs.per_op(pairs.redis_replicas());
    println!(
        "| uncontended pairs per Redis (master) core | {} |",
        per_core(redis_us)
    );
    println!(
        "| uncontended pairs per tumbler core | {} |",
        per_core(tumbler_us)
    );
    if replica_us > 0.0 {
        println!(
            "| uncontended pairs per Redis replica core (replication) | {} |",
            per_core(replica_us)
        );
    }
    let masters = pairs.redis.iter().filter(|r| r.1 == "master").count();
    if masters > 1 {
        let busiest = (pairs.redis.iter())
            .filter(|r| r.1 == "master")
            .map(|r| r.2)
            .max()
            .unwrap_or_default();
        println!(
            "| busiest master's share of the masters' CPU (even: {:.2}) | {:.2} |",
            1.0 / masters as f64,
            busiest.as_secs_f64() / pairs.masters().as_secs_f64().max(1e-9)
        );
    }
    let headroom = 0.7;
    println!(
        "| worked example: {target:.0} pairs/s at {:.0} % CPU: Redis masters (one core each) | {:.0} |",
        headroom * 100.0,
        (target * redis_us / 1e6 / headroom).ceil()
    );
    println!(
        "| worked example: tumbler cores | {:.1} |",
        target * tumbler_us / 1e6 / headroom
    );
    if let Some(hot) = find(topo, "hot lock", pairs.tumbler.len()) {
        let hottest = (hot.redis.iter())
            .filter(|r| r.1 == "master")
            .max_by_key(|r| r.2)
            .map(|r| (r.0.clone(), r.2, r.5));
        if let Some((label, cpu, subscribed_there)) = hottest {
            let grant_us = hot.per_op(cpu);
            println!(
                "| hot lock: grants/s measured, {} clients | {:.0} |",
                hot.clients,
                hot.rate()
            );
            println!(
                "| hot lock: replicas' wake-up subscriptions on its master / on all nodes | {subscribed_there} / {} |",
                hot.redis.iter().map(|r| r.5).sum::<usize>()
            );
            println!("| hot lock: its master ({label}) µs per grant | {grant_us:.1} |");
            println!(
                "| hot lock: ceiling of one lock if its master's core were the bound | {} |",
                per_core(grant_us)
            );
            let others: Duration = (hot.redis.iter())
                .filter(|r| r.0 != label)
                .map(|r| r.2)
                .sum();
            println!(
                "| hot lock: every other Redis node together, µs per grant (cluster bus fan-out of PUBLISH, replication) | {:.1} |",
                hot.per_op(others)
            );
        }
    }
    if let Some(one) = find(topo, "hot lock, clients on replica 1", pairs.tumbler.len()) {
        let publishes: u64 = one.redis.iter().map(|r| r.4).sum();
        for (i, cpu) in one.tumbler.iter().enumerate().skip(1) {
            // Less what the replica spends with no load at all.
            let at_rest = idle.map_or(0.0, |idle| us(idle.tumbler[i]) / idle.secs * one.secs);
            println!(
                "| wake-up fan-out: replica {} with no waiter, µs per PUBLISH heard ({publishes} in {:.1} s), less its CPU at rest ({:.0} µs/s) | {:.1} |",
                i + 1,
                one.secs,
                at_rest / one.secs,
                (us(*cpu) - at_rest).max(0.0) / (publishes.max(1) as f64)
            );
        }
    }
    if let Some(sessions) = find(topo, "sessions", pairs.tumbler.len()) {
        println!(
            "| sessions (open, 2 grants, close) per Redis core / per tumbler core | {} / {} |",
            per_core(sessions.per_op(sessions.masters())),
            per_core(sessions.per_op(sessions.tumbler_all()))
        );
    }
    if let Some(held) = rows
        .iter()
        .find(|r| r.topology == topo && matches!(r.kind, Kind::Held { .. }))
    {
        println!(
            "| held session grants (ttl {} ms) one Redis core keeps / one tumbler core keeps | {} / {} |",
            workloads::HELD_TTL_MS,
            per_core(held.per_op(held.masters())),
            per_core(held.per_op(held.tumbler_all()))
        );
    }

    // The check: the one-replica run's rate from the two-replica run's
    // CPU per pair and the cores left to the benchmark.
    let Some(check) = rows
        .iter()
        .find(|r| r.topology == topo && r.workload == "pairs" && r.tumbler.len() == 1)
    else {
        return;
    };
    let whole_us = pairs.per_op(pairs.ours());
    let available = |r: &Row| r.machine_cores() - r.others_cores();
    let predicted_now = available(check) * 1e6 / whole_us;
    let predicted_before = available(pairs) * 1e6 / whole_us;
    let off = |predicted: f64| (check.rate() - predicted) / predicted * 100.0;
    println!(
        "\n### The model's check: {} clients on 1 replica, predicted from {} replicas' CPU per pair\n",
        check.clients,
        pairs.tumbler.len()
    );
    println!("| figure | value |");
    println!("| --- | ---: |");
    println!(
        "| CPU per pair, everything of ours ({} replicas: tumbler + Redis + load generator) | {whole_us:.1} µs |",
        pairs.tumbler.len()
    );
    println!(
        "| CPU per pair measured with 1 replica | {:.1} µs ({:+.1} %) |",
        check.per_op(check.ours()),
        (check.per_op(check.ours()) - whole_us) / whole_us * 100.0
    );
    println!(
        "| of which tumbler: {} replicas / 1 replica | {:.1} / {:.1} µs |",
        pairs.tumbler.len(),
        tumbler_us,
        check.per_op(check.tumbler_all())
    );
    println!(
        "| of which Redis masters: {} replicas / 1 replica | {:.1} / {:.1} µs |",
        pairs.tumbler.len(),
        redis_us,
        check.per_op(check.masters())
    );
    println!(
        "| cores left to the benchmark (machine minus others' load) in the check's window | {:.2} |",
        available(check)
    );
    println!("| predicted pairs/s (those cores ÷ CPU per pair) | {predicted_now:.0} |");
    println!(
        "| predicted pairs/s with the model run's others' load ({:.2} cores left) | {predicted_before:.0} |",
        available(pairs)
    );
    println!(
        "| measured pairs/s | {:.0} ({:+.1} % against the prediction; {:+.1} % against the second) |",
        check.rate(),
        off(predicted_now),
        off(predicted_before)
    );
    println!(
        "| machine idle during the check (a CPU-bound run leaves ~0) | {:.2} cores |",
        check.idle_cores()
    );
}
