'use strict';
// The Connect transport of the unary calls (lib/connect.js) against a real
// `tumbler serve` over its own redis-server on free loopback ports (stopped
// by pid), some calls through a relay in front of it that this test drives
// (answers split into single bytes, kept-alive connections closed, requests
// dropped, answers held back):
//
// - a plaintext client sends its unary calls over Connect; transport 'grpc'
//   or TLS credentials keep grpc-js; answers and errors are grpc-js's
//   (InvalidArgumentError naming the field, LockBusyError with the reply);
// - connections are kept alive and reused; one the server closed is
//   replaced, and a request dropped on a reused one is sent once more;
// - an answer split across reads is read whole, errors too;
// - a call past its deadline ends at the deadline and closes its
//   connection; an aborted waiting acquire leaves the server's queue;
// - Redis stopped under the server, or the server gone, is UnavailableError;
//   a call retried with the same holder lands once it is back.
//
//   TUMBLER_BIN=target/debug/tumbler node --test clients/node/test/
// (from the package folder after `npm ci`, or with the installed package on
// NODE_PATH). Without a server binary these tests are skipped, saying so.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const {
  Client, grpc, InvalidArgumentError, LockBusyError, LockTimeoutError, TumblerError, UnavailableError,
} = require('tumbler-client');
const { parseAnswer } = require('tumbler-client/lib/connect');
const { fromGrpcError } = require('tumbler-client/lib/errors');

