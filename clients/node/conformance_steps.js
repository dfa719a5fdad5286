#!/usr/bin/env node
'use strict';
// Node's steps of the cross-language conformance scenario (clients/conformance),
// run with the installed tumbler-client package (NODE_PATH points at it).
// usage: conformance_steps.js ADDR NAMESPACE STEP ARGS...
// Prints JSON lines: events ({"event": ...}) while it runs, its result last.
const readline = require('readline');
const {
  Client, NotAcquiredError, LockLostError, NotLeaderError, InvalidArgumentError, DeadlockError, TumblerError,
} = require('tumbler-client');

const sleep = (ms, signal) => new Promise((resolve, reject) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); reject(signal.reason); }, { once: true });
});
const emit = (obj) => console.log(JSON.stringify(obj));
const grantJson = (lock) => ({ holder: lock.holder, token: lock.fencingToken, slot: lock.slot,
  acquired_at_ms: Number(lock.grant.acquiredAtMs) });

const weights = (lock) => ({ permits: lock.permits, slots: lock.slots });

// { status: 'ACQUIRED', ...what running resolves to }, or BUSY / TIMEOUT / DEADLOCK / the error.
async function outcome(running) {
  try {
    return { status: 'ACQUIRED', ...(await running) };
  } catch (e) {
    if (e instanceof NotAcquiredError) {
      return { status: e.busy ? 'BUSY' : 'TIMEOUT', holders: e.response?.holders ?? 0 };
    }
    if (e instanceof DeadlockError) return { status: 'DEADLOCK', code: e.code, typed: e.name, message: e.details };
    if (e instanceof TumblerError) return { status: 'ERROR', code: e.code, typed: e.name, message: e.details };
    throw e;
  }
}

// A try-once acquire kept (60 s lease): ACQUIRED with out(lock), BUSY, or the error.
const tryOnce = (acquiring, out) => outcome(acquiring.then((lock) => ({ ...grantJson(lock), ...out(lock) })));

const setJson = (set) => ({ holder: set.holder,
  grants: set.grants.map((g) => ({ name: g.name, token: g.fencingToken, slot: g.slot })) });

const leadershipJson = (l) => (l ? { candidate: l.candidate, term: l.term, value: l.value,
  elected_at_ms: Number(l.electedAtMs), expires_at_ms: Number(l.expiresAtMs) } : null);

// Resolves true when the signal aborts within ms, false otherwise.
const abortedWithin = (signal, ms) => sleep(ms, signal).then(() => false, () => true);

