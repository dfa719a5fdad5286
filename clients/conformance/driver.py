#!/usr/bin/env python3
"""Cross-language conformance scenario for tumbler's clients.

Runs each language's steps (clients/<lang>/conformance_steps.*) as separate
processes, with the installed packages (clients/test.sh builds and installs
them, then runs this file with the venv's Python), against servers this
driver starts on free loopback ports: `tumbler dev` for most checks, and
`tumbler serve` over its own redis-server for the restart check. Prints a
PASS/FAIL line per check, one line per language, and finally
`N passed, M failed`. Exits non-zero when any check fails. One file on
purpose: the parts share their helpers and read as one scenario.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import tumbler_client as tc
from tumbler_client import pb

from procs import (CLIENTS, ELECTION_LANGS, EXAMPLE_LANGS, LANGS, MULTI_LANGS, NAMESPACE, OBSERVE_LANGS,
                   READ_WRITE_LANGS, RESIGN_TAKES_LEADERSHIP, ROOT, WEIGHTED_LANGS, Step,
                   free_port, java_class_path, start_dev, start_redis, start_serve, stop)

results = []  # (lang, ok, text)


def check(lang, ok, text, detail=None):
    results.append((lang, bool(ok), text))
    line = f"{'PASS' if ok else 'FAIL'}  [{lang}] {text}"
    if not ok and detail is not None:
        line += f"\n        got: {detail}"
    print(line, flush=True)
    return ok


def step(lang, *args, addr):
    return Step(lang, args, addr, report=check).result()


def run_step(lang, args, addr, table="steps"):
    return Step(lang, args, addr, table=table, report=check)


def wait_for_queue(addr, name, expected, timeout=10):
    """Poll the lock's queue until it lists `expected` holders in order (orchestration only)."""
    with tc.Client(addr, namespace=NAMESPACE) as c:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if [r.holder for r in c.queue(name).requests] == expected:
                return True
            time.sleep(0.05)
    return False


def selected(*langs, part):
    """True when every language of a cross-language part is being run; else prints why the part is skipped."""
    missing = [lang for lang in langs if lang not in LANGS]
    if missing:
        print(f"SKIP  {part}: {', '.join(missing)} not selected (--langs)", flush=True)
    return not missing


def is_invalid_argument(code):
    """INVALID_ARGUMENT as each helper names it (INVALID_ARGUMENT, InvalidArgument, invalid_argument, 3)."""
    return str(code).replace("_", "").lower() in ("invalidargument", "3")


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
    tokens, pieces = [], 0
    if selected("python", "node", "go", "ruby", part="mutex hand-over Python -> Node -> Go, Ruby inspects"):
        pieces += 3
        held = step("python", "hold", mutex, "py-holder", "1", addr=addr)
        check("python", held and held["status"] == "ACQUIRED", f"takes the mutex {mutex}", held)
        tokens += [("python", int(held["token"]))] if held and held.get("token") else []
        node_wait = run_step("node", ["wait", mutex, "node-waiter", "20000", "300"], addr)
        check("node", wait_for_queue(addr, mutex, ["node-waiter"]), "waits in the server's queue (position 1)")
        go_wait = run_step("go", ["wait", mutex, "go-waiter", "20000", "300"], addr)
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
    # A later grant from Ruby continues the sequence, and one from Rust after it.
    for lang in ("ruby", "rust"):
        if selected(lang, part=f"a {lang} grant continues the token sequence"):
            pieces += 1
            last = step(lang, "hold", mutex, f"{lang}-holder", "1", addr=addr)
            if last and last.get("token"):
                tokens.append((lang, int(last["token"])))
                step(lang, "release", mutex, f"{lang}-holder", addr=addr)
    # Perl waits in the server's queue while Python holds the mutex, and is handed it.
    if selected("python", "perl", part="Python -> Perl hand-over"):
        pieces += 1
        py = step("python", "hold", mutex, "py-holder-2", "1", addr=addr)
        perl_wait = run_step("perl", ["wait", mutex, "perl-waiter", "20000", "100"], addr)
        check("perl", py and py["status"] == "ACQUIRED" and wait_for_queue(addr, mutex, ["perl-waiter"]),
              "waits in the server's queue while Python holds the mutex", py)
        step("python", "release", mutex, "py-holder-2", addr=addr)
        got_perl = perl_wait.result()
        if got_perl and py and py.get("token"):
            check("perl", got_perl["holder"] == "perl-waiter" and int(got_perl["token"]) > int(py["token"]),
                  f"is handed the mutex when Python releases (token {got_perl['token']})", got_perl)
            tokens.append(("perl", int(got_perl["token"])))
    seq = " < ".join(f"{lang} {t}" for lang, t in tokens)
    ok = len(tokens) == pieces and all(a[1] < b[1] for a, b in zip(tokens, tokens[1:]))
    for lang in LANGS:
        check(lang, ok, f"fencing tokens strictly increase across languages: {seq}")

    # 3. A semaphore with limit 2 shared across languages.
    sem = "exports"
    if selected("ruby", "go", "python", "node", part="semaphore shared by Ruby, Go, Python and Node"):
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
    # Perl's slots are IPC::ConcurrencyLimit's lock ids: the same semaphore with Python.
    if selected("python", "perl", part="semaphore shared by Python and Perl"):
        a = step("python", "hold", sem, "py-worker", "2", addr=addr)
        b = step("perl", "hold", sem, "perl-worker", "2", addr=addr)
        check("perl", a and a["slot"] == 1 and b and b["status"] == "ACQUIRED" and b["slot"] == 2,
              "semaphore limit 2: holds slot 2 beside Python's slot 1", {"python": a, "perl": b})
        seen = step("perl", "inspect", sem, addr=addr)
        check("perl", seen and seen["limit"] == 2 and
              sorted((h["holder"], h["slot"]) for h in seen["holders"]) == [("perl-worker", 2), ("py-worker", 1)],
              "inspect sees Python in slot 1 and Perl in slot 2 of limit 2", seen)
        e = step("perl", "hold", sem, "perl-worker-2", "2", addr=addr)
        check("perl", e and e["status"] == "BUSY" and e["holders"] == 2, "semaphore limit 2: a third holder refused BUSY", e)
        step("python", "release", sem, "py-worker", addr=addr)
        e = step("perl", "hold", sem, "perl-worker-2", "2", addr=addr)
        check("perl", e and e["status"] == "ACQUIRED" and e["slot"] == 1, "takes the freed slot 1", e)
        for holder in ("perl-worker", "perl-worker-2"):
            step("perl", "release", sem, holder, addr=addr)

    # 4. Bad input: INVALID_ARGUMENT naming the field.
    for lang in LANGS:
        r = step(lang, "invalid", addr=addr)
        if r:
            check(lang, is_invalid_argument(r["code"]) and r.get("message", "").startswith(r["field"]) and r.get("typed"),
                  f"bad {r['field']} -> {r.get('typed')} (INVALID_ARGUMENT) \"{r.get('message')}\"", r)


def campaigner(lang, name, candidate, value, ttl_ms, wait_ms, addr):
    """A campaign step that stays up, taking commands (proclaim, resign, lost, exit) on its stdin."""
    return Step(lang, ["campaign", name, candidate, value, ttl_ms, wait_ms], addr, report=check, commands_in=True)


def leader_is(lang, addr, name, candidate, term, value):
    r = step(lang, "leader", name, addr=addr)
    seen = r and r["leader"]
    return seen and (seen["candidate"], seen["term"], seen["value"]) == (candidate, term, value), r


