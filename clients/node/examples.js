#!/usr/bin/env node
'use strict';
// The Node seed patterns of clients/node/README.md, run by the conformance
// driver: a job that locks around an ID with a limit above 1, one leader
// among replicas (leader election), a transfer between two accounts under a
// multi-lock, and a cycle of waiters refused as a deadlock.
// usage: examples.js ADDR NAMESPACE all   — prints {"checks": [...]} as one JSON line.
const {
  Client, InvalidArgumentError, LockBusyError, LockLostError, LockSet, DeadlockError,
} = require('tumbler-client');

const { setTimeout: delay } = require('node:timers/promises');

const sleep = (ms, signal) => delay(ms, undefined, { signal });

// The bank's API allows 2 sessions per account: at most 2 syncs of one
// account run at once, across every worker process; other accounts are
// other locks and never wait for this one.
function withAccount(client, accountId, jobId, fn) {
  return client.withLock(`account-sync/${accountId}`, {
    holder: jobId, limit: 2, waitMs: 30000, ttlMs: 60000, kind: 'account_sync',
  }, fn);
}

// Run fn(leadership, signal) while this replica leads `election`; null when
// another one led for the whole wait. The value others see is this replica's address.
async function runAsLeader(client, election, me, fn) {
  const leadership = await client.campaign(election, { value: me, waitMs: 5000, ttlMs: 3000 });
  if (!leadership) return null;
  try {
    return await fn(leadership, leadership.signal); // the signal aborts if the term ends under it
  } finally {
    await leadership.resign(); // the next replica in line is elected at once
  }
}

async function electionChecks(client, check) {
  const term = await runAsLeader(client, 'node.scheduler', '10.0.0.7:8080', async (leadership) => {
    const now = await client.leader('node.scheduler');
    check('leader election: leader() shows this replica\'s value and term',
      now && now.value === '10.0.0.7:8080' && now.term === leadership.term, now);
    check('leader election: another replica is not elected while this one leads',
      (await client.campaign('node.scheduler', { value: '10.0.0.8:8080' })) === null);
    const observer = client.observe('node.scheduler');
    for await (const change of observer) {
      check('leader election: observe starts with the current leader',
        change.event === 'current' && change.leader.term === leadership.term, change);
      observer.cancel();
    }
    await leadership.proclaim('10.0.0.7:9090');
    return leadership.term;
  });
  check('leader election: elected, with a term (fencing token)', term && BigInt(term) > 0n, term);
  check('leader election: nobody leads after resign', (await client.leader('node.scheduler')) === null);
}

// A big export takes 3 of 10 permits, small ones share the rest; 11 of 10 is refused naming permits.
async function weightedChecks(client, check) {
  await client.withLock('node.exports', { limit: 10, permits: 3, ttlMs: 600 }, async (big) => {
    await sleep(500); // near the end of the lease: the watchdog has renewed it by now
    check('weighted permits: a big job holds 3 of 10, one slot per permit, kept across renewals',
      big.permits === 3 && JSON.stringify(big.slots) === '[1,2,3]', big.slots);
    const small = [];
    for (let i = 0; i < 7; i += 1) small.push(await client.acquire('node.exports', { limit: 10, ttlMs: 5000 }));
    check('weighted permits: seven small jobs take the other slots, 4..10',
      JSON.stringify(small.map((l) => l.slot).sort((a, b) => a - b)) === '[4,5,6,7,8,9,10]'
      && small.every((l) => l.permits === 1 && l.slots.length === 1 && l.slots[0] === l.slot),
      small.map((l) => l.slots));
    const inUse = (await client.inspect('node.exports')).permitsInUse;
    check('weighted permits: inspect counts 10 permits in use', inUse === 10, inUse);
    const busy = await client.acquire('node.exports', { limit: 10 })
      .then(() => false, (e) => e instanceof LockBusyError);
    check('weighted permits: an 11th permit is busy', busy);
    await Promise.all(small.map((l) => l.release()));
  });
  const refused = await client.acquire('node.exports', { limit: 10, permits: 11 })
    .then(() => null, (e) => (e instanceof InvalidArgumentError ? e.details : String(e)));
  check('weighted permits: 11 of 10 rejects with InvalidArgumentError and the server\'s message',
    refused && refused.startsWith('permits'), refused);
}

