//! A rolling restart loses no lock and no place in line: three `tumbler
//! serve` processes on one Redis, clients spread round-robin over them,
//! each replica restarted in turn (SIGTERM, start again on its port)
//! while session holders, queued waiters and try-once clients keep going.
//! The clients here do what the client libraries do: resume a session on
//! the next replica, and retry an UNAVAILABLE with the same holder there.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::session::Session;
use common::*;
use proto::AcquireStatus;
use proto::lock_service_client::LockServiceClient;
use proto::session_response::Event;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const REPLICAS: usize = 3;
const SESSIONS: usize = 50;
const WAITERS: usize = 20;
const TRY_ONCE_CLIENTS: usize = 200;
const SESSION_TTL_MS: u64 = 3_000;
const FLAGS: &[&str] = &["--shutdown-drain-ms", "300", "--shutdown-grace-ms", "2000"];

/// One lazily connected client per replica (reconnects after a restart).
#[derive(Clone)]
struct Replicas(Vec<LockServiceClient<Channel>>);

impl Replicas {
    fn client(&self, i: usize) -> LockServiceClient<Channel> {
        self.0[i % REPLICAS].clone()
    }
}

/// An error a client library retries on another replica: UNAVAILABLE, or
/// the connection failing under the call (tonic reports a request sent
/// just after the server's GOAWAY, never processed, as INTERNAL with the
/// transport error as its source).
fn retryable(status: &tonic::Status) -> bool {
    let transport = std::error::Error::source(status)
        .is_some_and(|source| source.downcast_ref::<tonic::transport::Error>().is_some());
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) || transport
}

/// What a session holder saw through the restarts.
struct Held {
    name: String,
    session: String,
    token: u64,
    resumes: u32,
    longest_stall: Duration,
    /// Still open: the grant is checked before the session closes.
    _stream: Session,
}

/// Holds `s-<i>` through a session, resuming it on the next replica
/// whenever its stream ends, until `stop`.
async fn hold(
    replicas: Replicas,
    i: usize,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Held, String> {
    let name = format!("s-{i}");
    let mut at = i;
    let mut session = loop {
        match Session::start(
            &mut replicas.client(at),
            proto::SessionOpen {
                ttl_ms: Some(SESSION_TTL_MS),
                ..Default::default()
            },
        )
        .await
        {
            Ok((session, _)) => break session,
            Err(status) if retryable(&status) => at += 1,
            Err(status) => return Err(format!("{name}: open: {status:?}")),
        }
    };
    let grant = session.acquire(1, acquire(&name, "")).await;
    if grant.status() != AcquireStatus::Acquired {
        return Err(format!("{name}: {grant:?}"));
    }
    let token = grant.grant.unwrap().fencing_token;
    let (id, secret) = (session.id.clone(), session.secret.clone());
    let (mut resumes, mut longest_stall) = (0, Duration::ZERO);
    let mut beat = tokio::time::interval(Duration::from_millis(SESSION_TTL_MS / 3));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = beat.tick() => {
                let keep_alive = proto::SessionRequest {
                    command: Some(proto::session_request::Command::KeepAlive(
                        proto::SessionKeepAlive {},
                    )),
                };
                let _ = session.commands.send(keep_alive).await;
            }
            event = session.events.message() => match event {
                Ok(Some(proto::SessionResponse { event: Some(Event::Lost(lost)) })) => {
                    return Err(format!("{name}: lost {lost:?}"));
                }
                Ok(Some(_)) => {}
                ended => {
                    if let Err(status) = &ended
                        && !retryable(status)
                    {
                        return Err(format!("{name}: session ended {status:?}"));
                    }
                    let stalled = Instant::now();
                    session = loop {
                        at += 1;
                        match Session::resume(&mut replicas.client(at), &id, &secret).await {
                            Ok((resumed, opened)) => {
                                let kept: Vec<_> = opened
                                    .grants
                                    .iter()
                                    .map(|g| (g.name.as_str(), g.fencing_token))
                                    .collect();
                                if kept != [(name.as_str(), token)] || !opened.lost.is_empty() {
                                    return Err(format!("{name}: resumed with {opened:?}"));
                                }
                                break resumed;
                            }
                            Err(status) if retryable(&status) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(status) => return Err(format!("{name}: resume: {status:?}")),
                        }
                    };
                    resumes += 1;
                    longest_stall = longest_stall.max(stalled.elapsed());
                }
            },
        }
    }
    Ok(Held {
        name,
        session: id,
        token,
        resumes,
        longest_stall,
        _stream: session,
    })
}

