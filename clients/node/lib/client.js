'use strict';
// The tumbler Client: the LockService stub loaded from the proto bundled in
// the package, every call retried on UNAVAILABLE with jittered back-off
// until its deadline (same holder id, so a retried Acquire can never take a
// second permit), AbortSignal support, withLock (acquire, watchdog,
// abort-on-loss, release), and the same for multi-locks (acquireAll,
// withLockAll: several locks, all or none).
const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const errors = require('./errors');
const { ConnectTransport, splitTarget } = require('./connect');
const { Lock, LockSet } = require('./lock');
const { Leadership, Observer } = require('./election');

// Refuses an option this call does not know (a misspelt `ttlMS` would
// otherwise give the lock the default lease), naming it and the one meant
// when only its case differs.
function knownOptions(where, options, known) {
  for (const key of Object.keys(options || {})) {
    if (known.includes(key)) continue;
    const meant = known.find((k) => k.toLowerCase() === key.toLowerCase());
    throw new TypeError(`${where}: unknown option ${JSON.stringify(key)}` +
      (meant ? ` (did you mean ${JSON.stringify(meant)}?)` : `; known: ${known.join(', ')}`));
  }
}

const ACQUIRE_OPTIONS = ['holder', 'waitMs', 'timeoutMs', 'signal', 'limit', 'ttlMs', 'kind', 'metadata', 'priority',
  'queueTtlMs', 'fair', 'mode', 'preferReaders', 'permits'];
const ACQUIRE_ALL_OPTIONS = ['holder', 'waitMs', 'timeoutMs', 'signal', 'limit', 'ttlMs', 'kind', 'metadata',
  'queueTtlMs'];
const CAMPAIGN_OPTIONS = ['value', 'candidate', 'waitMs', 'timeoutMs', 'signal', 'ttlMs', 'queueTtlMs', 'kind',
  'onLost'];
const CLIENT_OPTIONS = ['namespace', 'credentials', 'token', 'protoDir', 'timeoutMs', 'retry', 'channelOptions',
  'transport'];
const TRANSPORTS = ['auto', 'connect', 'grpc'];

// The proto ships inside the package (proto/, copied by `npm pack`); in a
// checkout of the repository it is ../../proto.
const BUNDLED_PROTO = path.join(__dirname, '..', 'proto');
const PROTO_DIR = fs.existsSync(path.join(BUNDLED_PROTO, 'tumbler/v1/lock.proto'))
  ? BUNDLED_PROTO : path.join(__dirname, '..', '..', '..', 'proto');
// Extra time on the RPC deadline beyond waitMs, so the server's own TIMEOUT
// reply (sent just before the deadline) wins over DEADLINE_EXCEEDED.
const DEADLINE_SLACK_MS = 5000;
// The lease withLock asks for when the caller names none; the watchdog
// renews it every third, so it only bounds how long a crashed holder keeps it.
const DEFAULT_HELPER_TTL_MS = 15000;

