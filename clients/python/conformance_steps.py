#!/usr/bin/env python3
"""Python's steps of the cross-language conformance scenario (clients/conformance),
run with the installed tumbler_client package (sync and asyncio).

usage: conformance_steps.py ADDR NAMESPACE STEP ARGS...
Prints JSON lines: events ({"event": ...}) while it runs, its result last.
"""
import asyncio
import json
import sys
import time

import tumbler_client as tc
from tumbler_client import pb


def now_ms():
    return int(time.time() * 1000)


def emit(obj):
    print(json.dumps(obj), flush=True)


def grant_json(lock):
    return {"holder": lock.holder, "token": str(lock.fencing_token), "slot": lock.slot,
            "acquired_at_ms": lock.grant.acquired_at_ms}


def hold(client, name, holder, limit):  # try once, keep the grant (60 s lease)
    try:
        return {"status": "ACQUIRED", **grant_json(client.acquire(name, holder, limit=int(limit), ttl_ms=60000))}
    except tc.NotAcquired as e:
        return {"status": "BUSY" if e.busy else "TIMEOUT", "holders": e.response.holders}


def release(client, name, holder):
    resp = client.stub.Release(pb.ReleaseRequest(namespace=client.namespace, name=name, holder=holder))
    return {"released": resp.status == pb.RELEASE_STATUS_RELEASED}


def wait(client, name, holder, wait_ms, hold_ms):  # wait, hold a while, release
    with client.lock(name, holder, wait_ms=int(wait_ms), ttl_ms=60000) as lock:
        out = grant_json(lock)
        time.sleep(int(hold_ms) / 1000)
        out["released_at_ms"] = now_ms()
    return out


def outcome(run):  # {"status": "ACQUIRED", **run()}, or BUSY / TIMEOUT / DEADLOCK / the error
    try:
        return {"status": "ACQUIRED", **run()}
    except tc.NotAcquired as e:
        return {"status": "BUSY" if e.busy else "TIMEOUT", "holders": getattr(e.response, "holders", 0)}
    except tc.Deadlock as e:
        return {"status": "DEADLOCK", "code": e.code.name, "typed": type(e).__name__, "message": e.details}
    except tc.TumblerError as e:
        return {"status": "ERROR", "code": e.code.name, "typed": type(e).__name__, "message": e.details}


def try_once(acquire, out):  # a try-once acquire kept (60 s lease): ACQUIRED with out(lock), BUSY, or the error
    def run():
        lock = acquire()
        return {**grant_json(lock), **out(lock)}

    return outcome(run)


def rw_hold(client, name, holder, mode):  # try once as "read", "write" or "plain"; keep the grant (60 s lease)
    return try_once(lambda: client.acquire(name, holder, ttl_ms=60000, mode=None if mode == "plain" else mode),
                    lambda lock: {"mode": lock.mode})


def weights(lock):
    return {"permits": lock.permits, "slots": lock.slots}


def weighted_hold(client, name, holder, limit, permits):  # try once for PERMITS of LIMIT; keep the grant
    return try_once(lambda: client.acquire(name, holder, ttl_ms=60000, limit=int(limit), permits=int(permits)),
                    weights)


def weighted_wait(client, name, holder, limit, permits, wait_ms, hold_ms):  # wait, extend, hold a while, release
    with client.lock(name, holder, wait_ms=int(wait_ms), ttl_ms=60000, limit=int(limit),
                     permits=int(permits)) as lock:
        out = {**grant_json(lock), **weights(lock)}
        lock.extend()
        out["extended"] = weights(lock)
        time.sleep(int(hold_ms) / 1000)
        out["released_at_ms"] = now_ms()
    return out


def set_json(held):
    return {"holder": held.holder, "grants": [{"name": g.name, "token": str(g.fencing_token), "slot": g.slot}
                                              for g in held.grants]}


def multi_hold(client, holder, names):  # try once for the set (60 s lease); keep it
    return outcome(lambda: set_json(client.acquire_all(names.split(","), holder, ttl_ms=60000)))


def multi_wait(client, holder, names, wait_ms, hold_ms):  # wait for the set, extend it, hold a while, release
    def run():
        with client.lock_all(names.split(","), holder, wait_ms=int(wait_ms), ttl_ms=60000) as held:
            out = set_json(held)
            try:
                out["extended"] = held.extend() is held
            except tc.LockLost:
                out["extended"] = False
            time.sleep(int(hold_ms) / 1000)
            out["released_at_ms"] = now_ms()
        return out

    return outcome(run)


def multi_release(client, holder, names):  # the set, by holder (no token)
    resp = client.stub.Release(pb.ReleaseRequest(namespace=client.namespace, holder=holder, names=names.split(",")))
    return {"released": resp.status == pb.RELEASE_STATUS_RELEASED}