/// Waits for `line` as `holder`, retrying on the next replica; on its
/// grant, checks it is the only holder, notes the order, and releases.
async fn wait_in_line(
    replicas: Replicas,
    holder: String,
    at: usize,
    order: Arc<Mutex<Vec<(String, u64)>>>,
) -> Result<u32, String> {
    let mut at = at;
    let mut retries = 0;
    loop {
        let request = proto::AcquireRequest {
            wait_ms: 120_000,
            queue_ttl_ms: Some(5_000),
            ..acquire("line", &holder)
        };
        match replicas.client(at).acquire(request).await {
            Ok(reply) if reply.get_ref().status() == AcquireStatus::Acquired => {
                let token = reply.into_inner().grant.unwrap().fencing_token;
                let seen = replicas
                    .client(at)
                    .inspect(inspect("line"))
                    .await
                    .map_err(|s| format!("{holder}: inspect {s:?}"))?
                    .into_inner();
                let holders: Vec<_> = seen
                    .holders
                    .iter()
                    .filter_map(|h| h.grant.as_ref().map(|g| g.holder.clone()))
                    .collect();
                if holders != [holder.clone()] {
                    return Err(format!("{holder}: granted beside {holders:?}"));
                }
                order.lock().unwrap().push((holder.clone(), token));
                replicas
                    .client(at)
                    .release(release("line", &holder))
                    .await
                    .map_err(|s| format!("{holder}: release {s:?}"))?;
                return Ok(retries);
            }
            Ok(reply) => return Err(format!("{holder}: {:?}", reply.into_inner())),
            Err(status) if retryable(&status) => {
                at += 1;
                retries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => return Err(format!("{holder}: {status:?}")),
        }
    }
}

/// Takes and gives back `t-<i>` every half second until `stop`, retrying
/// each call on the next replica; the longest a pair took.
async fn try_once(
    replicas: Replicas,
    i: usize,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(u32, Duration), String> {
    let (name, holder) = (format!("t-{i}"), format!("t-{i}-holder"));
    let (mut at, mut pairs, mut longest) = (i, 0, Duration::ZERO);
    while !stop.is_cancelled() {
        let started = Instant::now();
        loop {
            match replicas.client(at).acquire(acquire(&name, &holder)).await {
                Ok(reply) => match reply.into_inner().status() {
                    AcquireStatus::Acquired | AcquireStatus::AlreadyHeld => break,
                    other => return Err(format!("{name}: {other:?}")),
                },
                Err(status) if retryable(&status) => at += 1,
                Err(status) => return Err(format!("{name}: acquire {status:?}")),
            }
        }
        loop {
            match replicas.client(at).release(release(&name, &holder)).await {
                Ok(_) => break,
                Err(status) if retryable(&status) => at += 1,
                Err(status) => return Err(format!("{name}: release {status:?}")),
            }
        }
        pairs += 1;
        longest = longest.max(started.elapsed());
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    Ok((pairs, longest))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_no_grant_and_no_place_in_line() {
    let redis = start_redis();
    let mut processes: Vec<Option<TumblerProcess>> = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..REPLICAS {
        let port = tumbler::dev::free_port().unwrap();
        let process = TumblerProcess::spawn_at(&redis.url(), port, FLAGS);
        wait_for_health(
            &process.endpoint,
            tonic_health::pb::health_check_response::ServingStatus::Serving,
        )
        .await;
        processes.push(Some(process));
        ports.push(port);
    }
    let replicas = Replicas(
        processes
            .iter()
            .flatten()
            .map(|p| {
                let channel = Endpoint::from_shared(p.endpoint.clone())
                    .unwrap()
                    .connect_timeout(Duration::from_millis(500))
                    .connect_lazy();
                LockServiceClient::new(channel)
            })
            .collect(),
    );
    let stop = tokio_util::sync::CancellationToken::new();

    // Session holders, spread over the replicas.
    let mut holders = tokio::task::JoinSet::new();
    for i in 0..SESSIONS {
        holders.spawn(hold(replicas.clone(), i, stop.clone()));
    }
    // A gate holds `line`; the waiters queue behind it in a known order.
    let mut admin = replicas.client(0);
    admin
        .acquire(proto::AcquireRequest {
            ttl_ms: Some(120_000),
            ..acquire("line", "gate")
        })
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = tokio::task::JoinSet::new();
    let names: Vec<String> = (0..WAITERS).map(|i| format!("w{i:02}")).collect();
    for (i, holder) in names.iter().enumerate() {
        waiters.spawn(wait_in_line(
            replicas.clone(),
            holder.clone(),
            i,
            order.clone(),
        ));
        until_waiters(&mut admin, "line", i as u32 + 1).await;
    }
    let mut try_once_clients = tokio::task::JoinSet::new();
    for i in 0..TRY_ONCE_CLIENTS {
        try_once_clients.spawn(try_once(replicas.clone(), i, stop.clone()));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Restart each replica in turn: SIGTERM, wait for the exit, start
    // again on the same port.
    for (i, port) in ports.iter().enumerate() {
        let leaving = processes[i].take().unwrap();
        leaving.terminate();
        let exited = tokio::time::timeout(Duration::from_secs(20), leaving.exit_status())
            .await
            .expect("a draining replica exits within its grace");
        assert!(exited.success(), "{exited:?}");
        let back = TumblerProcess::spawn_at(&redis.url(), *port, FLAGS);
        wait_for_health(
            &back.endpoint,
            tonic_health::pb::health_check_response::ServingStatus::Serving,
        )
        .await;
        processes[i] = Some(back);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();

    // Every session grant is still its session's, with its first token.
    let mut resumes = 0;
    let mut longest_session_stall = Duration::ZERO;
    while let Some(held) = holders.join_next().await {
        let held = held.unwrap().unwrap_or_else(|e| panic!("{e}"));
        let seen = admin
            .inspect(inspect(&held.name))
            .await
            .unwrap()
            .into_inner();
        let grant = seen.holders.first().and_then(|h| h.grant.clone());
        let grant = grant.unwrap_or_else(|| panic!("{} was lost", held.name));
        assert_eq!(
            (grant.holder.as_str(), grant.fencing_token),
            (held.session.as_str(), held.token),
            "{}",
            held.name
        );
        resumes += held.resumes;
        longest_session_stall = longest_session_stall.max(held.longest_stall);
    }
    assert!(
        resumes >= SESSIONS as u32,
        "every session moved at least once: {resumes}"
    );
    let mut pairs = 0;
    let mut longest_pair = Duration::ZERO;
    while let Some(done) = try_once_clients.join_next().await {
        let (n, longest) = done.unwrap().unwrap_or_else(|e| panic!("{e}"));
        pairs += n;
        longest_pair = longest_pair.max(longest);
    }

    // The waiters go in their original order once the gate opens.
    admin.release(release("line", "gate")).await.unwrap();
    let mut waiter_retries = 0;
    while let Some(done) = tokio::time::timeout(Duration::from_secs(30), waiters.join_next())
        .await
        .expect("every waiter is granted")
    {
        waiter_retries += done.unwrap().unwrap_or_else(|e| panic!("{e}"));
    }
    let order = order.lock().unwrap().clone();
    let granted: Vec<&str> = order.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(granted, names, "the waiters lost their places");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "fencing tokens must rise with each grant: {order:?}"
    );
    println!(
        "rolling restart of {REPLICAS} replicas: {SESSIONS} session grants kept ({resumes} resumes, longest stall {longest_session_stall:?}); \
         {WAITERS} waiters granted in order ({waiter_retries} retries on another replica); \
         {TRY_ONCE_CLIENTS} try-once clients made {pairs} pairs (longest pair {longest_pair:?})"
    );
}

/// A replica that crashes (SIGKILL) tells nobody: its sessions' streams
/// break, and their clients resume them on another replica within the
/// session TTL, with their grants and tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_a_killed_replica_resume_elsewhere_with_their_grants() {
    let redis = start_redis();
    let mut crashing = TumblerProcess::start(&redis.url(), FLAGS).await;
    let staying = TumblerProcess::start(&redis.url(), FLAGS).await;
    let mut near = crashing.client().await;
    let mut far = staying.client().await;
    let mut session = Session::open(&mut near, SESSION_TTL_MS).await;
    let token = session
        .acquire(1, acquire("survivor", ""))
        .await
        .grant
        .unwrap()
        .fencing_token;

    crashing.kill();
    let (lost, status) = session.until_ended().await;
    assert!(lost.is_empty(), "{lost:?}");
    assert!(retryable(&status), "{status:?}");
    let (resumed, opened) = Session::resume(&mut far, &session.id, &session.secret)
        .await
        .expect("resumed on the surviving replica");
    assert_eq!(opened.grants.len(), 1, "{opened:?}");
    assert_eq!(opened.grants[0].fencing_token, token);
    // Renewed by the survivor past two of the old leases.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(SESSION_TTL_MS / 3)).await;
        resumed.keep_alive().await;
    }
    let seen = far.inspect(inspect("survivor")).await.unwrap().into_inner();
    let grant = seen.holders[0].grant.clone().unwrap();
    assert_eq!(
        (grant.holder, grant.fencing_token),
        (session.id.clone(), token)
    );
}
