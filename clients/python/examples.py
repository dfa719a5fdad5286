#!/usr/bin/env python3
"""Python seed patterns of clients/python/README.md, run by the conformance driver:
unique jobs (a uniqueness window keyed on a digest of job class + arguments),
one leader among replicas (leader election), a transfer between two accounts
under a multi-lock, and a cycle of waiters refused as a deadlock.

usage: examples.py ADDR NAMESPACE all
       examples.py ADDR NAMESPACE enqueue CLASS ARGS_JSON JOB_ID WINDOW_MS
       examples.py ADDR NAMESPACE perform CLASS ARGS_JSON JOB_ID
Prints one JSON line.
"""
import asyncio
import hashlib
import json
import sys
import threading
import time

import tumbler_client as tc
from tumbler_client import pb


def unique_lock_name(job_class, args):
    # The same digest in every language: sha256 of "<class>:<compact JSON of args>".
    payload = job_class + ":" + json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    return "unique/" + job_class + "/" + hashlib.sha256(payload.encode()).hexdigest()


def enqueue_unique(client, job_class, args, job_id, unique_for_ms):
    """True: push the job. False: the same job is already queued or running within the window."""
    try:
        client.acquire(unique_lock_name(job_class, args), job_id, ttl_ms=unique_for_ms, kind="unique")
        return True
    except tc.NotAcquired:
        return False


def run_unique(client, job_class, args, job_id, perform, unique_until="success"):
    """Run a job enqueued with enqueue_unique. unique_until="start" frees the
    digest as the job starts; "success" only once it succeeds, so a job that
    raises stays unique (for its retries) until the window ends."""
    release = lambda: client.stub.Release(pb.ReleaseRequest(  # noqa: E731
        namespace=client.namespace, name=unique_lock_name(job_class, args), holder=job_id))
    if unique_until == "start":
        release()
    result = perform(*args)
    if unique_until == "success":
        release()
    return result


def run_as_leader(client, election, me, work):
    """Run work(leadership) while this replica leads `election`; None when another one
    led for the whole wait. The value others see (client.leader) is this replica's address."""
    leadership = client.campaign(election, value=me, wait_ms=5000, ttl_ms=3000)
    if leadership is None:
        return None
    try:
        return work(leadership)       # leadership.lost is set if the term ends under it
    finally:
        leadership.resign()           # the next replica in line is elected at once


def election_checks(client, check):
    def work(leadership):
        now = client.leader("py.scheduler")
        check("leader election: leader() shows this replica's value and term",
              now is not None and (now.value, now.term) == ("10.0.0.7:8080", leadership.term), str(now))
        check("leader election: another replica is not elected while this one leads",
              client.campaign("py.scheduler", value="10.0.0.8:8080") is None)
        with client.observe("py.scheduler") as changes:
            first = next(iter(changes))
        check("leader election: observe starts with the current leader",
              first.event == "current" and first.leader.term == leadership.term, str(first))
        leadership.proclaim("10.0.0.7:9090")
        return leadership.term

    term = run_as_leader(client, "py.scheduler", "10.0.0.7:8080", work)
    check("leader election: elected, with a term (fencing token)", term and term > 0, term)
    check("leader election: nobody leads after resign", client.leader("py.scheduler") is None)


def weighted_checks(client, check):
    """A big job takes 3 of 10 permits, small ones share the rest; 11 of 10 is refused naming permits."""
    with client.lock("py.exports", limit=10, permits=3, ttl_ms=600) as big:
        time.sleep(0.5)  # near the end of the lease: the watchdog has renewed it by now
        check("weighted permits: a big job holds 3 of 10, one slot per permit, kept across renewals",
              big.permits == 3 and big.slots == [1, 2, 3], big.slots)
        small = [client.acquire("py.exports", limit=10, ttl_ms=5000) for _ in range(7)]
        check("weighted permits: seven small jobs take the other slots, 4..10", sorted(s.slot for s in small) ==
              list(range(4, 11)) and all(s.permits == 1 and s.slots == [s.slot] for s in small))
        check("weighted permits: inspect counts 10 permits in use", client.inspect("py.exports").permits_in_use == 10)
        try:
            client.acquire("py.exports", limit=10)
            busy = False
        except tc.LockBusy:
            busy = True
        check("weighted permits: an 11th permit is busy", busy)
        for lock in small:
            lock.release()
    try:
        client.acquire("py.exports", limit=10, permits=11)
        refused = None
    except tc.InvalidArgument as e:
        refused = e.details
    check("weighted permits: 11 of 10 raises InvalidArgument with the server's message",
          refused and refused.startswith("permits"), refused)