const steps = {
  async hold(client, name, holder, limit) {
    try {
      const lock = await client.acquire(name, { holder, limit: Number(limit), ttlMs: 60000 });
      return { status: 'ACQUIRED', ...grantJson(lock) };
    } catch (e) {
      if (e instanceof NotAcquiredError) return { status: e.busy ? 'BUSY' : 'TIMEOUT', holders: e.response.holders };
      throw e;
    }
  },
  async rw_hold(client, name, holder, mode) { // try once as read, write or plain; keep the grant (60 s lease)
    return tryOnce(client.acquire(name, { holder, ttlMs: 60000, mode: mode === 'plain' ? undefined : mode }),
      (lock) => ({ mode: lock.mode }));
  },
  async weighted_hold(client, name, holder, limit, permits) { // try once for PERMITS of LIMIT; keep the grant
    return tryOnce(client.acquire(name, { holder, ttlMs: 60000, limit: Number(limit), permits: Number(permits) }),
      weights);
  },
  async weighted_wait(client, name, holder, limit, permits, waitMs, holdMs) { // wait, extend, hold, release
    const options = { holder, waitMs: Number(waitMs), ttlMs: 60000, limit: Number(limit), permits: Number(permits) };
    return client.withLock(name, options, async (lock) => {
      const out = { ...grantJson(lock), ...weights(lock) };
      await lock.extend();
      out.extended = weights(lock);
      await sleep(Number(holdMs));
      out.released_at_ms = Date.now();
      return out;
    });
  },
  async multi_hold(client, holder, names) { // try once for the set (60 s lease); keep it
    return outcome(client.acquireAll(names.split(','), { holder, ttlMs: 60000 }).then(setJson));
  },
  async multi_wait(client, holder, names, waitMs, holdMs) { // wait for the set, extend it, hold a while, release
    const options = { holder, waitMs: Number(waitMs), ttlMs: 60000 };
    return outcome(client.withLockAll(names.split(','), options, async (set) => {
      const out = setJson(set);
      out.extended = await set.extend().then(() => true, (e) => {
        if (e instanceof LockLostError) return false;
        throw e;
      });
      await sleep(Number(holdMs));
      out.released_at_ms = Date.now();
      return out;
    }));
  },
  async multi_release(client, holder, names) { // the set, by holder (no token)
    const resp = await client.call('Release', () => ({ namespace: client.namespace, holder, names: names.split(',') }));
    return { released: resp.status === 'RELEASE_STATUS_RELEASED' };
  },
  async multi_stale(client, holder, names) { // S1 taken and released, S2 taken; S1's release again; "release": S2's
    const first = await client.acquireAll(names.split(','), { holder, ttlMs: 60000 });
    const firstReleased = await first.release();
    const second = await client.acquireAll(names.split(','), { holder, ttlMs: 60000 });
    emit({ event: 'stale', first: setJson(first), second: setJson(second), first_released: firstReleased,
      stale_released: await first.release() });
    const input = readline.createInterface({ input: process.stdin });
    await new Promise((resolve) => { input.once('line', resolve); input.once('close', resolve); });
    input.close();
    return { released: await second.release() };
  },
  async deadlock_wait(client, name, holder, waitMs) { // wait for one lock; a refusal must come as a DeadlockError
    return outcome(client.acquire(name, { holder, waitMs: Number(waitMs), ttlMs: 60000 }).then(async (lock) => {
      await lock.release();
      return { token: lock.fencingToken };
    }));
  },
  async rw_wait(client, name, holder, mode, waitMs, holdMs) { // wait in a mode, hold a while, release
    return client.withLock(name, { holder, waitMs: Number(waitMs), ttlMs: 60000, mode }, async (lock) => {
      const out = { ...grantJson(lock), mode: lock.mode };
      await sleep(Number(holdMs));
      out.released_at_ms = Date.now();
      return out;
    });
  },
  async release(client, name, holder) {
    const resp = await client.call('Release', () => ({ namespace: client.namespace, name, holder }));
    return { released: resp.status === 'RELEASE_STATUS_RELEASED' };
  },
  async wait(client, name, holder, waitMs, holdMs) {
    return client.withLock(name, { holder, waitMs: Number(waitMs), ttlMs: 60000 }, async (lock) => {
      const out = grantJson(lock);
      await sleep(Number(holdMs));
      out.released_at_ms = Date.now();
      return out;
    });
  },
  async scoped(client, name) {
    const out = await client.withLock(name, { ttlMs: 2000 }, async (lock) => {
      const o = grantJson(lock);
      const before = Number(lock.grant.expiresAtMs);
      await sleep(50);
      await lock.extend(30000);
      o.extended = Number(lock.grant.expiresAtMs) > before;
      return o;
    });
    out.holders_after = (await client.inspect(name)).holders.length;
    return out;
  },
  async inspect(client, name) {
    const info = await client.inspect(name);
    const queue = await client.queue(name);
    return { limit: info.limit, waiters: info.waiters,
      holders: info.holders.map((h) => ({ holder: h.grant.holder, token: h.grant.fencingToken, slot: h.grant.slot })),
      queue: queue.requests.map((r) => r.holder) };
  },
  async invalid(client) { // bad input: a kind outside [a-z0-9_.-]
    try {
      await client.acquire('conformance-invalid', { kind: 'Bad Kind!' });
      return { field: 'kind', code: 'OK' };
    } catch (e) {
      if (!(e instanceof InvalidArgumentError)) throw e;
      return { field: 'kind', code: 'INVALID_ARGUMENT', message: e.details, typed: e.name };
    }
  },
  async keep(client, name, ttlMs, workMs) { // a lease shorter than the work: the watchdog keeps it
    const out = await client.withLock(name, { holder: 'node-keeper', ttlMs: Number(ttlMs) }, async (lock, signal) => {
      emit({ event: 'held', ...grantJson(lock) });
      const start = Date.now();
      await sleep(Number(workMs), signal);
      const info = await client.inspect(name);
      return { body_start_ms: start, body_end_ms: Date.now(), token: lock.fencingToken, lost: lock.lost,
        token_inside: info.holders[0]?.grant.fencingToken };
    });
    // Its own grant only: the driver's prober may take the freed lock at once.
    out.holders_after = (await client.inspect(name)).holders.filter((h) => h.grant.holder === 'node-keeper').length;
    return out;
  },
  async crash(client, name, ttlMs) { // hold with the helper, then get killed by the driver
    await client.withLock(name, { holder: 'node-crasher', ttlMs: Number(ttlMs) }, async (lock, signal) => {
      emit({ event: 'held', ...grantJson(lock) });
      await sleep(60000, signal);
    });
    return { survived: true };
  },
  async lost(client, name, ttlMs) { // the driver takes the grant away: the body's signal aborts
    const out = { signalled: false };
    try {
      await client.withLock(name, { holder: 'node-loser', ttlMs: Number(ttlMs) }, async (lock, signal) => {
        emit({ event: 'held', ...grantJson(lock) });
        try {
          await sleep(10000, signal);
        } catch (e) {
          Object.assign(out, { signalled: signal.aborted, signal_at_ms: Date.now(), reason: lock.lostReason });
          throw e;
        }
      });
    } catch (e) {
      if (e instanceof LockLostError) out.raised = e.name;
    }
    return out;
  },
  async cancel(client, name, afterMs) { // abort a waiting acquire: no ghost waiter
    const holder = 'node-canceller';
    const ac = new AbortController();
    const pending = client.acquire(name, { holder, waitMs: 20000, ttlMs: 10000, signal: ac.signal });
    const settled = pending.then(() => 'acquired', (e) => e.name);
    await sleep(Number(afterMs));
    const queued = (await client.queue(name)).requests.map((r) => r.holder);
    const t0 = performance.now();
    ac.abort();
    const error = await settled;
    const out = { error, cancel_ms: Math.round(performance.now() - t0), queued_before: queued.includes(holder) };
    for (;;) { // poll the queue (up to 2 s) until the request has left it
      out.queue_after = (await client.queue(name)).requests.map((r) => r.holder);
      out.gone_ms = Math.round(performance.now() - t0);
      if (!out.queue_after.includes(holder) || out.gone_ms > 2000) return out;
      await sleep(10);
    }
  },
  async campaign(client, name, candidate, value, ttlMs, waitMs) { // campaign, then act on commands from stdin
    const held = await client.campaign(name, { candidate, value, ttlMs: Number(ttlMs), waitMs: Number(waitMs) });
    if (!held) return { elected: false };
    emit({ event: 'elected', elected: true, at_ms: Date.now(), ...leadershipJson(held.leader) });
    for await (const line of readline.createInterface({ input: process.stdin })) {
      const [cmd, ...rest] = line.trim().split(' ');
      const arg = rest.join(' ');
      if (cmd === 'proclaim') {
        try {
          await held.proclaim(arg);
          emit({ event: 'proclaim', status: 'PROCLAIMED', value: held.value, lost: held.lost });
        } catch (e) {
          if (!(e instanceof NotLeaderError)) throw e;
          emit({ event: 'proclaim', status: 'NOT_LEADER', typed: e.name, lost: held.lost });
        }
      } else if (cmd === 'resign') {
        const first = await held.resign();
        const second = await held.resign();
        emit({ event: 'resign', first, second, lost: held.lost });
      } else if (cmd === 'lost') {
        const lost = await abortedWithin(held.signal, Number(arg));
        emit({ event: 'lost', lost, reason: held.lostReason, at_ms: Date.now() });
      } else if (cmd === 'exit') {
        break;
      }
    }
    await held.resign();
    return { done: true, term: held.term };
  },
  async leader(client, name) {
    return { leader: leadershipJson(await client.leader(name)) };
  },
  async observe(client, name, stopCandidate, timeoutMs) { // the leader changes until stopCandidate is elected
    const out = { cancelled: false, changes: [] };
    const observer = client.observe(name, { signal: AbortSignal.timeout(Number(timeoutMs)) });
    for await (const change of observer) {
      const seen = { kind: change.event, leader: leadershipJson(change.leader), ended_term: change.endedTerm };
      out.changes.push(seen);
      emit({ event: 'change', ...seen });
      if (change.event === 'elected' && change.leader.candidate === stopCandidate) {
        observer.cancel();
        out.cancelled = true;
      }
    }
    return out;
  },
  async restart(client, name, holder, waitMs) { // wait through a server restart (retries on UNAVAILABLE)
    const started = performance.now();
    const lock = await client.acquire(name, { holder, waitMs: Number(waitMs), ttlMs: 30000 });
    const out = { status: 'ACQUIRED', ...grantJson(lock), elapsed_ms: Math.round(performance.now() - started) };
    await lock.release();
    return out;
  },
};

// The token is sent; none, or another namespace, is PermissionDeniedError.
async function auth(addr, namespace, token) {
  const attempt = async (ns, tok) => {
    const client = new Client(addr, { namespace: ns, token: tok });
    try {
      await (await client.acquire('auth-node', { ttlMs: 5000 })).release();
      return 'ACQUIRED';
    } catch (e) {
      return e.name;
    } finally {
      client.close();
    }
  };
  return { with_token: await attempt(namespace, token), no_token: await attempt(namespace),
    other_namespace: await attempt('elsewhere', token) };
}

async function main(addr, namespace, step, ...args) {
  if (step === 'auth') return auth(addr, namespace, ...args);
  const client = new Client(addr, { namespace });
  try {
    if (!steps[step]) throw new Error(`unknown step ${step}`);
    return await steps[step](client, ...args);
  } finally {
    client.close();
  }
}

main(...process.argv.slice(2)).then(
  (out) => { emit(out); process.exit(0); },
  (err) => { console.error(err); process.exit(1); },
);
