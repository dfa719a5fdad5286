#!/usr/bin/env python3
"""Cross-language conformance scenario for tumbler's clients.

Starts one tumbler server (`tumbler dev`, with its own private redis-server)
unless --addr is given, then runs each language's steps as separate
processes (clients/<lang>/conformance_steps.*) against it and checks what
they report. Prints a PASS/FAIL line per check, one line per language, and
finally `N passed, M failed`. Exits non-zero when any check fails.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.dirname(HERE)
ROOT = os.path.dirname(CLIENTS)
NAMESPACE = "conformance"
LANGS = ["python", "node", "go", "ruby"]
GO_ENV = {"GO111MODULE": "off", "GOPATH": os.path.join(CLIENTS, "go") + ":/usr/share/gocode"}
if not (os.environ.get("GOCACHE") or os.environ.get("HOME") or os.environ.get("XDG_CACHE_HOME")):
    GO_ENV["GOCACHE"] = os.path.join(CLIENTS, "go", "pkg", "cache")

COMMANDS = {
    "python": [sys.executable, os.path.join(CLIENTS, "python", "conformance_steps.py")],
    "node": ["node", os.path.join(CLIENTS, "node", "conformance_steps.js")],
    "go": [os.path.join(CLIENTS, "go", "bin", "conformance-steps")],
    "ruby": ["ruby", os.path.join(CLIENTS, "ruby", "conformance_steps.rb")],
}
EXAMPLES = {
    "python": [sys.executable, os.path.join(CLIENTS, "python", "examples.py")],
    "node": ["node", os.path.join(CLIENTS, "node", "examples.js")],
    "go": [os.path.join(CLIENTS, "go", "bin", "examples")],
    "ruby": ["ruby", os.path.join(CLIENTS, "ruby", "examples.rb")],
}

results = []  # (lang, ok, text)


def check(lang, ok, text, detail=None):
    results.append((lang, bool(ok), text))
    line = f"{'PASS' if ok else 'FAIL'}  [{lang}] {text}"
    if not ok and detail is not None:
        line += f"\n        got: {detail}"
    print(line, flush=True)
    return ok


class Step:
    """One language step as its own process; .result() is its JSON line (or None)."""

    def __init__(self, lang, args, addr, table=COMMANDS):
        self.lang, self.args = lang, args
        self.proc = subprocess.Popen(table[lang] + [addr, NAMESPACE] + list(args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **GO_ENV})

    def result(self, timeout=60):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            err += "\n(timed out)"
        lines = [line for line in out.splitlines() if line.strip()]
        if self.proc.returncode != 0 or not lines:
            check(self.lang, False, f"step {' '.join(self.args)} ran", (err or out).strip()[-800:])
            return None
        try:
            return json.loads(lines[-1])
        except ValueError:
            check(self.lang, False, f"step {' '.join(self.args)} printed JSON", lines[-1])
            return None


def step(lang, *args, addr):
    return Step(lang, args, addr).result()


def prepare():
    """Generate every language's stubs from proto/ and build the Go programs."""
    subprocess.run([sys.executable, os.path.join(CLIENTS, "python", "generate.py")], check=True)
    subprocess.run([os.path.join(CLIENTS, "go", "generate.sh")], check=True)
    subprocess.run(["go", "build", "-o", "bin/", "tumbler/cmd/conformance-steps", "tumbler/cmd/examples"],
                   check=True, cwd=os.path.join(CLIENTS, "go"), env={**os.environ, **GO_ENV})
    subprocess.run([os.path.join(CLIENTS, "ruby", "generate.sh")], check=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary):
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tumbler-conformance-{port}.log"), "w")
    proc = subprocess.Popen([binary, "dev", "--listen", addr, "--http-listen", "off"], stdout=log, stderr=log)
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tumbler exited with {proc.returncode}; see {log.name}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, addr
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"tumbler did not listen on {addr} within 30 s; see {log.name}")


def wait_for_queue(addr, name, expected, timeout=10):
    """Poll the lock's queue until it lists `expected` holders in order (orchestration only)."""
    sys.path.insert(0, os.path.join(CLIENTS, "python"))
    import tumbler_client as tc

    with tc.Client(addr, namespace=NAMESPACE) as c:
        deadline = time.time() + timeout
        while time.time() < deadline:
            q = c.stub.Queue(tc.pb.QueueRequest(namespace=NAMESPACE, name=name), timeout=5)
            if [r.holder for r in q.requests] == expected:
                return True
            time.sleep(0.05)
    return False


