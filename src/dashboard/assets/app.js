// tumbler dashboard: vanilla JavaScript, no build step, no dependencies.
// Each page is a shell from the server (body[data-page]); this script
// fetches the JSON endpoints under /api/v1/ and renders them, every
// REFRESH_MS while the tab is visible. Their JSON is the proto3 mapping
// (as Connect's): lowerCamel names, 64-bit integers as strings, and
// fields at their default (0, "", false, []) left out of proto messages,
// so numbers go through `int` and lists through `list`. Text from the server (lock names,
// holders, metadata) only ever reaches the page through textContent, with
// control, bidi and invisible characters shown as marked `\u{202E}`
// escapes (`visible`, the same characters as src/dashboard/visible.rs).
"use strict";

const REFRESH_MS = 3000;
const params = new URLSearchParams(location.search);
const namespace = params.get("namespace") || "";
const page = document.body.dataset.page;
// Admin controls show only when the JSON says so (`admin`: the server's
// --dashboard-admin and, with auth on, an admin token for the namespace).
const ADMIN_NOTES = {
  on: "Admin actions are ON (--dashboard-admin).",
  denied: "Read-only for this token (admin actions need an admin token for this namespace).",
  off: "Read-only (admin actions are off).",
};

// ------------------------------------------------------------ helpers

/** h("td", {class: "num"}, "3") → <td class="num">3</td>; strings become
 * text, through `visible` (attributes through `visibleText`, but for the
 * values a form sends and links, which must stay as they are). */
function h(tag, attrs, ...children) {
  const el = tag === "svg" || SVG_TAGS.has(tag)
    ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    const text = value === true ? "" : String(value);
    el.setAttribute(key, RAW_ATTRIBUTES.has(key) ? text : visibleText(text));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    if (child instanceof Node) el.append(child);
    else el.append(...visible(String(child)));
  }
  return el;
}
const RAW_ATTRIBUTES = new Set(["value", "href", "action"]);

// Characters that are invisible or reorder the text around them (C0/C1
// controls, DEL, bidi controls, zero width space, word joiner, BOM, line
// and paragraph separators): `pay\u{202E}gnp.exe` would show as
// "payexe.png". Zero width (non-)joiners stay: some scripts need them.
const HIDDEN = /([\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028-\u202E\u2060\u2066-\u2069\uFEFF])/u;

function escapeOf(c) {
  return `\\u{${c.codePointAt(0).toString(16).toUpperCase()}}`;
}

/** `text` as strings and nodes for `append`: each hidden character as a
 * marked escape, `<span class="esc" title="U+202E">\u{202E}</span>`. */
function visible(text) {
  const parts = text.split(HIDDEN);
  if (parts.length === 1) return [text];
  return parts.map((part, i) => {
    if (i % 2 === 0) return part;
    const code = part.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    return h("span", { class: "esc", title: `U+${code}` }, escapeOf(part));
  });
}

/** `text` with each hidden character as `\u{…}` (for attributes and plain text). */
function visibleText(text) {
  return text.split(HIDDEN).map((part, i) => (i % 2 ? escapeOf(part) : part)).join("");
}
const SVG_TAGS = new Set(["g", "line", "polyline", "rect", "text", "title", "desc", "path", "circle"]);

