//! Rust's steps of the cross-language conformance scenario
//! (`clients/conformance`), run with this crate.
//!
//! usage: conformance_steps ADDR NAMESPACE STEP ARGS...
//! Prints JSON lines: events (`{"event": ...}`) while it runs, its result last.
//! One file on purpose: one program, one function per step, as in the other
//! languages' steps programs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tumbler_client::{
    CancellationToken, Client, Error, Leadership, Lock, LockRequest, LockSet, Mode, proto,
};

type Out = Result<Value, Error>;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn emit(value: &Value) {
    println!("{value}");
}

fn num(s: &str) -> u64 {
    s.parse().unwrap_or(0)
}

fn ms(s: &str) -> Duration {
    Duration::from_millis(num(s))
}

fn grant_json(lock: &Lock) -> Value {
    let g = lock.grant();
    json!({"holder": g.holder, "token": g.fencing_token.to_string(), "slot": g.slot, "acquired_at_ms": g.acquired_at_ms})
}

fn with(mut value: Value, extra: Value) -> Value {
    if let (Value::Object(map), Value::Object(more)) = (&mut value, extra) {
        map.extend(more);
    }
    value
}

async fn hold(c: &Client, a: &[String]) -> Out {
    // try once, keep the grant (60 s lease) past this process
    let request = c
        .lock(&a[0])
        .holder(&a[1])
        .limit(num(&a[2]) as u32)
        .ttl(Duration::from_secs(60))
        .watchdog(false);
    match request.acquire().await {
        Ok(lock) => {
            let out = with(grant_json(&lock), json!({"status": "ACQUIRED"}));
            lock.forget();
            Ok(out)
        }
        Err(e) => refused(e),
    }
}

/// "read" / "write" asks that mode; anything else ("plain") a plain lock.
fn in_mode(request: LockRequest, mode: &str) -> LockRequest {
    match mode {
        "read" => request.read(),
        "write" => request.write(),
        _ => request,
    }
}

fn mode_json(lock: &Lock) -> Value {
    match lock.mode() {
        Some(Mode::Read) => json!("read"),
        Some(Mode::Write) => json!("write"),
        None => Value::Null,
    }
}

/// A try-once acquire kept (60 s lease, no watchdog): ACQUIRED with
/// `out(lock)`'s fields, BUSY, or the error.
async fn try_once(request: LockRequest, out: fn(&Lock) -> Value) -> Out {
    let request = request.ttl(Duration::from_secs(60)).watchdog(false);
    match request.acquire().await {
        Ok(lock) => {
            let got = with(
                with(grant_json(&lock), json!({"status": "ACQUIRED"})),
                out(&lock),
            );
            lock.forget();
            Ok(got)
        }
        Err(e) => refused(e),
    }
}

async fn rw_hold(c: &Client, a: &[String]) -> Out {
    // NAME HOLDER read|write|plain: try once, keep the grant (60 s lease)
    let request = in_mode(c.lock(&a[0]).holder(&a[1]), &a[2]);
    try_once(request, |lock| json!({"mode": mode_json(lock)})).await
}

fn weights(lock: &Lock) -> Value {
    json!({"permits": lock.permits(), "slots": lock.slots()})
}

async fn weighted_hold(c: &Client, a: &[String]) -> Out {
    // NAME HOLDER LIMIT PERMITS: try once, keep the grant (60 s lease)
    let request = c
        .lock(&a[0])
        .holder(&a[1])
        .limit(num(&a[2]) as u32)
        .permits(num(&a[3]) as u32);
    try_once(request, weights).await
}

async fn weighted_wait(c: &Client, a: &[String]) -> Out {
    // NAME HOLDER LIMIT PERMITS WAIT_MS HOLD_MS: wait, extend, hold a while, release
    let hold_for = ms(&a[5]);
    c.lock(&a[0])
        .holder(&a[1])
        .limit(num(&a[2]) as u32)
        .permits(num(&a[3]) as u32)
        .wait(ms(&a[4]))
        .ttl(Duration::from_secs(60))
        .run(async |lock| {
            let out = with(grant_json(lock), weights(lock));
            lock.extend(None).await?;
            let out = with(out, json!({"extended": weights(lock)}));
            tokio::time::sleep(hold_for).await;
            Ok(with(out, json!({"released_at_ms": now_ms()})))
        })
        .await?
}

