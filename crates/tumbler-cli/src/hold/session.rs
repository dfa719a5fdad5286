//! `hold --session`: the lock is taken and kept through a Session stream.
//! Acquiring resumes the session and sends the same acquire again when a
//! replica drains or restarts; once held, a task keeps the session alive
//! and resumes it on the next endpoint within its TTL, reporting the lock
//! lost only when the server says so or no endpoint took it back in time.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::retry::{Backoff, OPEN_WITHIN, RETRY_BUDGET, retryable};
use super::stream::{Resume, Stream, session_command};
use super::{Acquired, Held, Loss};
use crate::Failure;
use crate::connect::Conn;
use crate::output::{display_name, status_line};
use tumbler_proto as proto;

/// Acquires through a Session. When the stream ends with UNAVAILABLE or
/// breaks while waiting (a replica draining or restarting), the session
/// is resumed on the next endpoint and the same acquire sent again: its
/// holder is the session id, so it takes its place in the queue back.
///
/// With `campaign` (`elect --session`: the leader's value), the command is
/// a campaign in the election `request` names (its `wait_ms` 0: the
/// server's longest wait), answered the same way.
pub(crate) async fn acquire_in_session(
    mut conn: Conn,
    request: proto::AcquireRequest,
    campaign: Option<&str>,
) -> Result<Acquired, Failure> {
    use proto::session_response::Event;
    let acquire = proto::AcquireRequest {
        holder: String::new(),
        ttl_ms: None,
        ..request.clone()
    };
    let fresh = proto::SessionOpen {
        ttl_ms: request.ttl_ms,
        ..Default::default()
    };
    let started = Instant::now();
    let wait_until = started + Duration::from_millis(request.wait_ms);
    let retry_until = wait_until.max(started + RETRY_BUDGET);
    let mut resume: Option<Resume> = None;
    let mut request_id = 0;
    let mut backoff = Backoff::new();
    loop {
        let open = resume.as_ref().map_or(&fresh, |resume| &resume.open);
        let (mut stream, opened) = match Stream::open_retrying(&mut conn, open, retry_until).await {
            Ok(opened) => opened,
            // The session (which held nothing yet) is over: a new one.
            Err(status) if status.code() == tonic::Code::NotFound && resume.is_some() => {
                resume = None;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        resume = Some(Resume::of(&opened));
        let keep_alive_every = Duration::from_millis((opened.ttl_ms / 3).max(10));
        request_id += 1;
        let wait_ms = wait_until
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        let command = match campaign {
            Some(value) => proto::session_request::Command::Campaign(proto::SessionCampaign {
                request_id,
                campaign: Some(proto::CampaignRequest {
                    namespace: acquire.namespace.clone(),
                    name: acquire.name.clone(),
                    value: value.to_owned(),
                    wait_ms: (request.wait_ms > 0).then_some(wait_ms),
                    kind: acquire.kind.clone(),
                    ..Default::default()
                }),
            }),
            None => proto::session_request::Command::Acquire(proto::SessionAcquire {
                request_id,
                acquire: Some(proto::AcquireRequest {
                    wait_ms,
                    ..acquire.clone()
                }),
            }),
        };
        let _ = stream.commands.send(session_command(command)).await;
        let mut ticker = tokio::time::interval(keep_alive_every);
        let ended = loop {
            tokio::select! {
                _ = ticker.tick() => stream.keep_alive().await,
                event = stream.events.message() => match event {
                    Ok(Some(proto::SessionResponse { event: Some(Event::Acquired(acquired)) }))
                        if acquired.request_id == request_id =>
                    {
                        let reply = acquired.response.unwrap_or_default();
                        return Ok(match reply.grant.clone() {
                            Some(grant) => Acquired::Held(keep_session(
                                conn,
                                stream,
                                resume.expect("opened"),
                                acquire,
                                grant,
                                keep_alive_every,
                            )),
                            None => {
                                stream.close().await;
                                Acquired::Refused(reply)
                            }
                        });
                    }
                    Ok(Some(proto::SessionResponse { event: Some(Event::Error(error)) })) => {
                        // A draining replica answers the waiting acquire
                        // UNAVAILABLE, keeping its place for a retry.
                        let status = tonic::Status::new(error.code.into(), error.message);
                        if retryable(&status) {
                            break status;
                        }
                        return Err(status.into());
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(tonic::Status::unavailable("the session ended").into());
                    }
                    Err(status) if retryable(&status) => break status,
                    Err(status) => return Err(status.into()),
                },
            }
        };
        if Instant::now() >= retry_until {
            return Err(ended.into());
        }
        conn.skip();
        tokio::time::sleep(backoff.next()).await;
    }
}

/// Keeps the session alive in a task; when its stream ends with
/// UNAVAILABLE or breaks, resumes it on the next endpoint (backoff and
/// jitter) until its TTL would pass: the grant is reported lost only when
/// the server says so (a `lost` event, the session over or the grant gone
/// on resume) or no endpoint took the session back in time.
fn keep_session(
    mut conn: Conn,
    stream: Stream,
    resume: Resume,
    acquire: proto::AcquireRequest,
    grant: proto::Grant,
    keep_alive_every: Duration,
) -> Held {
    use proto::session_response::Event;
    let (lost_tx, lost) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let lock = display_name(&acquire.namespace, &acquire.name);
    // An empty namespace is the server's default one.
    let ours = move |namespace: &str, name: &str| {
        name == acquire.name && (namespace == acquire.namespace || acquire.namespace.is_empty())
    };
    let task = tokio::spawn({
        let stop = stop.clone();
        let token = grant.fencing_token;
        async move {
            let mut stream = Some(stream);
            let mut ticker = tokio::time::interval(keep_alive_every);
            let report = |reason: String| {
                let lost_tx = lost_tx.clone();
                async move {
                    let _ = lost_tx
                        .send(Loss {
                            reason,
                            kill_by: None,
                        })
                        .await;
                }
            };
            loop {
                let Some(live) = stream.as_mut() else {
                    // Lost: nothing left to keep.
                    stop.cancelled().await;
                    return;
                };
                let ended = tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    _ = ticker.tick() => {
                        live.keep_alive().await;
                        continue;
                    }
                    event = live.events.message() => match event {
                        Ok(Some(proto::SessionResponse { event: Some(Event::Lost(gone)) }))
                            if ours(&gone.namespace, &gone.name) =>
                        {
                            stream = None;
                            report(gone.reason).await;
                            continue;
                        }
                        Ok(Some(_)) => continue,
                        Ok(None) => {
                            stream = None;
                            report("the server closed the session".into()).await;
                            continue;
                        }
                        Err(status) if retryable(&status) => status,
                        Err(status) => {
                            stream = None;
                            report(format!("the session ended: {}", status.message())).await;
                            continue;
                        }
                    },
                };
                // The replica drains, restarts or cannot be reached: the
                // session's grants live on for its TTL, resumable anywhere.
                stream = None;
                // The server renews a third of a TTL apart, so the lease
                // has at least two thirds of a TTL left when the stream
                // ends: a resume that takes longer might find the lock
                // gone while the command still runs, so stop trying then.
                let until = Instant::now() + resume.ttl * 2 / 3;
                status_line(&format!(
                    "tumbler hold: the session of {lock} was cut off ({}: {}); resuming it",
                    conn.endpoint(),
                    ended.message()
                ));
                conn.skip();
                let resumed = tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    resumed = Stream::open_retrying(&mut conn, &resume.open, until) => resumed,
                };
                match resumed {
                    Ok((live, opened))
                        if opened
                            .grants
                            .iter()
                            .any(|g| ours(&g.namespace, &g.name) && g.fencing_token == token) =>
                    {
                        status_line(&format!(
                            "tumbler hold: resumed the session of {lock} on {}",
                            conn.endpoint()
                        ));
                        stream = Some(live);
                        ticker.reset();
                    }
                    Ok((live, _)) => {
                        live.close().await;
                        report("the grant was gone when the session was resumed".into()).await;
                    }
                    Err(status) => {
                        report(format!("cannot resume the session: {}", status.message())).await;
                    }
                }
            }
            // Closing the session releases the lock; cut off, the session
            // is resumed just to be closed (or its TTL ends it).
            let live = match stream {
                Some(live) => Some(live),
                None => {
                    Stream::open_retrying(&mut conn, &resume.open, Instant::now() + OPEN_WITHIN)
                        .await
                        .ok()
                        .map(|(live, _)| live)
                }
            };
            if let Some(live) = live {
                live.close().await;
            }
        }
    });
    Held {
        grant,
        lost,
        stop,
        task,
    }
}
