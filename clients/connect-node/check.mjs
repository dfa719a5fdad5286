// tumbler through clients nobody here wrote: @connectrpc/connect-node's
// Connect transport (JSON over HTTP/1.1, binary over HTTP/2) and its
// gRPC-Web transport, with code generated from proto/ by buf and
// protoc-gen-es (npm run generate). Starts `tumbler dev` (its own
// redis-server) on free ports, runs each check, prints "N passed, M failed"
// and exits non-zero on any failure.
//
//   TUMBLER_BIN=target/debug/tumbler node check.mjs
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import {
  AcquireStatus,
  ExtendStatus,
  LockService,
  NotAcquiredReason,
  ReleaseStatus,
} from "./gen/tumbler/v1/lock_pb.js";

const bin = process.env.TUMBLER_BIN ?? fileURLToPath(new URL("../../target/debug/tumbler", import.meta.url));

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

const grpcPort = await freePort();
const httpPort = await freePort();
const server = spawn(bin, ["dev", "--listen", `127.0.0.1:${grpcPort}`, "--http-listen", `127.0.0.1:${httpPort}`], {
  stdio: ["ignore", "ignore", "pipe"],
});
let serverLog = "";
server.stderr.on("data", (chunk) => (serverLog += chunk));
const baseUrl = `http://127.0.0.1:${grpcPort}`;

const json1 = createClient(LockService, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
const binary2 = createClient(
  LockService,
  createConnectTransport({ baseUrl, httpVersion: "2", useBinaryFormat: true }),
);
const grpcWeb = createClient(LockService, createGrpcWebTransport({ baseUrl, httpVersion: "1.1" }));

// Ready when a call goes through (the server waits for its redis-server).
for (let i = 0; ; i++) {
  try {
    await json1.listNamespaces({});
    break;
  } catch (err) {
    if (i >= 100) throw new Error(`tumbler dev did not answer: ${err}\n${serverLog}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const checks = [];
const check = (name, fn) => checks.push([name, fn]);

check("Connect JSON over HTTP/1.1: acquire, busy, extend, inspect, release", async () => {
  const got = await json1.acquire({ name: "node-json", holder: "a", ttlMs: 30_000n });
  assert.equal(got.status, AcquireStatus.ACQUIRED);
  const token = got.grant.fencingToken;
  assert.equal(typeof token, "bigint");
  const busy = await json1.acquire({ name: "node-json", holder: "b" });
  assert.equal(busy.status, AcquireStatus.NOT_ACQUIRED);
  assert.equal(busy.reason, NotAcquiredReason.BUSY);
  const extended = await json1.extend({ name: "node-json", holder: "a", ttlMs: 60_000n, fencingToken: token });
  assert.equal(extended.status, ExtendStatus.EXTENDED);
  const seen = await json1.inspect({ name: "node-json" });
  assert.equal(seen.holders[0].grant.holder, "a");
  assert.equal(seen.holders[0].grant.fencingToken, token);
  const released = await json1.release({ name: "node-json", holder: "a", fencingToken: token });
  assert.equal(released.status, ReleaseStatus.RELEASED);
});

check("Connect binary over HTTP/2: acquire and release", async () => {
  const got = await binary2.acquire({ name: "node-binary", holder: "a" });
  assert.equal(got.status, AcquireStatus.ACQUIRED);
  const released = await binary2.release({ name: "node-binary", holder: "a", fencingToken: got.grant.fencingToken });
  assert.equal(released.status, ReleaseStatus.RELEASED);
});

check("an invalid request is ConnectError invalid_argument", async () => {
  await assert.rejects(json1.acquire({ name: "" }), (err) => {
    assert.ok(err instanceof ConnectError);
    assert.equal(err.code, Code.InvalidArgument);
    assert.match(err.rawMessage, /name/);
    return true;
  });
});

check("a waiting acquire ends by the call's timeoutMs", async () => {
  await json1.acquire({ name: "node-wait", holder: "a" });
  const started = Date.now();
  try {
    const answer = await json1.acquire({ name: "node-wait", holder: "b", waitMs: 20_000n }, { timeoutMs: 700 });
    assert.equal(answer.reason, NotAcquiredReason.TIMEOUT);
  } catch (err) {
    assert.equal(ConnectError.from(err).code, Code.DeadlineExceeded);
  }
  const took = Date.now() - started;
  assert.ok(took >= 500 && took < 5000, `took ${took} ms`);
});

check("Watch as Connect server streaming", async () => {
  const abort = new AbortController();
  const events = [];
  const watching = (async () => {
    try {
      for await (const event of binary2.watch({ name: "node-watch", initialState: true }, { signal: abort.signal })) {
        events.push(event.event);
        if (event.event === "synced") {
          const got = await json1.acquire({ name: "node-watch", holder: "w" });
          await json1.release({ name: "node-watch", holder: "w", fencingToken: got.grant.fencingToken });
        }
        if (event.event === "released") abort.abort();
      }
    } catch (err) {
      if (ConnectError.from(err).code !== Code.Canceled) throw err;
    }
  })();
  const timer = setTimeout(() => abort.abort(), 5000);
  await watching;
  clearTimeout(timer);
  assert.deepEqual(events, ["synced", "acquired", "released"]);
});

check("gRPC-Web (createGrpcWebTransport): acquire and release", async () => {
  const got = await grpcWeb.acquire({ name: "node-grpc-web", holder: "a" });
  assert.equal(got.status, AcquireStatus.ACQUIRED);
  const busy = await json1.acquire({ name: "node-grpc-web", holder: "b" });
  assert.equal(busy.reason, NotAcquiredReason.BUSY);
  const released = await grpcWeb.release({ name: "node-grpc-web", holder: "a", fencingToken: got.grant.fencingToken });
  assert.equal(released.status, ReleaseStatus.RELEASED);
  await assert.rejects(grpcWeb.acquire({ name: "" }), (err) => ConnectError.from(err).code === Code.InvalidArgument);
});

let passed = 0;
let failed = 0;
for (const [name, fn] of checks) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (err) {
    failed++;
    console.log(`FAIL ${name}\n     ${err?.stack ?? err}`);
  }
}
server.kill("SIGTERM");
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