const BIN = process.env.TUMBLER_BIN || path.join(__dirname, '..', '..', '..', 'target', 'debug', 'tumbler');
const HAVE_BIN = fs.existsSync(BIN);
const LOGS = fs.mkdtempSync(path.join(os.tmpdir(), 'tumbler-node-transport-'));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function waitListening(proc, port, what) {
  for (let i = 0; i < 600; i += 1) {
    if (proc.exitCode !== null) throw new Error(`${what} exited (logs in ${LOGS})`);
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => { s.destroy(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (ok) return;
    await sleep(50);
  }
  throw new Error(`${what} did not listen on ${port} (logs in ${LOGS})`);
}

function start(name, argv) {
  const log = fs.openSync(path.join(LOGS, `${name}.log`), 'a');
  const proc = spawn(argv[0], argv.slice(1), { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  return proc;
}

async function stop(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  const gone = new Promise((resolve) => proc.once('exit', resolve));
  proc.kill('SIGTERM');
  const t = setTimeout(() => proc.kill('SIGKILL'), 15000);
  await gone;
  clearTimeout(t);
}

async function startRedis(port) {
  const p = port || await freePort();
  const proc = start(`redis-${p}`, ['redis-server', '--port', String(p), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no']);
  await waitListening(proc, p, 'redis-server');
  return { proc, port: p };
}

async function startServer(redisPort, port) {
  const p = port || await freePort();
  const proc = start(`tumbler-${p}`, [BIN, 'serve', '--listen', `127.0.0.1:${p}`, '--http-listen', 'off',
    '--no-auth', '--shutdown-drain-ms', '0', '--redis-url', `redis://127.0.0.1:${redisPort}`]);
  await waitListening(proc, p, 'tumbler serve');
  return { proc, port: p, addr: `127.0.0.1:${p}` };
}

// A TCP relay in front of the server: `split` sends the server's bytes one
// at a time, each in its own write a little later; `hold` keeps them back;
// `dropNext` closes the next connection that sends a request, before it
// reaches the server; closeAll() closes every connection from the client's
// side (a server closing its kept-alive connections).
async function startRelay(upstreamPort) {
  const relay = { accepted: 0, closed: 0, split: false, hold: false, dropNext: false, pairs: new Set() };
  const server = net.createServer((down) => {
    relay.accepted += 1;
    const up = net.connect(upstreamPort, '127.0.0.1');
    const pair = { down, up };
    relay.pairs.add(pair);
    const end = () => {
      if (!relay.pairs.delete(pair)) return;
      relay.closed += 1;
      down.destroy();
      up.destroy();
    };
    down.on('data', (chunk) => {
      if (relay.dropNext) { relay.dropNext = false; end(); return; }
      up.write(chunk);
    });
    let queue = Promise.resolve();
    up.on('data', (chunk) => {
      if (relay.hold) return;
      if (!relay.split) { down.write(chunk); return; }
      queue = queue.then(async () => {
        for (let i = 0; i < chunk.length; i += 1) {
          if (down.destroyed) return;
          down.write(chunk.subarray(i, i + 1));
          await sleep(1);
        }
      });
    });
    for (const s of [down, up]) { s.on('close', end); s.on('error', end); }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  relay.addr = `127.0.0.1:${server.address().port}`;
  relay.closeAll = () => { for (const { down, up } of [...relay.pairs]) { down.destroy(); up.destroy(); } };
  relay.close = () => { relay.closeAll(); return new Promise((resolve) => server.close(resolve)); };
  return relay;
}

let nsCount = 0;
const ns = () => `node-connect-${process.pid}-${nsCount += 1}`;

test('parseAnswer reads lengths, chunks and read-to-close answers, and waits for the rest', () => {
  const whole = Buffer.from('HTTP/1.1 200 OK\r\ncontent-type: application/proto\r\ncontent-length: 3\r\n\r\nabc');
  for (let i = 0; i < whole.length; i += 1) assert.strictEqual(parseAnswer(whole.subarray(0, i), false), null);
  const a = parseAnswer(whole, false);
  assert.deepStrictEqual([a.status, a.body.toString(), a.keep, a.used], [200, 'abc', true, whole.length]);
  const chunked = Buffer.from('HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n'
    + '3\r\n{"c\r\n2;x=1\r\nx}\r\n0\r\n\r\n');
  for (let i = 0; i < chunked.length; i += 1) assert.strictEqual(parseAnswer(chunked.subarray(0, i), false), null);
  const c = parseAnswer(chunked, false);
  assert.deepStrictEqual([c.status, c.body.toString(), c.keep, c.used], [400, '{"cx}', false, chunked.length]);
  const toClose = Buffer.from('HTTP/1.0 503 Unavailable\r\n\r\nbusy');
  assert.strictEqual(parseAnswer(toClose, false), null);
  const t = parseAnswer(toClose, true);
  assert.deepStrictEqual([t.status, t.body.toString(), t.keep], [503, 'busy', false]);
  assert.throws(() => parseAnswer(Buffer.from('SSH-2.0-x\r\n\r\n'), false), /not an HTTP\/1.1 answer/);
});

test('no message has a bytes field (answers are decoded in place from the read buffer)', () => {
  // protobufjs gives a bytes field as a view of the buffer it decodes; lib/connect.js decodes answers
  // straight from each connection's read buffer, which the next answer overwrites. A bytes field would
  // need the body copied first (Conn.finish).
  const { PROTO_DIR } = require('tumbler-client/lib/client');
  const proto = fs.readFileSync(path.join(PROTO_DIR, 'tumbler', 'v1', 'lock.proto'), 'utf8');
  assert.doesNotMatch(proto, /^\s*(repeated\s+|optional\s+)?bytes\s+\w+\s*=/m);
  assert.match(proto, /^\s*string holder = \d+;/m, 'the pattern reads fields');
});

test('the transport is chosen from the target and the credentials', () => {
  assert.strictEqual(new Client('127.0.0.1:1').transport, 'connect');
  assert.strictEqual(new Client('localhost:1', { credentials: grpc.credentials.createInsecure() }).transport, 'connect');
  assert.strictEqual(new Client('[::1]:1').connect.authority, '[::1]:1');
  assert.strictEqual(new Client('127.0.0.1:1', { transport: 'grpc' }).transport, 'grpc');
  assert.strictEqual(new Client('localhost:1', { credentials: grpc.credentials.createSsl() }).transport, 'grpc');
  assert.strictEqual(new Client('dns:///localhost:1').transport, 'grpc');
  assert.throws(() => new Client('dns:///localhost:1', { transport: 'connect' }), /needs a plaintext host:port/);
  assert.throws(() => new Client('localhost:1', { transport: 'connect', credentials: grpc.credentials.createSsl() }),
    /with TLS credentials/);
  assert.throws(() => new Client('localhost:1', { transport: 'http' }), /not one of auto, connect, grpc/);
});

test('against a real server', { skip: HAVE_BIN ? false : `no server binary at ${BIN} (set TUMBLER_BIN)` }, async (t) => {
  const redis = await startRedis();
  const server = await startServer(redis.port);
  const relay = await startRelay(server.port);
  t.after(async () => { await relay.close(); await stop(server.proc); await stop(redis.proc); });

  await t.test('unary calls go over Connect and answer as grpc-js does', async () => {
    const namespace = ns();
    const client = new Client(server.addr, { namespace });
    const viaGrpc = new Client(server.addr, { namespace, transport: 'grpc' });
    try {
      const lock = await client.acquire('a', { ttlMs: 5000, kind: 'job', metadata: { k: 'v' } });
      assert.match(lock.fencingToken, /^\d+$/);
      const seen = await viaGrpc.inspect('a');
      assert.deepStrictEqual(seen.holders.map((h) => h.grant.holder), [lock.holder]);
      const again = await client.inspect('a');
      assert.deepStrictEqual(Object.keys(again).sort(), Object.keys(seen).sort());
      assert.deepStrictEqual(again.holders[0].grant, seen.holders[0].grant);
      assert.deepStrictEqual(again.holders[0].grant.metadata, { k: 'v' });
      // The same holder asking again gets the same grant (what a retry relies on).
      const same = await client.acquire('a', { holder: lock.holder, ttlMs: 5000 });
      assert.strictEqual(same.fencingToken, lock.fencingToken);
      await lock.extend(8000);
      assert.strictEqual(await lock.release(), true);
      assert.strictEqual(await lock.release(), false);
      const leadership = await client.campaign('e', { value: 'v1', ttlMs: 3000 });
      assert.strictEqual((await viaGrpc.leader('e')).value, 'v1');
      await leadership.proclaim('v2');
      assert.strictEqual((await client.leader('e')).value, 'v2');
      assert.strictEqual(await leadership.resign(), true);
      assert.strictEqual(await client.leader('e'), null);
      assert.strictEqual(client.connect.idle.length, 1, 'one kept-alive connection served every call');
    } finally {
      client.close();
      viaGrpc.close();
    }
  });

  await t.test('errors are the grpc transport\'s: a bad field names it, busy carries the reply', async () => {
    const namespace = ns();
    const client = new Client(server.addr, { namespace });
    const viaGrpc = new Client(server.addr, { namespace, transport: 'grpc' });
    try {
      const seen = [];
      for (const c of [client, viaGrpc]) {
        const err = await c.acquire('b', { kind: 'NOT A KIND' }).catch((e) => e);
        assert.ok(err instanceof InvalidArgumentError, String(err));
        assert.strictEqual(err.code, grpc.status.INVALID_ARGUMENT);
        assert.match(err.details, /^kind: /);
        seen.push(err.message);
        const many = await c.acquireAll(['x', 'x']).catch((e) => e);
        assert.ok(many instanceof InvalidArgumentError && /^names\[1\]: /.test(many.details), String(many));
      }
      assert.strictEqual(seen[0], seen[1]);
      const held = await viaGrpc.acquire('b', { ttlMs: 5000 });
      const busy = await client.acquire('b').catch((e) => e);
      assert.ok(busy instanceof LockBusyError, String(busy));
      assert.strictEqual(busy.response.holders, 1);
      const late = await client.acquire('b', { waitMs: 200 }).catch((e) => e);
      assert.ok(late instanceof LockTimeoutError && late.response, String(late));
      await held.release();
    } finally {
      client.close();
      viaGrpc.close();
    }
  });

  await t.test('a kept-alive connection the server closed is replaced; a dropped request is sent again', async () => {
    const client = new Client(relay.addr, { namespace: ns() });
    try {
      for (let i = 0; i < 5; i += 1) await (await client.acquire('c', { ttlMs: 5000 })).release();
      const first = relay.accepted;
      const conn = client.connect.idle[0];
      relay.closeAll(); // the server ends its idle connections
      await sleep(100);
      assert.ok(conn.dead, 'the client saw it go');
      await (await client.acquire('c', { ttlMs: 5000 })).release();
      assert.strictEqual(relay.accepted, first + 1);
      assert.notStrictEqual(client.connect.idle[0], conn);
      // Closed just as the request went out: nothing came back, so it is sent once more on a fresh
      // connection, within the one try (the watchdog's renewals are single tries).
      const lock = await client.acquire('c', { ttlMs: 5000 });
      relay.dropNext = true;
      const renewed = await client.callOnce('Extend', lock.extendRequest(6000), 2000);
      assert.strictEqual(renewed.status, 'EXTEND_STATUS_EXTENDED');
      assert.strictEqual(relay.accepted, first + 2);
      assert.strictEqual(await lock.release(), true);
      // Dropped on a fresh connection, the try fails as UNAVAILABLE (the client's own retries take it from there).
      relay.closeAll();
      await sleep(50);
      relay.dropNext = true;
      const dropped = await client.callOnce('Inspect', { namespace: client.namespace, name: 'c' }, 2000).catch((e) => e);
      assert.strictEqual(dropped.code, grpc.status.UNAVAILABLE, String(dropped));
    } finally {
      client.close();
    }
  });

  await t.test('an answer split across reads is read whole, errors too', async () => {
    const client = new Client(relay.addr, { namespace: ns() });
    relay.split = true;
    try {
      const lock = await client.acquire('d', { ttlMs: 5000 });
      const busy = await client.acquire('d').catch((e) => e);
      assert.ok(busy instanceof LockBusyError, String(busy));
      const bad = await client.acquire('d', { kind: 'NOT A KIND' }).catch((e) => e);
      assert.ok(bad instanceof InvalidArgumentError && /^kind: /.test(bad.details), String(bad));
      assert.strictEqual((await client.inspect('d')).holders.length, 1);
      assert.strictEqual(await lock.release(), true);
      assert.strictEqual(client.connect.idle.length, 1);
    } finally {
      relay.split = false;
      client.close();
    }
  });

  await t.test('an answer longer than the read buffer is read in pieces', async () => {
    const client = new Client(server.addr, { namespace: ns() });
    try {
      const locks = [];
      for (let i = 0; i < 40; i += 1) {
        locks.push(await client.acquire('big', { limit: 40, ttlMs: 10000, metadata: { note: `${i}`.padEnd(480, '.') } }));
      }
      const seen = await client.inspect('big');
      assert.strictEqual(seen.holders.length, 40);
      assert.ok(seen.holders.every((h) => h.grant.metadata.note.length === 480));
      const viaGrpc = new Client(server.addr, { namespace: client.namespace, transport: 'grpc' });
      assert.deepStrictEqual(seen.holders.map((h) => h.grant), (await viaGrpc.inspect('big')).holders.map((h) => h.grant));
      viaGrpc.close();
      for (const lock of locks) assert.strictEqual(await lock.release(), true);
    } finally {
      client.close();
    }
  });

  await t.test('a call past its deadline ends at the deadline and closes its connection', async () => {
    const client = new Client(relay.addr, { namespace: ns(), timeoutMs: 500 });
    try {
      await (await client.acquire('f', { ttlMs: 5000 })).release();
      const closedBefore = relay.closed;
      relay.hold = true; // the server answers, the answer never arrives
      let t0 = performance.now();
      const err = await client.inspect('f').catch((e) => e);
      assert.ok(err instanceof TumblerError, String(err));
      assert.strictEqual(err.code, grpc.status.DEADLINE_EXCEEDED);
      t0 = performance.now();
      const late = await client.acquire('f', { waitMs: 100, timeoutMs: 400 }).catch((e) => e);
      const took = performance.now() - t0;
      assert.ok(late instanceof LockTimeoutError, String(late));
      assert.ok(took >= 390 && took < 1500, `took ${took} ms`);
      await sleep(50);
      assert.ok(relay.closed >= closedBefore + 2, 'each cut call closed its connection');
    } finally {
      relay.hold = false;
      client.close();
    }
  });

  await t.test('an aborted waiting acquire leaves the server\'s queue', async () => {
    const client = new Client(server.addr, { namespace: ns() });
    try {
      const held = await client.acquire('g', { ttlMs: 10000 });
      const controller = new AbortController();
      const waiting = client.acquire('g', { holder: 'waiter', waitMs: 10000, signal: controller.signal });
      for (let i = 0; i < 100 && (await client.queue('g')).requests.length === 0; i += 1) await sleep(20);
      assert.deepStrictEqual((await client.queue('g')).requests.map((r) => r.holder), ['waiter']);
      controller.abort();
      await assert.rejects(waiting, { name: 'AbortError' });
      let left = ['waiter'];
      for (let i = 0; i < 100 && left.length; i += 1) {
        left = (await client.queue('g')).requests.map((r) => r.holder);
        if (left.length) await sleep(20);
      }
      assert.deepStrictEqual(left, []);
      await held.release();
    } finally {
      client.close();
    }
  });

  await t.test('Redis stopped under the server is UnavailableError; a retry with the same holder lands when it is back', async () => {
    const own = await startRedis();
    const front = await startServer(own.port);
    const client = new Client(front.addr, { namespace: ns(), retry: { initialMs: 20, maxMs: 200 } });
    let r = own;
    try {
      await (await client.acquire('h', { ttlMs: 5000 })).release();
      await stop(own.proc);
      // One try: the server's UNAVAILABLE, read from the Connect answer, is the client's UnavailableError.
      const once = await client.callOnce('Inspect', { namespace: client.namespace, name: 'h' }, 8000).catch((e) => e);
      assert.strictEqual(once.code, grpc.status.UNAVAILABLE, String(once));
      assert.match(once.details, /^lock store unavailable/);
      const err = fromGrpcError(once);
      assert.ok(err instanceof UnavailableError && err.message === `UNAVAILABLE: ${once.details}`, String(err));
      // The client's own call retries it with the same holder until Redis is back.
      const pending = client.acquire('h', { holder: 'kept-holder', ttlMs: 5000, timeoutMs: 15000 });
      await sleep(500);
      r = await startRedis(own.port);
      const lock = await pending;
      assert.strictEqual(lock.holder, 'kept-holder');
      assert.strictEqual(await lock.release(), true);
    } finally {
      client.close();
      await stop(front.proc);
      await stop(r.proc);
    }
  });

  await t.test('a server that is gone is UnavailableError; a retry keeps the holder and lands when it is back', async () => {
    const front = await startServer(redis.port);
    const client = new Client(front.addr, { namespace: ns(), timeoutMs: 1500, retry: { initialMs: 20, maxMs: 200 } });
    let back = null;
    try {
      await (await client.acquire('i', { ttlMs: 5000 })).release();
      await stop(front.proc);
      const err = await client.inspect('i').catch((e) => e);
      assert.ok(err instanceof UnavailableError, String(err));
      assert.match(err.message, /^UNAVAILABLE: .*ECONNREFUSED/);
      // A waiting acquire retried while the server is down lands once it is back, with the holder it was given.
      const pending = client.acquire('i', { holder: 'same-holder', ttlMs: 5000, waitMs: 4000 });
      await sleep(300);
      back = await startServer(redis.port, front.port);
      const lock = await pending;
      assert.strictEqual(lock.holder, 'same-holder');
      assert.strictEqual(await lock.release(), true);
    } finally {
      client.close();
      await stop(back?.proc);
    }
  });

  await t.test('idle connections do not keep the process alive', async () => {
    const script = `const { Client } = require('tumbler-client');
      new Client(${JSON.stringify(server.addr)}).inspect('j').then(() => console.log('done'));`;
    const child = spawn(process.execPath, ['-e', script], { env: process.env, cwd: process.cwd() });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const code = await Promise.race([new Promise((resolve) => child.once('exit', resolve)),
      sleep(10000).then(() => { child.kill(); return 'hung'; })]);
    assert.strictEqual(code, 0, out);
    assert.match(out, /done/);
  });
});
