//! Paths of the protocol model (`crates/tumbler-model`) replayed against
//! the real functions on a real Redis (issue 39, item 4; SAFETY.md,
//! "Next"): every Redis call of a path is the `FCALL` of the function it
//! is named after, and its status must be the one the model expects, the
//! ids a refresh finds gone too, and the real fencing tokens must rise as
//! the model's do. Time: a model tick is `TICK_MS` of real time and each
//! tick's calls run in its middle; leases and request TTLs are half a tick
//! short of their ticks, so an expiry falls between ticks, never within
//! one tick's calls. First increment: configurations without sessions or
//! data loss; read/write locks (decision 74) with a downgrade and
//! `prefer_readers`; weighted permits (decision 75), fair and barging; an
//! election (decision 69): campaign, proclaim, resign; multi-locks
//! (decision 76) in one call and on the Cluster path (one call per slot
//! group with a reservation, the extends, the rollback), whose functions
//! are the same on a standalone Redis: the path's order is the model's;
//! a held set's release and extend, one `release_many` / `extend_many`
//! per slot group (decision 79).

use crate::common::{redis_conn, start_redis};
use std::collections::HashMap;
use std::time::Duration;
use tumbler_engine::scripts::{LockScript, Scripts};
use tumbler_model::model::{Action, Call, State};
use tumbler_model::redis::{Id, Reply};
use tumbler_model::set::locks_of;
use tumbler_model::trace::{self, Step};
use tumbler_model::{Config, Faults, Mode};

/// An election's grant metadata in the replay: its value and the digest of
/// its leader's secret, which Proclaim and Resign send (decision 0082).
const ELECTION_METADATA: &str = r#"{"":"v","\u0001":"proof"}"#;
const ELECTION_PROOF: &str = "proof";

const TICK_MS: u64 = 120;
/// Not a status: what `seen` records for a grant handed over.
const HANDED_OVER: i64 = 100;
const SHARD: &str = "tumbler:{replay:0}";
/// The model's locks' names (a multi-lock asks both; one shard, so one
/// fencing counter, as in the model).
const NAMES: [&str; 2] = ["m", "m2"];

/// The functions' status codes (lua/shared/numbers.lua).
fn status(reply: &Reply) -> i64 {
    match reply {
        Reply::Busy => 0,
        Reply::Acquired { .. }
        | Reply::Ok { .. }
        | Reply::Downgraded { .. }
        | Reply::AcquiredMany { .. } => 1,
        Reply::Held { .. } | Reply::HeldMany { .. } => 2,
        // release_many: OK when every lock of the call was released.
        Reply::ReleasedMany { locks, released } if locks == released => 1,
        Reply::ReleasedMany { .. } => 8,
        Reply::Queued { .. } => 3,
        Reply::LimitMismatch => 6,
        Reply::Late => 7,
        Reply::NotHeld => 8,
        Reply::Moved => 9,
        Reply::ModeMismatch => 10,
        Reply::UpgradeRefused => 11,
    }
}

/// The keys of the model's lock `lock` (0 or 1).
fn lock_keys(lock: u8) -> Vec<String> {
    keys_of(SHARD, NAMES[usize::from(lock)])
}

/// The keys a function of lock `name` in `shard` declares (lock, queue,
/// fence).
pub(crate) fn keys_of(shard: &str, name: &str) -> Vec<String> {
    ["l", "q"]
        .iter()
        .map(|k| format!("{shard}:{k}:{name}"))
        .chain([format!("{shard}:fence")])
        .collect()
}

/// A Redis with the functions loaded, a connection to it and the
/// functions' names.
pub(crate) async fn redis_with_functions() -> (
    tumbler::dev::RedisServer,
    redis::aio::MultiplexedConnection,
    Scripts,
) {
    let redis = start_redis();
    let mut conn = redis_conn(&redis.url()).await;
    let scripts = Scripts::compile();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&*scripts.acquire.library)
        .query_async(&mut conn)
        .await
        .unwrap();
    (redis, conn, scripts)
}

/// The real token of a grant record (its third field).
fn record_token(record: &redis::Value) -> String {
    let record: String = redis::from_redis_value(record.clone()).unwrap();
    record.split('|').nth(2).unwrap().to_owned()
}

fn holder(c: Id) -> String {
    format!("client-{c}")
}