def refused_without_the_secret(addr, name, candidate, term):
    """Proclaim and Resign for a leader by its readable candidate and term, with no secret and with a wrong one:
    each must be PERMISSION_DENIED (decision 0082). Returns the codes seen."""
    import grpc
    seen = []
    with tc.Client(addr, namespace=NAMESPACE) as c:
        for secret in ("", "0" * 64):
            for call, req in (
                    (c.stub.Proclaim, pb.ProclaimRequest(namespace=NAMESPACE, name=name, candidate=candidate,
                                                         term=int(term), value="forged", secret=secret)),
                    (c.stub.Resign, pb.ResignRequest(namespace=NAMESPACE, name=name, candidate=candidate,
                                                     term=int(term), secret=secret))):
                try:
                    call(req, timeout=5)
                    seen.append("OK")
                except grpc.RpcError as e:
                    seen.append(e.code().name)
    return seen


def election_round(addr, a, b, o, r, n):
    """One round: `a` is elected, `b` waits, `r` reads the leader, `o` observes (None: nobody observes)."""
    name, ttl = f"election-{n}", 1500
    ca, cb = f"{a}-leader-{n}", f"{b}-next-{n}"
    lead = campaigner(a, name, ca, f"{a}-v1", ttl, 5000, addr)
    got = lead.event()
    if not check(a, got and got.get("elected") and int(got["term"]) > 0 and got["candidate"] == ca
                 and got["value"] == f"{a}-v1", f"election: campaign elected (term {got and got.get('term')}, "
                                                 f"value {a}-v1)", got):
        lead.kill()
        return
    term = got["term"]
    wait = campaigner(b, name, cb, f"{b}-v1", ttl, 20000, addr)
    check(b, wait_for_queue(addr, name, [cb]), f"election: a second candidate waits in the queue behind {a}")
    watch = o and Step(o, ["observe", name, cb, 20000], addr, report=check)
    first = watch and watch.event()
    if watch:
        check(o, first and first["kind"] == "current" and first["leader"]
              and (first["leader"]["candidate"], first["leader"]["term"]) == (ca, term),
              f"election: observe starts with the current leader ({a}, term {term})", first)
    time.sleep(2 * ttl / 1000)
    ok, seen = leader_is(r, addr, name, ca, term, f"{a}-v1")
    check(r, ok, f"election: leader() sees {a}'s candidate, term {term}, value {a}-v1 after {2 * ttl} ms "
                 f"(twice its {ttl} ms lease: the watchdog extended it)", seen)
    # Anyone with the namespace reads the candidate and term; acting for the leader needs its secret.
    codes = refused_without_the_secret(addr, name, ca, term)
    ok, seen = leader_is(r, addr, name, ca, term, f"{a}-v1")
    check(a, codes == ["PERMISSION_DENIED"] * 4 and ok,
          f"election: Proclaim and Resign for {a}'s leader without its secret, or with a wrong one -> "
          f"PERMISSION_DENIED, the leadership unchanged ({', '.join(codes)})", seen)
    said = lead.ask(f"proclaim {a}-v2")
    check(a, said and said["status"] == "PROCLAIMED" and said["value"] == f"{a}-v2" and not said["lost"],
          f"election: proclaim {a}-v2", said)
    if watch:
        change = watch.event()
        check(o, change and change["kind"] == "proclaimed" and change["leader"]
              and (change["leader"]["term"], change["leader"]["value"]) == (term, f"{a}-v2"),
              f"election: observe tells \"proclaimed\" {a}-v2 (term {term})", change)
    ok, seen = leader_is(r, addr, name, ca, term, f"{a}-v2")
    check(r, ok, f"election: leader() sees the proclaimed value {a}-v2", seen)
    resigned = lead.ask("resign")
    by_value = a in RESIGN_TAKES_LEADERSHIP
    if by_value:
        check(a, resigned and resigned["first"] is True,
              "election: resign ends the term (it takes the leadership: nothing can use it after)", resigned)
    else:
        check(a, resigned and resigned["first"] is True and resigned["second"] is False,
              "election: resign ends the term (a second resign is a no-op)", resigned)
    won = wait.event()
    check(b, won and won.get("elected") and won["candidate"] == cb and int(won["term"]) > int(term),
          f"election: elected when {a} resigned, term {won and won.get('term')} > {term}", won)
    if not by_value:
        stale = lead.ask(f"proclaim {a}-v3")
        check(a, stale and stale["status"] == "NOT_LEADER" and stale["lost"],
              f"election: proclaim with the old term {term} -> NOT_LEADER ({stale and stale.get('typed')}), lost",
              stale)
    lead.send("exit")
    lead.result()
    if watch:
        seen = watch.result()
        kinds = [c["kind"] for c in (seen or {}).get("changes", [])]
        last = (seen or {}).get("changes", [{}])[-1].get("leader") or {}
        check(o, seen and seen["cancelled"] and kinds[-1:] == ["elected"] and won
              and (last.get("candidate"), last.get("term")) == (cb, won["term"])
              and set(kinds) <= {"current", "proclaimed", "resigned", "elected"},
              f"election: observe tells {b}'s election, then is cancelled ({' -> '.join(kinds)})", seen)
    # Taken away from outside (an admin's Clear of the namespace, the one way besides its secret): the
    # watchdog's Extend says NOT_HELD.
    if won and won.get("elected"):
        taken = now_ms()
        with tc.Client(addr, namespace=NAMESPACE) as c:
            c.stub.Clear(pb.ClearRequest(namespace=NAMESPACE), timeout=5)
        lost = wait.ask(f"lost {2 * ttl}")
        check(b, lost and lost["lost"] and lost["at_ms"] - taken <= ttl,
              f"election: lost() {lost and lost['at_ms'] - taken} ms after its term was cleared by an admin "
              f"({lost and lost.get('reason')})",
              lost)
        stale = wait.ask(f"proclaim {b}-v2")
        check(b, stale and stale["status"] == "NOT_LEADER" and stale["lost"],
              f"election: proclaim with the term cleared by an admin -> NOT_LEADER "
              f"({stale and stale.get('typed')})", stale)
    wait.send("exit")
    wait.result()


def killed_leader(addr, k, w, n):
    """A leader whose process is SIGKILLed: the waiting candidate is elected within about one lease."""
    name, ttl = f"election-kill-{n}", 1000
    lead = campaigner(k, name, f"{k}-doomed-{n}", "doomed", ttl, 5000, addr)
    got = lead.event()
    wait = campaigner(w, name, f"{w}-next-{n}", "next", ttl, 20000, addr)
    queued = wait_for_queue(addr, name, [f"{w}-next-{n}"])
    time.sleep(ttl / 1000)  # the leader has extended its lease at least once
    lead.kill()
    killed = now_ms()
    won = wait.event()
    after = won and won.get("at_ms", 0) - killed
    check(w, got and queued and won and won.get("elected") and int(won["term"]) > int(got["term"])
          and after <= ttl + 500,
          f"election: {k}'s leader SIGKILLed, elected {after} ms later (lease {ttl} ms), term "
          f"{won and won.get('term')} > {got and got.get('term')}", {"killed": got, "next": won})
    wait.send("exit")
    wait.result()


