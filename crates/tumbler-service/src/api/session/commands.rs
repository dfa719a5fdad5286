//! A session stream's commands: starting one (validated, charged to the
//! token, its namespace checked), the set running with their stop
//! signals, and what a finished one tells the stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;

use super::Driver;
use crate::auth::LiveAccess;
use crate::engine::sessions::LostGrant;
use crate::engine::{
    AcquireRequest, EngineError, EngineFace, LockId, LockName, MultiAcquireRequest, Ttl,
};
use crate::errors::{self, invalid};
use crate::proto;
use crate::proto::session_request::Command;
use crate::proto::session_response::Event;
use crate::replies::ToProto;
use crate::{report, requests, validate};

/// Commands one session may have running at once (waiting acquires
/// included); more are refused with RESOURCE_EXHAUSTED.
const MAX_RUNNING_COMMANDS: usize = 1000;

/// How long the commands still running when a stream ends may take to
/// stop at a safe point (a waiting acquire leaves its queue; a function
/// call in flight answers, so a grant it made is released with the
/// others) before they are cut off.
const STOP_WITHIN: Duration = Duration::from_secs(2);

/// What a finished command tells the stream: its reply, and whether it
/// found the session taken over by another stream (this one then ends).
pub(super) struct Done {
    pub(super) event: Event,
    pub(super) moved: bool,
}

impl Driver {
    /// Starts one command; returns an immediate reply (refusals) if any.
    pub(super) fn start(
        &self,
        request: proto::SessionRequest,
        access: &LiveAccess,
        lost: &mpsc::Sender<LostGrant>,
        running: &mut Running,
    ) -> Option<Event> {
        match request.command {
            None => Some(refused(0, Status::invalid_argument("command: missing"))),
            Some(Command::KeepAlive(_)) => None,
            Some(Command::Open(_)) => Some(refused(
                0,
                Status::invalid_argument("command: the session is already open"),
            )),
            // With `names`, a multi-lock (decision 0078), checked as the
            // Acquire RPC checks one.
            Some(Command::Acquire(command)) => {
                let build = || {
                    let mut req = command
                        .acquire
                        .ok_or_else(|| Status::invalid_argument("acquire: missing"))?;
                    if !req.takes_over.is_empty() {
                        return Err(Status::invalid_argument(
                            "takes_over: not in a session (a session's grants are its own; decision 0083)",
                        ));
                    }
                    let mut names = Vec::new();
                    if !req.names.is_empty() {
                        names = validate::multi_names(&req.name, std::mem::take(&mut req.names))
                            .map_err(invalid)?;
                        validate::multi_plain(req.mode, req.permits).map_err(invalid)?;
                        req.name = names[0].to_string();
                    }
                    let request = requests::acquire(
                        req,
                        self.session.clone(),
                        Ttl::stored(self.ttl_ms),
                        None,
                        &self.api.limits,
                    )?;
                    Ok((request, names))
                };
                self.start_acquire(command.request_id, build, access, lost, running)
            }
            // A campaign is an acquire (limit 1, fair, the value in the
            // grant), answered as one.
            Some(Command::Campaign(command)) => {
                let build = || {
                    let req = command
                        .campaign
                        .ok_or_else(|| Status::invalid_argument("campaign: missing"))?;
                    let request = requests::campaign(
                        req,
                        self.session.clone(),
                        Ttl::stored(self.ttl_ms),
                        None,
                        self.proof.clone(),
                        &self.api.limits,
                    )?;
                    Ok((request, Vec::new()))
                };
                self.start_acquire(command.request_id, build, access, lost, running)
            }
            Some(Command::Release(command)) => {
                let id = command.request_id;
                if running.tasks.len() >= MAX_RUNNING_COMMANDS {
                    return Some(refused(id, too_many_running()));
                }
                let locks = match access.charge().and_then(|()| {
                    let locks = release_locks(command)?;
                    access.access().act(&locks[0].namespace)?;
                    Ok(locks)
                }) {
                    Ok(locks) => locks,
                    Err(status) => return Some(refused(id, status)),
                };
                let engine = self.api.engine.clone();
                let (session, epoch) = (self.session.clone(), self.epoch);
                let turn = running.turn(&locks, None);
                running.tasks.spawn(async move {
                    let _done = turn.wait().await;
                    let field = if locks.len() == 1 { "name" } else { "names" };
                    let stream = engine.session_calls().stream(&session, epoch);
                    let released = stream.release(&locks, field);
                    let done = match released.await {
                        Ok(outcome) => {
                            let reply = (&outcome).to_proto();
                            if let [lock] = locks.as_slice() {
                                report::released(&*engine, lock, &session, None, outcome);
                            } else {
                                report::released_set(&outcome);
                            }
                            Done::reply(Event::Released(proto::SessionReleased {
                                request_id: id,
                                response: Some(reply),
                            }))
                        }
                        Err(err) => Done::refused(id, err),
                    };
                    (locks, done)
                });
                None
            }
        }
    }