/// Request `req` of client `c` sent through replica `via`, named as a replica
/// names it; release.lua's `alive` for replica `r` (decision 0090).
fn request(via: u8, c: Id, req: u8) -> String {
    format!("r{via}.c{c}x{req}")
}
fn alive_arg(r: u8) -> String {
    format!("r{r}.")
}

/// Replays one path; panics naming the step where Redis and the model part.
struct Replay {
    conn: redis::aio::MultiplexedConnection,
    scripts: Scripts,
    cfg: Config,
    /// Redis ms at which model tick 1 begins.
    start_ms: u64,
    /// Model token -> the real one.
    tokens: HashMap<u32, String>,
    /// The statuses compared, so a run shows it compared something.
    seen: Vec<i64>,
    /// The replica each request (client, req) was sent through.
    vias: HashMap<(Id, u8), u8>,
}

impl Replay {
    async fn redis_ms(&mut self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        secs * 1000 + micros / 1000
    }

    /// Redis ms of the end of model tick `tick` (0: no bound).
    fn tick_end(&self, tick: u8) -> String {
        if tick == 0 {
            return "0".into();
        }
        (self.start_ms + u64::from(tick) * TICK_MS).to_string()
    }

    fn ticks_ms(&self, ticks: u8) -> String {
        (u64::from(ticks) * TICK_MS - TICK_MS / 2).to_string()
    }