def election(addr):
    """Leader election across the helpers: each language in turn leads, waits, observes and reads the leader."""
    langs = [lang for lang in ELECTION_LANGS if lang in LANGS]
    if not langs:
        print("SKIP  election: no election language selected (--langs)", flush=True)
        return
    observers = [lang for lang in langs if lang in OBSERVE_LANGS]
    for n, a in enumerate(langs):
        b = langs[(n + 1) % len(langs)]
        r = langs[(n + 3) % len(langs)]
        o = observers[(n + 2) % len(observers)] if observers else None
        election_round(addr, a, b, o, r, n)
    for n, k in enumerate(langs):
        killed_leader(addr, k, langs[(n + 1) % len(langs)], n)


def is_failed_precondition(code):
    """FAILED_PRECONDITION as each helper names it (FAILED_PRECONDITION, FailedPrecondition, failed_precondition, 9)."""
    return str(code).replace("_", "").lower() in ("failedprecondition", "9")


def mode_is(got, mode):
    """A step's grant mode (read, READ, LOCK_MODE_READ, Read) is `mode`."""
    return bool(got) and str(got.get("mode") or "").lower().endswith(mode)


def read_write_round(addr, r1, r2, w, n):
    """Readers from r1 and r2 hold at once; w's writer waits for both, then gets a higher token; an upgrade and a
    plain acquire of the held read/write lock are FAILED_PRECONDITION."""
    name = f"rw-{n}"
    a = step(r1, "rw_hold", name, f"{r1}-reader", "read", addr=addr)
    check(r1, a and a["status"] == "ACQUIRED" and mode_is(a, "read"), f"read/write: a {r1} reader holds {name}", a)
    b = step(r2, "rw_hold", name, f"{r2}-reader", "read", addr=addr)
    check(r2, b and b["status"] == "ACQUIRED" and mode_is(b, "read"),
          f"read/write: a {r2} reader holds {name} beside the {r1} reader", b)
    with tc.Client(addr, namespace=NAMESPACE) as c:
        info = c.inspect(name)
    holders = sorted(h.grant.holder for h in info.holders)
    check(r2, holders == sorted([f"{r1}-reader", f"{r2}-reader"]) and info.mode == pb.LOCK_MODE_READ
          and all(h.grant.mode == pb.LOCK_MODE_READ for h in info.holders),
          f"read/write: two readers ({r1}, {r2}) hold at once, the lock in read mode", (holders, info.mode))
    writer = run_step(w, ["rw_wait", name, f"{w}-writer", "write", "20000", "100"], addr)
    check(w, wait_for_queue(addr, name, [f"{w}-writer"]), f"read/write: a {w} writer waits while the readers hold")
    up = step(r1, "rw_hold", name, f"{r1}-reader", "write", addr=addr)
    check(r1, up and up["status"] == "ERROR" and is_failed_precondition(up["code"]),
          f"read/write: the {r1} reader's upgrade to write -> FAILED_PRECONDITION ({up and up.get('typed')})", up)
    plain = step(r2, "rw_hold", name, f"{r2}-plain", "plain", addr=addr)
    check(r2, plain and plain["status"] == "ERROR" and is_failed_precondition(plain["code"]),
          f"read/write: a plain acquire of the held read/write lock -> FAILED_PRECONDITION "
          f"({plain and plain.get('typed')})", plain)
    step(r1, "release", name, f"{r1}-reader", addr=addr)
    check(w, wait_for_queue(addr, name, [f"{w}-writer"], timeout=0.3),
          f"read/write: the {w} writer still waits while the {r2} reader holds")
    released_at = now_ms()
    step(r2, "release", name, f"{r2}-reader", addr=addr)
    got = writer.result()
    tokens = [int(x["token"]) for x in (a, b) if x and x.get("token")]
    check(w, got and mode_is(got, "write") and len(tokens) == 2 and int(got["token"]) > max(tokens)
          and got["acquired_at_ms"] >= released_at,
          f"read/write: the {w} writer is granted once both readers released, token {got and got.get('token')} > "
          f"{max(tokens) if tokens else '?'}", got)


def in_turn(addr, part, langs, one_round):
    """one_round(addr, a, b, c, n) once per selected language of `langs`, each in turn `a` (the next two `b`, `c`)."""
    langs = [lang for lang in langs if lang in LANGS]
    if len(langs) < 3:
        print(f"SKIP  {part}: fewer than 3 of its languages selected (--langs)", flush=True)
        return
    for n in range(len(langs)):
        one_round(addr, langs[n], langs[(n + 1) % len(langs)], langs[(n + 2) % len(langs)], n)


def read_write(addr):
    """Read/write locks across the helpers: each language in turn is a reader beside another, and the writer."""
    in_turn(addr, "read_write", READ_WRITE_LANGS, read_write_round)


def weights_are(got, permits, slots):
    """A step's grant holds `permits` permits in `slots`, one slot per permit."""
    return bool(got) and got.get("permits") == permits and got.get("slots") == slots


def weighted_round(addr, a, b, c, n):
    """On a semaphore of limit 5: a takes 3 permits, b's 3 do not fit (BUSY), c's 2 do; b waits, and is granted
    3 slots with a higher token when a releases; a's 6 of 5 is INVALID_ARGUMENT naming `permits`."""
    name, limit = f"weighted-{n}", "5"
    big = step(a, "weighted_hold", name, f"{a}-big", limit, "3", addr=addr)
    check(a, big and big["status"] == "ACQUIRED" and weights_are(big, 3, [1, 2, 3]),
          f"weighted: a {a} job takes 3 of {limit} permits, slots 1..3", big)
    busy = step(b, "weighted_hold", name, f"{b}-big", limit, "3", addr=addr)
    check(b, busy and busy["status"] == "BUSY" and busy["holders"] == 3,
          f"weighted: {b}'s 3 more do not fit beside {a}'s 3 of {limit} (BUSY, 3 permits in use)", busy)
    small = step(c, "weighted_hold", name, f"{c}-small", limit, "2", addr=addr)
    check(c, small and small["status"] == "ACQUIRED" and weights_are(small, 2, [4, 5]),
          f"weighted: {c}'s 2 fit beside {a}'s 3, slots 4 and 5", small)
    with tc.Client(addr, namespace=NAMESPACE) as cl:
        info = cl.inspect(name)
    seen = sorted((h.grant.holder, h.grant.permits, list(h.grant.slots)) for h in info.holders)
    check(c, info.permits_in_use == 5 and seen == sorted([(f"{a}-big", 3, [1, 2, 3]), (f"{c}-small", 2, [4, 5])]),
          f"weighted: inspect counts 5 permits in use, {a}'s 3 and {c}'s 2", (info.permits_in_use, seen))
    waiter = run_step(b, ["weighted_wait", name, f"{b}-big", limit, "3", "20000", "100"], addr)
    queued = wait_for_queue(addr, name, [f"{b}-big"])
    with tc.Client(addr, namespace=NAMESPACE) as cl:
        asks = [r.permits for r in cl.queue(name).requests]
    check(b, queued and asks == [3], f"weighted: {b} waits in the queue for its 3 permits", asks)
    refused = step(a, "weighted_hold", name, f"{a}-too-many", limit, "6", addr=addr)
    check(a, refused and refused["status"] == "ERROR" and is_invalid_argument(refused["code"])
          and str(refused.get("message", "")).startswith("permits"),
          f"weighted: 6 of {limit} permits -> {refused and refused.get('typed')} (INVALID_ARGUMENT) "
          f"\"{refused and refused.get('message')}\"", refused)
    released_at = now_ms()
    step(a, "release", name, f"{a}-big", addr=addr)
    got = waiter.result()
    tokens = [int(x["token"]) for x in (big, small) if x and x.get("token")]
    check(b, got and weights_are(got, 3, [1, 2, 3]) and len(tokens) == 2 and int(got["token"]) > max(tokens)
          and got["acquired_at_ms"] >= released_at,
          f"weighted: {b} is granted its 3 permits (slots 1..3) once {a} released, token {got and got.get('token')} > "
          f"{max(tokens) if tokens else '?'}", got)
    check(b, got and weights_are(got.get("extended"), 3, [1, 2, 3]),
          f"weighted: {b}'s grant keeps its 3 permits and slots when extended", got)
    step(c, "release", name, f"{c}-small", addr=addr)