function withNamespace(path, extra) {
  const q = new URLSearchParams(extra || {});
  if (namespace) q.set("namespace", namespace);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

function lockHref(name) {
  return withNamespace("/dashboard/lock", { name });
}

/** A JSON integer of any width (64-bit ones are strings), or 0 when left out. */
function int(value) {
  return Number(value ?? 0);
}

/** A repeated field, or [] when left out. */
function list(value) {
  return value || [];
}

function fmtNumber(n) {
  return Number(n).toLocaleString("en-US");
}

function fmtRate(n) {
  return n >= 10 ? n.toFixed(0) : n.toFixed(1);
}

/** A distance in ms as "12 s", "3 min 4 s", "2 h 5 min". */
function fmtDuration(ms) {
  const s = Math.round(Math.abs(ms) / 1000);
  if (Math.abs(ms) < 1000) return `${Math.abs(Math.round(ms))} ms`;
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
  const hours = Math.floor(m / 60);
  return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
}

/** A timestamp relative to the server's clock, with the exact time as a tooltip. */
function when(atMs, nowMs) {
  if (!int(atMs)) return h("span", { class: "empty" }, "—");
  const diff = int(atMs) - int(nowMs);
  const text = diff >= 0 ? `in ${fmtDuration(diff)}` : `${fmtDuration(diff)} ago`;
  const iso = new Date(int(atMs)).toISOString();
  return h("time", { datetime: iso, title: iso }, text);
}

function clock(ms) {
  return new Date(int(ms)).toISOString().slice(11, 16);
}

function table(caption, headers, rows, opts) {
  const o = opts || {};
  return h("table", { id: o.id },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((head) =>
      h("th", { scope: "col", class: head.num ? "num" : null }, head.label || head)))),
    h("tbody", {}, rows.length ? rows : h("tr", {},
      h("td", { colspan: headers.length, class: "empty" }, o.empty || "Nothing here."))),
    o.foot ? h("tfoot", {}, o.foot) : null);
}

function num(value) {
  return h("td", { class: "num" }, fmtNumber(value));
}

