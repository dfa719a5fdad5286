#!/usr/bin/env node
'use strict';
// Node's steps of the cross-language conformance scenario (clients/conformance).
// usage: conformance_steps.js ADDR NAMESPACE STEP ARGS...   — prints one JSON line.
const { Client, NotAcquiredError } = require('./index');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const grantJson = (lock) => ({ holder: lock.holder, token: lock.fencingToken, slot: lock.slot,
  acquired_at_ms: Number(lock.grant.acquiredAtMs) });

async function main(addr, namespace, step, ...args) {
  const client = new Client(addr, { namespace });
  try {
    switch (step) {
      case 'hold': { // NAME HOLDER LIMIT
        try {
          const lock = await client.acquire(args[0], { holder: args[1], limit: Number(args[2]), ttlMs: 60000 });
          return { status: 'ACQUIRED', ...grantJson(lock) };
        } catch (e) {
          if (e instanceof NotAcquiredError) return { status: e.busy ? 'BUSY' : 'TIMEOUT', holders: e.response.holders };
          throw e;
        }
      }
      case 'release': { // NAME HOLDER
        const resp = await client.call('Release', { namespace, name: args[0], holder: args[1] });
        return { released: resp.status === 'RELEASE_STATUS_RELEASED' };
      }
      case 'wait': { // NAME HOLDER WAIT_MS HOLD_MS
        return await client.withLock(args[0], { holder: args[1], waitMs: Number(args[2]), ttlMs: 60000 }, async (lock) => {
          const out = grantJson(lock);
          await sleep(Number(args[3]));
          out.released_at_ms = Date.now();
          return out;
        });
      }
      case 'scoped': { // NAME
        const out = await client.withLock(args[0], { ttlMs: 2000 }, async (lock) => {
          const o = grantJson(lock);
          const before = Number(lock.grant.expiresAtMs);
          await sleep(50);
          await lock.extend(30000);
          o.extended = Number(lock.grant.expiresAtMs) > before;
          return o;
        });
        out.holders_after = (await client.inspect(args[0])).holders.length;
        return out;
      }
      case 'inspect': { // NAME
        const info = await client.inspect(args[0]);
        const queue = await client.call('Queue', { namespace, name: args[0] });
        return { limit: info.limit, waiters: info.waiters,
          holders: info.holders.map((h) => ({ holder: h.grant.holder, token: h.grant.fencingToken, slot: h.grant.slot })),
          queue: queue.requests.map((r) => r.holder) };
      }
      case 'invalid': { // bad input: a kind outside [a-z0-9_.-]
        try {
          await client.acquire('conformance-invalid', { kind: 'Bad Kind!' });
          return { field: 'kind', code: 'OK' };
        } catch (e) {
          const { status } = require('@grpc/grpc-js');
          return { field: 'kind', code: Object.keys(status).find((k) => status[k] === e.code), message: e.details };
        }
      }
      default:
        throw new Error(`unknown step ${step}`);
    }
  } finally {
    client.close();
  }
}

main(...process.argv.slice(2)).then(
  (out) => console.log(JSON.stringify(out)),
  (err) => { console.error(err); process.exit(1); },
);