/// A wait for the lock `a[0]` as the holder `a[1]`, up to `wait_ms`, with a
/// 60 s lease.
fn waiting(c: &Client, a: &[String], wait_ms: &str) -> LockRequest {
    c.lock(&a[0])
        .holder(&a[1])
        .wait(ms(wait_ms))
        .ttl(Duration::from_secs(60))
}

fn names(list: &str) -> Vec<String> {
    list.split(',').map(str::to_owned).collect()
}

fn set_json(set: &LockSet) -> Value {
    let grants: Vec<Value> = (set.grants().iter())
        .map(|g| json!({"name": g.name, "token": g.fencing_token.to_string(), "slot": g.slot}))
        .collect();
    json!({"status": "ACQUIRED", "holder": set.holder(), "grants": grants})
}

/// BUSY / TIMEOUT / DEADLOCK / ERROR for a refused acquire (a deadlock is
/// told by its type, `Error::Deadlock`); other errors stay errors.
fn refused(e: Error) -> Out {
    match e {
        Error::NotAcquired {
            reason, holders, ..
        } => {
            let status = if reason == tumbler_client::NotAcquiredReason::Busy {
                "BUSY"
            } else {
                "TIMEOUT"
            };
            Ok(json!({"status": status, "holders": holders}))
        }
        Error::Deadlock { message } => Ok(json!({
            "status": "DEADLOCK", "code": "Aborted", "typed": "Error::Deadlock", "message": message,
        })),
        Error::InvalidArgument { message } => Ok(json!({
            "status": "ERROR", "code": "InvalidArgument", "typed": "Error::InvalidArgument", "message": message,
        })),
        Error::Status(status) => Ok(json!({
            "status": "ERROR", "code": format!("{:?}", status.code()), "typed": "Error::Status",
            "message": status.message(),
        })),
        e => Err(e),
    }
}

async fn multi_hold(c: &Client, a: &[String]) -> Out {
    // HOLDER NAMES: try once for the set (60 s lease), keep it past this process
    let request = c
        .lock_all(names(&a[1]))
        .holder(&a[0])
        .ttl(Duration::from_secs(60))
        .watchdog(false);
    match request.acquire().await {
        Ok(set) => {
            let out = set_json(&set);
            // Not dropped: the guard would release the set.
            std::mem::forget(set);
            Ok(out)
        }
        Err(e) => refused(e),
    }
}

async fn multi_wait(c: &Client, a: &[String]) -> Out {
    // HOLDER NAMES WAIT_MS HOLD_MS: wait for the set, extend it, hold a while, release
    let request = c
        .lock_all(names(&a[1]))
        .holder(&a[0])
        .wait(ms(&a[2]))
        .ttl(Duration::from_secs(60));
    let set = match request.acquire().await {
        Ok(set) => set,
        Err(e) => return refused(e),
    };
    let extended = match set.extend(None).await {
        Ok(_) => true,
        Err(Error::LockLost { .. }) => false,
        Err(e) => return Err(e),
    };
    let out = set_json(&set);
    tokio::time::sleep(ms(&a[3])).await;
    let released_at = now_ms();
    set.release().await?;
    Ok(with(
        out,
        json!({"extended": extended, "released_at_ms": released_at}),
    ))
}

async fn multi_release(c: &Client, a: &[String]) -> Out {
    // HOLDER NAMES: the raw Release naming the set (by holder, no token)
    let request = proto::ReleaseRequest {
        namespace: c.namespace().to_owned(),
        holder: a[0].clone(),
        names: names(&a[1]),
        ..Default::default()
    };
    let reply = c.stub().release(request).await.map_err(Error::from)?;
    Ok(json!({"released": reply.get_ref().status == proto::ReleaseStatus::Released as i32}))
}

