'use strict';
// A thin helper over tumbler's gRPC service. The stubs are built at run time
// from proto/tumbler/v1/lock.proto by @grpc/proto-loader (no generated code
// is committed); `client.stub` is the raw LockService client for anything
// this file does not wrap. Field names are camelCase, 64-bit integers are
// strings (fencingToken), enums are their names ('ACQUIRE_STATUS_ACQUIRED').
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.TUMBLER_PROTO_DIR || path.join(__dirname, '..', '..', 'proto');
// Extra time on the RPC deadline beyond waitMs, so the server's own TIMEOUT
// reply (sent just before the deadline) wins over DEADLINE_EXCEEDED.
const DEADLINE_SLACK_MS = 5000;

function loadProto(protoDir = PROTO_DIR) {
  const def = protoLoader.loadSync('tumbler/v1/lock.proto', {
    includeDirs: [protoDir], longs: String, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(def).tumbler.v1;
}

class NotAcquiredError extends Error {
  constructor(name, response) {
    super(`${name}: not acquired (${response.reason}, ${response.holders} holder(s))`);
    this.response = response;
    this.busy = response.reason === 'NOT_ACQUIRED_REASON_BUSY';
    this.timeout = response.reason === 'NOT_ACQUIRED_REASON_TIMEOUT';
  }
}

class LockLostError extends Error {}

class Lock {
  constructor(client, name, grant) { this.client = client; this.name = name; this.grant = grant; }
  get holder() { return this.grant.holder; }
  get fencingToken() { return this.grant.fencingToken; } // a decimal string (uint64)
  get slot() { return this.grant.slot; }

  // Reset the lease to ttlMs from now (default: the grant's own ttl); throws LockLostError.
  async extend(ttlMs) {
    const req = { namespace: this.client.namespace, name: this.name, holder: this.holder,
      fencingToken: this.fencingToken };
    if (ttlMs !== undefined) req.ttlMs = ttlMs;
    const resp = await this.client.call('Extend', req);
    if (resp.status !== 'EXTEND_STATUS_EXTENDED') throw new LockLostError(`${this.name}: lease of ${this.holder} lost`);
    this.grant = resp.grant;
    return this;
  }

  // Give the permit back; false when it was no longer held (expired).
  async release() {
    const resp = await this.client.call('Release', { namespace: this.client.namespace, name: this.name,
      holder: this.holder, fencingToken: this.fencingToken });
    return resp.status === 'RELEASE_STATUS_RELEASED';
  }

  // `await using lock = await client.acquire(...)` where the runtime supports it.
  async [Symbol.asyncDispose || Symbol.for('Symbol.asyncDispose')]() { await this.release(); }
}

class Client {
  constructor(target = '127.0.0.1:50051', { namespace = '', credentials, protoDir, timeoutMs = 10000 } = {}) {
    const v1 = loadProto(protoDir);
    this.stub = new v1.LockService(target, credentials || grpc.credentials.createInsecure());
    this.namespace = namespace;
    this.timeoutMs = timeoutMs; // deadline of the calls that do not wait
  }

  call(method, request, timeoutMs = this.timeoutMs) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, { deadline: Date.now() + timeoutMs }, (err, resp) => (err ? reject(err) : resolve(resp)));
    });
  }

  // Take a permit, waiting up to waitMs in the server (0: try once). timeoutMs
  // is the RPC deadline (default waitMs plus a little). Resolves to a Lock;
  // rejects with NotAcquiredError (err.busy / err.timeout) or a gRPC error.
  async acquire(name, { holder = '', waitMs = 0, timeoutMs, limit, ttlMs, kind = '', metadata = {},
    priority = 0, queueTtlMs, fair } = {}) {
    const req = { namespace: this.namespace, name, holder, kind, metadata, waitMs, priority };
    if (limit !== undefined) req.limit = limit;
    if (ttlMs !== undefined) req.ttlMs = ttlMs;
    if (queueTtlMs !== undefined) req.queueTtlMs = queueTtlMs;
    if (fair !== undefined) req.fair = fair;
    const resp = await this.call('Acquire', req, timeoutMs ?? waitMs + DEADLINE_SLACK_MS);
    if (resp.status === 'ACQUIRE_STATUS_NOT_ACQUIRED') throw new NotAcquiredError(name, resp);
    return new Lock(this, name, resp.grant);
  }

  // Run fn(lock) while holding the lock; the lock is released however fn ends.
  async withLock(name, options, fn) {
    const lock = await this.acquire(name, options);
    try {
      return await fn(lock);
    } finally {
      await lock.release();
    }
  }

  inspect(name) { return this.call('Inspect', { namespace: this.namespace, name }); }

  close() { this.stub.close(); }
}

module.exports = { Client, Lock, NotAcquiredError, LockLostError, loadProto, grpc };
