'use strict';
// tumbler-client: the Node.js client of the tumbler lock service. The
// LockService stub is loaded from the proto bundled in the package
// (proto/tumbler/v1/lock.proto); this module adds acquire with retries and
// AbortSignal, withLock kept alive by a watchdog, fencing tokens and slots,
// multi-locks (acquireAll, withLockAll), typed errors, and leader election (campaign, leader, observe). Types: index.d.ts (messages generated from the proto).
const grpc = require('@grpc/grpc-js');
const { Client, loadProto, DEFAULT_HELPER_TTL_MS } = require('./lib/client');
const { Lock, LockSet } = require('./lib/lock');
const { Leadership, Observer } = require('./lib/election');
const {
  TumblerError, NotAcquiredError, LockBusyError, LockTimeoutError, LockLostError, NotLeaderError, DeadlockError,
  InvalidArgumentError, PermissionDeniedError, UnavailableError,
} = require('./lib/errors');

// Plain names only, so `import { Client } from 'tumbler-client'` works from ES modules too.
module.exports = {
  Client, Lock, LockSet, Leadership, Observer, loadProto, grpc, DEFAULT_HELPER_TTL_MS,
  TumblerError, NotAcquiredError, LockBusyError, LockTimeoutError, LockLostError, NotLeaderError, DeadlockError,
  InvalidArgumentError, PermissionDeniedError, UnavailableError,
};