def transfer(client, source, target, amount, move):
    """Move ``amount`` between two accounts holding both locks (or neither): whatever order other transfers
    name the same accounts in, none waits on another while holding a part of its set."""
    names = [f"py.accounts/{source}", f"py.accounts/{target}"]
    with client.lock_all(names, wait_ms=5000, ttl_ms=3000) as held:
        # Each write is fenced by its own lock's token.
        return move(source, target, amount, held.fencing_token(names[0]), held.fencing_token(names[1]))


def multi_checks(client, check):
    """A set held as one, renewed as one and released as one; all or nothing; a duplicate name is refused."""
    names = ["py.accounts/1", "py.accounts/2"]
    with client.lock_all(names, ttl_ms=600) as held:
        time.sleep(0.8)  # past the 600 ms lease: the watchdog has renewed the whole set
        check("multi-lock: one grant per name in the order asked, each with its own fencing token",
              held.names == names and [g.name for g in held.grants] == names
              and all(held.fencing_token(n) > 0 for n in names) and held.fencing_token("py.other") is None,
              repr(held))
        holders = [[h.grant.holder for h in client.inspect(n).holders] for n in names]
        check("multi-lock: both locks still held by the set's holder after its lease, renewed as one",
              holders == [[held.holder], [held.holder]] and not held.lost.is_set(), holders)
        try:
            client.acquire(names[1])
            busy = False
        except tc.LockBusy:
            busy = True
        check("multi-lock: a lock of a held set is busy for others", busy)
    check("multi-lock: the block released the whole set",
          all(len(client.inspect(n).holders) == 0 for n in names))
    moved = transfer(client, 2, 1, 30, lambda *a: a)
    check("multi-lock: a transfer holds both accounts, with a token for each",
          moved[:3] == (2, 1, 30) and all(t > 0 for t in moved[3:]), moved)

    other = client.acquire(names[1], ttl_ms=5000)
    try:
        client.acquire_all(names)
        refused = None
    except tc.LockBusy as e:
        refused = e.name
    check("multi-lock: all or nothing: a set with one lock taken is busy, and the free lock is left free",
          refused == ",".join(names) and len(client.inspect(names[0]).holders) == 0, refused)
    other.release()
    try:
        client.acquire_all(["py.accounts/1", "py.accounts/1"])
        refused = None
    except tc.InvalidArgument as e:
        refused = e.details
    check("multi-lock: a name twice raises InvalidArgument naming names", refused and refused.startswith("names"),
          refused)
    try:
        with client.lock_all(names, "py-transfer", ttl_ms=600) as held:
            client.stub.Release(pb.ReleaseRequest(namespace=client.namespace, name=names[0], holder="py-transfer"))
            signalled = held.lost.wait(2)  # the next renewal of the set hears NOT_HELD
        raised = None
    except tc.LockLost as e:
        raised = str(e)
    check("multi-lock: a lock of the set taken away: lost is set, the block raises LockLost, the rest is freed",
          signalled and raised and len(client.inspect(names[1]).holders) == 0, raised)
    held = client.acquire_all(names, ttl_ms=5000)
    check("multi-lock: extend and release act on the set", held.extend(ttl_ms=10000) is held and held.release()
          and all(len(client.inspect(n).holders) == 0 for n in names))


def deadlock_checks(client, check):
    """a holds x and waits for y; b holds y: b's wait for x would close the cycle and is refused at once."""
    x = client.acquire("py.deadlock-x", "py-a", ttl_ms=10000)
    y = client.acquire("py.deadlock-y", "py-b", ttl_ms=10000)
    waited = {}
    waiter = threading.Thread(target=lambda: waited.update(lock=client.acquire("py.deadlock-y", "py-a",
                                                                              wait_ms=10000, ttl_ms=10000)))
    waiter.start()
    time.sleep(1.2)  # past a's own check (a tenth of its wait, at most 1 s): only b's wait closes the cycle
    started = time.monotonic()
    try:
        client.acquire("py.deadlock-x", "py-b", wait_ms=10000)
        refused = None
    except tc.Deadlock as e:
        refused = e.details
    elapsed = time.monotonic() - started
    check("deadlock: a wait that closes a cycle raises Deadlock at once, naming the cycle",
          refused and refused.startswith("deadlock: ") and "py-a" in refused and elapsed < 5, (refused, elapsed))
    y.release()
    waiter.join(10)
    check("deadlock: the other waiter is granted once the cycle is broken", "lock" in waited, repr(waited))
    for lock in (x, waited.get("lock")):
        if lock is not None:
            lock.release()


async def async_multi_checks(addr, namespace, check):
    async with tc.AsyncClient(addr, namespace=namespace) as client:
        async with client.lock_all(["py.async-accounts/1", "py.async-accounts/2"], ttl_ms=3000) as held:
            await held.extend()
            check("multi-lock (asyncio): the set held, with a token per name, extended as one",
                  isinstance(held, tc.AsyncLockSet) and all(held.fencing_token(n) > 0 for n in held.names),
                  repr(held))
        check("multi-lock (asyncio): released on exit",
              len((await client.inspect("py.async-accounts/1")).holders) == 0)


