'use strict';
// Typed errors of tumbler-client and the mapping from gRPC status codes.
// Not getting a lock rejects with NotAcquiredError (LockBusyError after a
// try-once request, LockTimeoutError after a wait); a grant that ends while
// it is relied on is a LockLostError; a wait that would close a cycle of
// waiters is a DeadlockError. gRPC failures become
// InvalidArgumentError, PermissionDeniedError, UnavailableError (after the
// retries ran out) or TumblerError; `code` and `details` are the status's.
const { status } = require('@grpc/grpc-js');

class TumblerError extends Error {
  constructor(message, { code, details, cause } = {}) {
    super(message, cause ? { cause } : undefined);
    this.name = new.target.name;
    this.code = code;
    this.details = details ?? '';
  }
}

class NotAcquiredError extends TumblerError {
  constructor(name, response, message) {
    super(message || `${name}: not acquired (${response ? response.reason : 'deadline'}, ${response ? response.holders : '?'} holder(s))`);
    this.lockName = name;
    this.response = response || null;
    this.busy = false;
    this.timeout = false;
  }
}

class LockBusyError extends NotAcquiredError {
  constructor(name, response) { super(name, response); this.busy = true; }
}

class LockTimeoutError extends NotAcquiredError {
  constructor(name, response, message) { super(name, response, message); this.timeout = true; }
}

class LockLostError extends TumblerError {
  constructor(lock, reason) {
    const token = lock.fencingToken === null ? '' : ` (token ${lock.fencingToken})`; // a multi-lock's: null
    super(`${lock.name}: lock lost by ${lock.holder}${token}: ${reason}`);
    this.lockName = lock.name;
    this.holder = lock.holder;
    this.fencingToken = lock.fencingToken;
    this.reason = reason;
  }
}

// A leadership whose term is over (Proclaim answered NOT_LEADER, or the
// watchdog's Extend NOT_HELD): a LockLostError with the candidate and term.
class NotLeaderError extends LockLostError {
  constructor(leadership, reason) {
    super(leadership, reason);
    this.candidate = leadership.candidate;
    this.term = leadership.term;
  }
}

// A wait refused because it would close a cycle of waiters (ABORTED, the
// message naming it: `deadlock: holder "a" waits for lock "x" held by "b", …`).
// Nothing of the request stayed queued: release what the holder holds (or
// take locks together with acquireAll) and try again.
class DeadlockError extends TumblerError {}

class InvalidArgumentError extends TumblerError {}
class PermissionDeniedError extends TumblerError {}
class UnavailableError extends TumblerError {}

const BY_CODE = {
  [status.INVALID_ARGUMENT]: InvalidArgumentError,
  [status.PERMISSION_DENIED]: PermissionDeniedError,
  [status.UNAUTHENTICATED]: PermissionDeniedError,
  [status.UNAVAILABLE]: UnavailableError,
};

// Other ABORTED answers (a session resume race) say something else.
const DEADLOCK_PREFIX = 'deadlock: ';

// The typed error for a gRPC error (kept as `cause`).
function fromGrpcError(err) {
  const deadlock = err.code === status.ABORTED && String(err.details || '').startsWith(DEADLOCK_PREFIX);
  const Cls = deadlock ? DeadlockError : BY_CODE[err.code] || TumblerError;
  const codeName = Object.keys(status).find((k) => status[k] === err.code) || 'UNKNOWN';
  // grpc-js ends a failed connection's details with a name-resolution note,
  // empty for an address: left out, so the message ends with the cause.
  const details = String(err.details ?? '').replace(/[\s.]*Resolution note:\s*$/, '');
  return new Cls(`${codeName}: ${details}`, { code: err.code, details, cause: err });
}

// UNAVAILABLE: the server was not reached or its Redis was down; nothing was applied.
const isRetryable = (err) => err && err.code === status.UNAVAILABLE;

module.exports = {
  TumblerError, NotAcquiredError, LockBusyError, LockTimeoutError, LockLostError, NotLeaderError, DeadlockError,
  InvalidArgumentError, PermissionDeniedError, UnavailableError, fromGrpcError, isRetryable,
};