def weighted(addr):
    """Weighted permits across the helpers: each language in turn takes a big share, waits for one, and fits beside."""
    in_turn(addr, "weighted", WEIGHTED_LANGS, weighted_round)


def is_aborted(code):
    """ABORTED as each helper names it (ABORTED, Aborted, aborted, 10)."""
    return str(code).replace("_", "").lower() in ("aborted", "10")


def set_names(got):
    """The names of a multi step's grants, in the order reported."""
    return [g.get("name") for g in (got or {}).get("grants") or []]


def set_tokens(got):
    return [int(g["token"]) for g in (got or {}).get("grants") or [] if g.get("token")]


def holders_of(addr, *names):
    """Each lock's holders, by name (orchestration: the driver's own client)."""
    with tc.Client(addr, namespace=NAMESPACE) as cl:
        return [[h.grant.holder for h in cl.inspect(name).holders] for name in names]


def held_by(addr, name, holder, timeout=10):
    """Polls until `holder` alone holds the lock: its grant (pb.Grant), or None."""
    with tc.Client(addr, namespace=NAMESPACE) as cl:
        deadline = time.time() + timeout
        while time.time() < deadline:
            grants = [h.grant for h in cl.inspect(name).holders]
            if [g.holder for g in grants] == [holder]:
                return grants[0]
            time.sleep(0.02)
    return None


def multi_round(addr, a, b, c, n):
    """a takes {x, y}; b's {y, z} is BUSY and leaves z unheld; c's {z, w} fits beside; b waits for {y, z} and is
    granted, tokens above the earlier ones, only once both a and c released; a release of a set not held answers
    false; a name twice is INVALID_ARGUMENT naming `names`."""
    x, y, z, w = (f"multi-{n}-{k}" for k in "xyzw")
    ha, hb, hc = f"{a}-set", f"{b}-set", f"{c}-set"
    first = step(a, "multi_hold", ha, f"{x},{y}", addr=addr)
    check(a, first and first["status"] == "ACQUIRED" and first["holder"] == ha and set_names(first) == [x, y]
          and len(set_tokens(first)) == 2 and min(set_tokens(first)) > 0,
          f"multi: a {a} set takes {{x, y}}, a grant and a fencing token per name in the order asked", first)
    busy = step(b, "multi_hold", hb, f"{y},{z}", addr=addr)
    z_held = holders_of(addr, z)[0]
    check(b, busy and busy["status"] == "BUSY" and z_held == [],
          f"multi: {b}'s {{y, z}} is BUSY beside {a}'s {{x, y}}, and leaves z unheld (all or nothing)",
          {"step": busy, "z held by": z_held})
    other = step(c, "multi_hold", hc, f"{z},{w}", addr=addr)
    check(c, other and other["status"] == "ACQUIRED" and set_names(other) == [z, w],
          f"multi: {c}'s {{z, w}} fits beside {a}'s {{x, y}}", other)
    waiter = run_step(b, ["multi_wait", hb, f"{y},{z}", "20000", "1000"], addr)
    check(b, wait_for_queue(addr, y, [hb]) and wait_for_queue(addr, z, [hb]),
          f"multi: {b} waits for {{y, z}}, in the queues of both busy locks")
    stray = step(a, "multi_release", ha, f"{z},{w}", addr=addr)
    check(a, stray and stray["released"] is False and holders_of(addr, z, w) == [[hc], [hc]],
          f"multi: {a}'s release of a set it does not hold ({c}'s {{z, w}}) answers released=false, "
          f"and {c} still holds it", stray)
    dup = step(a, "multi_hold", f"{a}-dup", f"multi-{n}-v,multi-{n}-v", addr=addr)
    check(a, dup and dup["status"] == "ERROR" and is_invalid_argument(dup["code"])
          and str(dup.get("message", "")).startswith("names"),
          f"multi: a set naming a lock twice -> {dup and dup.get('typed')} (INVALID_ARGUMENT) "
          f"\"{dup and dup.get('message')}\"", dup)
    rel = step(a, "multi_release", ha, f"{x},{y}", addr=addr)
    check(a, rel and rel["released"] is True, f"multi: {a} releases its set {{x, y}}", rel)
    queued = wait_for_queue(addr, y, [hb], timeout=0.3)
    y_held = holders_of(addr, y)[0]
    check(b, queued and y_held == [], f"multi: {b} still waits once {a} released: y is free, not taken alone "
                                      f"while z is held", {"queued": queued, "y held by": y_held})
    released_at = now_ms()
    rel = step(c, "multi_release", hc, f"{z},{w}", addr=addr)
    check(c, rel and rel["released"] is True, f"multi: {c} releases its set {{z, w}}", rel)
    grant = held_by(addr, y, hb)
    got = waiter.result()
    earlier = set_tokens(first) + set_tokens(other)
    check(b, got and got["status"] == "ACQUIRED" and set_names(got) == [y, z] and grant is not None
          and grant.acquired_at_ms >= released_at and len(earlier) == 4 and len(set_tokens(got)) == 2
          and min(set_tokens(got)) > max(earlier),
          f"multi: {b} is granted {{y, z}} only once both {a} and {c} released, tokens "
          f"{set_tokens(got) if got else '?'} > {max(earlier) if earlier else '?'}",
          {"step": got, "acquired_at_ms": grant and grant.acquired_at_ms, "released_at_ms": released_at})
    check(b, got and got.get("extended") is True, f"multi: {b}'s set is extended as one", got)
    check(b, holders_of(addr, x, y, z, w) == [[], [], [], []], "multi: every lock free once the sets are released")


def stale_set_round(addr, lang, n):
    """SAFETY.md finding 10: a holder takes {a, b} (S1), releases it and takes it again (S2); S1's late release
    (sent to the server, pinned to S1's tokens) answers not held and leaves S2 held with its own tokens; S2's own
    release then frees both."""
    a, b, holder = f"stale-{n}-a", f"stale-{n}-b", f"{lang}-stale"
    s = Step(lang, ["multi_stale", holder, f"{a},{b}"], addr, report=check, commands_in=True)
    got = s.event() or {}
    first, second = set_tokens(got.get("first")), set_tokens(got.get("second"))
    with tc.Client(addr, namespace=NAMESPACE) as cl:
        held = [[(h.grant.holder, h.grant.fencing_token) for h in cl.inspect(name).holders] for name in (a, b)]
    check(lang, got.get("first_released") is True and got.get("stale_released") is False and len(first) == 2
          and len(second) == 2 and min(second) > max(first) and held == [[(holder, t)] for t in second],
          f"multi: a late release of {lang}'s set S1 {first} after it took {{a, b}} again as S2 {second} answers "
          f"not held, and S2 keeps both locks with its tokens", {"step": got, "inspect": held})
    s.send("release")
    done = s.result()
    check(lang, done and done.get("released") is True and holders_of(addr, a, b) == [[], []],
          f"multi: {lang}'s S2 then releases normally (released=true), both locks free", done)