// Move `amount` between two accounts holding both locks (or neither): whatever
// order other transfers name the same accounts in, none waits on another
// while holding a part of its set.
function transfer(client, from, to, amount, move) {
  const names = [`node.accounts/${from}`, `node.accounts/${to}`];
  return client.withLockAll(names, { waitMs: 5000, ttlMs: 3000 }, (set) =>
    move(from, to, amount, set.fencingToken(names[0]), set.fencingToken(names[1]))); // each write fenced by its token
}

const holdersOf = async (client, name) => (await client.inspect(name)).holders.map((h) => h.grant.holder);

// A set held as one, renewed as one and released as one; all or nothing; a duplicate name is refused.
async function multiChecks(client, check) {
  const names = ['node.accounts/1', 'node.accounts/2'];
  await client.withLockAll(names, { ttlMs: 600 }, async (set) => {
    await sleep(800); // past the 600 ms lease: the watchdog has renewed the whole set
    check('multi-lock: one grant per name in the order asked, each with its own fencing token',
      set instanceof LockSet && JSON.stringify(set.grants.map((g) => g.name)) === JSON.stringify(names)
      && names.every((n) => BigInt(set.fencingToken(n)) > 0n) && set.fencingToken('node.other') === null,
      set.grants);
    const holders = [await holdersOf(client, names[0]), await holdersOf(client, names[1])];
    check('multi-lock: both locks still held by the set\'s holder after its lease, renewed as one',
      holders.every((h) => h.length === 1 && h[0] === set.holder) && !set.lost, holders);
    const busy = await client.acquire(names[1]).then(() => false, (e) => e instanceof LockBusyError);
    check('multi-lock: a lock of a held set is busy for others', busy);
  });
  const after = [await holdersOf(client, names[0]), await holdersOf(client, names[1])];
  check('multi-lock: withLockAll released the whole set', after.every((h) => h.length === 0), after);
  const moved = await transfer(client, 2, 1, 30, (...a) => a);
  check('multi-lock: a transfer holds both accounts, with a token for each',
    moved.slice(0, 3).join() === '2,1,30' && moved.slice(3).every((t) => BigInt(t) > 0n), moved);

  const other = await client.acquire(names[1], { ttlMs: 5000 });
  const refused = await client.acquireAll(names)
    .then(() => null, (e) => (e instanceof LockBusyError ? e.lockName : String(e)));
  check('multi-lock: all or nothing: a set with one lock taken is busy, and the free lock is left free',
    refused === names.join(',') && (await holdersOf(client, names[0])).length === 0, refused);
  await other.release();
  const twice = await client.acquireAll([names[0], names[0]])
    .then(() => null, (e) => (e instanceof InvalidArgumentError ? e.details : String(e)));
  check('multi-lock: a name twice rejects with InvalidArgumentError naming names',
    twice && twice.startsWith('names'), twice);

  const lost = await client.withLockAll(names, { holder: 'node-transfer', ttlMs: 600 }, async (set, signal) => {
    await client.call('Release', () => ({ namespace: client.namespace, name: names[0], holder: 'node-transfer' }));
    await sleep(2000, signal).catch(() => {}); // the next renewal of the set hears NOT_HELD and aborts the signal
    return signal.aborted ? 'aborted' : 'not aborted';
  }).then((r) => `resolved ${r}`, (e) => (e instanceof LockLostError ? e.message : String(e)));
  check('multi-lock: a lock of the set taken away: the signal aborts, withLockAll rejects with LockLostError, '
    + 'the rest is freed', lost.includes('lock lost') && (await holdersOf(client, names[1])).length === 0, lost);
  const set = await client.acquireAll(names, { ttlMs: 5000 });
  const extended = (await set.extend(10000)) === set;
  check('multi-lock: extend and release act on the set', extended && (await set.release())
    && (await holdersOf(client, names[0])).length === 0);
}

