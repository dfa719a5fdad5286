//! How the front bench drives and measures a target: the clients' loop
//! (try-once pairs, or waiting on one lock), the CPU of each process from
//! `/proc` and of Redis from `INFO`, one measured window, rounds of them,
//! and tumbler's group-commit batch sizes from its `/metrics`.

use super::*;

/// User + system CPU time of a process so far, from `/proc/<pid>/stat`.
pub(crate) fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

/// The machine's CPU time so far from `/proc/stat`: (idle, all), in ticks.
pub(crate) fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let ticks: Vec<u64> = (stat.lines().next().unwrap().split_whitespace())
        .skip(1)
        .map(|t| t.parse().unwrap())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    (ticks[3] + ticks[4], ticks.iter().take(8).sum())
}

/// Redis' own CPU so far (`INFO cpu`: used_cpu_user + used_cpu_sys).
pub(crate) async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Duration {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap();
    let seconds: f64 = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .map(|v| v.trim().parse::<f64>().unwrap())
        .sum();
    Duration::from_secs_f64(seconds)
}

#[derive(Clone)]
pub(crate) struct Bearer;

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        Ok(req)
    }
}

/// One client's loop: Acquire + Release until `stop` (try-once on its
/// own name, or waiting on the one lock); each Acquire's latency in µs.
/// Every call carries the bearer token (the yardstick ignores it; tumbler
/// checks it).
pub(crate) async fn client_loop(
    target: Arc<Target>,
    conn: Conn,
    id: usize,
    one_lock: bool,
    stop: Arc<AtomicBool>,
) -> (u64, Histogram<u64>) {
    let mut latency = Histogram::<u64>::new(3).unwrap();
    let mut pairs = 0;
    let name = if one_lock {
        HOT_NAME.to_owned()
    } else {
        format!("front-{id}")
    };
    let holder = format!("client-{id}");
    let channel = match conn {
        Conn::Grpc(channel) => channel,
        Conn::Zk(client) => {
            let dir = format!("/{name}");
            zookeeper::make_lock_node(&client, &dir).await;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let held = zookeeper::lock(&client, &dir, || {}).await;
                latency
                    .record(started.elapsed().as_micros() as u64)
                    .unwrap();
                zookeeper::unlock(&client, &held).await;
                pairs += 1;
            }
            return (pairs, latency);
        }
    };
    if target.kind == Kind::Etcd {
        let mut grpc = tonic::client::Grpc::new(channel);
        let lease: etcd::LeaseGrantResponse = etcd::call(
            &mut grpc,
            "/etcdserverpb.Lease/LeaseGrant",
            etcd::LeaseGrantRequest { ttl: 600, id: 0 },
        )
        .await;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let locked: etcd::LockResponse = etcd::call(
                &mut grpc,
                "/v3lockpb.Lock/Lock",
                etcd::LockRequest {
                    name: name.clone().into_bytes(),
                    lease: lease.id,
                },
            )
            .await;
            latency
                .record(started.elapsed().as_micros() as u64)
                .unwrap();
            let _: etcd::UnlockResponse = etcd::call(
                &mut grpc,
                "/v3lockpb.Lock/Unlock",
                etcd::UnlockRequest { key: locked.key },
            )
            .await;
            pairs += 1;
        }
        return (pairs, latency);
    }
    let mut client = LockServiceClient::new(InterceptedService::new(channel, Bearer));
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let acquired = client
            .acquire(proto::AcquireRequest {
                name: name.clone(),
                holder: holder.clone(),
                ttl_ms: Some(30_000),
                wait_ms: if one_lock { 10_000 } else { 0 },
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        latency
            .record(started.elapsed().as_micros() as u64)
            .unwrap();
        assert_eq!(
            acquired.status(),
            AcquireStatus::Acquired,
            "{}",
            target.label
        );
        let released = client
            .release(proto::ReleaseRequest {
                name: name.clone(),
                holder: holder.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            released.status(),
            ReleaseStatus::Released,
            "{}",
            target.label
        );
        pairs += 1;
    }
    (pairs, latency)
}

pub(crate) async fn measure(
    target: &Arc<Target>,
    scenario: Scenario,
    warm_up: Duration,
    window: Duration,
    redis: &mut redis::aio::MultiplexedConnection,
) -> Measured {
    let clients = scenario.clients;
    // A channel per CLIENTS_PER_CHANNEL clients; for ZooKeeper a session
    // per client. Both opened before the warm-up and kept for both phases.
    let mut conns = Vec::new();
    if target.kind == Kind::ZooKeeper {
        for _ in 0..clients {
            conns.push(Conn::Zk(zookeeper::session(&target.endpoint).await));
        }
    } else {
        for id in 0..clients {
            if id % CLIENTS_PER_CHANNEL == 0 {
                let channel = Channel::from_shared(target.endpoint.clone())
                    .unwrap()
                    .connect()
                    .await
                    .unwrap();
                conns.push(Conn::Grpc(channel));
            } else {
                conns.push(conns[id - id % CLIENTS_PER_CHANNEL].clone());
            }
        }
    }
    // Warm up, then the measured window with fresh counters.
    for (phase, length) in [("warm-up", warm_up), ("measure", window)] {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for (id, conn) in conns.iter().enumerate() {
            tasks.spawn(client_loop(
                target.clone(),
                conn.clone(),
                id,
                scenario.one_lock,
                stop.clone(),
            ));
        }
        let (server_before, redis_before, client_before, machine_before, started) = (
            process_cpu(target.pid),
            redis_cpu(redis).await,
            process_cpu(std::process::id()),
            machine_ticks(),
            Instant::now(),
        );
        tokio::time::sleep(length).await;
        stop.store(true, Ordering::Relaxed);
        let mut pairs = 0;
        let mut latency = Histogram::<u64>::new(3).unwrap();
        while let Some(done) = tasks.join_next().await {
            let (n, h) = done.unwrap();
            pairs += n;
            latency.add(h).unwrap();
        }
        let seconds = started.elapsed().as_secs_f64();
        if phase == "measure" {
            return Measured {
                pairs,
                seconds,
                latency,
                server_cpu: process_cpu(target.pid) - server_before,
                redis_cpu: redis_cpu(redis).await - redis_before,
                client_cpu: process_cpu(std::process::id()) - client_before,
                idle: {
                    let (idle, all) = machine_ticks();
                    (idle - machine_before.0) as f64 / (all - machine_before.1).max(1) as f64
                },
            };
        }
    }
    unreachable!()
}

/// `tumbler_group_commit_calls_total` by size, from a tumbler's
/// `/metrics` (a plain HTTP/1.1 GET), in bucket order.
pub(crate) async fn batch_sizes(http: &str) -> Option<Vec<(String, f64)>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(http).await.ok()?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut page = String::new();
    stream.read_to_string(&mut page).await.ok()?;
    let mut sizes: Vec<(String, f64)> = page
        .lines()
        .filter_map(|line| line.strip_prefix("tumbler_group_commit_calls_total{size=\""))
        .filter_map(|rest| {
            let (size, count) = rest.split_once("\"} ")?;
            Some((size.to_owned(), count.trim().parse().ok()?))
        })
        .collect();
    let order = |size: &str| {
        tumbler_engine::group::SIZE_BUCKETS
            .iter()
            .position(|b| *b == size)
    };
    sizes.sort_by_key(|(size, _)| order(size));
    Some(sizes)
}

/// Measures every target in turn, round after round, so a slow spell of
/// the machine falls on all of them; each round starts one target later,
/// so no target is always the one measured right after another (or always
/// first or last). Each target's rounds summed, and its rate per round.
pub(crate) async fn rounds_of(
    targets: &[Arc<Target>],
    scenario: Scenario,
    (warm_up, window, rounds): (Duration, Duration, u64),
    redis: &mut redis::aio::MultiplexedConnection,
) -> Vec<(Measured, Vec<f64>)> {
    let mut sums: Vec<Option<Measured>> = targets.iter().map(|_| None).collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for round in 0..rounds {
        for i in (0..targets.len()).map(|k| (k + round as usize) % targets.len()) {
            let target = &targets[i];
            let measured = measure(target, scenario, warm_up, window, redis).await;
            assert!(measured.pairs > 0, "{}: no pairs", target.label);
            rates[i].push(measured.rate());
            match &mut sums[i] {
                Some(sum) => sum.add(measured),
                None => sums[i] = Some(measured),
            }
        }
    }
    sums.into_iter()
        .map(|sum| sum.expect("every target measured"))
        .zip(rates)
        .collect()
}
