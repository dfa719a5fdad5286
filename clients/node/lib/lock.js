'use strict';
// A grant (Lock) and its watchdog: extend every third of the lease, pinned
// to the fencing token. NOT_HELD, or renewals that fail until the lease has
// run out, mark the lock lost at once and abort `lock.signal`.
const { LockLostError } = require('./errors');

class Lock {
  constructor(client, name, grant, leaseEnd) {
    this.client = client;
    this.name = name;
    this.grant = grant;
    this.lost = false;
    this.lostReason = null;
    this.leaseEnd = leaseEnd; // local (performance.now) estimate of when the lease runs out
    this.controller = new AbortController();
    this.timer = null;
    this.onLost = null;
  }

  get holder() { return this.grant.holder; }
  get fencingToken() { return this.grant.fencingToken; } // a decimal string (uint64)
  get slot() { return this.grant.slot; }
  get ttlMs() { return Number(this.grant.ttlMs); }
  // 'read' or 'write' for a grant of a read/write lock, null for a plain lock's.
  get mode() { return { LOCK_MODE_READ: 'read', LOCK_MODE_WRITE: 'write' }[this.grant.mode] || null; }
  // The permits the grant holds (1 unless acquired with `permits`), and its slots, one per permit.
  get permits() { return Math.max(1, this.grant.permits || 0); }
  get slots() { return this.grant.slots && this.grant.slots.length ? [...this.grant.slots] : [this.grant.slot]; }
  // Aborted (with a LockLostError as reason) the moment the grant is known lost.
  get signal() { return this.controller.signal; }

  extendRequest(ttlMs) {
    const req = { namespace: this.client.namespace, name: this.name, holder: this.holder,
      fencingToken: this.fencingToken };
    if (ttlMs !== undefined) req.ttlMs = ttlMs;
    return req;
  }

  releaseRequest() {
    return { namespace: this.client.namespace, name: this.name, holder: this.holder, fencingToken: this.fencingToken };
  }

  // Reset the lease to ttlMs from now (default: the grant's own ttl); rejects with LockLostError.
  async extend(ttlMs) {
    const sent = performance.now();
    const resp = await this.client.call('Extend', () => this.extendRequest(ttlMs));
    if (resp.status !== 'EXTEND_STATUS_EXTENDED') {
      this.markLost('not held');
      throw this.lostError();
    }
    this.renewed(resp.grant, sent);
    return this;
  }

  // Turn a write grant into a read grant at once: same fencing token, slot and
  // lease; readers may then join. Rejects with TumblerError (FAILED_PRECONDITION)
  // on a plain lock, LockLostError when the grant is gone.
  async downgrade() {
    const req = { namespace: this.client.namespace, name: this.name, holder: this.holder, waitMs: 0,
      ttlMs: this.ttlMs, kind: this.grant.kind || '', mode: 'LOCK_MODE_READ' };
    if (this.limit !== undefined) req.limit = this.limit;
    const sent = performance.now();
    const resp = await this.client.call('Acquire', () => req);
    if (resp.status === 'ACQUIRE_STATUS_NOT_ACQUIRED' || resp.grant.fencingToken !== this.fencingToken) {
      if (resp.status !== 'ACQUIRE_STATUS_NOT_ACQUIRED') { // a new grant, not ours: give it back
        await this.client.call('Release', () => ({ namespace: this.client.namespace, name: this.name,
          holder: this.holder, fencingToken: resp.grant.fencingToken }));
      }
      this.markLost('not held');
      throw this.lostError();
    }
    this.renewed(resp.grant, sent);
    return this;
  }

  // Give the permit back (pinned to the fencing token); false when it was no longer held.
  async release() {
    this.stopKeepAlive();
    const resp = await this.client.call('Release', () => this.releaseRequest());
    return resp.status === 'RELEASE_STATUS_RELEASED';
  }

  // Start the watchdog; onLost(LockLostError) is called when the grant is lost.
  keepAlive({ onLost } = {}) {
    this.onLost = onLost || null;
    if (!this.timer && !this.lost) this.schedule(this.ttlMs / 3, 0);
    return this;
  }