// a holds x and waits for y; b holds y: b's wait for x would close the cycle and is refused at once.
async function deadlockChecks(client, check) {
  const x = await client.acquire('node.deadlock-x', { holder: 'node-a', ttlMs: 10000 });
  const y = await client.acquire('node.deadlock-y', { holder: 'node-b', ttlMs: 10000 });
  const waiting = client.acquire('node.deadlock-y', { holder: 'node-a', waitMs: 10000, ttlMs: 10000 });
  await sleep(1200); // past a's own check (a tenth of its wait, at most 1 s): only b's wait closes the cycle
  const started = performance.now();
  const refused = await client.acquire('node.deadlock-x', { holder: 'node-b', waitMs: 10000 })
    .then(() => null, (e) => (e instanceof DeadlockError ? e.details : String(e)));
  const elapsed = performance.now() - started;
  check('deadlock: a wait that closes a cycle rejects with DeadlockError at once, naming the cycle',
    refused && refused.startsWith('deadlock: ') && refused.includes('node-a') && elapsed < 5000, { refused, elapsed });
  await y.release();
  const granted = await waiting.catch((e) => e);
  check('deadlock: the other waiter is granted once the cycle is broken',
    granted && granted.fencingToken, String(granted));
  await Promise.all([x.release(), granted.release?.()]);
}

async function allChecks(client) {
  const checks = [];
  const check = (what, ok, detail) => checks.push({ what, ok: Boolean(ok), detail });
  const running = {}; const peak = {}; let peakAll = 0; let all = 0;
  const slots = new Set(); const order = [];
  const job = (account, i) => withAccount(client, account, `sync-${account}-${i}`, async (lock) => {
    running[account] = (running[account] || 0) + 1; all += 1;
    peak[account] = Math.max(peak[account] || 0, running[account]); peakAll = Math.max(peakAll, all);
    slots.add(`${account}:${lock.slot}`);
    order.push([BigInt(lock.fencingToken), lock.holder]); // tokens grow in grant order
    await sleep(250); // the sync
    running[account] -= 1; all -= 1;
  });
  // Start the jobs of account 42 one after the other, each once the previous
  // one holds a permit or waits in the queue (so the arrival order is known),
  // then account 7's.
  const arrived = async (n) => { // granted so far + waiting now
    const name = 'account-sync/42';
    while (order.filter(([, h]) => h.startsWith('sync-42-')).length
      + (await client.queue(name)).waiters < n) await sleep(5);
  };
  const jobs = [];
  for (let i = 1; i <= 5; i += 1) { jobs.push(job(42, i)); await arrived(i); }
  jobs.push(job(7, 1), job(7, 2));
  await Promise.all(jobs);
  check('lock around an ID: 7 syncs over 2 accounts all ran', order.length === 7, order.map(([, h]) => h));
  check('lock around an ID: at most 2 syncs of account 42 at once, and 2 did run together', peak[42] === 2, peak);
  check('lock around an ID: another account is not held up (3 or more syncs ran at once)', peakAll >= 3, { peakAll });
  check('lock around an ID: slots stay in 1..2 per account',
    [...slots].every((s) => ['1', '2'].includes(s.split(':')[1])), [...slots]);
  const o42 = order.sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([, h]) => h).filter((h) => h.startsWith('sync-42-'));
  check('lock around an ID: waiters of account 42 were served in arrival order',
    JSON.stringify(o42) === JSON.stringify([1, 2, 3, 4, 5].map((i) => `sync-42-${i}`)), o42);
  await electionChecks(client, check);
  await weightedChecks(client, check);
  await multiChecks(client, check);
  await deadlockChecks(client, check);
  return { checks };
}

async function main(addr, namespace, cmd) {
  const client = new Client(addr, { namespace });
  try {
    if (cmd === 'all') return await allChecks(client);
    throw new Error(`unknown command ${cmd}`);
  } finally {
    client.close();
  }
}

main(...process.argv.slice(2)).then(
  (out) => console.log(JSON.stringify(out)),
  (err) => { console.error(err); process.exit(1); },
);
