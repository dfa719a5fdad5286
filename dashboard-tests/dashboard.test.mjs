// Drives tumbler's dashboard in headless Chromium (see run.sh for the scene
// it expects: auth on, an admin token, a client token for `billing` and an
// admin token naming `tumbler-system`),
// logs in on the login page and checks what the pages show against the
// gRPC API.
import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import path from "node:path";

const base = process.env.DASHBOARD_URL;
const grpcAddr = process.env.GRPC_ADDR;
const shots = process.env.SCREENSHOTS;
const adminToken = process.env.DASHBOARD_ADMIN_TOKEN;
const clientToken = process.env.DASHBOARD_CLIENT_TOKEN;
const systemToken = process.env.DASHBOARD_SYSTEM_TOKEN;
assert.ok(base && grpcAddr && shots && adminToken && clientToken && systemToken,
  "run through run.sh (DASHBOARD_URL, GRPC_ADDR, SCREENSHOTS, DASHBOARD_ADMIN_TOKEN, " +
  "DASHBOARD_CLIENT_TOKEN, DASHBOARD_SYSTEM_TOKEN)");

const TIMEOUT = 15_000;
const steps = [];
function step(name) {
  steps.push(name);
  console.log(`  - ${name}`);
}

/** An RPC of the lock service over gRPC (grpcurl, through server reflection), as the admin token. */
function grpc(method, request) {
  const out = execFileSync("grpcurl", [
    "-plaintext", "-H", `authorization: Bearer ${adminToken}`, "-d", JSON.stringify(request),
    grpcAddr, `tumbler.v1.LockService/${method}`,
  ], { encoding: "utf8" });
  return JSON.parse(out);
}

function metricsRpc(namespace) {
  return grpc("Metrics", { namespace });
}

/** gRPC JSON omits zeros and spells uint64 as strings. */
function counters(row) {
  const keys = ["acquired", "denied", "timedOut", "released", "extended", "expired", "reaped", "cleared", "downgraded",
    "errors"];
  return keys.map((k) => Number((row && row[k]) || 0));
}

/** The cells of a table's rows: [[th, td, td, ...], ...]. */
async function tableRows(page, selector) {
  return page.$$eval(selector, (rows) => rows.map((row) =>
    [...row.querySelectorAll("th, td")].map((cell) => cell.textContent.trim())));
}