async fn multi_stale(c: &Client, a: &[String]) -> Out {
    // HOLDER NAMES: S1 taken and released, S2 taken; S1's release again;
    // on "release": S2's. `LockSet::release` takes the set by value (a
    // second release does not compile), so S1's late release is the raw
    // Release carrying S1's tokens, as its guard sent them.
    let take = || {
        c.lock_all(names(&a[1]))
            .holder(&a[0])
            .ttl(Duration::from_secs(60))
    };
    let mut commands = commands();
    let first = take().acquire().await?;
    let first_json = set_json(&first);
    let tokens: Vec<u64> = first.grants().iter().map(|g| g.fencing_token).collect();
    let first_released = first.release().await?;
    let second = take().acquire().await?;
    let stale = proto::ReleaseRequest {
        namespace: c.namespace().to_owned(),
        holder: a[0].clone(),
        names: names(&a[1]),
        fencing_tokens: tokens,
        ..Default::default()
    };
    let reply = c.stub().release(stale).await.map_err(Error::from)?;
    emit(
        &json!({"event": "stale", "first": first_json, "second": set_json(&second),
                 "first_released": first_released,
                 "stale_released": reply.get_ref().status == proto::ReleaseStatus::Released as i32}),
    );
    commands.recv().await;
    Ok(json!({"released": second.release().await?}))
}

async fn deadlock_wait(c: &Client, a: &[String]) -> Out {
    // NAME HOLDER WAIT_MS: wait for one lock; a refusal must be Error::Deadlock
    let request = waiting(c, a, &a[2]);
    match request.acquire().await {
        Ok(lock) => {
            let token = lock.fencing_token().to_string();
            lock.release().await?;
            Ok(json!({"status": "ACQUIRED", "token": token}))
        }
        Err(e) => refused(e),
    }
}

async fn rw_wait(c: &Client, a: &[String]) -> Out {
    // NAME HOLDER MODE WAIT_MS HOLD_MS: wait in a mode, hold a while, release
    let request = waiting(c, a, &a[3]);
    let hold_for = ms(&a[4]);
    in_mode(request, &a[2])
        .run(async |lock| {
            let out = with(grant_json(lock), json!({"mode": mode_json(lock)}));
            tokio::time::sleep(hold_for).await;
            with(out, json!({"released_at_ms": now_ms()}))
        })
        .await
}

async fn release(c: &Client, a: &[String]) -> Out {
    Ok(json!({"released": c.release(&a[0], &a[1], None).await?}))
}

async fn wait(c: &Client, a: &[String]) -> Out {
    // wait, hold a while, release
    let request = waiting(c, a, &a[2]);
    let hold_for = ms(&a[3]);
    request
        .run(async |lock| {
            let out = grant_json(lock);
            tokio::time::sleep(hold_for).await;
            with(out, json!({"released_at_ms": now_ms()}))
        })
        .await
}

async fn scoped(c: &Client, a: &[String]) -> Out {
    // the guard's scope, extend inside, nothing held after
    let out = c
        .lock(&a[0])
        .ttl(Duration::from_secs(2))
        .run(async |lock| {
            let out = grant_json(lock);
            let before = lock.grant().expires_at_ms;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let after = lock
                .extend(Some(Duration::from_secs(30)))
                .await?
                .expires_at_ms;
            Ok::<_, Error>(with(out, json!({"extended": after > before})))
        })
        .await??;
    let holders = c.inspect(&a[0]).await?.holders.len();
    Ok(with(out, json!({"holders_after": holders})))
}

async fn queue_names(c: &Client, name: &str) -> Result<Vec<String>, Error> {
    Ok(c.queue(name)
        .await?
        .requests
        .into_iter()
        .map(|r| r.holder)
        .collect())
}