    async fn wait_for_tick(&mut self, tick: u8) {
        let at = self.start_ms + (u64::from(tick) - 1) * TICK_MS + TICK_MS / 2;
        let now = self.redis_ms().await;
        assert!(now < at + TICK_MS / 3, "the replay fell behind its ticks");
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now))).await;
    }

    async fn fcall(
        &mut self,
        function: &LockScript,
        keys: &[String],
        args: &[String],
    ) -> redis::Value {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&function.function)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd.query_async(&mut self.conn).await.unwrap()
    }

    fn real_token(&self, model: u32) -> String {
        if model == 0 {
            return String::new();
        }
        self.tokens
            .get(&model)
            .cloned()
            .expect("a token the replay saw granted")
    }

    /// The request id of (client, req), named by its replica.
    fn request_id(&self, c: Id, req: u8) -> String {
        request(self.vias.get(&(c, req)).copied().unwrap_or(0), c, req)
    }

    async fn call(
        &mut self,
        c: Id,
        call: Call,
        mode: Option<Mode>,
        alive: Option<u8>,
    ) -> redis::Value {
        let cfg = self.cfg.clone();
        if cfg.is_set(c) {
            return self.set_call(c, call).await;
        }
        let keys = lock_keys(cfg.lock_of(c));
        // A read/write request's flag comes first ('r', 'w': both fair;
        // 'R': a reader that prefers readers); then 'p<k>' for a request of
        // k > 1 permits.
        let flags = |fair: bool, permits: u8| {
            let mut flags = match mode {
                Some(Mode::Read) if fair => "r".to_string(),
                Some(Mode::Read) => "R".to_string(),
                Some(Mode::Write) => "w".to_string(),
                None if fair => "f".to_string(),
                None => String::new(),
            };
            if permits > 1 {
                flags.push_str(&format!("p{permits}"));
            }
            flags
        };
        match call {
            Call::Acquire {
                req,
                answer_by,
                via,
                ..
            } => {
                self.vias.insert((c, req), via);
                let a = cfg.acquire_args(c, req, answer_by, 0);
                let mut args = vec![
                    holder(c),
                    self.ticks_ms(a.ttl),
                    self.tick_end(answer_by),
                    a.limit.to_string(),
                    "default".into(),
                    // A campaign's grant carries its value and the digest
                    // of its leader's secret (decision 0082).
                    if cfg.election {
                        ELECTION_METADATA.into()
                    } else {
                        String::new()
                    },
                    flags(a.fair, a.permits),
                    a.priority.to_string(),
                    "0".into(),
                ];
                if let Some(queue_ttl) = a.queue_ttl {
                    args.extend([
                        (u64::from(cfg.wait) * TICK_MS).to_string(),
                        self.ticks_ms(queue_ttl),
                        "1000".into(),
                        // The request, named (finding 6), and with the
                        // hand-over its answer-by time (decision 68);
                        // without, the model wakes its waiters.
                        self.request_id(c, req),
                        if cfg.hand_over {
                            self.tick_end(answer_by)
                        } else {
                            String::new()
                        },
                    ]);
                }
                let f = self.scripts.acquire.clone();
                self.fcall(&f, &keys, &args).await
            }
            Call::Downgrade { .. } => {
                // The writer asks READ for its grant, trying once.
                let args = vec![
                    holder(c),
                    self.ticks_ms(cfg.ttl),
                    "0".into(),
                    cfg.limit.to_string(),
                    "default".into(),
                    String::new(),
                    flags(true, 1),
                ];
                let f = self.scripts.acquire.clone();
                self.fcall(&f, &keys, &args).await
            }
            Call::Release { token, .. } => {
                let mut args = vec![holder(c), self.real_token(token), "0".into()];
                if cfg.election || alive.is_some() {
                    // Resign: the release proved by the secret's digest.
                    let proof = if cfg.election { ELECTION_PROOF } else { "" };
                    args.extend([String::new(), String::new(), proof.into()]);
                }
                args.extend(alive.map(alive_arg));
                let f = self.scripts.release.clone();
                self.fcall(&f, &keys, &args).await
            }
            Call::Extend { token, .. } => {
                let args = vec![
                    holder(c),
                    self.real_token(token),
                    self.ticks_ms(cfg.ttl),
                    "0".into(),
                    "0".into(),
                ];
                let f = self.scripts.extend.clone();
                self.fcall(&f, &keys, &args).await
            }
            Call::Proclaim { token } => {
                let args = vec![
                    holder(c),
                    self.real_token(token),
                    "leader".into(),
                    "0".into(),
                    ELECTION_PROOF.into(),
                ];
                let f = self.scripts.proclaim.clone();
                self.fcall(&f, &keys, &args).await
            }
            Call::Dequeue { req } => {
                let f = self.scripts.dequeue.clone();
                let args = [holder(c), "0".into(), self.request_id(c, req)];
                self.fcall(&f, &keys, &args).await
            }
            // A replica gives back a grant handed to its request, which is
            // gone: pinned to its token and to that request.
            Call::GiveBack { req, token } => {
                let mut args = vec![
                    holder(c),
                    self.real_token(token),
                    "0".into(),
                    String::new(),
                    self.request_id(c, req),
                ];
                if let Some(r) = alive {
                    args.extend([String::new(), alive_arg(r)]);
                }
                let f = self.scripts.release.clone();
                self.fcall(&f, &keys, &args).await
            }
            other => panic!("not replayed yet: {other:?}"),
        }
    }

    /// A multi-lock's call (decision 76): acquire_many with the keys of
    /// its group's locks (lock after lock), or one lock's extend or
    /// release (pinned to the part's token), or its wake-up places'
    /// dequeue on each lock.
    async fn set_call(&mut self, c: Id, call: Call) -> redis::Value {
        let cfg = self.cfg.clone();
        match call {
            Call::AcquireMany {
                answer_by, group, ..
            } => {
                let a = cfg.many_args(c, answer_by, group);
                let keys: Vec<String> = (0..2)
                    .filter(|i| group & (1 << i) != 0)
                    .flat_map(lock_keys)
                    .collect();
                let args = vec![
                    holder(c),
                    self.ticks_ms(cfg.ttl),
                    self.tick_end(answer_by),
                    a.limit.to_string(),
                    "default".into(),
                    String::new(),
                    String::new(),
                    "3".into(),
                    "0".into(),
                    self.ticks_ms(a.lease),
                    a.queue_ttl.map_or(String::new(), |t| self.ticks_ms(t)),
                    "1000".into(),
                ];
                let f = self.scripts.acquire_many.clone();
                self.fcall(&f, &keys, &args).await
            }
            // The Cluster path's extends and its rollback: one lock's
            // call, pinned to the part's token.
            Call::ExtendPart { lock, .. } => {
                let args = vec![
                    holder(c),
                    self.real_token(cfg.part_token(&call)),
                    self.ticks_ms(cfg.ttl),
                    "0".into(),
                    "0".into(),
                ];
                let f = self.scripts.extend.clone();
                self.fcall(&f, &lock_keys(lock), &args).await
            }
            Call::RollBack { lock, .. } => {
                let token = self.real_token(cfg.part_token(&call));
                let args = vec![holder(c), token, "0".into()];
                let f = self.scripts.release.clone();
                self.fcall(&f, &lock_keys(lock), &args).await
            }
            // A held set's release and extend (decision 79): one call per
            // slot group, its locks' keys lock after lock, each pinned to
            // its token ('' for a caller that sends no `fencing_tokens`).
            Call::ReleaseSet { groups, .. } | Call::ExtendSet { groups, .. } => {
                let group = cfg.group_of(c, groups);
                let locks: Vec<u8> = locks_of(group).collect();
                let keys: Vec<String> = locks.iter().flat_map(|&l| lock_keys(l)).collect();
                let mut args = vec![holder(c)];
                let f = if let Call::ExtendSet { .. } = call {
                    args.extend([self.ticks_ms(cfg.ttl), "0".into()]);
                    self.scripts.extend_many.clone()
                } else {
                    self.scripts.release_many.clone()
                };
                args.extend(["0".into(), lock_keys(0).len().to_string()]);
                let tokens = cfg.set_tokens(&call);
                for &l in &locks {
                    args.push(self.real_token(tokens[usize::from(l)]));
                }
                self.fcall(&f, &keys, &args).await
            }
            Call::Dequeue { .. } => {
                let f = self.scripts.dequeue.clone();
                let args = [holder(c), "0".into(), String::new()];
                self.fcall(&f, &lock_keys(0), &args).await;
                self.fcall(&f, &lock_keys(1), &args).await
            }
            other => panic!("not a multi-lock's call: {other:?}"),
        }
    }

    /// The real token of a new grant: above every one seen, and named
    /// after the model's.
    fn minted(&mut self, model: u32, real: String) {
        if self.tokens.contains_key(&model) {
            return;
        }
        if let Some(last) = (self.tokens.values()).max_by_key(|t| t.parse::<u64>().unwrap()) {
            assert!(real.parse::<u64>().unwrap() > last.parse::<u64>().unwrap());
        }
        self.tokens.insert(model, real);
    }

    async fn run(&mut self, path: &[(State, Option<Action>)]) {
        let steps = trace::trace(&self.cfg, path);
        let mut tick = 1;
        self.wait_for_tick(tick).await;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Tick => {
                    tick += 1;
                    self.wait_for_tick(tick).await;
                }
                Step::Function {
                    client,
                    call: Some(call),
                    mode,
                    reply: Some(expected),
                    alive,
                    ..
                } => {
                    let reply = self.call(*client, *call, *mode, *alive).await;
                    let items: Vec<redis::Value> = redis::from_redis_value(reply).unwrap();
                    let code: i64 = redis::from_redis_value(items[0].clone()).unwrap();
                    assert_eq!(code, status(expected), "step {i} of {steps:#?}");
                    self.seen.push(code);
                    if let Reply::Acquired { token, .. } = expected {
                        self.minted(*token, record_token(&items[6]));
                    }
                    // release_many: per lock of the call its status (and
                    // its released grant), after 3 fixed items.
                    if let Reply::ReleasedMany { locks, released } = expected {
                        for (k, lock) in locks_of(*locks).enumerate() {
                            let code: i64 =
                                redis::from_redis_value(items[3 + 2 * k].clone()).unwrap();
                            let want = if released & (1 << lock) != 0 { 1 } else { 8 };
                            assert_eq!(code, want, "lock {lock}, step {i} of {steps:#?}");
                        }
                    }
                    // acquire_many: per lock of the call, its holders and
                    // its grant record, after 5 fixed items.
                    if let Reply::AcquiredMany { tokens, .. } = expected {
                        let ours = tokens.iter().filter(|&&t| t > 0);
                        for (k, &token) in ours.enumerate() {
                            self.minted(token, record_token(&items[6 + 2 * k]));
                        }
                    }
                }
                Step::Function {
                    client,
                    call: Some(call @ Call::Dequeue { .. }),
                    ..
                } => {
                    self.call(*client, *call, None, None).await;
                }
                Step::Refresh {
                    lock,
                    waiters,
                    lost,
                    ..
                } => {
                    let mut args = vec!["0".to_string()];
                    for &w in waiters {
                        args.extend([holder(w), self.ticks_ms(self.cfg.queue_ttl)]);
                    }
                    let f = self.scripts.refresh.clone();
                    let reply = self.fcall(&f, &lock_keys(*lock), &args).await;
                    let items: Vec<redis::Value> = redis::from_redis_value(reply).unwrap();
                    let gone: Vec<String> = (items[1..].iter())
                        .map(|v| redis::from_redis_value::<String>(v.clone()).unwrap())
                        .take_while(|s| !s.is_empty())
                        .collect();
                    let want: Vec<String> = lost.iter().map(|&c| holder(c)).collect();
                    assert_eq!(gone, want, "step {i} of {steps:#?}");
                }
                Step::Reap => {
                    let args = vec![String::new(), "0".into(), "0".into(), NAMES[0].into()];
                    let f = self.scripts.reap.clone();
                    self.fcall(&f, &[format!("{SHARD}:fence")], &args).await;
                }
                // The step before handed a grant over: the real lock holds
                // it, with a new token above every one before.
                Step::Handed { client, token } => {
                    let name = NAMES[usize::from(self.cfg.lock_of(*client))];
                    let record: redis::Value = redis::cmd("HGET")
                        .arg(format!("{SHARD}:l:{name}"))
                        .arg(format!("h:{}", holder(*client)))
                        .query_async(&mut self.conn)
                        .await
                        .unwrap();
                    assert_ne!(record, redis::Value::Nil, "step {i} of {steps:#?}");
                    self.minted(*token, record_token(&record));
                    self.seen.push(HANDED_OVER);
                }
                other => panic!("not replayed yet: {other:?}"),
            }
        }
    }
}

