'use strict';
// Easy mistakes answered in words, before any call or after a failed one:
// an option this call does not know, and an unreachable server. Run with
// the installed package on NODE_PATH (clients/test.sh), or from the
// package folder after `npm ci`.
const test = require('node:test');
const assert = require('node:assert');
const net = require('node:net');
const { Client, UnavailableError } = require('tumbler-client');

// A loopback port nobody listens on (bound, then closed).
async function closedPort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

test('a misspelt option is refused, naming it and the one meant', async () => {
  const client = new Client(`127.0.0.1:${await closedPort()}`);
  try {
    await assert.rejects(client.acquire('x', { ttlMS: 1000 }),
      (err) => err instanceof TypeError && /unknown option "ttlMS" \(did you mean "ttlMs"\?\)/.test(err.message));
    await assert.rejects(client.acquireAll(['a', 'b'], { waitMS: 10 }), /did you mean "waitMs"/);
    await assert.rejects(client.campaign('e', { valu: 'v' }), /unknown option "valu"; known: value/);
    assert.throws(() => new Client('127.0.0.1:1', { nameSpace: 'x' }), /did you mean "namespace"/);
  } finally {
    client.close();
  }
});

test('an unreachable server is UnavailableError ending with its cause, no empty note', async () => {
  // grpc-js's own details for a refused connection, as it words them.
  const { fromGrpcError } = require('tumbler-client/lib/errors');
  const { status } = require('@grpc/grpc-js');
  const details = 'No connection established. Last error: connect ECONNREFUSED 127.0.0.1:9 (2026-11-29T08:00:00.000Z). Resolution note: ';
  const err = fromGrpcError(Object.assign(new Error(details), { code: status.UNAVAILABLE, details }));
  assert.ok(err instanceof UnavailableError);
  assert.strictEqual(err.message,
    'UNAVAILABLE: No connection established. Last error: connect ECONNREFUSED 127.0.0.1:9 (2026-11-29T08:00:00.000Z)');
  // A note with something in it stays.
  const noted = fromGrpcError({ code: status.UNAVAILABLE, details: 'x. Resolution note: DNS failed' });
  assert.match(noted.message, /Resolution note: DNS failed$/);
  // And through a real refused connection, when the retries end on it.
  const client = new Client(`127.0.0.1:${await closedPort()}`);
  try {
    const seen = await client.acquire('x', { timeoutMs: 2000 }).catch((e) => e);
    assert.doesNotMatch(String(seen.message), /Resolution note: *$/);
  } finally {
    client.close();
  }
});