async fn inspect(c: &Client, a: &[String]) -> Out {
    let info = c.inspect(&a[0]).await?;
    let holders: Vec<Value> = info
        .holders
        .iter()
        .filter_map(|h| h.grant.as_ref())
        .map(|g| json!({"holder": g.holder, "token": g.fencing_token.to_string(), "slot": g.slot}))
        .collect();
    Ok(
        json!({"limit": info.limit, "waiters": info.waiters, "holders": holders, "queue": queue_names(c, &a[0]).await?}),
    )
}

async fn invalid(c: &Client) -> Out {
    // bad input: priority out of range
    match c.lock("conformance-invalid").priority(5000).acquire().await {
        Err(Error::InvalidArgument { message }) => Ok(
            json!({"field": "priority", "code": "InvalidArgument", "message": message, "typed": "Error::InvalidArgument"}),
        ),
        other => Ok(json!({"field": "priority", "code": format!("{other:?}")})),
    }
}

async fn keep(c: &Client, a: &[String]) -> Out {
    // a lease shorter than the work: the watchdog keeps it
    let (name, work) = (a[0].clone(), ms(&a[2]));
    let out = c
        .lock(&name)
        .holder("rust-keeper")
        .ttl(ms(&a[1]))
        .run(async |lock| {
            emit(&with(grant_json(lock), json!({"event": "held"})));
            let start = now_ms();
            tokio::time::sleep(work).await;
            let inside = c.inspect(&name).await?;
            let token_inside = inside
                .holders
                .first()
                .and_then(|h| h.grant.as_ref())
                .map(|g| g.fencing_token);
            Ok::<_, Error>(json!({"body_start_ms": start, "body_end_ms": now_ms(),
                "token": lock.fencing_token().to_string(), "lost": lock.is_lost(),
                "token_inside": token_inside.unwrap_or(0).to_string()}))
        })
        .await??;
    // Its own grant only: the driver's prober may take the freed lock at once.
    let info = c.inspect(&name).await?;
    let mine = info
        .holders
        .iter()
        .filter(|h| h.grant.as_ref().is_some_and(|g| g.holder == "rust-keeper"))
        .count();
    Ok(with(out, json!({"holders_after": mine})))
}