function loadProto(protoDir = PROTO_DIR) {
  const def = protoLoader.loadSync('tumbler/v1/lock.proto', {
    includeDirs: [protoDir], longs: String, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(def).tumbler.v1;
}

// Full-jitter back-off: initialMs doubling up to maxMs.
function makeRetry({ initialMs = 50, maxMs = 1000, multiplier = 2 } = {}) {
  return { delay: (attempt) => Math.random() * Math.min(maxMs, initialMs * multiplier ** attempt) };
}

function abortError(signal) {
  if (signal.reason instanceof Error) return signal.reason;
  const err = new Error('The operation was aborted');
  err.name = 'AbortError';
  return err;
}

// Resolves after ms, or rejects at once when the signal aborts.
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const onAbort = () => { clearTimeout(t); reject(abortError(signal)); };
    const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(); }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

// A signal that aborts when either of two does (with its reason); detach() drops the listeners.
function followBoth(a, b) {
  if (!b) return { signal: a, detach: () => {} };
  const controller = new AbortController();
  const forward = (from) => () => controller.abort(from.reason);
  const onA = forward(a);
  const onB = forward(b);
  if (a.aborted || b.aborted) controller.abort(a.aborted ? a.reason : b.reason);
  a.addEventListener('abort', onA, { once: true });
  b.addEventListener('abort', onB, { once: true });
  return { signal: controller.signal, detach: () => { a.removeEventListener('abort', onA); b.removeEventListener('abort', onB); } };
}

// 'read' / 'write' (or the enum's own name) -> the LockMode enum name; undefined: a plain lock.
const MODES = { read: 'LOCK_MODE_READ', write: 'LOCK_MODE_WRITE' };
function modeOf(mode) {
  if (mode === undefined || mode === null) return 'LOCK_MODE_UNSPECIFIED';
  const name = MODES[mode] || (Object.values(MODES).includes(mode) ? mode : undefined);
  if (!name) throw new errors.InvalidArgumentError(`mode: ${JSON.stringify(mode)} is not 'read' or 'write'`, { details: `mode: ${JSON.stringify(mode)} is not 'read' or 'write'` });
  return name;
}

const newHolder = () => `node-${crypto.randomUUID()}`;

// A call that waits in the server: its deadline (default waitMs + 5 s) and
// request() = build(what is left of the wait, in ms) for each try; `sent` is
// when the last try was sent (performance.now()).
function waiting(waitMs, timeoutMs, build) {
  const started = Date.now();
  const tries = { deadline: started + (timeoutMs ?? waitMs + DEADLINE_SLACK_MS), sent: performance.now() };
  tries.request = () => {
    tries.sent = performance.now();
    const wait = Math.max(0, Math.min(waitMs - (Date.now() - started), tries.deadline - Date.now() - 50));
    return build(Math.floor(wait));
  };
  return tries;
}

// fn(lock, signal) with the grant of acquire(options) kept alive (the
// helper's lease unless options say another); released when fn ends, or
// LockLostError (its cause fn's error, if any) when the grant was lost.
async function scoped(acquire, options, fn) {
  if (typeof options === 'function') { fn = options; options = {}; }
  const { onLost, ttlMs = DEFAULT_HELPER_TTL_MS, ...acquireOptions } = options || {};
  const lock = await acquire({ ...acquireOptions, ttlMs });
  lock.keepAlive({ onLost });
  const body = followBoth(lock.signal, acquireOptions.signal);
  let result;
  try {
    result = await fn(lock, body.signal);
  } catch (err) {
    lock.stopKeepAlive();
    if (lock.lost) throw Object.assign(lock.lostError(), { cause: err });
    await lock.release().catch(() => {});
    throw err;
  } finally {
    body.detach();
  }
  lock.stopKeepAlive();
  if (lock.lost) throw lock.lostError();
  await lock.release();
  return result;
}

class Client {
  // new Client('127.0.0.1:50051', { namespace, credentials, token, timeoutMs, retry, protoDir, transport })
  //
  // transport 'auto' (the default): the unary calls go over Connect (lib/connect.js) when the target is a
  // plain host:port and the channel is plaintext (no credentials, or insecure ones), else over gRPC;
  // 'connect' insists on Connect, 'grpc' keeps every call on grpc-js. Streams are always gRPC.
  constructor(target = '127.0.0.1:50051', options = {}) {
    knownOptions('new Client', options, CLIENT_OPTIONS);
    const { namespace = '', credentials, token, protoDir, timeoutMs = 10000, retry, channelOptions,
      transport = 'auto' } = options;
    if (!TRANSPORTS.includes(transport)) {
      throw new TypeError(`new Client: transport ${JSON.stringify(transport)} is not one of ${TRANSPORTS.join(', ')}`);
    }
    const where = splitTarget(target);
    const secure = Boolean(credentials && (typeof credentials._isSecure !== 'function' || credentials._isSecure()));
    if (transport === 'connect' && (!where || secure)) {
      throw new TypeError(`new Client: transport 'connect' needs a plaintext host:port target (${JSON.stringify(target)}`
        + `${secure ? ' with TLS credentials' : ''}); use transport 'grpc'`);
    }
    const v1 = loadProto(protoDir);
    this.stub = new v1.LockService(target, credentials || grpc.credentials.createInsecure(), channelOptions);
    this.connect = transport !== 'grpc' && where && !secure
      ? new ConnectTransport(where.host, where.port, v1.LockService.service,
        token ? { authorization: `Bearer ${token}` } : {})
      : null;
    this.transport = this.connect ? 'connect' : 'grpc';
    this.namespace = namespace;
    this.timeoutMs = timeoutMs; // deadline of the calls that do not wait, retries included
    this.retry = makeRetry(retry);
    this.metadata = new grpc.Metadata();
    if (token) this.metadata.set('authorization', `Bearer ${token}`);
  }

  // One attempt; the RPC is cancelled when `signal` aborts.
  callOnce(method, request, timeoutMs, signal) {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortError(signal));
      const onAbort = () => { call.cancel(); reject(abortError(signal)); };
      const done = signal
        ? (err, resp) => {
          signal.removeEventListener('abort', onAbort);
          if (err) reject(err); else resolve(resp);
        }
        : (err, resp) => { if (err) reject(err); else resolve(resp); };
      const call = this.connect !== null && this.connect.has(method)
        ? this.connect.unary(method, request, Math.max(1, timeoutMs), done)
        : this.stub[method](request, this.metadata, { deadline: Date.now() + Math.max(1, timeoutMs) }, done);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  // One RPC, retried on UNAVAILABLE until the deadline (ms since the epoch).
  async call(method, makeRequest, { deadline = Date.now() + this.timeoutMs, signal } = {}) {
    for (let attempt = 0; ; attempt += 1) {
      try {
        return await this.callOnce(method, makeRequest(), deadline - Date.now(), signal);
      } catch (err) {
        if (signal?.aborted) throw abortError(signal);
        const pause = Math.min(this.retry.delay(attempt), deadline - Date.now() - 1);
        if (!errors.isRetryable(err) || pause <= 0) throw errors.fromGrpcError(err);
        await sleep(pause, signal);
      }
    }
  }

  // Take a permit (`permits`: that many of `limit` at once), waiting up to
  // waitMs in the server (0: try once).
  // timeoutMs bounds the whole call, retries included (default waitMs + 5 s);
  // `signal` cancels the wait (the server drops the request at once).
  // Resolves to a Lock (no watchdog: see withLock / lock.keepAlive());
  // rejects with LockBusyError, LockTimeoutError, InvalidArgumentError,
  // PermissionDeniedError, UnavailableError, or the signal's reason.
  async acquire(name, options = {}) {
    knownOptions('acquire', options, ACQUIRE_OPTIONS);
    const { holder, waitMs = 0, timeoutMs, signal, limit, ttlMs, kind = '', metadata = {},
      priority = 0, queueTtlMs, fair, mode, preferReaders = false, permits } = options;
    const lockMode = modeOf(mode);
    const { resp, leaseEnd } = await this.sendAcquire(name, { holder, waitMs, timeoutMs, signal }, (who, wait) => {
      const req = { namespace: this.namespace, name, holder: who, kind, metadata, waitMs: wait, priority };
      if (limit !== undefined) req.limit = limit;
      if (ttlMs !== undefined) req.ttlMs = ttlMs;
      if (queueTtlMs !== undefined) req.queueTtlMs = queueTtlMs;
      if (fair !== undefined) req.fair = fair;
      if (lockMode !== 'LOCK_MODE_UNSPECIFIED') req.mode = lockMode;
      if (preferReaders) req.preferReaders = true;
      if (permits !== undefined) req.permits = permits;
      return req;
    });
    const lock = new Lock(this, name, resp.grant, leaseEnd);
    lock.limit = limit; // a downgrade asks the same limit
    return lock;
  }

  // Take every lock of `names` (2 to 16 distinct names of the namespace) or
  // none, for one holder with one lease and one wait (each lock grants one
  // permit under `limit`, default 1). While it waits it holds nothing, so
  // callers asking overlapping sets in any order never deadlock. Resolves to
  // a LockSet (no watchdog: see withLockAll / set.keepAlive()); rejects as
  // acquire does (LockBusyError / LockTimeoutError whose lockName is the
  // names joined by commas, DeadlockError, InvalidArgumentError `names: …`).
  async acquireAll(names, options = {}) {
    knownOptions('acquireAll', options, ACQUIRE_ALL_OPTIONS);
    const { holder, waitMs = 0, timeoutMs, signal, limit, ttlMs, kind = '', metadata = {}, queueTtlMs } = options;
    if (typeof names === 'string') throw new TypeError(`names: an array of lock names, not ${JSON.stringify(names)}`);
    const set = [...names];
    const sending = { holder, waitMs, timeoutMs, signal };
    const { resp, leaseEnd } = await this.sendAcquire(set.join(','), sending, (who, wait) => {
      const req = { namespace: this.namespace, names: set, holder: who, kind, metadata, waitMs: wait };
      if (limit !== undefined) req.limit = limit;
      if (ttlMs !== undefined) req.ttlMs = ttlMs;
      if (queueTtlMs !== undefined) req.queueTtlMs = queueTtlMs;
      return req;
    });
    return new LockSet(this, set, resp, leaseEnd);
  }

  // Sends build(holder, waitMs left) as an Acquire, retried on UNAVAILABLE
  // with the same holder (made here when none is given) until the deadline
  // (default waitMs + 5 s): { resp, leaseEnd } of a grant, or the rejection.
  async sendAcquire(label, { holder, waitMs, timeoutMs, signal }, build) {
    const who = holder || newHolder();
    const tries = waiting(waitMs, timeoutMs, (wait) => build(who, wait));
    let resp;
    try {
      resp = await this.call('Acquire', tries.request, { deadline: tries.deadline, signal });
    } catch (err) {
      if (err.code === grpc.status.DEADLINE_EXCEEDED) throw new errors.LockTimeoutError(label, null, `${label}: not acquired before the deadline`);
      throw err;
    }
    if (resp.status === 'ACQUIRE_STATUS_NOT_ACQUIRED') {
      if (resp.reason === 'NOT_ACQUIRED_REASON_BUSY') throw new errors.LockBusyError(label, resp);
      throw new errors.LockTimeoutError(label, resp);
    }
    return { resp, leaseEnd: Math.max(tries.sent, performance.now() - 50) + Number(resp.grant.ttlMs) };
  }

  // Run fn(lock, signal) while holding the lock. A watchdog extends the lease
  // every ttlMs/3 (default lease 15 s); if the grant is lost, `signal` aborts
  // at once (its reason a LockLostError), onLost is called, and withLock
  // rejects with LockLostError when fn ends. Otherwise the grant is released
  // however fn ends. options.signal cancels a waiting acquire, and aborts
  // the body's signal too if it fires while fn runs.
  withLock(name, options, fn) { return scoped((o) => this.acquire(name, o), options, fn); }

  // Run fn(set, signal) while holding every lock of `names` (see
  // acquireAll): as withLock, one watchdog renews the whole set, `signal`
  // aborts when any lock of it is lost, and the set is released when fn ends.
  withLockAll(names, options, fn) { return scoped((o) => this.acquireAll(names, o), options, fn); }

  // Leader election: wait up to waitMs in the election's queue (0: try
  // once). Resolves to a Leadership whose watchdog extends the lease every
  // ttlMs/3 (default 15 s), or null when not elected within the wait.
  // `candidate` defaults to an id made here before the first try, so a
  // retried Campaign is the same candidacy (same term if it already leads).
  async campaign(name, options = {}) {
    knownOptions('campaign', options, CAMPAIGN_OPTIONS);
    const { value = '', candidate, waitMs = 0, timeoutMs, signal, ttlMs = DEFAULT_HELPER_TTL_MS,
      queueTtlMs, kind = '', onLost } = options;
    const who = candidate || newHolder();
    const tries = waiting(waitMs, timeoutMs, (wait) => {
      const req = { namespace: this.namespace, name, candidate: who, value, ttlMs, waitMs: wait, kind };
      if (queueTtlMs !== undefined) req.queueTtlMs = queueTtlMs;
      return req;
    });
    let resp;
    try {
      resp = await this.call('Campaign', tries.request, { deadline: tries.deadline, signal });
    } catch (err) {
      if (err.code === grpc.status.DEADLINE_EXCEEDED) return null;
      throw err;
    }
    if (!resp.elected) return null;
    const leadership = new Leadership(this, name, resp.leader,
      Math.max(tries.sent, performance.now() - 50) + Number(resp.leader.ttlMs), resp.secret);
    return leadership.keepAlive({ onLost });
  }

  // The election's current Leadership message, or null when nobody leads.
  async leader(name) {
    const resp = await this.call('Leader', () => ({ namespace: this.namespace, name }));
    return resp.leader || null;
  }

  // The election's leader changes: an async iterable of LeaderChange (first:
  // the current leader); observer.cancel() or `signal` ends it.
  observe(name, { signal } = {}) {
    return new Observer(this.stub.Observe({ namespace: this.namespace, name }, this.metadata), signal);
  }

  inspect(name) { return this.call('Inspect', () => ({ namespace: this.namespace, name })); }

  queue(name, maxEntries = 0) { return this.call('Queue', () => ({ namespace: this.namespace, name, maxEntries })); }

  close() {
    if (this.connect) this.connect.close();
    this.stub.close();
  }
}

module.exports = { Client, loadProto, DEFAULT_HELPER_TTL_MS, PROTO_DIR };