def multi_stale(client, holder, names):  # S1 taken and released, S2 taken; S1's release again; "release": S2's
    first = client.acquire_all(names.split(","), holder, ttl_ms=60000)
    first_released = first.release()
    second = client.acquire_all(names.split(","), holder, ttl_ms=60000)
    emit({"event": "stale", "first": set_json(first), "second": set_json(second), "first_released": first_released,
          "stale_released": first.release()})
    sys.stdin.readline()
    return {"released": second.release()}


def deadlock_wait(client, name, holder, wait_ms):  # wait for one lock; a refusal must come as tc.Deadlock
    def run():
        lock = client.acquire(name, holder, wait_ms=int(wait_ms), ttl_ms=60000)
        lock.release()
        return {"token": str(lock.fencing_token)}

    return outcome(run)


def rw_wait(client, name, holder, mode, wait_ms, hold_ms):  # wait in a mode, hold a while, release
    with client.lock(name, holder, wait_ms=int(wait_ms), ttl_ms=60000, mode=mode) as lock:
        out = {**grant_json(lock), "mode": lock.mode}
        time.sleep(int(hold_ms) / 1000)
        out["released_at_ms"] = now_ms()
    return out


def scoped(client, name):  # context manager, extend inside, nothing held after
    with client.lock(name, ttl_ms=2000) as lock:
        out = grant_json(lock)
        before = lock.expires_at_ms
        time.sleep(0.05)
        lock.extend(ttl_ms=30000)
        out["extended"] = lock.expires_at_ms > before
    out["holders_after"] = len(client.inspect(name).holders)
    return out


def inspect(client, name):
    info, queue = client.inspect(name), client.queue(name)
    return {"limit": info.limit, "waiters": info.waiters,
            "holders": [{"holder": h.grant.holder, "token": str(h.grant.fencing_token), "slot": h.grant.slot}
                        for h in info.holders],
            "queue": [r.holder for r in queue.requests]}


def invalid(client):  # bad input: priority out of range
    try:
        client.acquire("conformance-invalid", priority=5000)
        return {"field": "priority", "code": "OK"}
    except tc.InvalidArgument as e:
        return {"field": "priority", "code": e.code.name, "message": e.details, "typed": "InvalidArgument"}


def keep(client, name, ttl_ms, work_ms):  # a lease shorter than the work: the watchdog keeps it
    with client.lock(name, "py-keeper", ttl_ms=int(ttl_ms)) as lock:
        emit({"event": "held", **grant_json(lock)})
        start = now_ms()
        time.sleep(int(work_ms) / 1000)
        out = {"body_start_ms": start, "body_end_ms": now_ms(), "token": str(lock.fencing_token),
               "lost": lock.lost.is_set()}
        out["token_inside"] = str(client.inspect(name).holders[0].grant.fencing_token)
    # Its own grant only: the driver's prober may take the freed lock at once.
    out["holders_after"] = sum(h.grant.holder == "py-keeper" for h in client.inspect(name).holders)
    return out


def crash(client, name, ttl_ms):  # hold with the helper, then get killed by the driver
    with client.lock(name, "py-crasher", ttl_ms=int(ttl_ms)) as lock:
        emit({"event": "held", **grant_json(lock)})
        time.sleep(60)
    return {"survived": True}


def lost(client, name, ttl_ms):  # the driver takes the grant away; the helper must say so
    try:
        with client.lock(name, "py-loser", ttl_ms=int(ttl_ms)) as lock:
            emit({"event": "held", **grant_json(lock)})
            signalled = lock.lost.wait(10)
            out = {"signalled": signalled, "signal_at_ms": now_ms(), "reason": lock.lost_reason}
    except tc.LockLost as e:
        out["raised"] = type(e).__name__
    return out


async def lost_async(addr, namespace, name, ttl_ms):  # the body task is cancelled, the block raises LockLost
    async with tc.AsyncClient(addr, namespace=namespace) as client:
        out = {"signalled": False}
        try:
            async with client.lock(name, "py-aio-loser", ttl_ms=int(ttl_ms)) as lock:
                emit({"event": "held", **grant_json(lock)})
                await asyncio.sleep(10)
        except tc.LockLost as e:
            out.update(signalled=True, signal_at_ms=now_ms(), raised=type(e).__name__, reason=e.reason)
        return out


async def cancel_async(addr, namespace, name, after_ms):  # cancel a waiting acquire: no ghost waiter
    async with tc.AsyncClient(addr, namespace=namespace) as client:
        holder = "py-aio-canceller"
        task = asyncio.ensure_future(client.acquire(name, holder, wait_ms=20000, ttl_ms=10000))
        await asyncio.sleep(int(after_ms) / 1000)
        queued = [r.holder for r in (await client.queue(name)).requests]
        t0 = time.monotonic()
        task.cancel()
        try:
            await task
            out = {"error": "acquired"}
        except asyncio.CancelledError:
            out = {"error": "CancelledError"}
        out["cancel_ms"] = int((time.monotonic() - t0) * 1000)
        out["queued_before"] = holder in queued
        out["queue_after"], out["gone_ms"] = await queue_without(client, name, holder, t0)
        return out