async fn crash(c: &Client, a: &[String]) -> Out {
    // hold with the watchdog, then get killed by the driver
    c.lock(&a[0])
        .holder("rust-crasher")
        .ttl(ms(&a[1]))
        .run(async |lock| {
            emit(&with(grant_json(lock), json!({"event": "held"})));
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await?;
    Ok(json!({"survived": true}))
}

async fn lost(c: &Client, a: &[String]) -> Out {
    // the driver takes the grant away: lost() resolves, run() returns LockLost
    let result = c
        .lock(&a[0])
        .holder("rust-loser")
        .ttl(ms(&a[1]))
        .run(async |lock| {
            emit(&with(grant_json(lock), json!({"event": "held"})));
            tokio::time::sleep(Duration::from_secs(10)).await;
        })
        .await;
    Ok(match result {
        Err(Error::LockLost { reason, .. }) => {
            json!({"signalled": true, "signal_at_ms": now_ms(), "reason": reason, "raised": "Error::LockLost"})
        }
        other => json!({"signalled": false, "got": format!("{other:?}")}),
    })
}

async fn cancel(c: &Client, a: &[String]) -> Out {
    // cancel a waiting acquire: no ghost waiter
    let holder = "rust-canceller";
    let token = CancellationToken::new();
    let request = c
        .lock(&a[0])
        .holder(holder)
        .wait(Duration::from_secs(20))
        .ttl(Duration::from_secs(10));
    let waiting = tokio::spawn(request.cancel_on(token.clone()).acquire());
    tokio::time::sleep(ms(&a[1])).await;
    let before = queue_names(c, &a[0]).await?;
    let t0 = std::time::Instant::now();
    token.cancel();
    let error = match waiting.await.expect("the acquire task") {
        Err(Error::Cancelled) => "Error::Cancelled".to_owned(),
        other => format!("{other:?}"),
    };
    let cancel_ms = t0.elapsed().as_millis() as u64;
    let after = loop {
        let names = queue_names(c, &a[0]).await?;
        if !names.iter().any(|n| n == holder) || t0.elapsed() > Duration::from_secs(2) {
            break names;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    Ok(
        json!({"error": error, "cancel_ms": cancel_ms, "queued_before": before.iter().any(|n| n == holder),
        "queue_after": after, "gone_ms": t0.elapsed().as_millis() as u64}),
    )
}

async fn restart(c: &Client, a: &[String]) -> Out {
    // wait through a server restart (retries on UNAVAILABLE, same holder)
    let started = std::time::Instant::now();
    let lock = c
        .lock(&a[0])
        .holder(&a[1])
        .wait(ms(&a[2]))
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let out = with(
        grant_json(&lock),
        json!({"status": "ACQUIRED", "elapsed_ms": started.elapsed().as_millis() as u64}),
    );
    lock.release().await?;
    Ok(out)
}

async fn auth(addr: &str, namespace: &str, token: &str) -> Out {
    // the token is sent; none, or another namespace, is PermissionDenied
    async fn attempt(addr: &str, namespace: &str, token: &str) -> String {
        let client = match Client::builder(addr)
            .namespace(namespace)
            .token(token)
            .connect()
            .await
        {
            Ok(client) => client,
            Err(e) => return format!("{e:?}"),
        };
        match client
            .lock("auth-rust")
            .ttl(Duration::from_secs(5))
            .acquire()
            .await
        {
            Ok(lock) => {
                let _ = lock.release().await;
                "ACQUIRED".into()
            }
            Err(Error::PermissionDenied { .. }) => "Error::PermissionDenied".into(),
            Err(e) => format!("{e:?}"),
        }
    }
    Ok(
        json!({"with_token": attempt(addr, namespace, token).await, "no_token": attempt(addr, namespace, "").await,
        "other_namespace": attempt(addr, "elsewhere", token).await}),
    )
}

fn leadership_json(leader: &proto::Leadership) -> Value {
    json!({"candidate": leader.candidate, "term": leader.term.to_string(), "value": leader.value,
           "elected_at_ms": leader.elected_at_ms, "expires_at_ms": leader.expires_at_ms})
}

/// The lines the driver writes to this step's stdin, read on a thread of
/// their own.
fn commands() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn campaign(c: &Client, a: &[String]) -> Out {
    // campaign, then act on the driver's commands: proclaim V, resign,
    // lost MS, exit. `resign` takes the leadership by value (a second
    // resign, or a proclaim after it, does not compile), so the driver
    // asks Rust for neither.
    let election = c
        .election(&a[0])
        .candidate(&a[1])
        .ttl(ms(&a[3]))
        .wait(ms(&a[4]));
    let mut held: Leadership = match election.campaign(&a[2]).await {
        Ok(held) => held,
        Err(Error::NotAcquired { .. }) => return Ok(json!({"elected": false})),
        Err(e) => return Err(e),
    };
    emit(
        &json!({"event": "elected", "elected": true, "at_ms": now_ms(),
                 "candidate": held.candidate(), "term": held.term().to_string(), "value": held.value()}),
    );
    let term = held.term();
    let mut commands = commands();
    while let Some(line) = commands.recv().await {
        let (command, arg) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        match command {
            "proclaim" => {
                let said = held.proclaim(arg).await;
                emit(&match said {
                    Ok(()) => json!({"event": "proclaim", "status": "PROCLAIMED",
                                     "value": held.value(), "lost": held.is_lost()}),
                    Err(Error::LockLost { .. }) => {
                        json!({"event": "proclaim", "status": "NOT_LEADER",
                                                         "typed": "Error::LockLost", "lost": held.is_lost()})
                    }
                    Err(e) => return Err(e),
                });
            }
            "resign" => {
                let first = held.resign().await?;
                emit(&json!({"event": "resign", "first": first}));
                return Ok(json!({"done": true, "term": term.to_string()}));
            }
            "lost" => {
                let lost = tokio::time::timeout(ms(arg), held.lost()).await;
                emit(&match lost {
                    Ok(Error::LockLost { reason, .. }) => {
                        json!({"event": "lost", "lost": true, "reason": reason, "at_ms": now_ms()})
                    }
                    Ok(other) => {
                        json!({"event": "lost", "lost": true, "reason": other.to_string(), "at_ms": now_ms()})
                    }
                    Err(_) => json!({"event": "lost", "lost": false, "at_ms": now_ms()}),
                });
            }
            "exit" => break,
            other => eprintln!("unknown command {other}"),
        }
    }
    held.resign().await?;
    Ok(json!({"done": true, "term": term.to_string()}))
}

async fn leader(c: &Client, a: &[String]) -> Out {
    let leader = c.election(&a[0]).leader().await?;
    Ok(json!({"leader": leader.as_ref().map(leadership_json)}))
}

async fn observe(c: &Client, a: &[String]) -> Out {
    // the leader changes until a[1] is elected, then the stream is dropped
    let (name, stop_candidate) = (&a[0], &a[1]);
    let mut changes = Vec::new();
    let mut cancelled = false;
    let watched = async {
        let mut stream = c.election(name).observe().await?;
        while let Some(change) = stream.next().await {
            let change = change?;
            let seen = json!({"kind": change.event, "leader": change.leader.as_ref().map(leadership_json),
                              "ended_term": change.ended_term.to_string()});
            emit(&with(json!({"event": "change"}), seen.clone()));
            changes.push(seen);
            if change.event == "elected"
                && change
                    .leader
                    .as_ref()
                    .is_some_and(|l| &l.candidate == stop_candidate)
            {
                cancelled = true;
                break;
            }
        }
        Ok::<(), Error>(())
    };
    let error = match tokio::time::timeout(ms(&a[2]), watched).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("timed out".to_owned()),
    };
    let mut out = json!({"cancelled": cancelled, "changes": changes});
    if let Some(error) = error {
        out = with(out, json!({"error": error}));
    }
    Ok(out)
}

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.len() < 3 {
        eprintln!("usage: conformance_steps ADDR NAMESPACE STEP ARGS...");
        std::process::exit(2);
    }
    let (addr, namespace, step, args) = (&argv[0], &argv[1], argv[2].as_str(), &argv[3..]);
    let result = if step == "auth" {
        auth(addr, namespace, &args[0]).await
    } else {
        match Client::builder(addr.as_str())
            .namespace(namespace.as_str())
            .connect_lazy()
        {
            Err(e) => Err(e),
            Ok(c) => match step {
                "hold" => hold(&c, args).await,
                "rw_hold" => rw_hold(&c, args).await,
                "rw_wait" => rw_wait(&c, args).await,
                "weighted_hold" => weighted_hold(&c, args).await,
                "weighted_wait" => weighted_wait(&c, args).await,
                "multi_hold" => multi_hold(&c, args).await,
                "multi_wait" => multi_wait(&c, args).await,
                "multi_release" => multi_release(&c, args).await,
                "multi_stale" => multi_stale(&c, args).await,
                "deadlock_wait" => deadlock_wait(&c, args).await,
                "release" => release(&c, args).await,
                "wait" => wait(&c, args).await,
                "scoped" => scoped(&c, args).await,
                "inspect" => inspect(&c, args).await,
                "invalid" => invalid(&c).await,
                "keep" => keep(&c, args).await,
                "crash" => crash(&c, args).await,
                "lost" => lost(&c, args).await,
                "cancel" => cancel(&c, args).await,
                "restart" => restart(&c, args).await,
                "campaign" => campaign(&c, args).await,
                "leader" => leader(&c, args).await,
                "observe" => observe(&c, args).await,
                other => {
                    eprintln!("unknown step {other}");
                    std::process::exit(2);
                }
            },
        }
    };
    match result {
        Ok(value) => emit(&value),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
