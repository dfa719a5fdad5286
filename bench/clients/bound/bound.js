// node bound.js ADDR PAIRS [ROUNDS]
//
// The floor under the Node client (issue 50 item 4): what one call costs
// through Node's transports doing nothing else, against one server, beside
// the client itself on both of its transports. One caller, sequential
// acquire+release pairs (the same lock, try-once, lease 10 s), each row
// warmed up with 200 pairs; the rows take turns in ROUNDS (default 3)
// rounds of PAIRS/ROUNDS pairs, so every row meets the same load. Prints,
// per row, µs per call (a call is half a pair) and this process's CPU per
// call (process.cpuUsage, user+system), the median round's wall time.
//
//   grpc-js stub        @grpc/grpc-js: the proto-loader stub's Acquire and
//                       Release, requests built once, no deadline or metadata
//   http.Agent Connect  Connect binary proto through Node's `http` module with
//                       a keep-alive Agent (one socket), noDelay
//   net Connect         Connect binary proto over one kept-alive `net`
//                       socket (TCP_NODELAY, one write per request), the
//                       answer read by its Content-Length
//   client (connect)    tumbler-client, the default transport
//   client (grpc)       tumbler-client with transport: 'grpc'
//   Rust client         with RUST_PAIRS=target/release/tumbler-client-bench:
//                       the client bench's Rust arm (tonic), run as a child
//                       process for each round (its own warm-up of 20
//                       pairs; its CPU is not this process's, so none is shown)
//
// and each row's µs per call ÷ the Rust client's when it ran.
//
// Needs tumbler-client (and so @grpc/grpc-js) on NODE_PATH, e.g.
//   cd clients/node && npm ci && cd - && NODE_PATH=$PWD/clients/node/node_modules:<dir with tumbler-client> node bench/clients/bound/bound.js 127.0.0.1:50051 3000
'use strict';
const { execFileSync } = require('node:child_process');
const http = require('node:http');
const net = require('node:net');
const { Client, loadProto } = require('tumbler-client');

const [addr, pairsArg, roundsArg] = process.argv.slice(2);
const pairs = Number(pairsArg || 3000);
const rounds = Number(roundsArg || 3);
const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
const TTL_MS = 10000;
const svc = loadProto().LockService;
const M = svc.service;
const acq = { name: 'bound-node', holder: 'bound-node', ttlMs: TTL_MS };
const rel = { name: 'bound-node', holder: 'bound-node' };

function grpcStub() {
  const grpc = require('@grpc/grpc-js');
  const stub = new svc(addr, grpc.credentials.createInsecure());
  const call = (m, req) => new Promise((resolve, reject) => stub[m](req, (e, r) => (e ? reject(e) : resolve(r))));
  return {
    pair: async () => {
      const a = await call('Acquire', acq);
      if (a.status !== 'ACQUIRE_STATUS_ACQUIRED') throw new Error(a.status);
      const r = await call('Release', rel);
      if (r.status !== 'RELEASE_STATUS_RELEASED') throw new Error(r.status);
    },
    close: () => stub.close(),
  };
}