def is_invalid_argument(code):
    return str(code).replace("_", "").lower() == "invalidargument"


def scenario(addr):
    # 1. Every client's helper: scoped acquire that always releases, extend, token and slot.
    for lang in LANGS:
        r = step(lang, "scoped", f"scoped-{lang}", addr=addr)
        if r:
            check(lang, int(r["token"]) > 0 and r["slot"] == 1,
                  f"scoped acquire: fencing token {r['token']}, slot {r['slot']}", r)
            check(lang, r["extended"] is True, "extend moved the lease's expiry forward", r)
            check(lang, r["holders_after"] == 0, "the scoped form released the lock on exit", r)

    # 2. Mutex hand-over across languages, FIFO.
    mutex = "orders/42"
    held = step("python", "hold", mutex, "py-holder", "1", addr=addr)
    check("python", held and held["status"] == "ACQUIRED", f"takes the mutex {mutex}", held)
    tokens = [("python", int(held["token"]))] if held and held.get("token") else []
    node_wait = Step("node", ["wait", mutex, "node-waiter", "20000", "300"], addr)
    check("node", wait_for_queue(addr, mutex, ["node-waiter"]), "waits in the server's queue (position 1)")
    go_wait = Step("go", ["wait", mutex, "go-waiter", "20000", "300"], addr)
    check("go", wait_for_queue(addr, mutex, ["node-waiter", "go-waiter"]), "waits in the queue behind Node (position 2)")
    seen = step("ruby", "inspect", mutex, addr=addr)
    if seen:
        check("ruby", [h["holder"] for h in seen["holders"]] == ["py-holder"] and seen["waiters"] == 2,
              "inspect sees the Python holder and 2 waiters", seen)
        check("ruby", seen["queue"] == ["node-waiter", "go-waiter"], "queue lists Node then Go", seen["queue"])
        check("ruby", held and seen["holders"] and seen["holders"][0]["token"] == held["token"],
              "inspect reports the holder's fencing token", seen)
    rel = step("python", "release", mutex, "py-holder", addr=addr)
    check("python", rel and rel["released"], "releases the mutex", rel)
    got_node, got_go = node_wait.result(), go_wait.result()
    if got_node and got_go:
        check("node", got_node["holder"] == "node-waiter", f"gets the mutex first after Python (token {got_node['token']})", got_node)
        check("go", int(got_go["token"]) > int(got_node["token"]) and got_go["acquired_at_ms"] >= got_node["acquired_at_ms"] + 300,
              f"gets the mutex second, after Node released (token {got_go['token']})", got_go)
        tokens += [("node", int(got_node["token"])), ("go", int(got_go["token"]))]
    after = step("ruby", "inspect", mutex, addr=addr)
    check("ruby", after and after["holders"] == [] and after["waiters"] == 0, "inspect after hand-over: free, nobody waits", after)
    # A later grant from Ruby continues the sequence.
    last = step("ruby", "hold", mutex, "ruby-holder", "1", addr=addr)
    if last and last.get("token"):
        tokens.append(("ruby", int(last["token"])))
        step("ruby", "release", mutex, "ruby-holder", addr=addr)
    seq = " < ".join(f"{lang} {t}" for lang, t in tokens)
    ok = len(tokens) == 4 and all(a[1] < b[1] for a, b in zip(tokens, tokens[1:]))
    for lang in LANGS:
        check(lang, ok, f"fencing tokens strictly increase across languages: {seq}")

    # 3. A semaphore with limit 2 shared across languages.
    sem = "exports"
    a = step("ruby", "hold", sem, "ruby-worker", "2", addr=addr)
    check("ruby", a and a["status"] == "ACQUIRED" and a["slot"] == 1, "semaphore limit 2: holds slot 1", a)
    b = step("go", "hold", sem, "go-worker", "2", addr=addr)
    check("go", b and b["status"] == "ACQUIRED" and b["slot"] == 2, "semaphore limit 2: holds slot 2", b)
    c = step("python", "hold", sem, "py-worker", "2", addr=addr)
    check("python", c and c["status"] == "BUSY" and c["holders"] == 2, "semaphore limit 2: third holder refused BUSY", c)
    seen = step("node", "inspect", sem, addr=addr)
    check("node", seen and seen["limit"] == 2 and
          sorted((h["holder"], h["slot"]) for h in seen["holders"]) == [("go-worker", 2), ("ruby-worker", 1)],
          "inspect sees Ruby in slot 1 and Go in slot 2 of limit 2", seen)
    rel = step("ruby", "release", sem, "ruby-worker", addr=addr)
    check("ruby", rel and rel["released"], "releases slot 1", rel)
    d = step("node", "hold", sem, "node-worker", "2", addr=addr)
    check("node", d and d["status"] == "ACQUIRED" and d["slot"] == 1, "takes the freed slot 1", d)
    for lang, holder in (("go", "go-worker"), ("node", "node-worker")):
        step(lang, "release", sem, holder, addr=addr)

    # 4. Bad input: INVALID_ARGUMENT naming the field.
    for lang in LANGS:
        r = step(lang, "invalid", addr=addr)
        if r:
            check(lang, is_invalid_argument(r["code"]) and r.get("message", "").startswith(r["field"]),
                  f"bad {r['field']} -> INVALID_ARGUMENT \"{r.get('message')}\"", r)