    /// Starts an acquire (or a campaign: `build` makes either; with names,
    /// a multi-lock's) of the session; returns an immediate reply
    /// (refusals) if any.
    fn start_acquire(
        &self,
        id: u64,
        build: impl FnOnce() -> Result<(AcquireRequest, Vec<LockName>), Status>,
        access: &LiveAccess,
        lost: &mpsc::Sender<LostGrant>,
        running: &mut Running,
    ) -> Option<Event> {
        if running.tasks.len() >= MAX_RUNNING_COMMANDS {
            return Some(refused(id, too_many_running()));
        }
        let started = access.charge().and_then(|()| {
            let (request, names) = build()?;
            access.access().act(&request.lock.namespace)?;
            let waiting = self.api.waiter_slot(access.access(), &request)?;
            Ok((request, names, waiting))
        });
        let (mut request, names, waiting) = match started {
            Ok(started) => started,
            Err(status) => return Some(refused(id, status)),
        };
        let namespace_stop = running.stop_for(&request.lock.namespace);
        let stop = namespace_stop.child_token();
        request.stop = Some(stop.clone());
        request.session_epoch = Some(self.epoch);
        let engine: Arc<dyn EngineFace> = self.api.engine.clone();
        let (session, epoch, lost) = (self.session.clone(), self.epoch, lost.clone());
        // A set takes its turn on every lock of it.
        let locks: Vec<LockId> = match names.as_slice() {
            [] => vec![request.lock.clone()],
            names => (names.iter())
                .map(|name| LockId {
                    namespace: request.lock.namespace.clone(),
                    name: name.clone(),
                })
                .collect(),
        };
        let turn = running.turn(&locks, Some(stop));
        running.tasks.spawn(async move {
            let _waiting = waiting;
            let _done = turn.wait().await;
            let outcome = if names.is_empty() {
                report::acquire_waiting(&*engine, &request);
                let started = std::time::Instant::now();
                let stream = engine.session_calls().stream(&session, epoch);
                let outcome = stream.acquire(&request, &lost).await;
                outcome.map(|outcome| {
                    report::acquired(&*engine, &request, &outcome, started.elapsed());
                    outcome.to_proto()
                })
            } else {
                let set = MultiAcquireRequest {
                    req: request.clone(),
                    names,
                };
                let started = std::time::Instant::now();
                let stream = engine.session_calls().stream(&session, epoch);
                (stream.acquire_set(set, &lost).await).map(|outcome| {
                    report::acquired_set(&request, &outcome, started.elapsed());
                    outcome.to_proto()
                })
            };
            let done = match outcome {
                Ok(response) => Done::reply(Event::Acquired(proto::SessionAcquired {
                    request_id: id,
                    response: Some(response),
                })),
                Err(EngineError::Stopped) if !namespace_stop.is_cancelled() => {
                    Done::reply(refused(
                        id,
                        Status::cancelled(
                            "acquire: a later release of this lock on the stream stopped the wait",
                        ),
                    ))
                }
                Err(err) => {
                    if matches!(err, EngineError::Deadlock(_)) {
                        report::refused_as_deadlock(&request);
                    }
                    Done::refused(id, err)
                }
            };
            (locks, done)
        });
        None
    }
}

/// The commands a stream has running, and the signal that stops them at a
/// safe point: one child signal per namespace, so a namespace taken from
/// the token stops only its own waits.
///
/// Commands on one lock run in the order they came, each after the one
/// before has answered: a release sent before an acquire never undoes the
/// grant the acquire makes. A multi-lock's command (a set's acquire or
/// release) takes its place on every lock of the set: it starts once the
/// commands before it on each of them have answered. A release that finds
/// an acquire of its lock still waiting stops that wait first (the
/// acquire is answered `CANCELLED`, or with its grant when it was made
/// meanwhile, which the release then releases).
pub(super) struct Running {
    pub(super) tasks: JoinSet<(Vec<LockId>, Done)>,
    stop: CancellationToken,
    by_namespace: HashMap<String, CancellationToken>,
    by_lock: HashMap<LockId, Last>,
}