  stopKeepAlive() {
    clearTimeout(this.timer);
    this.timer = null;
    this.stopped = true;
  }

  // Throws LockLostError if the grant is known to be gone.
  check() { if (this.lost) throw this.lostError(); }

  lostError() { return new LockLostError(this, this.lostReason || 'lost'); }

  schedule(delayMs, attempt) {
    this.stopped = false;
    this.timer = setTimeout(() => this.renew(attempt), Math.max(0, delayMs));
  }

  async renew(attempt) {
    const interval = this.ttlMs / 3;
    const sent = performance.now();
    const timeoutMs = Math.max(50, Math.min(interval, this.leaseEnd - sent));
    let resp;
    try {
      resp = await this.client.callOnce('Extend', this.extendRequest(this.ttlMs), timeoutMs);
    } catch (err) {
      if (this.stopped) return;
      if (performance.now() >= this.leaseEnd) return this.markLost(`renewals failed until the lease ran out (${err.code})`);
      return this.schedule(Math.min(this.client.retry.delay(attempt), this.leaseEnd - performance.now()), attempt + 1);
    }
    if (this.stopped) return;
    if (resp.status !== 'EXTEND_STATUS_EXTENDED') return this.markLost('not held');
    this.renewed(resp.grant, sent);
    this.schedule(sent + interval - performance.now(), 0);
  }

  renewed(grant, sent) {
    this.grant = grant;
    this.leaseEnd = sent + Number(grant.ttlMs);
  }

  markLost(reason) {
    if (this.lost) return;
    this.lost = true;
    this.lostReason = reason;
    this.timer = null;
    const err = this.lostError();
    this.controller.abort(err);
    if (this.onLost) this.onLost(err);
  }

  // `await using lock = ...` where the runtime supports it.
  async [Symbol.asyncDispose || Symbol.for('Symbol.asyncDispose')]() { if (!this.lost) await this.release(); }
}

// A multi-lock's grants, held and given back as one: `names`, `holder`,
// `grants` (one per name, in the order asked, each with its `name` and own
// fencing token), `fencingToken(name)`, `fencingTokens`. Its Extend and
// Release name the set, each lock pinned to the token it was granted (so a
// late release of this set never touches a newer set of the same holder),
// so extend(), release(), keepAlive(), `lost` and `signal` work as a Lock's
// for the whole set. `grant` is the grant whose lease ends first.
class LockSet extends Lock {
  constructor(client, names, resp, leaseEnd) {
    const grants = resp.grants.length ? resp.grants : [resp.grant];
    // The set's lease is as long as its shortest.
    const first = grants.reduce((a, b) => (BigInt(b.expiresAtMs) < BigInt(a.expiresAtMs) ? b : a));
    super(client, names.join(','), first, leaseEnd);
    this.names = [...names];
    this.grants = grants;
  }

  // The fencing token (a decimal string) of the lock `name` of the set; null when not in the set.
  fencingToken(name) { return this.grants.find((g) => g.name === name)?.fencingToken ?? null; }

  // Each lock's fencing token (decimal strings), in the order of `names`.
  get fencingTokens() { return this.names.map((name) => this.fencingToken(name)); }

  extendRequest(ttlMs) {
    const req = { namespace: this.client.namespace, holder: this.holder, names: this.names,
      fencingTokens: this.fencingTokens };
    if (ttlMs !== undefined) req.ttlMs = ttlMs;
    return req;
  }

  releaseRequest() {
    return { namespace: this.client.namespace, holder: this.holder, names: this.names,
      fencingTokens: this.fencingTokens };
  }

  async downgrade() { throw new TypeError('a multi-lock has no read/write mode to downgrade'); }

  lostError() {
    return new LockLostError({ name: this.name, holder: this.holder, fencingToken: null }, this.lostReason || 'lost');
  }
}

module.exports = { Lock, LockSet };