impl Replay {
    /// Every live grant of the model's last state of a path is in the
    /// real lock, with the real token of the model's (the calls of the
    /// path left it, as the model says they do).
    async fn grants_as_model(&mut self, last: &State) {
        for lock in 0..2u8 {
            let mut data = last.redis.clone();
            data.select(lock);
            let grants = data.lock.iter().flat_map(|l| l.holders.clone());
            for g in grants.filter(|g| g.expires > last.now) {
                let key = format!("{SHARD}:l:{}", NAMES[usize::from(lock)]);
                let record: redis::Value = redis::cmd("HGET")
                    .arg(&key)
                    .arg(format!("h:{}", holder(g.holder)))
                    .query_async(&mut self.conn)
                    .await
                    .unwrap();
                assert_ne!(
                    record,
                    redis::Value::Nil,
                    "no grant of {} on {key}",
                    g.holder
                );
                assert_eq!(record_token(&record), self.real_token(g.token), "{key}");
            }
        }
    }
}

/// Replays `path`; the statuses compared.
async fn replay(cfg: &Config, path: &[(State, Option<Action>)]) -> Vec<i64> {
    replay_with(cfg, path, false).await
}

/// Replays `path`, then compares the live grants of its last state with
/// the real lock's; the statuses compared.
async fn replay_to_grants(cfg: &Config, path: &[(State, Option<Action>)]) -> Vec<i64> {
    replay_with(cfg, path, true).await
}

