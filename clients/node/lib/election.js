'use strict';
// Leader election: a Leadership is a Lock whose holder is the candidate and
// whose fencing token is the term, so the same watchdog keeps its lease
// (Extend pinned to the term) and the same `lost`/`signal` tell when the
// term ended under it. proclaim() and resign() act only with this term.
// observe() is the election's LeaderChange stream as an async iterable.
const { Lock } = require('./lock');
const errors = require('./errors');

class Leadership extends Lock {
  constructor(client, name, leader, leaseEnd, secret = '') {
    super(client, name, {
      holder: leader.candidate, fencingToken: leader.term, slot: 1, acquiredAtMs: leader.electedAtMs,
      expiresAtMs: leader.expiresAtMs, ttlMs: leader.ttlMs, kind: '', metadata: {},
    }, leaseEnd);
    this.leader = leader; // the Leadership message as last told by the server
    // Told only to the winning Campaign: Proclaim and Resign need it (the candidate and term anyone can read).
    this.secret = secret;
    this.resigned = false;
  }

  get candidate() { return this.leader.candidate; }
  get term() { return this.leader.term; } // a decimal string (uint64)
  get value() { return this.leader.value; }

  // Replace the leader's value; rejects with NotLeaderError (and the leadership is lost) when the term is over.
  async proclaim(value) {
    const resp = await this.client.call('Proclaim', () => ({ namespace: this.client.namespace, name: this.name,
      candidate: this.candidate, term: this.term, value, secret: this.secret }));
    if (resp.status !== 'PROCLAIM_STATUS_PROCLAIMED') {
      this.markLost('not the leader');
      throw this.lostError();
    }
    this.leader = resp.leader;
    return this;
  }

  // Step down (stops the watchdog): true when this call ended the term,
  // false when it was over already. Safe to call more than once.
  async resign() {
    this.stopKeepAlive();
    if (this.resigned) return false;
    const resp = await this.client.call('Resign', () => ({ namespace: this.client.namespace, name: this.name,
      candidate: this.candidate, term: this.term, secret: this.secret }));
    this.resigned = true;
    return resp.status === 'RESIGN_STATUS_RESIGNED';
  }

  release() { return this.resign(); }

  lostError() { return new errors.NotLeaderError(this, this.lostReason || 'not the leader'); }

  async [Symbol.asyncDispose || Symbol.for('Symbol.asyncDispose')]() { await this.resign(); }
}

// The leader changes of one election: `for await (const change of observer)`;
// the first is the current leader (event "current"). cancel() ends it (the
// loop then ends quietly), as does the `signal` given to observe().
class Observer {
  constructor(call, signal) {
    this.call = call;
    this.cancelled = false;
    this.onAbort = () => this.cancel();
    this.signal = signal;
    if (signal?.aborted) this.cancel();
    else signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  cancel() {
    this.cancelled = true;
    this.call.cancel();
  }

  async* [Symbol.asyncIterator]() {
    try {
      for await (const change of this.call) yield change;
    } catch (err) {
      if (this.cancelled) return;
      throw errors.fromGrpcError(err);
    } finally {
      this.signal?.removeEventListener('abort', this.onAbort);
      if (!this.cancelled) this.cancel();
    }
  }
}

module.exports = { Leadership, Observer };