let lastError = "";
function showError(message) {
  if (message === lastError) return;
  lastError = message;
  document.getElementById("error").replaceChildren(...visible(message));
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (response.status === 401) {
    // The login ended (logged out elsewhere, token expired or removed).
    location.assign(`/dashboard/login?next=${encodeURIComponent(location.pathname + location.search)}`);
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.message || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

/** Renders `render(data)` into #content now and every REFRESH_MS. */
function poll(load, render) {
  const content = document.getElementById("content");
  let timer = null;
  async function tick() {
    clearTimeout(timer);
    try {
      const data = await load();
      const fresh = render(data);
      content.replaceChildren(...[fresh].flat());
      content.setAttribute("aria-busy", "false");
      showError("");
      document.getElementById("updated").textContent =
        `Updated ${new Date().toLocaleTimeString("en-GB")}.`;
    } catch (err) {
      showError(`Could not load: ${err.message}`);
      if (err.status === 400) return; // bad input: polling will not fix it
    }
    timer = setTimeout(() => { if (!document.hidden) tick(); }, REFRESH_MS);
  }
  document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
  content.setAttribute("aria-busy", "true");
  tick();
}

// ------------------------------------------------------------ chrome

function setupChrome() {
  for (const a of document.querySelectorAll("a[data-keep-namespace]")) {
    a.href = withNamespace(a.getAttribute("href"));
  }
  const input = document.getElementById("namespace-input");
  input.value = namespace;
  // Keep the page (and its other parameters) when switching namespace.
  const form = input.form;
  form.action = location.pathname;
  for (const [key, value] of params) {
    if (key !== "namespace" && key !== "page_token" && page !== "lock") {
      form.append(h("input", { type: "hidden", name: key, value }));
    }
  }
  if (page === "lock") form.action = "/dashboard/locks";
  getJson("/api/v1/namespaces").then((data) => {
    const picker = document.getElementById("namespace-list");
    const names = data.seesDefault
      ? ["default", ...list(data.namespaces).filter((n) => n !== "default")]
      : list(data.namespaces);
    picker.replaceChildren(...names.map((n) => h("option", { value: n })));
  }).catch(() => {});
  document.getElementById("admin-state").textContent =
    ADMIN_NOTES[document.body.dataset.admin] || ADMIN_NOTES.off;
}

function heading(text, perNamespace = true) {
  const el = document.getElementById("heading");
  el.replaceChildren(text, perNamespace ? h("span", { class: "ns-tag" }, `namespace ${namespace || "default"}`) : "");
  document.title = `${typeof text === "string" ? text : el.textContent} · tumbler`;
}

// ------------------------------------------------------------ overview

function chart(minutes) {
  const series = minutes.map((p) => ({
    minuteMs: int(p.minuteMs), acquired: int(p.acquired), denied: int(p.denied), errors: int(p.errors),
  }));
  const W = 760, H = 190, L = 44, R = 12, T = 12, B = 28;
  const max = Math.max(1, ...series.map((p) => Math.max(p.acquired, p.denied, p.errors)));
  const top = niceCeil(max);
  const x = (i) => L + (i * (W - L - R)) / Math.max(1, series.length - 1);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const line = (key, cls) => h("polyline", {
    points: series.map((p, i) => `${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" "),
    fill: "none", stroke: `var(--${cls})`, "stroke-width": 2, "stroke-linejoin": "round",
  });
  const grid = [0, top / 2, top].map((v) => h("g", {},
    h("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }),
    h("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, fmtNumber(v))));
  const ticks = [0, 15, 30, 45, series.length - 1].map((i) => h("text", {
    x: x(i), y: H - 8, "text-anchor": i === 0 ? "start" : i === series.length - 1 ? "end" : "middle",
  }, series[i] ? clock(series[i].minuteMs) : ""));
  const sum = (key) => series.reduce((a, p) => a + p[key], 0);
  const peak = series.reduce((best, p) => (p.acquired > best.acquired ? p : best), series[0]);
  return h("svg", {
    class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-labelledby": "chart-title chart-desc",
  },
  h("title", { id: "chart-title" }, "Acquired, denied and errors per minute, last hour"),
  h("desc", { id: "chart-desc" },
    `Over the last hour: ${sum("acquired")} acquired, ${sum("denied")} denied or timed out, ` +
    `${sum("errors")} errors. Busiest minute ${clock(peak.minuteMs)} UTC with ${peak.acquired} acquired.`),
  grid,
  h("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) }),
  ticks,
  line("acquired", "acquired"), line("denied", "denied"), line("errors", "errors"));
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function card(label, value, note) {
  return h("div", { class: "card" }, h("dt", {}, label),
    h("dd", {}, value, note ? h("small", {}, ` ${note}`) : null));
}

function renderOverview(d) {
  const r = d.rates;
  const cards = h("dl", { class: "cards", "aria-label": "Current state" },
    card("Locks held", fmtNumber(d.locksHeld), d.truncated ? "(first 10,000 locks)" : null),
    card("Holders", fmtNumber(d.holders)),
    card("Waiters", fmtNumber(d.waiters), `on ${fmtNumber(d.waitingLocks)} ${int(d.waitingLocks) === 1 ? "lock" : "locks"}`),
    card("Acquire rate", fmtRate(r.acquiredPerMinute), "/ min"),
    card("Denial rate", fmtRate(r.deniedPerMinute), "/ min"),
    card("Error rate", fmtRate(r.errorsPerMinute), "/ min"));
  const hour = d.lastHour || {};
  const figure = h("figure", { class: "panel" },
    h("figcaption", {}, `Per minute, last hour (UTC). Rates above: average of the last ${r.minutes} minutes; ` +
      `${(d.denialRatio * 100).toFixed(1)}% of the hour's attempts were denied or timed out.`),
    chart(d.series),
    h("ul", { class: "legend" },
      h("li", { class: "acquired" }, h("span", {}, `acquired (${fmtNumber(int(hour.acquired))})`)),
      h("li", { class: "denied" }, h("span", {}, `denied + timed out (${fmtNumber(int(hour.denied) + int(hour.timedOut))})`)),
      h("li", { class: "errors" }, h("span", {}, `errors (${fmtNumber(int(hour.errors))})`))));
  const busiest = table("Locks with the most waiters", [
    "Lock", { label: "Permits in use", num: true }, { label: "Limit", num: true },
    { label: "Waiters", num: true }, "Next expiry"],
  list(d.busiest).map((l) => lockRow(l, d.nowMs)),
  { id: "busiest", empty: "Nobody is waiting." });
  const parts = [
    h("section", { "aria-labelledby": "state-h" }, h("h2", { id: "state-h", class: "visually-hidden" }, "Current state"), cards),
    h("section", { "aria-labelledby": "activity-h" }, h("h2", { id: "activity-h" }, "Activity"), figure),
    h("section", { "aria-labelledby": "busy-h" }, h("h2", { id: "busy-h" }, "Queues"), busiest,
      h("p", {}, h("a", { href: withNamespace("/dashboard/locks") }, `All ${fmtNumber(d.locks)} locks →`))),
  ];
  if (d.admin) {
    parts.push(h("section", { class: "danger-zone", "aria-labelledby": "danger-h" },
      h("h2", { id: "danger-h" }, "Admin"),
      h("p", {}, "Release every lock and drop every waiting request of this namespace."),
      h("a", { class: "button danger", href: withNamespace("/dashboard/clear") },
        `Clear namespace ${d.namespace}…`)));
  }
  return parts;
}

// ------------------------------------------------------------ locks

function renderLocksToolbar() {
  const form = h("form", { class: "toolbar", method: "get", action: "/dashboard/locks", role: "search",
    "aria-label": "Find locks" },
  namespace ? h("input", { type: "hidden", name: "namespace", value: namespace }) : null,
  h("div", { class: "field" }, h("label", { for: "prefix" }, "Name starts with"),
    h("input", { id: "prefix", name: "prefix", type: "search", value: params.get("prefix") || "",
      spellcheck: "false", autocomplete: "off" })),
  h("div", { class: "check" }, h("input", { id: "only_waiting", name: "only_waiting", type: "checkbox",
    value: "1", checked: params.get("only_waiting") === "1" }),
  h("label", { for: "only_waiting" }, "Only locks with waiters")),
  h("button", { type: "submit" }, "Search"));
  document.getElementById("content").before(form);
}

/** One LockSummary as a table row. Its permits in use are its holders for
 * a plain lock (one each), more where a holder took several (List says no
 * more than the sum, so the column is always there). */
function lockRow(l, nowMs) {
  return h("tr", {},
    h("th", { scope: "row" }, h("a", { href: lockHref(l.name) }, l.name)),
    num(int(l.permitsInUse)), num(int(l.limit)), num(int(l.waiters)),
    h("td", {}, when(l.nextExpiryAtMs, nowMs)));
}

function renderLocks(d) {
  const locks = list(d.locks);
  const rows = locks.map((l) => lockRow(l, d.nowMs));
  const pageNo = Number(params.get("page") || "1");
  const pager = h("nav", { class: "pager", "aria-label": "Pages" },
    params.get("page_token") ? h("a", { class: "button secondary", href: pageHref(null, 1) }, "First page") : null,
    h("span", {}, `Page ${pageNo}`),
    d.nextPageToken ? h("a", { class: "button", href: pageHref(d.nextPageToken, pageNo + 1), rel: "next" },
      "Next page") : null);
  const what = d.prefix ? `Locks whose name starts with “${d.prefix}”` : "Locks";
  return [table(`${what}: ${locks.length} on this page, in name order`, [
    "Lock", { label: "Permits in use", num: true }, { label: "Limit", num: true },
    { label: "Waiters", num: true }, "Next expiry"], rows,
  { id: "locks", empty: "No locks match." }), pager];
}

function pageHref(token, pageNo, path = "/dashboard/locks") {
  const q = new URLSearchParams(params);
  q.delete("page_token"); q.delete("page");
  if (token) { q.set("page_token", token); q.set("page", String(pageNo)); }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

function locksQuery() {
  const q = new URLSearchParams();
  if (namespace) q.set("namespace", namespace);
  for (const key of ["prefix", "page_token"]) if (params.get(key)) q.set(key, params.get(key));
  if (params.get("only_waiting") === "1") q.set("only_waiting", "1");
  q.set("page_size", "50");
  return `/api/v1/locks?${q}`;
}

// ------------------------------------------------------------ changelog

const CHANGELOG_EVENTS = ["acquired", "released", "extended", "expired", "lost", "reaped", "cleared",
  "queued", "dequeued", "skipped", "downgraded"];

function renderChangelogToolbar() {
  const chosen = params.get("event") || "";
  const form = h("form", { class: "toolbar", method: "get", action: "/dashboard/changelog", role: "search",
    "aria-label": "Filter events" },
  namespace ? h("input", { type: "hidden", name: "namespace", value: namespace }) : null,
  h("div", { class: "field" }, h("label", { for: "prefix" }, "Name starts with"),
    h("input", { id: "prefix", name: "prefix", type: "search", value: params.get("prefix") || "",
      spellcheck: "false", autocomplete: "off" })),
  h("div", { class: "field" }, h("label", { for: "holder" }, "Holder"),
    h("input", { id: "holder", name: "holder", type: "search", value: params.get("holder") || "",
      spellcheck: "false", autocomplete: "off" })),
  h("div", { class: "field" }, h("label", { for: "event" }, "Event"),
    h("select", { id: "event", name: "event" },
      h("option", { value: "", selected: chosen === "" }, "Any"),
      CHANGELOG_EVENTS.map((e) => h("option", { value: e, selected: chosen === e }, e)))),
  h("button", { type: "submit" }, "Filter"));
  document.getElementById("content").before(form);
}

function renderChangelog(d) {
  if (!d.enabled) {
    return h("p", { id: "changelog-off" }, "This namespace keeps no changelog: name it in ",
      h("code", {}, "--changelog-namespaces"), " to record its lock events.");
  }
  const now = Date.now();
  const events = list(d.events);
  const rows = events.map((e) => h("tr", {},
    h("td", {}, when(e.atMs, now)),
    h("td", {}, e.event, modeOf(e.mode) ? [" ", modeBadge(e.mode)] : null),
    h("th", { scope: "row" }, h("a", { href: lockHref(e.name) }, e.name)),
    h("td", {}, e.holder),
    h("td", { class: "num" }, int(e.fencingToken) ? e.fencingToken : "—"),
    h("td", {}, e.kind),
    h("td", {}, e.actor),
    h("td", { class: "num" }, int(e.holdMs) ? fmtDuration(int(e.holdMs)) : "—"),
    h("td", {}, metadata(e.metadata), e.metadataTruncated ? h("span", { class: "badge warn",
      title: `The changelog keeps the first bytes of metadata only: ${fmtNumber(e.metadataBytes)} bytes in all` },
    "cut") : null)));
  const kept = `each shard keeps its last ${fmtNumber(d.size)} events, each ${fmtDuration(int(d.retentionMs))} at most`;
  const pageNo = Number(params.get("page") || "1");
  const path = "/dashboard/changelog";
  const pager = h("nav", { class: "pager", "aria-label": "Pages" },
    params.get("page_token") ? h("a", { class: "button secondary", href: pageHref(null, 1, path) }, "Newest") : null,
    h("span", {}, `Page ${pageNo} (${fmtNumber(d.scanned)} events looked at)`),
    d.nextPageToken ? h("a", { class: "button", href: pageHref(d.nextPageToken, pageNo + 1, path), rel: "next" },
      "Older events") : null);
  return [table(`${events.length} events on this page, newest first (${kept})`, [
    "When", "Event", "Lock", "Holder", { label: "Token", num: true }, "Kind", "Actor",
    { label: "Held", num: true }, "Metadata"], rows,
  { id: "changelog", empty: d.nextPageToken ? "None on this page: older events may match." : "No events match." }),
  pager];
}

function changelogQuery() {
  const q = new URLSearchParams();
  if (namespace) q.set("namespace", namespace);
  for (const key of ["prefix", "holder", "event", "page_token"]) if (params.get(key)) q.set(key, params.get(key));
  return `/api/v1/changelog?${q}`;
}

// ------------------------------------------------------------ one lock

// A read/write lock's mode as Inspect and Queue spell it (left out for a
// plain lock, as every field at its default).
const MODES = { LOCK_MODE_READ: "read", LOCK_MODE_WRITE: "write" };

function modeOf(value) {
  return MODES[value] || "";
}

function modeBadge(value) {
  const mode = modeOf(value);
  return mode ? h("span", { class: `badge mode-${mode}` }, mode) : h("span", { class: "empty" }, "—");
}

/** Who holds a read/write lock: its writer, readers, or nobody yet. */
function rwNote(mode, holders, waiters) {
  if (mode === "write") return "a writer holds it";
  if (holders) return `${holders} ${holders === 1 ? "reader holds" : "readers hold"} it`;
  return waiters ? "nobody holds it; waited for" : "nobody holds it";
}

function renderLock(d) {
  const held = list(d.holders);
  const queued = list(d.queue.requests);
  // A read/write lock: Inspect says so (READ or WRITE), or its waiters do.
  const lockMode = modeOf(d.mode);
  const rw = Boolean(lockMode) || queued.some((r) => modeOf(r.mode));
  // Weighted permits (a grant or a waiting request of more than one):
  // the permits in use, and each holder's permits and slots, each
  // waiter's permits. A lock of one-permit grants shows none of it.
  const weighted = held.some((info) => int((info.grant || {}).permits) > 1) ||
    queued.some((r) => int(r.permits) > 1);
  // An election is a lock of limit 1 whose grant carries the leader's
  // value as the metadata entry "" (only Campaign and Proclaim write it).
  const lead = held.length === 1 && int(d.limit) === 1 ? held[0].grant || {} : {};
  const elected = Object.prototype.hasOwnProperty.call(lead.metadata || {}, "");
  const facts = h("dl", { class: "cards", "aria-label": "Lock state" },
    rw ? card("Mode", "read/write", rwNote(lockMode, held.length, int(d.waiters))) : null,
    weighted ? card("Holders", fmtNumber(held.length))
      : card("Holders", `${held.length} / ${int(d.limit) || "—"}`, rw ? "(the limit: readers at once)" : null),
    weighted ? card("Permits in use", `${int(d.permitsInUse)} / ${int(d.limit) || "—"}`, "(the limit: permits at once)")
      : null,
    card("Waiters", fmtNumber(int(d.waiters))),
    card("Next expiry", held.length
      ? fmtDuration(Math.min(...held.map((info) => int(info.remainingMs)))) : "—"),
    elected ? card("Leader", h("code", {}, lead.holder), `term ${lead.fencingToken}`) : null,
    elected ? card("Leader's value", lead.metadata[""]) : null);
  const holderHead = [weighted ? "Slots" : "Slot", "Holder", ...(rw ? ["Mode"] : []),
    ...(weighted ? [{ label: "Permits", num: true }] : []), "Fencing token", "Remaining TTL", "Lease",
    "Acquired", "Kind", "Metadata"];
  if (d.admin) holderHead.push("Action");
  const holders = table(`Holders of ${d.name}`, holderHead, held.map((info) => [info.grant || {}, info]).map(([g, info]) => h("tr", {},
    h("td", { class: weighted ? "slots" : "num" }, weighted && list(g.slots).length ? list(g.slots).join(", ") : int(g.slot)),
    h("th", { scope: "row" }, h("code", {}, g.holder)),
    rw ? h("td", {}, modeBadge(g.mode)) : null,
    weighted ? num(int(g.permits) || 1) : null,
    h("td", {}, h("code", {}, g.fencingToken)),
    h("td", {}, fmtDuration(int(info.remainingMs))),
    h("td", {}, fmtDuration(int(g.ttlMs))),
    h("td", {}, when(g.acquiredAtMs, d.nowMs)),
    h("td", {}, g.kind),
    h("td", {}, metadata(g.metadata)),
    d.admin ? h("td", {}, h("a", {
      class: "button danger",
      href: withNamespace("/dashboard/release", { name: d.name, holder: g.holder }),
      "aria-label": `Force release ${g.holder}`,
    }, "Force release…")) : null)),
  { id: "holders", empty: "Nobody holds this lock." });
  const queue = table(`Queue of ${d.name}, in grant order (${int(d.queue.waiters)} waiting)`, [
    { label: "Position", num: true }, "Holder", { label: "Priority", num: true }, "Order",
    ...(rw ? ["Mode"] : []), ...(weighted ? [{ label: "Permits", num: true }] : []),
    "Enqueued", "Alive until", "Waits until", "Kind"],
  queued.map((r) => h("tr", {},
    h("td", { class: "num" }, int(r.position)),
    h("th", { scope: "row" }, h("code", {}, r.holder)),
    num(int(r.priority)),
    h("td", {}, r.fair ? h("span", { class: "badge ok" }, "fair") : h("span", { class: "badge warn" }, "barging")),
    rw ? h("td", {}, modeBadge(r.mode)) : null,
    weighted ? num(int(r.permits) || 1) : null,
    h("td", {}, when(r.enqueuedAtMs, d.nowMs)),
    h("td", {}, when(r.expiresAtMs, d.nowMs)),
    h("td", {}, when(r.waitDeadlineMs, d.nowMs)),
    h("td", {}, r.kind))),
  { id: "queue", empty: "Nobody waits." });
  return [
    facts,
    h("section", { "aria-labelledby": "holders-h" }, h("h2", { id: "holders-h" }, "Holders"), holders),
    h("section", { "aria-labelledby": "queue-h" }, h("h2", { id: "queue-h" }, "Queue"), queue),
  ];
}

function metadata(map) {
  const entries = Object.entries(map || {});
  if (!entries.length) return h("span", { class: "empty" }, "—");
  return h("ul", { class: "meta" }, entries.map(([k, v]) => h("li", {},
    k === "" ? h("span", { class: "badge ok" }, "election value") : h("code", {}, k), " = ", v)));
}

// ------------------------------------------------------------ metrics

const EVENTS = ["acquired", "denied", "timedOut", "released", "extended", "expired", "reaped", "cleared", "downgraded",
  "errors"];
const EVENT_LABELS = ["Acquired", "Denied", "Timed out", "Released", "Extended", "Expired", "Reaped", "Cleared",
  "Downgraded", "Errors"];

function renderMetricsToolbar() {
  const minutes = params.get("minutes") || "60";
  const choices = [["15", "15 minutes"], ["60", "1 hour"], ["180", "3 hours"], ["360", "6 hours"], ["1440", "24 hours"]];
  const form = h("form", { class: "toolbar", method: "get", action: "/dashboard/metrics", "aria-label": "Metrics range" },
    namespace ? h("input", { type: "hidden", name: "namespace", value: namespace }) : null,
    h("div", { class: "field" }, h("label", { for: "minutes" }, "Range"),
      h("select", { id: "minutes", name: "minutes" }, choices.map(([v, label]) =>
        h("option", { value: v, selected: v === minutes }, `last ${label}`)))),
    h("div", { class: "field" }, h("label", { for: "kind" }, "Kind (empty: all)"),
      h("input", { id: "kind", name: "kind", value: params.get("kind") || "", spellcheck: "false", autocomplete: "off" })),
    h("div", { class: "check" }, h("input", { id: "per_minute", name: "per_minute", type: "checkbox", value: "1",
      checked: params.get("per_minute") === "1" }), h("label", { for: "per_minute" }, "Per minute")),
    h("button", { type: "submit" }, "Show"));
  document.getElementById("content").before(form);
}

function counterCells(row) {
  return EVENTS.map((e) => num(int(row[e])));
}

function renderMetrics(d) {
  const range = `${new Date(int(d.fromMs)).toISOString().slice(0, 16).replace("T", " ")} → ` +
    `${new Date(int(d.toMs)).toISOString().slice(11, 16)} UTC`;
  const heads = ["Kind", ...EVENT_LABELS.map((label) => ({ label, num: true }))];
  const totals = table(`Counts per kind, ${range}, summed over every replica`, heads,
    list(d.totals).map((row) => h("tr", {}, h("th", { scope: "row" }, row.kind), counterCells(row))),
    {
      id: "metrics-totals", empty: "Nothing counted in this range.",
      foot: list(d.totals).length ? h("tr", {}, h("th", { scope: "row" }, "All kinds"), counterCells(d.overall || {})) : null,
    });
  const parts = [totals];
  if (params.get("per_minute") === "1") {
    const rows = [...list(d.minutes)].reverse().map((row) => h("tr", {},
      h("th", { scope: "row" }, clock(row.minuteMs)), h("td", {}, row.kind), counterCells(row)));
    parts.push(h("h2", {}, "Per minute"), table("Counts per minute (UTC) and kind, newest first",
      ["Minute", "Kind", ...EVENT_LABELS.map((label) => ({ label, num: true }))], rows,
      { id: "metrics-minutes", empty: "Nothing counted in this range." }));
  }
  return parts;
}

function metricsQuery() {
  const q = new URLSearchParams();
  if (namespace) q.set("namespace", namespace);
  q.set("minutes", params.get("minutes") || "60");
  if (params.get("kind")) q.set("kind", params.get("kind"));
  return `/api/v1/metrics?${q}`;
}

// ------------------------------------------------------------ reaper

function renderReaper(d) {
  const holder = d.holder && (d.holder.grant || {});
  const facts = holder
    ? h("dl", { class: "facts", id: "reaper-facts" },
      h("dt", {}, "Reaping replica"), h("dd", {}, h("code", {}, holder.holder)),
      h("dt", {}, "Lease ends"), h("dd", {}, when(holder.expiresAtMs, d.nowMs), ` (lease ${fmtDuration(int(holder.ttlMs))}, renewed each round)`),
      h("dt", {}, "Reaper since"), h("dd", {}, when(holder.acquiredAtMs, d.nowMs)),
      h("dt", {}, "Fencing token"), h("dd", {}, h("code", {}, holder.fencingToken)))
    : h("p", { class: "notice", id: "reaper-facts" },
      "No replica holds the reaper lock now: the background reaper is off (--reap-interval-ms 0) " +
      "or between leases. Redis still expires every key of an untouched lock.");
  return [
    h("p", { class: "lead" }, "One replica at a time reaps every namespace in use; it is whoever holds the tumbler lock ",
      h("a", { href: `/dashboard/lock?namespace=${d.namespace}&name=${d.name}` }, h("code", {}, `${d.namespace}/${d.name}`)), "."),
    facts,
    h("h2", {}, "Namespaces in use"),
    list(d.namespaces).length
      ? h("ul", {}, list(d.namespaces).map((n) => h("li", {}, h("a", { href: `/dashboard?namespace=${encodeURIComponent(n)}` }, n))))
      : h("p", { class: "empty" }, "None recorded yet."),
  ];
}

// ------------------------------------------------------------ wait-for chains

/** The overview and the namespace's wait-for chains (decision 0077), together. */
async function loadOverviewAndWaits() {
  const [overview, waits] = await Promise.all([
    getJson(withNamespace("/api/v1/overview")),
    getJson(withNamespace("/api/v1/waits"))]);
  return { overview, waits };
}

/** One chain: `a → x (held by b) → y (held by c)`. */
function waitChain(chain) {
  const steps = list(chain);
  return h("li", {}, h("code", {}, steps[0].holder),
    steps.flatMap((step) => [" → ", h("code", {}, step.lock),
      " (held by ", h("code", {}, step.heldBy), ")"]));
}

function renderWaits(d) {
  const chains = list(d.chains);
  return h("section", { "aria-labelledby": "waits-h" }, h("h2", { id: "waits-h" }, "Wait-for chains"),
    chains.length
      ? h("ul", { id: "wait-chains", class: "chains" }, chains.map(waitChain))
      : h("p", { id: "wait-chains" }, "No holder of other locks is waiting."),
    d.nextPageToken
      ? h("p", { id: "wait-chains-more", class: "note" }, "More waits than one page: the first page's chains are shown " +
        "(GET /api/v1/waits with page_token for the rest).")
      : null,
    h("p", { class: "note" }, "Waits of holders that may hold other locks of this namespace; " +
      "a wait that would close a cycle is refused at once (ABORTED)."));
}

/** The overview's sections with the chains before the admin's. */
function renderOverviewAndWaits(d) {
  const parts = renderOverview(d.overview);
  const admin = parts.findIndex((part) => part.classList.contains("danger-zone"));
  parts.splice(admin < 0 ? parts.length : admin, 0, renderWaits(d.waits));
  return parts;
}

// ------------------------------------------------------------ start

setupChrome();
switch (page) {
  case "overview":
    heading("Overview");
    poll(loadOverviewAndWaits, renderOverviewAndWaits);
    break;
  case "locks":
    heading("Locks");
    renderLocksToolbar();
    poll(() => getJson(locksQuery()), renderLocks);
    break;
  case "lock": {
    const name = params.get("name") || "";
    heading(h("code", {}, name || "(no name)"));
    poll(() => getJson(withNamespace(`/api/v1/locks/${encodeURIComponent(name)}`)), renderLock);
    break;
  }
  case "metrics":
    heading("Metrics");
    renderMetricsToolbar();
    poll(() => getJson(metricsQuery()), renderMetrics);
    break;
  case "changelog":
    heading("Changelog");
    renderChangelogToolbar();
    poll(() => getJson(changelogQuery()), renderChangelog);
    break;
  case "reaper":
    heading("Reaper", false);
    poll(() => getJson("/api/v1/reaper"), renderReaper);
    break;
  default:
    document.getElementById("refresh-note").textContent = "";
    document.getElementById("updated").textContent = "";
}