function agentConnect() {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1, noDelay: true });
  const call = (m, body) => new Promise((resolve, reject) => {
    const req = http.request({
      host, port, agent, method: 'POST', path: `/tumbler.v1.LockService/${m}`,
      headers: { 'content-type': 'application/proto', 'connect-protocol-version': '1', 'content-length': body.length },
    }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => (res.statusCode === 200 ? resolve(M[m].responseDeserialize(Buffer.concat(parts)))
        : reject(new Error(`HTTP ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end(body);
  });
  const a = M.Acquire.requestSerialize(acq);
  const r = M.Release.requestSerialize(rel);
  return {
    pair: async () => {
      if ((await call('Acquire', a)).status !== 'ACQUIRE_STATUS_ACQUIRED') throw new Error('acquire');
      if ((await call('Release', r)).status !== 'RELEASE_STATUS_RELEASED') throw new Error('release');
    },
    close: () => agent.destroy(),
  };
}

function netConnect() {
  const socket = net.connect({ host, port, noDelay: true });
  const request = (m, body) => Buffer.concat([Buffer.from(`POST /tumbler.v1.LockService/${m} HTTP/1.1\r\n`
    + `Host: ${addr}\r\nContent-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n`
    + `Content-Length: ${body.length}\r\n\r\n`, 'latin1'), body]);
  const a = request('Acquire', M.Acquire.requestSerialize(acq));
  const r = request('Release', M.Release.requestSerialize(rel));
  let buf = null;
  let waiter = null;
  socket.on('data', (chunk) => {
    buf = buf === null ? chunk : Buffer.concat([buf, chunk]);
    const end = buf.indexOf('\r\n\r\n');
    if (end < 0) return;
    const head = buf.latin1Slice(0, end).toLowerCase();
    const at = head.indexOf('content-length:');
    const length = Number(head.slice(at + 15, head.indexOf('\r\n', at) >>> 0).trim());
    if (buf.length < end + 4 + length) return;
    const body = buf.subarray(end + 4, end + 4 + length);
    const ok = head.startsWith('http/1.1 200');
    buf = null;
    const w = waiter;
    waiter = null;
    if (ok) w.resolve(body); else w.reject(new Error(head.slice(0, 12)));
  });
  const call = (m, bytes) => new Promise((resolve, reject) => {
    waiter = { resolve: (b) => resolve(M[m].responseDeserialize(b)), reject };
    socket.write(bytes);
  });
  return {
    pair: async () => {
      if ((await call('Acquire', a)).status !== 'ACQUIRE_STATUS_ACQUIRED') throw new Error('acquire');
      if ((await call('Release', r)).status !== 'RELEASE_STATUS_RELEASED') throw new Error('release');
    },
    close: () => socket.destroy(),
  };
}

function client(transport) {
  const c = new Client(addr, { transport, namespace: `bound-${transport}` });
  return {
    pair: async () => {
      const lock = await c.acquire('bound-node', { ttlMs: TTL_MS });
      if (!(await lock.release())) throw new Error('release: not held');
    },
    close: () => c.close(),
  };
}

// The Rust arm of bench/clients/run.sh for `count` pairs: its own "pairs=N secs=S" is the time measured.
function rustRow(bin) {
  return {
    external: (count) => {
      const out = execFileSync(bin, ['tumbler', addr, '1', String(count), '600'], { encoding: 'utf8' });
      const [, done, secs] = out.match(/pairs=(\d+) secs=([\d.]+)/);
      return (Number(secs) * 1e6) / (2 * Number(done));
    },
    close: () => {},
  };
}

async function main() {
  const rows = [['grpc-js stub', grpcStub()], ['http.Agent Connect', agentConnect()], ['net Connect', netConnect()],
    ['client (connect)', client('connect')], ['client (grpc)', client('grpc')]];
  if (process.env.RUST_PAIRS) rows.unshift(['Rust client (tonic)', rustRow(process.env.RUST_PAIRS)]);
  for (const [, row] of rows) for (let i = 0; i < 200 && row.pair; i += 1) await row.pair();
  const seen = new Map(rows.map(([name]) => [name, []]));
  const each = Math.max(1, Math.floor(pairs / rounds));
  for (let round = 0; round < rounds; round += 1) {
    for (const [name, row] of rows) {
      if (row.external) { seen.get(name).push({ wall: row.external(each), cpu: NaN }); continue; }
      const cpu = process.cpuUsage();
      const t0 = performance.now();
      for (let i = 0; i < each; i += 1) await row.pair();
      const wall = performance.now() - t0;
      const used = process.cpuUsage(cpu);
      seen.get(name).push({ wall: (wall * 1000) / (2 * each), cpu: (used.user + used.system) / (2 * each) });
    }
  }
  const rust = seen.get('Rust client (tonic)');
  const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  for (const [name, row] of rows) {
    row.close();
    const xs = seen.get(name);
    const wall = median(xs.map((x) => x.wall));
    const cpu = median(xs.map((x) => x.cpu));
    // Per round, over the Rust client's in the same round; the median of those.
    const ratio = rust ? ` ${median(xs.map((x, i) => x.wall / rust[i].wall)).toFixed(2)} x Rust` : '';
    console.log(`${name.padEnd(20)} ${wall.toFixed(0).padStart(6)} µs per call${ratio}`
      + `  ${Number.isNaN(cpu) ? '    -' : cpu.toFixed(0).padStart(5)} µs CPU per call`
      + `  (rounds: ${xs.map((x) => x.wall.toFixed(0)).join(', ')})`);
  }
}

main().catch((e) => { console.error(e.stack || e); process.exit(1); });