/// The last command started on a lock: done once `done` is cancelled;
/// `waiting` stops it when it is an acquire.
struct Last {
    done: CancellationToken,
    waiting: Option<CancellationToken>,
}

/// A command's place in its locks' lines: it starts once the commands
/// before it have answered, and marks itself done when dropped (answered,
/// or its task cut off).
pub(super) struct Turn {
    after: Vec<CancellationToken>,
    done: DropGuard,
}

impl Turn {
    /// Waits for the commands before this one; what it returns marks this
    /// one done when dropped.
    pub(super) async fn wait(self) -> DropGuard {
        for after in &self.after {
            after.cancelled().await;
        }
        self.done
    }
}

impl Running {
    pub(super) fn new() -> Self {
        Running {
            tasks: JoinSet::new(),
            stop: CancellationToken::new(),
            by_namespace: HashMap::new(),
            by_lock: HashMap::new(),
        }
    }

    /// The place of a new command on `locks` (`waiting`: it is an acquire,
    /// stopped by that signal). A release stops the wait of the acquire
    /// before it on any of its locks.
    fn turn(&mut self, locks: &[LockId], waiting: Option<CancellationToken>) -> Turn {
        let done = CancellationToken::new();
        let releasing = waiting.is_none();
        let mut after = Vec::new();
        for lock in locks {
            let last = Last {
                done: done.clone(),
                waiting: waiting.clone(),
            };
            if let Some(last) = self.by_lock.insert(lock.clone(), last) {
                if let (true, Some(wait)) = (releasing, &last.waiting) {
                    wait.cancel();
                }
                after.push(last.done);
            }
        }
        Turn {
            after,
            done: done.drop_guard(),
        }
    }

    /// Forgets the lines of a command's locks where it was the last one.
    pub(super) fn answered(&mut self, locks: &[LockId]) {
        for lock in locks {
            if (self.by_lock.get(lock)).is_some_and(|last| last.done.is_cancelled()) {
                self.by_lock.remove(lock);
            }
        }
    }

    /// The stop signal of a command in `namespace`.
    fn stop_for(&mut self, namespace: &str) -> CancellationToken {
        self.by_namespace
            .entry(namespace.to_owned())
            .or_insert_with(|| self.stop.child_token())
            .clone()
    }

    /// Stops the waits in namespaces the token may no longer act in.
    pub(super) fn stop_unpermitted(&mut self, access: &LiveAccess) {
        self.by_namespace.retain(|namespace, stop| {
            let permitted = access.access().act(namespace).is_ok();
            if !permitted {
                stop.cancel();
            }
            permitted
        });
    }

    /// Stops every command at a safe point (with `stop`; without, they end
    /// by themselves, as a draining replica's do) and waits a bounded time
    /// for them: a grant one of them made is then among the session's
    /// grants, handled with them. Whatever has not stopped by then is cut
    /// off.
    pub(super) async fn finish(&mut self, stop: bool) {
        if stop {
            self.stop.cancel();
        }
        let drained = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_WITHIN, drained).await.is_err() {
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
    }
}

impl Done {
    fn reply(event: Event) -> Done {
        Done {
            event,
            moved: false,
        }
    }

    fn refused(request_id: u64, err: EngineError) -> Done {
        let moved = matches!(err, EngineError::SessionMoved);
        let status = match err {
            EngineError::Stopped => {
                Status::permission_denied("the token may no longer act in this namespace")
            }
            err => errors::status(err),
        };
        Done {
            event: refused(request_id, status),
            moved,
        }
    }
}

/// The locks a release command names: `name`, or a multi-lock's `names`
/// (checked as ReleaseRequest.names: 2 to 16 distinct, `name` empty).
fn release_locks(command: proto::SessionRelease) -> Result<Vec<LockId>, Status> {
    if command.names.is_empty() {
        let lock = LockId::parse(command.namespace, command.name).map_err(invalid)?;
        return Ok(vec![lock]);
    }
    let namespace = validate::namespace(command.namespace).map_err(invalid)?;
    let names = validate::multi_set(&command.name, command.names, None).map_err(invalid)?;
    Ok((names.into_iter())
        .map(|name| LockId {
            namespace: namespace.clone(),
            name,
        })
        .collect())
}

fn too_many_running() -> Status {
    Status::resource_exhausted(format!(
        "command: this session already runs {MAX_RUNNING_COMMANDS} commands; wait for answers"
    ))
}

/// A refused command, as the session reports it (the session goes on).
pub(super) fn refused(request_id: u64, status: Status) -> Event {
    Event::Error(proto::SessionError {
        request_id,
        code: status.code() as i32,
        message: status.message().to_owned(),
    })
}