def deadlock_round(addr, a, b, n):
    """a holds x and waits for y; b holds y and its wait for x would close the cycle: refused at once as the
    helper's typed deadlock (ABORTED, "deadlock: ..."); once everything is released a's wait is granted."""
    x, y = f"deadlock-{n}-x", f"deadlock-{n}-y"
    ha, hb = f"{a}-dl", f"{b}-dl"
    hold_x = step(a, "hold", x, ha, "1", addr=addr)
    hold_y = step(b, "hold", y, hb, "1", addr=addr)
    check(b, hold_x and hold_x["status"] == "ACQUIRED" and hold_y and hold_y["status"] == "ACQUIRED",
          f"deadlock: {a} holds x, {b} holds y", {"x": hold_x, "y": hold_y})
    waiting = run_step(a, ["wait", y, ha, "20000", "100"], addr)
    queued = wait_for_queue(addr, y, [ha])
    # A wait is checked once it has lasted a tenth of its wait_ms (at most 1 s): past a's own check, only b's
    # wait closes the cycle (two waits closing it at the same moment may both be refused).
    time.sleep(1.2)
    started = time.monotonic()
    got = step(b, "deadlock_wait", x, hb, "10000", addr=addr)
    took = int((time.monotonic() - started) * 1000)
    message = str((got or {}).get("message", ""))
    check(b, queued and got and got["status"] == "DEADLOCK" and is_aborted(got.get("code"))
          and "deadlock" in str(got.get("typed", "")).lower() and message.startswith("deadlock: ")
          and ha in message and hb in message,
          f"deadlock: {b}'s wait for x, held by {a} who waits for {b}'s y, is refused in {took} ms as "
          f"{got and got.get('typed')} (ABORTED) \"{message}\"", got)
    with tc.Client(addr, namespace=NAMESPACE) as cl:
        left = [r.holder for r in cl.queue(x).requests]
    check(b, left == [], f"deadlock: nothing of {b}'s refused wait stays queued on x", left)
    step(b, "release", y, hb, addr=addr)
    step(a, "release", x, ha, addr=addr)
    won = waiting.result()
    check(a, won and won.get("holder") == ha and hold_y and int(won["token"]) > int(hold_y["token"]),
          f"deadlock: {a}'s wait for y is granted once everything is released (token {won and won.get('token')})",
          won)


def multi(addr):
    """Multi-locks and deadlock detection across the helpers: each language in turn holds a set, waits for one,
    fits beside; each sends a late release of a set it has taken again since (the newer set stays held); then
    each in turn closes a cycle of waiters and is refused with its typed deadlock."""
    in_turn(addr, "multi", MULTI_LANGS, multi_round)
    for n, lang in enumerate(lang for lang in MULTI_LANGS if lang in LANGS):
        stale_set_round(addr, lang, n)
    langs = [lang for lang in MULTI_LANGS if lang in LANGS]
    if len(langs) < 2:
        print("SKIP  multi (deadlock): fewer than 2 of its languages selected (--langs)", flush=True)
        return
    for n, a in enumerate(langs):
        deadlock_round(addr, a, langs[(n + 1) % len(langs)], n)


def unique_across_languages(addr):
    """Ruby and Python compute the same digest, so a job is unique whichever language enqueues it."""
    args = json.dumps([42, "Zürich"])
    r1 = Step("ruby", ["enqueue", "ReportJob", args, "rb-jid-1", "60000"], addr, table="examples").result()
    check("ruby", r1 and r1["enqueued"], "unique jobs across languages: Ruby enqueues ReportJob(42, Zürich)", r1)
    p1 = Step("python", ["enqueue", "ReportJob", args, "py-jid-2", "60000"], addr, table="examples").result()
    check("python", p1 and r1 and p1["lock"] == r1["lock"] and not p1["enqueued"],
          "unique jobs across languages: same digest as Ruby, the duplicate is refused", p1)
    done = Step("ruby", ["perform", "ReportJob", args, "rb-jid-1"], addr, table="examples").result()
    p2 = Step("python", ["enqueue", "ReportJob", args, "py-jid-3", "60000"], addr, table="examples").result()
    check("python", done and p2 and p2["enqueued"],
          "unique jobs across languages: accepted once Ruby's job has succeeded", p2)


def examples(addr):
    """The seed patterns of the clients' READMEs, run as they are documented."""
    if selected("ruby", "python", part="unique jobs across Ruby and Python"):
        unique_across_languages(addr)
    for lang in EXAMPLE_LANGS:
        r = run_step(lang, ["all"], addr, table="examples").result(timeout=120)
        for c in (r or {}).get("checks", []):
            check(lang, c["ok"], "example: " + c["what"], c.get("detail"))


def now_ms():
    return int(time.time() * 1000)


def probe(client, name, holder="probe"):
    """Try once to take the lock as another client; give it back at once if granted. Returns the status name."""
    resp = client.stub.Acquire(pb.AcquireRequest(namespace=NAMESPACE, name=name, holder=holder, wait_ms=0,
                                                 ttl_ms=1000), timeout=5)
    if resp.status == pb.ACQUIRE_STATUS_ACQUIRED:
        client.stub.Release(pb.ReleaseRequest(namespace=NAMESPACE, name=name, holder=holder), timeout=5)
        return "ACQUIRED"
    return pb.NotAcquiredReason.Name(resp.reason).replace("NOT_ACQUIRED_REASON_", "")


def held_means_held(addr):
    """A lease shorter than the work: the helper's watchdog keeps the grant; a second client is refused throughout."""
    ttl, work = 600, 2000
    steps = {lang: run_step(lang, ["keep", f"keep-{lang}", ttl, work], addr) for lang in LANGS}
    held = {lang: None for lang in LANGS}
    probes = {lang: [] for lang in LANGS}
    with tc.Client(addr, namespace=NAMESPACE) as c:  # probe each lock from its "held" line until its step ends
        deadline = time.time() + 30
        while time.time() < deadline and any(s.proc.poll() is None for s in steps.values()):
            for lang, s in steps.items():
                held[lang] = held[lang] or s.poll_event()
                if s.proc.poll() is None and held[lang]:
                    probes[lang].append((now_ms(), probe(c, f"keep-{lang}")))
            time.sleep(0.1)
    for lang, s in steps.items():
        r = s.result()
        if not (check(lang, held[lang], "held means held: the helper took the lock") and r):
            continue
        timed = [(t, st) for t, st in probes[lang] if r["body_start_ms"] <= t <= r["body_end_ms"]]
        inside = [st for _, st in timed]
        # Probes across at least two leases of the body (however few a
        # loaded machine lets this loop send), every one refused.
        spans = len(timed) >= 3 and timed[-1][0] - timed[0][0] >= 2 * ttl
        check(lang, not r["lost"] and spans and set(inside) == {"BUSY"},
              f"held means held: lease {ttl} ms, body {work} ms; a second client was refused "
              f"{inside.count('BUSY')}/{len(inside)} times while the body ran", {"probes": inside, "step": r})
        check(lang, r["token_inside"] == r["token"] == held[lang]["token"],
              f"held means held: the grant kept its fencing token {r['token']} (extended, never re-acquired)", r)
        check(lang, r["holders_after"] == 0, "held means held: released when the block ended", r)


