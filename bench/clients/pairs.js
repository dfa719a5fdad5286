// node pairs.js TARGET ADDR CALLERS PAIRS SECS
//
// The Node arms of bench/clients/run.sh: acquire+release pairs, try-once,
// each caller on its own lock name. TARGET `tumbler` (tumbler-client, one
// Client shared by CALLERS async callers) or `redis` (ioredis, one
// connection shared by them, as ioredis is used: SET key token NX PX ttl,
// then compare-and-delete as a defineCommand script, i.e. EVALSHA). A
// warm-up of 20 pairs per caller, then up to PAIRS pairs in all, cut at
// SECS seconds. Prints "pairs=N secs=S"; a pair not granted and released
// fails the run. The client's unary calls go over its default transport
// (Connect on kept-alive HTTP/1.1 for a plaintext address);
// TUMBLER_NODE_TRANSPORT=grpc measures them over @grpc/grpc-js instead.
'use strict';
const crypto = require('node:crypto');

const TTL_MS = 10000;
const UNLOCK = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";
const [target, addr, callersArg, pairsArg, secsArg] = process.argv.slice(2);
const callers = Number(callersArg);
const pairs = Number(pairsArg);
const secs = Number(secsArg);
const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];

async function runCallers(pair, total, deadline) {
  let done = 0;
  const one = async (i, n) => {
    const name = `bench-node-${process.pid}-${i}`;
    for (let k = 0; k < n; k += 1) {
      if (deadline !== null && performance.now() >= deadline) break;
      await pair(name);
      done += 1;
    }
  };
  const share = (i) => Math.floor(total / callers) + (i < total % callers ? 1 : 0);
  await Promise.all(Array.from({ length: callers }, (_, i) => one(i, share(i))));
  return done;
}

async function measure(pair) {
  await runCallers(pair, 20 * callers, null);
  const start = performance.now();
  const done = await runCallers(pair, pairs, start + secs * 1000);
  return [done, (performance.now() - start) / 1000];
}

async function main() {
  let result;
  if (target === 'tumbler') {
    const { Client } = require('tumbler-client');
    const transport = process.env.TUMBLER_NODE_TRANSPORT;
    const client = new Client(addr, transport ? { transport } : {});
    try {
      result = await measure(async (name) => {
        const lock = await client.acquire(name, { ttlMs: TTL_MS });
        if (!(await lock.release())) throw new Error(`release ${name}: not held`);
      });
    } finally {
      client.close();
    }
  } else if (target === 'redis') {
    const Redis = require('ioredis');
    const redis = new Redis({ host, port, lazyConnect: true });
    await redis.connect();
    redis.defineCommand('unlock', { numberOfKeys: 1, lua: UNLOCK });
    try {
      result = await measure(async (name) => {
        const token = crypto.randomUUID();
        if ((await redis.set(name, token, 'PX', TTL_MS, 'NX')) !== 'OK') throw new Error(`SET ${name}: not acquired`);
        if ((await redis.unlock(name, token)) !== 1) throw new Error(`unlock ${name}: not held`);
      });
    } finally {
      redis.disconnect();
    }
  } else {
    throw new Error(`unknown target ${target}`);
  }
  console.log(`pairs=${result[0]} secs=${result[1].toFixed(6)}`);
}

main().catch((e) => { console.error(`node ${target}: ${e.stack || e}`); process.exit(1); });
