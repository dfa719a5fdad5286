// The gRPC port's Host/Origin rule from a real browser (headless Chromium,
// driven by Playwright; docs/security.md "The gRPC port: Host and Origin").
// Starts `tumbler dev` (auth off, its own redis-server) with
// TUMBLER_CORS_ALLOW_ORIGIN (--cors-allow-origin) naming one page origin,
// serves origin-page.html (@connectrpc/connect-web from node_modules, code
// generated into gen/ by run.sh) from three places, and checks:
//   - the page on the listed origin calls Acquire through Connect and
//     through gRPC-Web, and succeeds (preflight and CORS answers);
//   - the same page on another origin is refused (no preflight answer:
//     the browser never sends the call), and nothing is acquired; the
//     browser would stop it without the rule too (no CORS at all), so
//     the server's refusal of the preflight and of the call itself is
//     pinned by tests/surface/origin.rs;
//   - DNS rebinding: Chromium resolves evil.example to 127.0.0.1
//     (--host-resolver-rules) and the page is served from
//     http://evil.example:R, whose server hands every call, byte for byte,
//     to tumbler's port, as a rebound name would: the page calls its own
//     origin (no CORS involved), tumbler sees Host evil.example:R and
//     answers PERMISSION_DENIED; Acquire and Clear change nothing.
// Prints each step, ends with "N passed, M failed", exits non-zero on any
// failure.
//
//   TUMBLER_BIN=target/debug/tumbler node origin.test.mjs
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { createServer as createHttpServer } from "node:http";
import { createServer as createTcpServer, connect as tcpConnect } from "node:net";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import path from "node:path";
import assert from "node:assert/strict";

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.TUMBLER_BIN ?? path.join(here, "../target/debug/tumbler");

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createTcpServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

const grpcPort = await freePort();
const httpPort = await freePort();
const allowedPort = await freePort();
const otherPort = await freePort();
const rebindPort = await freePort();
const allowedOrigin = `http://127.0.0.1:${allowedPort}`;
const otherOrigin = `http://127.0.0.1:${otherPort}`;
const evilOrigin = `http://evil.example:${rebindPort}`;
const grpcUrl = `http://127.0.0.1:${grpcPort}`;

// The listed origin through the variable (the flag's twin), so a binary
// without the rule starts too and shows what it lets through.
const tumbler = spawn(bin, [
  "dev", "--listen", `127.0.0.1:${grpcPort}`, "--http-listen", `127.0.0.1:${httpPort}`, "--log-level", "warn",
], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, TUMBLER_CORS_ALLOW_ORIGIN: allowedOrigin } });
let tumblerLog = "";
tumbler.stderr.on("data", (chunk) => { tumblerLog += chunk; });

/** A Connect JSON call from node (no Origin: not a browser). */
async function rpc(method, body) {
  const res = await fetch(`${grpcUrl}/tumbler.v1.LockService/${method}`, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

async function holders(name) {
  const { body } = await rpc("Inspect", { name });
  return (body.holders ?? []).map((h) => h.grant.holder);
}

// The pages and the modules they load: origin-page.html, node_modules
// under /m/, the generated code under /gen/. Every answer closes its
// connection (the rebinding server hands later requests to tumbler).
const types = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript" };
const statics = createHttpServer(async (req, res) => {
  res.setHeader("connection", "close");
  const url = new URL(req.url, "http://page");
  let file;
  if (url.pathname === "/") file = path.join(here, "origin-page.html");
  else if (url.pathname.startsWith("/m/")) file = path.join(here, "node_modules", url.pathname.slice(3));
  else if (url.pathname.startsWith("/gen/")) file = path.join(here, "gen", url.pathname.slice(5));
  const inside = file && path.resolve(file).startsWith(here + path.sep);
  try {
    if (!inside) throw new Error("outside");
    const data = await readFile(file);
    res.writeHead(200, { "content-type": types[path.extname(file)] ?? "application/octet-stream" });
    res.end(data);
  } catch {
    res.writeHead(404).end();
  }
});
function listen(server, port) {
  return new Promise((resolve) => server.listen(port, "127.0.0.1", resolve));
}
const pageServers = [createTcpServer(), createTcpServer()];
for (const server of pageServers) server.on("connection", (socket) => statics.emit("connection", socket));
await listen(pageServers[0], allowedPort);
await listen(pageServers[1], otherPort);
// The rebound name: GETs are the attacker's page; anything else goes to
// tumbler's port as the browser sent it.
const rebind = createTcpServer((socket) => {
  socket.once("data", (first) => {
    if (first.subarray(0, 4).toString() === "GET ") {
      socket.pause();
      socket.unshift(first);
      statics.emit("connection", socket);
      socket.resume();
      return;
    }
    const upstream = tcpConnect(grpcPort, "127.0.0.1", () => {
      upstream.write(first);
      socket.pipe(upstream).pipe(socket);
    });
    upstream.on("error", () => socket.destroy());
    socket.on("error", () => upstream.destroy());
  });
});
await listen(rebind, rebindPort);

let passed = 0;
let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed += 1;
    console.log(`  ok - ${name}`);
  } catch (err) {
    failed += 1;
    console.log(`  FAILED - ${name}\n${err.stack ?? err}`);
  }
}