def crash_frees(addr):
    """A killed helper process: the watchdog stops, the lock frees when its lease ends (no Session is used)."""
    ttl = 1000
    steps = {lang: run_step(lang, ["crash", f"crash-{lang}", ttl], addr) for lang in LANGS}
    held = {lang: s.event() for lang, s in steps.items()}
    time.sleep(1.5)
    with tc.Client(addr, namespace=NAMESPACE) as c:
        for lang, s in steps.items():
            if not held[lang]:
                s.kill()
                continue
            holders = [str(h.grant.fencing_token) for h in c.inspect(f"crash-{lang}").holders]
            check(lang, holders == [held[lang]["token"]], f"crash: still held 1.5 s into a {ttl} ms lease", holders)
            s.kill()
            killed = time.monotonic()
            while probe(c, f"crash-{lang}") != "ACQUIRED" and time.monotonic() - killed < 5:
                time.sleep(0.02)
            freed = int((time.monotonic() - killed) * 1000)
            check(lang, freed <= ttl + 250,
                  f"crash: SIGKILLed holder's lock free again {freed} ms after the kill (watchdog lease {ttl} ms)")


def lost_signalled(addr):
    """The driver force-releases the grant with the holder's token while the body runs: the helper says so at once."""
    ttl = 900
    variants = [("python", "lost", "event set, LockLost at the block's end"),
                ("python", "lost-async", "asyncio: body task cancelled, LockLost"),
                ("node", "lost", "body's AbortSignal aborted, withLock rejects with LockLostError"),
                ("go", "lost", "body's ctx cancelled, WithLock returns ErrLockLost"),
                ("ruby", "lost", "LockLost raised inside the block"),
                ("rust", "lost", "lost() resolved: run() dropped the body, returns Error::LockLost"),
                ("perl", "lost", "heartbeat false in the work loop, then check dies with LockLost"),
                ("java", "lost", "onLost listener called, close() throws LockLostException")]
    steps = [(lang, how, run_step(lang, [st, f"lost-{lang}-{st}", ttl], addr)) for lang, st, how in variants
             if lang in LANGS]
    released_at = []
    with tc.Client(addr, namespace=NAMESPACE) as c:
        for lang, how, s in steps:
            ev = s.event()
            if ev:
                time.sleep(0.2)
                # Taken before the call: a loaded machine may run the
                # helper's renewal (and its signal) before this process
                # hears the answer.
                released_at.append(now_ms())
                resp = c.stub.Release(pb.ReleaseRequest(namespace=NAMESPACE, name=f"lost-{lang}-{s.args[0]}",
                                                        holder=ev["holder"], fencing_token=int(ev["token"])), timeout=5)
                check(lang, resp.status == pb.RELEASE_STATUS_RELEASED, f"lost: forced release with the holder's token ({how.split(':')[0]})")
            else:
                released_at.append(now_ms())
    for (lang, how, s), at in zip(steps, released_at):
        r = s.result()
        if r:
            delay = r.get("signal_at_ms", 0) - at
            check(lang, r["signalled"] and r.get("raised") and 0 <= delay <= ttl // 3 + 300,
                  f"lost: signalled {delay} ms after the grant was taken away ({how})", r)


def cancel_leaves_no_waiter(addr):
    """Cancel a waiting acquire: the call ends at once, the server drops the request, nobody is granted later."""
    names = {"python": ("cancel-async", "CancelledError"), "node": ("cancel", "AbortError"),
             "go": ("cancel", "context.Canceled"), "ruby": ("cancel", "Timeout::Error"),
             "rust": ("cancel", "Error::Cancelled"), "perl": ("cancel", "SIGALRM"),
             "java": ("cancel", "InterruptedException")}
    with tc.Client(addr, namespace=NAMESPACE) as c:
        for lang in LANGS:
            c.acquire(f"cancel-{lang}", "blocker", ttl_ms=30000)
        steps = {lang: run_step(lang, [names[lang][0], f"cancel-{lang}", 400], addr) for lang in LANGS}
        for lang, s in steps.items():
            r = s.result()
            if r:
                check(lang, r["queued_before"] and r["error"] == names[lang][1] and r["cancel_ms"] <= 200,
                      f"cancel: a queued acquire stopped {r['cancel_ms']} ms after {names[lang][1]}", r)
                check(lang, r["queue_after"] == [] and r["gone_ms"] <= 500,
                      f"cancel: the request left the server's queue within {r['gone_ms']} ms (Queue RPC)", r)
            c.stub.Release(pb.ReleaseRequest(namespace=NAMESPACE, name=f"cancel-{lang}", holder="blocker"), timeout=5)
            time.sleep(0.1)
            info = c.inspect(f"cancel-{lang}")
            check(lang, not info.holders and info.waiters == 0,
                  "cancel: once the holder released, no ghost waiter was granted the lock", info)


def restart_retries(binary):
    """Waiters whose server is killed retry with the same holder against its replacement and are granted once."""
    redis, redis_port = start_redis()
    port = free_port()
    addr = f"127.0.0.1:{port}"
    servers = [start_serve(binary, port, redis_port)]
    try:
        with tc.Client(addr, namespace=NAMESPACE) as c:
            for lang in LANGS:
                c.acquire(f"restart-{lang}", "blocker", ttl_ms=4000)
        steps = {lang: run_step(lang, ["restart", f"restart-{lang}", f"{lang}-restarter", 15000], addr) for lang in LANGS}
        queued = {lang: wait_for_queue(addr, f"restart-{lang}", [f"{lang}-restarter"]) for lang in LANGS}
        stop(servers[0], sig=9)
        time.sleep(0.5)
        servers.append(start_serve(binary, port, redis_port))
        for lang, s in steps.items():
            r = s.result()
            check(lang, queued[lang] and r and r["status"] == "ACQUIRED" and r["holder"] == f"{lang}-restarter",
                  f"restart: a waiter whose server was SIGKILLed retried on UNAVAILABLE and was granted "
                  f"after {r and r['elapsed_ms']} ms (same holder)", r)
        time.sleep(0.3)
        with tc.Client(addr, namespace=NAMESPACE) as c:
            for lang in LANGS:
                info = c.inspect(f"restart-{lang}")
                check(lang, not info.holders, "restart: after its release nothing is held (the retry took one permit)",
                      info)
    finally:
        for proc in servers + [redis]:
            stop(proc)

# A rollout's drain: short, so that a restart fits in a lease of a few seconds.
DRAIN = ("--shutdown-drain-ms", "300", "--shutdown-grace-ms", "2000")