/** Waits until the text of the card whose label is `label` is `value`. */
async function waitForCard(page, label, value) {
  await page.waitForFunction(([label, value]) => {
    for (const card of document.querySelectorAll(".card")) {
      const dt = card.querySelector("dt");
      const dd = card.querySelector("dd");
      if (dt && dd && dt.textContent.trim() === label) {
        return dd.firstChild && dd.firstChild.textContent.trim() === value;
      }
    }
    return false;
  }, [label, value], { timeout: TIMEOUT });
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
let failed = false;
const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
const page = await context.newPage();
const consoleErrors = [];
page.on("console", (msg) => { if (msg.type() === "error") consoleErrors.push(msg.text()); });
page.on("pageerror", (err) => consoleErrors.push(String(err)));

/** Runs `fn`, in which the browser is refused on purpose (401/403): Chromium
 * logs each refused load as a console error, which the final check must not
 * count. Any other error stays. */
async function expectingRefusals(fn) {
  const before = consoleErrors.length;
  await fn();
  const added = consoleErrors.splice(before);
  consoleErrors.push(...added.filter((e) => !/status of 40[13]/.test(e)));
}

/** Logs in on the login page the browser is on. */
async function logIn(token) {
  await page.getByLabel("Token", { exact: true }).fill(token);
  await page.getByRole("button", { name: "Log in" }).click();
}

try {
  // Auth is on: a visit without a login lands on the login form.
  step("without a login, the dashboard sends the browser to the login page");
  await page.goto(`${base}/dashboard`);
  await page.waitForURL(/\/dashboard\/login\?next=%2Fdashboard$/);
  await page.getByRole("heading", { name: "Log in" }).waitFor();
  const tokenInput = page.getByLabel("Token", { exact: true });
  assert.equal(await tokenInput.getAttribute("type"), "password");
  await page.screenshot({ path: path.join(shots, "login.png"), fullPage: true });
  const api = await page.request.get(`${base}/api/v1/overview`);
  assert.equal(api.status(), 401, "the JSON endpoints refuse too");

  step("a wrong token is refused on the login page");
  await expectingRefusals(async () => {
    await logIn("not-a-token");
    await page.getByRole("alert").filter({ hasText: "not accepted" }).waitFor();
  });
  assert.equal(await tokenInput.getAttribute("aria-invalid"), "true");
  assert.deepEqual(await context.cookies(), [], "no cookie for a wrong token");
  await page.screenshot({ path: path.join(shots, "login-refused.png"), fullPage: true });

  step("logging in with the admin token sets an HttpOnly, SameSite=Strict cookie");
  await logIn(adminToken);
  await page.waitForURL(`${base}/dashboard`);
  const cookies = await context.cookies();
  assert.equal(cookies.length, 1);
  assert.equal(cookies[0].name, "tumbler_token");
  assert.equal(cookies[0].httpOnly, true);
  assert.equal(cookies[0].sameSite, "Strict");
  assert.equal(cookies[0].path, "/");
  assert.equal(cookies[0].secure, false, "plain HTTP here; Secure over --http-tls");
  assert.equal(await page.evaluate(() => document.cookie), "", "scripts cannot read it");
  assert.ok(!cookies[0].value.includes(adminToken), "the cookie holds a session, not the token");
  await page.getByText("Token dashboard-ops").waitFor();

  // Overview: counts from List and Metrics, the waiting lock listed.
  step("overview shows locks held, holders, waiters and the waiting lock");
  await page.goto(`${base}/dashboard`);
  await waitForCard(page, "Waiters", "1");
  await waitForCard(page, "Locks held", "2");
  await waitForCard(page, "Holders", "3");
  const busiest = await tableRows(page, "#busiest tbody tr");
  assert.deepEqual(busiest.map((r) => [r[0], r[3]]), [["reports", "1"]]);
  assert.equal(await page.locator("svg.chart polyline").count(), 3, "three series in the chart");
  // The namespace's wait-for chains (decision 0077): worker-3 waits for
  // reports, which worker-1 holds.
  await page.locator("#wait-chains li").first().waitFor();
  assert.deepEqual(await page.locator("#wait-chains li").allInnerTexts(),
    ["worker-3 → reports (held by worker-1)"]);
  assert.equal(await page.locator("main#main").count(), 1);
  assert.equal(await page.locator("nav[aria-label]").count(), 1);
  await page.screenshot({ path: path.join(shots, "overview.png"), fullPage: true });

  // Locks list: search by prefix.
  step("locks list searches by prefix");
  await page.getByRole("link", { name: "Locks", exact: true }).click();
  await page.getByLabel("Name starts with").fill("jobs/");
  await page.getByRole("button", { name: "Search" }).click();
  await page.waitForURL(/prefix=jobs%2F/);
  await page.waitForSelector("#locks tbody tr th a");
  const jobs = await tableRows(page, "#locks tbody tr");
  assert.deepEqual(jobs.map((r) => r.slice(0, 4)), [["jobs/nightly", "2", "3", "0"]]);
  await page.screenshot({ path: path.join(shots, "locks.png"), fullPage: true });

  // One lock: from the overview's link to its detail, holder and queue.
  step("lock detail shows the holder with its token and the queue in order");
  await page.goto(`${base}/dashboard`);
  await page.getByRole("link", { name: "reports", exact: true }).click();
  await page.waitForURL(/\/dashboard\/lock\?name=reports/);
  await page.waitForSelector("#holders tbody tr th code");
  await page.waitForSelector("#queue tbody tr th code");
  const holders = await tableRows(page, "#holders tbody tr");
  assert.equal(holders.length, 1);
  const [slot, holder, token, remaining, , , kind, metadata] = holders[0];
  assert.equal(slot, "1");
  assert.equal(holder, "worker-1");
  assert.match(token, /^\d{16}$/);
  assert.match(remaining, /min|s$/);
  assert.equal(kind, "export");
  assert.match(metadata, /job = 42/);
  assert.match(metadata, /team = billing/);
  const inspect = grpc("Inspect", { name: "reports" });
  assert.equal(token, inspect.holders[0].grant.fencingToken, "the token the Inspect RPC reports");
  const queue = await tableRows(page, "#queue tbody tr");
  assert.deepEqual(queue.map((r) => r.slice(0, 4)), [["1", "worker-3", "0", "fair"]]);
  await page.screenshot({ path: path.join(shots, "lock.png"), fullPage: true });

  // Metrics: the table is the Metrics RPC's report, number for number.
  step("metrics table matches the Metrics RPC (grpcurl)");
  await page.getByRole("link", { name: "Metrics", exact: true }).click();
  await page.waitForSelector("#metrics-totals tfoot tr");
  const shown = await tableRows(page, "#metrics-totals tbody tr");
  const overall = (await tableRows(page, "#metrics-totals tfoot tr"))[0];
  const rpc = metricsRpc("default");
  const expected = rpc.totals.map((row) => [row.kind, ...counters(row).map(String)]);
  assert.deepEqual(shown, expected);
  assert.deepEqual(overall, ["All kinds", ...counters(rpc.overall).map(String)]);
  const exportRow = shown.find((r) => r[0] === "export");
  assert.deepEqual(exportRow.slice(1, 3), ["1", "1"], "export: 1 acquired, 1 denied");
  await page.screenshot({ path: path.join(shots, "metrics.png"), fullPage: true });

  // An election: its leader, term and value, as the Leader RPC says.
  step("an election's page shows its leader, term and value");
  await page.goto(`${base}/dashboard/lock?name=primary&namespace=ops`);
  await page.waitForSelector("#holders tbody tr th code");
  const leaderRpc = grpc("Leader", { namespace: "ops", name: "primary" }).leader;
  const cards = await page.$$eval("dl.cards .card", (els) => els.map((el) => el.textContent));
  assert.ok(cards.some((c) => c.includes("Leader") && c.includes("node-a") && c.includes(`term ${leaderRpc.term}`)),
    `a Leader card with node-a and term ${leaderRpc.term}: ${JSON.stringify(cards)}`);
  assert.ok(cards.some((c) => c.includes("Leader's value") && c.includes("db-1:5432")), JSON.stringify(cards));
  const [, , , , , , , leaderMeta] = (await tableRows(page, "#holders tbody tr"))[0];
  assert.match(leaderMeta, /election value = db-1:5432/);
  await page.screenshot({ path: path.join(shots, "election.png"), fullPage: true });

  // A read/write lock: its mode, who holds it, each holder's and waiter's
  // mode, as Inspect and Queue say.
  step("a read/write lock's page shows readers holding it and a writer waiting");
  await page.goto(`${base}/dashboard/lock?name=catalog&namespace=inventory`);
  await page.waitForSelector("#queue tbody tr th code");
  const rwInspect = grpc("Inspect", { namespace: "inventory", name: "catalog" });
  assert.equal(rwInspect.mode, "LOCK_MODE_READ");
  const rwCards = await page.$$eval("dl.cards .card", (els) => els.map((el) => el.textContent));
  assert.ok(rwCards.some((c) => c.includes("Mode") && c.includes("read/write") && c.includes("2 readers hold it")),
    JSON.stringify(rwCards));
  const rwHolders = await tableRows(page, "#holders tbody tr");
  assert.deepEqual(rwHolders.map((r) => r.slice(1, 3)), [["reader-1", "read"], ["reader-2", "read"]]);
  const rwQueue = await tableRows(page, "#queue tbody tr");
  assert.deepEqual(rwQueue.map((r) => r.slice(0, 5)), [["1", "writer-1", "0", "fair", "write"]]);
  await page.screenshot({ path: path.join(shots, "read-write.png"), fullPage: true });

  // A weighted semaphore: the permits in use, each holder's permits and
  // slots, each waiter's permits, as Inspect and Queue say; the locks
  // list counts permits.
  step("a weighted semaphore's page shows its permits in use, each holder's permits and slots");
  await page.goto(`${base}/dashboard/lock?name=gpus&namespace=render`);
  await page.waitForSelector("#queue tbody tr th code");
  const weighted = grpc("Inspect", { namespace: "render", name: "gpus" });
  assert.equal(weighted.permitsInUse, 3);
  await waitForCard(page, "Permits in use", "3 / 4");
  await waitForCard(page, "Holders", "2");
  const farmHolders = await tableRows(page, "#holders tbody tr");
  assert.deepEqual(farmHolders.map((r) => r.slice(0, 3)), [["1, 2", "farm-a", "2"], ["3", "farm-b", "1"]]);
  assert.deepEqual(farmHolders.map((r) => r[0]),
    weighted.holders.map((info) => info.grant.slots.join(", ")), "the slots Inspect reports");
  const farmQueue = await tableRows(page, "#queue tbody tr");
  assert.deepEqual(farmQueue.map((r) => r.slice(0, 5)), [["1", "farm-c", "0", "fair", "2"]]);
  await page.screenshot({ path: path.join(shots, "weighted.png"), fullPage: true });
  await page.goto(`${base}/dashboard/locks?namespace=render`);
  await page.waitForSelector("#locks tbody tr th a");
  assert.deepEqual((await tableRows(page, "#locks tbody tr")).map((r) => r.slice(0, 4)), [["gpus", "3", "4", "1"]]);
  // A plain lock's page has no permits column.
  await page.goto(`${base}/dashboard/lock?name=reports`);
  await page.waitForSelector("#holders tbody tr th code");
  const plainHead = await page.$$eval("#holders thead th", (els) => els.map((el) => el.textContent));
  assert.ok(!plainHead.includes("Permits") && plainHead[0] === "Slot", JSON.stringify(plainHead));

  // Namespace switch (query parameter) from the header form.
  step("namespace selector switches to another namespace");
  await page.getByLabel("Namespace", { exact: true }).fill("billing");
  await page.getByRole("button", { name: "Show" }).first().click();
  await page.waitForURL(/namespace=billing/);
  await page.getByRole("link", { name: "Locks", exact: true }).click();
  await page.waitForSelector("#locks tbody tr th a");
  assert.deepEqual((await tableRows(page, "#locks tbody tr")).map((r) => r[0]), ["invoices"]);

  // Bidi and invisible characters: written out, never applied. The lock
  // `pay<U+202E>gnp.exe` would read "payexe.png" otherwise.
  step("bidi characters in a name, a holder and metadata show as \\u{…} escapes");
  const shownName = "pay\\u{202E}gnp.exe";
  const hiddenChars = /[\u061C\u200B\u200E\u200F\u2028-\u202E\u2060\u2066-\u2069\uFEFF]/;
  const rawOnPage = () => page.evaluate((source) =>
    new RegExp(source).test(document.body.textContent + document.title), hiddenChars.source);
  await page.goto(`${base}/dashboard/locks?namespace=lab`);
  await page.waitForSelector("#locks tbody tr th a");
  assert.deepEqual((await tableRows(page, "#locks tbody tr")).map((r) => r[0]), [shownName]);
  assert.equal(await page.locator("#locks .esc").count(), 1, "the escape is marked");
  assert.equal(await page.locator("#locks .esc").getAttribute("title"), "U+202E");
  assert.equal(await rawOnPage(), false, "no bidi character reaches the page");
  await page.getByRole("link", { name: shownName, exact: true }).click();
  await page.waitForSelector("#holders tbody tr th code");
  const [bidiHolder] = await tableRows(page, "#holders tbody tr");
  assert.equal(bidiHolder[1], "svc\\u{2066}-1");
  assert.match(bidiHolder[7], /^note = txt\.\\u\{202E\}exe$/);
  assert.equal(await page.locator("#heading code").textContent(), shownName);
  assert.ok((await page.title()).startsWith(shownName), await page.title());
  assert.equal(await rawOnPage(), false, "no bidi character reaches the lock page");
  const bidiInspect = grpc("Inspect", { namespace: "lab", name: "pay\u202Egnp.exe" });
  assert.equal(bidiInspect.holders[0].grant.holder, "svc\u2066-1", "the lock the page links to");
  await page.screenshot({ path: path.join(shots, "bidi.png"), fullPage: true });
  // The server-rendered confirmation page escapes the same way.
  await page.getByRole("link", { name: "Force release svc\\u{2066}-1" }).click();
  await page.waitForSelector("text=Force release?");
  assert.match(await page.locator("dl.facts").textContent(), /Lockpay\\u\{202E\}gnp\.exe/);
  assert.equal(await rawOnPage(), false, "no bidi character on the confirmation page");

  // tumbler-system is tumbler's own: not even a `*` admin token sees it.
  step("a token for every namespace sees no Reaper page (tumbler-system is reserved)");
  assert.equal(await page.getByRole("link", { name: "Reaper", exact: true }).count(), 0);
  await expectingRefusals(async () => {
    const reaper = await page.goto(`${base}/dashboard/reaper`);
    assert.equal(reaper.status(), 403);
    await page.getByRole("heading", { name: "Not allowed" }).waitFor();
  });

  // Admin (on in this run): force release through the confirmation page;
  // the waiter gets the lock.
  step("force release through the confirmation page hands the lock to the waiter");
  await page.goto(`${base}/dashboard/lock?name=reports`);
  await page.getByRole("link", { name: "Force release worker-1" }).click();
  await page.waitForSelector("text=Force release?");
  await page.screenshot({ path: path.join(shots, "confirm-release.png"), fullPage: true });
  await page.getByRole("button", { name: "Release this grant" }).click();
  await page.waitForSelector("text=was released");
  await page.getByRole("link", { name: "Back to the lock" }).click();
  await page.waitForFunction(() => {
    const cell = document.querySelector("#holders tbody tr th code");
    return cell && cell.textContent === "worker-3";
  }, null, { timeout: TIMEOUT });
  await page.waitForSelector("#queue td.empty");

  // A client token of `billing`: only its namespace, no admin controls.
  step("log out; a client token sees only its namespace and no admin controls");
  await page.getByRole("button", { name: "Log out" }).click();
  await page.waitForURL(`${base}/dashboard/login`);
  assert.deepEqual(await context.cookies(), [], "logging out drops the cookie");
  await logIn(clientToken);
  // It may not see `default`, so the overview opens on its own namespace.
  await page.waitForURL(`${base}/dashboard?namespace=billing`);
  await page.waitForSelector(".card");
  assert.match(await page.locator("#heading").textContent(), /namespace billing/);
  assert.equal(await page.getByRole("link", { name: "Reaper", exact: true }).count(), 0);
  assert.equal(await page.locator(".danger-zone").count(), 0, "no clear button");
  await page.waitForFunction(() => document.querySelectorAll("#namespace-list option").length > 0,
    null, { timeout: TIMEOUT });
  const offered = await page.$$eval("#namespace-list option", (options) => options.map((o) => o.value));
  assert.deepEqual(offered, ["billing"], "the namespace picker offers only its own");
  await page.getByRole("link", { name: "Locks", exact: true }).click();
  await page.getByRole("link", { name: "invoices", exact: true }).click();
  await page.waitForSelector("#holders tbody tr th code");
  assert.deepEqual((await tableRows(page, "#holders tbody tr")).map((r) => r[1]), ["svc-1"]);
  assert.equal(await page.getByRole("link", { name: /Force release/ }).count(), 0);
  assert.match(await page.locator("#admin-state").textContent(), /Read-only for this token/);
  await page.screenshot({ path: path.join(shots, "client-lock.png"), fullPage: true });
  await expectingRefusals(async () => {
    const other = await page.goto(`${base}/dashboard/locks?namespace=default`);
    assert.equal(other.status(), 403);
    await page.getByRole("heading", { name: "Not allowed" }).waitFor();
  });

  // Reaper: an admin token naming tumbler-system reads it.
  step("a token naming tumbler-system sees the replica holding tumbler-system/reaper");
  await page.goto(`${base}/dashboard`);
  await page.getByRole("button", { name: "Log out" }).click();
  await page.waitForURL(`${base}/dashboard/login`);
  await logIn(systemToken);
  await page.waitForURL(/\/dashboard\?namespace=tumbler-system$/);
  await page.getByRole("link", { name: "Reaper", exact: true }).click();
  await page.waitForFunction(() => /replica-/.test(document.querySelector("#reaper-facts")?.textContent || ""),
    null, { timeout: TIMEOUT });
  await page.screenshot({ path: path.join(shots, "reaper.png"), fullPage: true });

  assert.deepEqual(consoleErrors, [], "no errors in the browser console");
  console.log(`dashboard in a browser: ${steps.length} steps passed; screenshots in ${shots}`);
} catch (err) {
  failed = true;
  console.error(`FAILED at step "${steps[steps.length - 1]}": ${err.stack || err}`);
  await page.screenshot({ path: path.join(shots, "failure.png"), fullPage: true }).catch(() => {});
  if (consoleErrors.length) console.error("browser console:", consoleErrors);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