let browser;
try {
  for (let i = 0; ; i += 1) {
    try {
      if ((await rpc("Inspect", { name: "ready" })).status === 200) break;
    } catch {}
    if (i > 150) throw new Error(`tumbler dev did not start:\n${tumblerLog}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--host-resolver-rules=MAP evil.example 127.0.0.1",
    ],
  });
  const context = await browser.newContext();
  const open = async (origin) => {
    const page = await context.newPage();
    await page.goto(`${origin}/`);
    await page.waitForFunction(() => document.body.dataset.ready === "yes", null, { timeout: 15_000 });
    return page;
  };
  const call = (page, args) => page.evaluate((a) => window.tumbler(a), args);

  const allowed = await open(allowedOrigin);
  for (const transport of ["connect", "grpc-web"]) {
    await check(`a page on the listed origin acquires through ${transport}`, async () => {
      const name = `from-page-${transport}`;
      const got = await call(allowed, {
        baseUrl: grpcUrl, transport, method: "acquire", request: { name, holder: "listed-page", ttlMs: "600000" },
      });
      assert.deepEqual(got, { ok: true, status: "ACQUIRED" });
      assert.deepEqual(await holders(name), ["listed-page"]);
    });
  }

  const other = await open(otherOrigin);
  for (const transport of ["connect", "grpc-web"]) {
    await check(`a page on another origin is refused through ${transport}`, async () => {
      const name = `other-page-${transport}`;
      const got = await call(other, {
        baseUrl: grpcUrl, transport, method: "acquire", request: { name, holder: "other-page", ttlMs: "600000" },
      });
      assert.equal(got.ok, false, JSON.stringify(got));
      assert.deepEqual(await holders(name), []);
    });
  }

  const evil = await open(evilOrigin);
  for (const transport of ["connect", "grpc-web"]) {
    await check(`a rebinding page (Host evil.example) is refused through ${transport}`, async () => {
      const name = `rebound-${transport}`;
      const got = await call(evil, {
        baseUrl: evilOrigin, transport, method: "acquire", request: { name, holder: "evil-page", ttlMs: "600000" },
      });
      assert.equal(got.ok, false, JSON.stringify(got));
      assert.equal(got.code, "PermissionDenied", JSON.stringify(got));
      assert.match(got.message, /evil\.example/);
      assert.deepEqual(await holders(name), []);
    });
  }
  await check("a rebinding page cannot Clear the namespace", async () => {
    const got = await call(evil, { baseUrl: evilOrigin, transport: "connect", method: "clear", request: {} });
    assert.equal(got.code, "PermissionDenied", JSON.stringify(got));
    assert.deepEqual(await holders("from-page-connect"), ["listed-page"]);
  });
} catch (err) {
  failed += 1;
  console.log(`  FAILED - setting up\n${err.stack ?? err}`);
} finally {
  if (browser) await browser.close();
  tumbler.kill("SIGTERM");
  for (const server of [...pageServers, rebind]) server.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