def restart_mid_hold(binary):
    """A server restart (SIGTERM, started again on its port, same Redis) in the middle of a scoped hold whose lease
    is shorter than the body: the watchdog's Extend rides out the gap; never lost, same token, a second client
    refused whenever the server answered."""
    # The lease must outlast the whole outage from a renewal's point of
    # view: at the stop up to a third of it may have passed since the last
    # Extend, and after the restart a client may wait out its reconnect
    # back-off (up to 1 s) before it extends. With a 3 s lease that left
    # well under a second for stopping and starting the server, and on a
    # loaded machine python's and ruby's watchdogs found the lock expired.
    ttl, work = 6000, 12000
    redis, redis_port = start_redis()
    port = free_port()
    addr = f"127.0.0.1:{port}"
    servers = [start_serve(binary, port, redis_port, *DRAIN)]
    try:
        steps = {lang: run_step(lang, ["keep", f"rkeep-{lang}", ttl, work], addr) for lang in LANGS}
        held = {lang: s.event() for lang, s in steps.items()}
        probes = {lang: [] for lang in LANGS}

        def probe_all(c):
            for lang, s in steps.items():
                if s.proc.poll() is None and held[lang]:
                    try:
                        probes[lang].append((now_ms(), probe(c, f"rkeep-{lang}")))
                    except Exception:  # the server is restarting
                        probes[lang].append((now_ms(), "DOWN"))

        with tc.Client(addr, namespace=NAMESPACE) as c:
            until = time.time() + 1.0
            while time.time() < until:
                probe_all(c)
                time.sleep(0.1)
        stopped = time.monotonic()
        stop(servers[0])
        time.sleep(1.6)  # down (stop, sleep, start) for over a third of the lease: at least one Extend fails and is retried
        servers.append(start_serve(binary, port, redis_port, *DRAIN))
        gap = int((time.monotonic() - stopped) * 1000)
        with tc.Client(addr, namespace=NAMESPACE) as c:
            deadline = time.time() + 30
            while time.time() < deadline and any(s.proc.poll() is None for s in steps.values()):
                probe_all(c)
                time.sleep(0.1)
        for lang, s in steps.items():
            r = s.result()
            if not (check(lang, held[lang], "restart mid-hold: the helper took the lock") and r):
                continue
            inside = [st for t, st in probes[lang] if r["body_start_ms"] <= t <= r["body_end_ms"]]
            answered = [st for st in inside if st != "DOWN"]
            check(lang, not r["lost"] and len(answered) >= 10 and set(answered) == {"BUSY"},
                  f"a server restart mid-hold keeps the lock: lease {ttl} ms, restart gap {gap} ms, body {work} ms; "
                  f"never lost, a second client refused {answered.count('BUSY')}/{len(answered)} times",
                  {"probes": inside, "step": r})
            check(lang, r["token_inside"] == r["token"] == held[lang]["token"],
                  f"restart mid-hold: the grant kept its fencing token {r['token']}", r)
    finally:
        for proc in servers + [redis]:
            stop(proc)


def restart_keeps_place(binary):
    """A waiter whose server drains (SIGTERM) and comes back on its port keeps its place in the queue: a waiter
    that queued after it on another replica is granted after it."""
    redis, redis_port = start_redis()
    port, other_port = free_port(), free_port()
    addr, other = f"127.0.0.1:{port}", f"127.0.0.1:{other_port}"
    servers = [start_serve(binary, port, redis_port, *DRAIN), start_serve(binary, other_port, redis_port, *DRAIN)]
    import threading
    later = {}
    try:
        # The blockers hold until after the restart (released then, not by
        # their lease, which a loaded machine could outlast before it).
        with tc.Client(other, namespace=NAMESPACE) as c:
            for lang in LANGS:
                c.acquire(f"place-{lang}", "blocker", ttl_ms=60000)
        steps = {lang: run_step(lang, ["restart", f"place-{lang}", f"{lang}-first", 20000], addr) for lang in LANGS}
        queued = {lang: wait_for_queue(other, f"place-{lang}", [f"{lang}-first"]) for lang in LANGS}

        def wait_later(lang):
            with tc.Client(other, namespace=NAMESPACE) as c:
                later[lang] = c.stub.Acquire(pb.AcquireRequest(namespace=NAMESPACE, name=f"place-{lang}",
                                                               holder=f"{lang}-later", wait_ms=20000, ttl_ms=1000),
                                             timeout=25)

        threads = [threading.Thread(target=wait_later, args=(lang,)) for lang in LANGS]
        for t in threads:
            t.start()
        for lang in LANGS:
            queued[lang] = queued[lang] and wait_for_queue(other, f"place-{lang}", [f"{lang}-first", f"{lang}-later"])
        stop(servers[0])
        servers.append(start_serve(binary, port, redis_port, *DRAIN))
        with tc.Client(other, namespace=NAMESPACE) as c:
            for lang in LANGS:
                c.stub.Release(pb.ReleaseRequest(namespace=NAMESPACE, name=f"place-{lang}", holder="blocker"), timeout=5)
        for lang, s in steps.items():
            r = s.result()
            for t in threads:
                t.join(timeout=25)
            got = later.get(lang)
            ok = (queued[lang] and r and r["status"] == "ACQUIRED" and got is not None
                  and got.status == pb.ACQUIRE_STATUS_ACQUIRED and int(got.grant.fencing_token) > int(r["token"]))
            check(lang, ok, "a waiter keeps its place across a restart: its server drained and came back, it was "
                            "granted before the waiter queued after it (same holder)",
                  {"step": r, "later": str(got)})
    finally:
        for proc in servers + [redis]:
            stop(proc)


def renewal_fails(binary):
    """The server dies under a held lock: renewals fail, and the helper says the grant is lost when its lease ends."""
    ttl = 1500
    redis, redis_port = start_redis()
    port = free_port()
    addr = f"127.0.0.1:{port}"
    server = start_serve(binary, port, redis_port)
    try:
        variants = [("python", "lost"), ("python", "lost-async"), ("node", "lost"), ("go", "lost"), ("ruby", "lost"),
                    ("rust", "lost"), ("perl", "lost"), ("java", "lost")]
        steps = [(lang, run_step(lang, [st, f"renew-{lang}-{st}", ttl], addr)) for lang, st in variants
                 if lang in LANGS]
        # A leadership's watchdog is the lock's: the same when the server dies under a leader.
        leaders = [(lang, campaigner(lang, f"renew-{lang}-election", f"{lang}-renewer", "v", ttl, 0, addr))
                   for lang in ELECTION_LANGS if lang in LANGS]
        held = [s.event() for _, s in steps]
        elected = [s.event() for _, s in leaders]
        stop(server, sig=9)
        killed_at = now_ms()
        for lang, s in leaders:
            s.send(f"lost {ttl * 3}")
        for (lang, s), ev in zip(leaders, elected):
            r = s.event() if ev else None
            s.kill()
            if r:
                delay = r["at_ms"] - killed_at
                check(lang, r["lost"] and "lease ran out" in (r.get("reason") or "") and ttl // 3 <= delay <= ttl + 300,
                      f"server gone: a leader's renewals failed, lost() {delay} ms after the kill, by the end of "
                      f"the {ttl} ms lease (campaign)", r)
        for (lang, s), ev in zip(steps, held):
            r = s.result()
            if ev and r:
                delay = r.get("signal_at_ms", 0) - killed_at
                check(lang, r["signalled"] and "lease ran out" in r.get("reason", "") and ttl // 3 <= delay <= ttl + 300,
                      f"server gone: renewals failed, lost signalled {delay} ms after the kill, by the end of "
                      f"the {ttl} ms lease ({s.args[0]})", r)
    finally:
        stop(server)
        stop(redis)