async fn replay_with(cfg: &Config, path: &[(State, Option<Action>)], grants: bool) -> Vec<i64> {
    let (_redis, conn, scripts) = redis_with_functions().await;
    let mut replay = Replay {
        conn,
        scripts,
        cfg: cfg.clone(),
        start_ms: 0,
        tokens: HashMap::new(),
        seen: Vec::new(),
        vias: HashMap::new(),
    };
    replay.start_ms = replay.redis_ms().await + 20;
    replay.run(path).await;
    if let (true, Some((last, _))) = (grants, path.last()) {
        replay.grants_as_model(last).await;
    }
    replay.seen
}

/// A mutex, two requests per client, extends and the reaper; a crash and
/// lost or duplicated wake-ups (whose orphaned calls still run).
fn configs() -> Vec<Config> {
    let mutex = Config::mutex();
    let faults = Faults {
        crash: 1,
        lose_wake: 1,
        duplicate_wake: 1,
        ..Faults::default()
    };
    let crash = Config {
        faults,
        ..Config::small(1)
    };
    vec![mutex, crash, Config::small(2)]
}

/// One replay at a time: a replay keeps real time (a call a tick late
/// meets an expiry the model did not), and the checker's exploration in
/// another test beside it, on 2 cores, made one fall behind.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn random_model_paths_get_the_replies_the_model_expects() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut seen = Vec::new();
    for (n, cfg) in configs().iter().enumerate() {
        for seed in 0..4 {
            let path = trace::random_walk(cfg, seed + 100 * n as u64, 200);
            seen.extend(replay(cfg, &path).await);
        }
    }
    // Grants and queued waiters were compared, many times over.
    for code in [1, 3] {
        assert!(seen.contains(&code), "no status {code} among {seen:?}");
    }
    assert!(seen.len() > 50, "only {} calls compared", seen.len());
}

mod paths;