def unique_across_languages(addr):
    """Ruby and Python compute the same digest, so a job is unique whichever language enqueues it."""
    args = json.dumps([42, "Zürich"])
    r1 = Step("ruby", ["enqueue", "ReportJob", args, "rb-jid-1", "60000"], addr, table=EXAMPLES).result()
    check("ruby", r1 and r1["enqueued"], "unique jobs across languages: Ruby enqueues ReportJob(42, Zürich)", r1)
    p1 = Step("python", ["enqueue", "ReportJob", args, "py-jid-2", "60000"], addr, table=EXAMPLES).result()
    check("python", p1 and r1 and p1["lock"] == r1["lock"] and not p1["enqueued"],
          "unique jobs across languages: same digest as Ruby, the duplicate is refused", p1)
    done = Step("ruby", ["perform", "ReportJob", args, "rb-jid-1"], addr, table=EXAMPLES).result()
    p2 = Step("python", ["enqueue", "ReportJob", args, "py-jid-3", "60000"], addr, table=EXAMPLES).result()
    check("python", done and p2 and p2["enqueued"],
          "unique jobs across languages: accepted once Ruby's job has succeeded", p2)


def examples(addr):
    """The seed patterns of the clients' READMEs, run as they are documented."""
    unique_across_languages(addr)
    for lang in LANGS:
        if not os.path.exists(EXAMPLES[lang][-1]):
            continue
        r = Step(lang, ["all"], addr, table=EXAMPLES).result(timeout=120)
        for c in (r or {}).get("checks", []):
            check(lang, c["ok"], "example: " + c["what"], c.get("detail"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", help="use this running server (host:port) instead of starting one")
    ap.add_argument("--server", default=os.path.join(ROOT, "target", "debug", "tumbler"))
    ap.add_argument("--no-prepare", action="store_true", help="skip stub generation and the Go build")
    opts = ap.parse_args()
    if not opts.no_prepare:
        prepare()
    proc = None
    addr = opts.addr
    if not addr:
        if not os.path.exists(opts.server):
            raise SystemExit(f"{opts.server} is missing: cargo build --bin tumbler")
        proc, addr = start_server(opts.server)
        print(f"==> tumbler dev on {addr} (pid {proc.pid})", flush=True)
    try:
        for part in (scenario, examples):
            try:
                part(addr)
            except Exception as e:  # a malformed reply must not hide the summary
                check("driver", False, f"{part.__name__} stopped: {e!r}")
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    print()
    for lang in LANGS + (["driver"] if any(la == "driver" for la, _, _ in results) else []):
        mine = [ok for la, ok, _ in results if la == lang]
        bad = mine.count(False)
        print(f"{lang}: {'PASS' if mine and not bad else 'FAIL'} ({len(mine) - bad}/{len(mine)} checks)")
    passed = sum(ok for _, ok, _ in results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