def permission_denied(binary):
    """Against a server with a tokens file: the client's token is sent; none, or another namespace, is denied."""
    out = subprocess.run([binary, "token", "--name", "conformance", "--namespace", NAMESPACE],
                         capture_output=True, text=True, check=True).stdout
    token = re.search(r"^#\s+(\S+)\s*$", out.split("not stored anywhere", 1)[1], re.M).group(1)
    tokens = os.path.join(tempfile.mkdtemp(prefix="tumbler-auth-"), "tokens.toml")
    with open(tokens, "w") as f:
        f.write("\n".join(line for line in out.splitlines() if not line.startswith("#")) + "\n")
    proc, addr = start_dev(binary, "--auth-tokens-file", tokens)
    try:
        typed = {"python": "PermissionDenied", "node": "PermissionDeniedError", "go": "ErrPermissionDenied",
                 "ruby": "Tumbler::PermissionDenied", "rust": "Error::PermissionDenied",
                 "perl": "Tumbler::Error::Denied", "java": "PermissionDeniedException"}
        for lang in LANGS:
            r = step(lang, "auth", token, addr=addr)
            if r:
                check(lang, r["with_token"] == "ACQUIRED", "auth: the client's bearer token is accepted", r)
                check(lang, r["no_token"] == r["other_namespace"] == typed[lang],
                      f"auth: no token, or a token for another namespace -> {typed[lang]}", r)
    finally:
        stop(proc)


def readme_code(lang, heading="Example"):
    """The code blocks of the '## <heading>' section of clients/<lang>/README.md ([] when it has none)."""
    fences = {"python": "python", "node": "js", "go": "go", "ruby": "ruby", "perl": "perl", "java": "java"}
    with open(os.path.join(CLIENTS, lang, "README.md")) as f:
        parts = f.read().split("\n## " + heading, 1)
    section = parts[1].split("\n## ", 1)[0] if len(parts) == 2 else ""
    return re.findall(r"```" + fences[lang] + r"\n(.*?)```", section, re.S)


def run_readme_block(lang, code, n, work):
    """Writes one README block where a user would and runs it; (returncode, output)."""
    if lang == "go":  # a program of its own inside the module (built with its vendor/)
        module = os.environ.get("TUMBLER_GO_MODULE", os.path.join(CLIENTS, "go"))
        path = os.path.join(module, "cmd", f"readme-example-{n}", "main.go")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(code)
        out = os.path.join(work, f"readme-example-{n}")
        build = subprocess.run(["go", "build", "-o", out, "./" + os.path.relpath(os.path.dirname(path), module)],
                               capture_output=True, text=True, timeout=300, cwd=module)
        if build.returncode != 0:
            return build.returncode, build.stderr
        argv, cwd = [out], work
    else:
        cwd = os.environ.get("TUMBLER_NODE_APP", work) if lang == "node" else work
        path = os.path.join(cwd, f"readme-example-{n}" + {"python": ".py", "node": ".mjs", "ruby": ".rb", "perl": ".pl",
                                                          "java": ".java"}[lang])
        with open(path, "w") as f:
            f.write(code)
        argv = {"python": [os.environ.get("TUMBLER_PYTHON", sys.executable)], "node": ["node"], "ruby": ["ruby"],
                "perl": ["perl", "-I", os.environ.get("TUMBLER_PERL5LIB", os.path.join(CLIENTS, "perl", "lib"))],
                # a single-file program run from source, as `java Main.java` runs it, with the built jar
                "java": ["java", "-cp", java_class_path()]}[lang]
        argv = argv + [path]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)
    return proc.returncode, proc.stdout + proc.stderr


def readme_examples(addr):
    """Each README's examples, run as a new user would with the installed package (its address replaced)."""
    work = tempfile.mkdtemp(prefix="tumbler-readme-")
    for lang in EXAMPLE_LANGS:
        blocks = readme_code(lang)
        check(lang, blocks, f"README has {len(blocks)} example(s)")
        for n, code in enumerate(blocks, 1):
            rc, out = run_readme_block(lang, code.replace("127.0.0.1:50051", addr), n, work)
            last = out.strip().splitlines()[-1:] or [""]
            check(lang, rc == 0 and "token" in out, f"README example {n} runs with the installed package: {last[0]}",
                  out[-800:])
        # The weighted permits example, where it is a whole program (Go's uses the client of the example above).
        for n, code in enumerate(readme_code(lang, "Weighted permits") if lang != "go" else [], 1):
            rc, out = run_readme_block(lang, code.replace("127.0.0.1:50051", addr), f"weighted-{n}", work)
            check(lang, rc == 0 and "3 of 10 permits, slots" in out,
                  f"README weighted permits example runs: {(out.strip().splitlines() or [''])[0]}", out[-800:])
        # The multi-locks example, where there is one and it is a whole program (not Go's, as above).
        for n, code in enumerate(readme_code(lang, "Multi-locks") if lang != "go" else [], 1):
            rc, out = run_readme_block(lang, code.replace("127.0.0.1:50051", addr), f"multi-{n}", work)
            check(lang, rc == 0 and "token" in out,
                  f"README multi-locks example runs: {(out.strip().splitlines() or [''])[0]}", out[-800:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=os.path.join(ROOT, "target", "debug", "tumbler"))
    ap.add_argument("--only", help="comma-separated parts to run (scenario, election, read_write, weighted, multi, "
                                   "examples, "
                                   "keep, crash, lost, "
                                   "cancel, readme, restart, restart-hold, restart-place, auth, renewal); "
                                   "default all")
    ap.add_argument("--langs", help="comma-separated languages to run (" + ",".join(LANGS) + "); default all. "
                                    "Cross-language parts that need a language left out are skipped (SKIP lines)")
    opts = ap.parse_args()
    if opts.langs:
        wanted = opts.langs.split(",")
        unknown = [lang for lang in wanted if lang not in LANGS]
        if unknown:
            raise SystemExit(f"unknown --langs {','.join(unknown)}: choose from {','.join(LANGS)}")
        LANGS[:] = [lang for lang in LANGS if lang in wanted]
        EXAMPLE_LANGS[:] = [lang for lang in EXAMPLE_LANGS if lang in wanted]
        ELECTION_LANGS[:] = [lang for lang in ELECTION_LANGS if lang in wanted]
        OBSERVE_LANGS[:] = [lang for lang in OBSERVE_LANGS if lang in wanted]
        READ_WRITE_LANGS[:] = [lang for lang in READ_WRITE_LANGS if lang in wanted]
        WEIGHTED_LANGS[:] = [lang for lang in WEIGHTED_LANGS if lang in wanted]
        MULTI_LANGS[:] = [lang for lang in MULTI_LANGS if lang in wanted]
    if not os.path.exists(opts.server):
        raise SystemExit(f"{opts.server} is missing: cargo build --bin tumbler")
    proc, addr = start_dev(opts.server)
    print(f"==> tumbler dev on {addr} (pid {proc.pid})", flush=True)
    server = opts.server
    parts = [("scenario", scenario), ("election", election), ("read_write", read_write), ("weighted", weighted),
             ("multi", multi), ("examples", examples),
             ("keep", held_means_held), ("crash", crash_frees),
             ("lost", lost_signalled), ("cancel", cancel_leaves_no_waiter), ("readme", readme_examples),
             ("restart", lambda _addr: restart_retries(server)),
             ("restart-hold", lambda _addr: restart_mid_hold(server)),
             ("restart-place", lambda _addr: restart_keeps_place(server)), ("auth", lambda _addr: permission_denied(server)),
             ("renewal", lambda _addr: renewal_fails(server))]
    try:
        for name, part in parts:
            if opts.only and name not in opts.only.split(","):
                continue
            started = time.monotonic()
            try:
                part(addr)
            except Exception as e:  # a malformed reply must not hide the summary
                check("driver", False, f"{name} stopped: {e!r}")
            print(f"==> {name}: {time.monotonic() - started:.1f} s", flush=True)
    finally:
        stop(proc)
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