async def queue_without(client, name, holder, t0):
    """Polls the queue (up to 2 s) until `holder` has left it: (last queue, ms since t0)."""
    while True:
        queue = [r.holder for r in (await client.queue(name)).requests]
        if holder not in queue or time.monotonic() - t0 > 2:
            return queue, int((time.monotonic() - t0) * 1000)
        await asyncio.sleep(0.01)


def restart(client, name, holder, wait_ms):  # wait through a server restart (retries on UNAVAILABLE)
    started = time.monotonic()
    lock = client.acquire(name, holder, wait_ms=int(wait_ms), ttl_ms=30000)
    out = {"status": "ACQUIRED", **grant_json(lock), "elapsed_ms": int((time.monotonic() - started) * 1000)}
    lock.release()
    return out


def auth(addr, namespace, token):  # the token is sent; none, or another namespace, is PermissionDenied
    def attempt(ns, tok):
        with tc.Client(addr, namespace=ns, token=tok) as client:
            try:
                client.acquire("auth-python", ttl_ms=5000).release()
                return "ACQUIRED"
            except tc.TumblerError as e:
                return type(e).__name__

    return {"with_token": attempt(namespace, token), "no_token": attempt(namespace, None),
            "other_namespace": attempt("elsewhere", token)}


def leadership_json(leader):
    if leader is None:
        return None
    return {"candidate": leader.candidate, "term": str(leader.term), "value": leader.value,
            "elected_at_ms": leader.elected_at_ms, "expires_at_ms": leader.expires_at_ms}


def campaign(client, name, candidate, value, ttl_ms, wait_ms):  # campaign, then act on commands from stdin
    held = client.campaign(name, value, candidate=candidate, ttl_ms=int(ttl_ms), wait_ms=int(wait_ms))
    if held is None:
        return {"elected": False}
    emit({"event": "elected", "elected": True, "at_ms": now_ms(), **leadership_json(held.leader)})
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "proclaim":
            try:
                held.proclaim(arg)
                emit({"event": "proclaim", "status": "PROCLAIMED", "value": held.value, "lost": held.lost.is_set()})
            except tc.NotLeader as e:
                emit({"event": "proclaim", "status": "NOT_LEADER", "typed": type(e).__name__,
                      "lost": held.lost.is_set()})
        elif cmd == "resign":
            first, second = held.resign(), held.resign()
            emit({"event": "resign", "first": first, "second": second, "lost": held.lost.is_set()})
        elif cmd == "lost":
            lost = held.lost.wait(int(arg) / 1000)
            emit({"event": "lost", "lost": lost, "reason": held.lost_reason, "at_ms": now_ms()})
        elif cmd == "exit":
            break
    held.resign()
    return {"done": True, "term": str(held.term)}


def leader(client, name):
    return {"leader": leadership_json(client.leader(name))}


def observe(client, name, stop_candidate, timeout_ms):  # the leader changes until stop_candidate is elected
    changes, out = [], {"cancelled": False}
    with client.observe(name, timeout=int(timeout_ms) / 1000) as observer:
        try:
            for _ in _until_elected(observer, stop_candidate, changes, out):
                pass
        except tc.TumblerError as e:
            out["error"] = str(e)
    return {**out, "changes": changes}


def _until_elected(observer, stop_candidate, changes, out):
    for change in observer:
        seen = {"kind": change.event, "leader": leadership_json(change.leader if change.HasField("leader") else None),
                "ended_term": str(change.ended_term)}
        changes.append(seen)
        emit({"event": "change", **seen})
        if change.event == "elected" and change.leader.candidate == stop_candidate:
            observer.cancel()
            out["cancelled"] = True
        yield seen


SYNC = {"hold": hold, "release": release, "wait": wait, "rw_hold": rw_hold, "rw_wait": rw_wait,
        "weighted_hold": weighted_hold, "weighted_wait": weighted_wait, "multi_hold": multi_hold,
        "multi_wait": multi_wait, "multi_release": multi_release, "multi_stale": multi_stale,
        "deadlock_wait": deadlock_wait, "scoped": scoped,
        "inspect": inspect,
        "invalid": invalid,
        "keep": keep, "crash": crash, "lost": lost, "restart": restart, "campaign": campaign, "leader": leader,
        "observe": observe}
ASYNC = {"lost-async": lost_async, "cancel-async": cancel_async}


def main(addr, namespace, step, *args):
    if step == "auth":
        return auth(addr, namespace, *args)
    if step in ASYNC:
        return asyncio.run(ASYNC[step](addr, namespace, *args))
    with tc.Client(addr, namespace=namespace) as client:
        return SYNC[step](client, *args)


if __name__ == "__main__":
    emit(main(*sys.argv[1:]))