async def async_weighted_checks(addr, namespace, check):
    async with tc.AsyncClient(addr, namespace=namespace) as client:
        async with client.lock("py.async-exports", limit=4, permits=2) as pair:
            check("weighted permits (asyncio): 2 of 4 permits, slots [1, 2]",
                  pair.permits == 2 and pair.slots == [1, 2], pair.slots)


async def async_election_checks(addr, namespace, check):
    async with tc.AsyncClient(addr, namespace=namespace) as client:
        leadership = await client.campaign("py.async-scheduler", value="a", ttl_ms=600)
        async with leadership:                # resigns on exit
            await asyncio.sleep(1.0)          # longer than the lease: the watchdog task extends it
            now = await client.leader("py.async-scheduler")
            check("leader election (asyncio): still the leader after 1 s of a 600 ms lease",
                  now is not None and now.term == leadership.term and not leadership.lost.is_set(), str(now))
            async with client.observe("py.async-scheduler") as changes:
                async for first in changes:
                    break
            check("leader election (asyncio): observe starts with the current leader",
                  first.event == "current" and first.leader.term == leadership.term, str(first))
            await leadership.proclaim("b")
        check("leader election (asyncio): nobody leads after the block", await client.leader("py.async-scheduler")
              is None)
        try:
            await leadership.proclaim("c")
            refused = False
        except tc.NotLeader:
            refused = leadership.lost.is_set()
        check("leader election (asyncio): proclaim after resign raises NotLeader", refused)


def all_checks(client):
    checks = []

    def check(what, ok, detail=None):
        checks.append({"what": what, "ok": bool(ok), "detail": detail})

    args = [42, "pdf"]
    check("unique jobs: first enqueue accepted", enqueue_unique(client, "py.Report", args, "job-1", 60000))
    check("unique jobs: same class + args refused while job-1 is pending",
          not enqueue_unique(client, "py.Report", args, "job-2", 60000))
    check("unique jobs: other args are another job", enqueue_unique(client, "py.Report", [43, "pdf"], "job-x", 60000))

    def failing(*_):
        raise RuntimeError("boom")

    try:
        run_unique(client, "py.Report", args, "job-1", failing)
    except RuntimeError:
        pass
    check("unique jobs (until success): a failed run keeps the digest locked",
          not enqueue_unique(client, "py.Report", args, "job-3", 60000))
    run_unique(client, "py.Report", args, "job-1", lambda *a: "ok")
    check("unique jobs (until success): success frees it, the next enqueue is accepted",
          enqueue_unique(client, "py.Report", args, "job-4", 60000))

    check("unique jobs (window 300 ms): accepted", enqueue_unique(client, "py.Ping", [1], "job-5", 300))
    check("unique jobs (window 300 ms): duplicate refused", not enqueue_unique(client, "py.Ping", [1], "job-6", 300))
    time.sleep(0.4)
    check("unique jobs (window 300 ms): accepted again once the window has passed",
          enqueue_unique(client, "py.Ping", [1], "job-7", 300))

    enqueue_unique(client, "py.Sync", [7], "job-8", 60000)
    inside = run_unique(client, "py.Sync", [7], "job-8",
                        lambda *a: enqueue_unique(client, "py.Sync", [7], "job-9", 60000), unique_until="start")
    check("unique jobs (until start): the same job can be enqueued again while it runs", inside)
    election_checks(client, check)
    weighted_checks(client, check)
    multi_checks(client, check)
    deadlock_checks(client, check)
    return {"checks": checks}


def main(addr, namespace, cmd, *rest):
    client = tc.Client(addr, namespace=namespace)
    if cmd == "all":
        out = all_checks(client)

        def check(what, ok, detail=None):
            out["checks"].append({"what": what, "ok": bool(ok), "detail": detail})

        asyncio.run(async_election_checks(addr, namespace, check))
        asyncio.run(async_weighted_checks(addr, namespace, check))
        asyncio.run(async_multi_checks(addr, namespace, check))
        return out
    if cmd == "enqueue":
        job_class, args, job_id, window = rest[0], json.loads(rest[1]), rest[2], int(rest[3])
        return {"enqueued": enqueue_unique(client, job_class, args, job_id, window),
                "lock": unique_lock_name(job_class, args)}
    if cmd == "perform":
        job_class, args, job_id = rest[0], json.loads(rest[1]), rest[2]
        run_unique(client, job_class, args, job_id, lambda *a: None)
        return {"performed": True, "lock": unique_lock_name(job_class, args)}
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])), flush=True)
