#!/usr/bin/env python3
"""Python's steps of the cross-language conformance scenario (clients/conformance).

usage: conformance_steps.py ADDR NAMESPACE STEP ARGS...   — prints one JSON line.
"""
import json
import sys
import time

import grpc

import tumbler_client as tc
from tumbler_client import pb


def grant_json(lock):
    return {"holder": lock.holder, "token": str(lock.fencing_token), "slot": lock.slot,
            "acquired_at_ms": lock.grant.acquired_at_ms}


def main(addr, namespace, step, *args):
    client = tc.Client(addr, namespace=namespace)
    if step == "hold":  # NAME HOLDER LIMIT: try once, keep the grant (60 s lease)
        name, holder, limit = args[0], args[1], int(args[2])
        try:
            return {"status": "ACQUIRED", **grant_json(client.acquire(name, holder, limit=limit, ttl_ms=60000))}
        except tc.NotAcquired as e:
            return {"status": "BUSY" if e.busy else "TIMEOUT", "holders": e.response.holders}
    if step == "release":  # NAME HOLDER
        resp = client.stub.Release(pb.ReleaseRequest(namespace=namespace, name=args[0], holder=args[1]))
        return {"released": resp.status == pb.RELEASE_STATUS_RELEASED}
    if step == "wait":  # NAME HOLDER WAIT_MS HOLD_MS: wait, hold a while, release
        name, holder, wait_ms, hold_ms = args[0], args[1], int(args[2]), int(args[3])
        with client.lock(name, holder, wait_ms=wait_ms, ttl_ms=60000) as lock:
            out = grant_json(lock)
            time.sleep(hold_ms / 1000)
            out["released_at_ms"] = int(time.time() * 1000)
        return out
    if step == "scoped":  # NAME: context manager, extend inside, nothing held after
        name = args[0]
        with client.lock(name, ttl_ms=2000) as lock:
            out = grant_json(lock)
            before = lock.expires_at_ms
            time.sleep(0.05)
            lock.extend(ttl_ms=30000)
            out["extended"] = lock.expires_at_ms > before
        out["holders_after"] = len(client.inspect(name).holders)
        return out
    if step == "inspect":  # NAME
        info = client.inspect(args[0])
        queue = client.stub.Queue(pb.QueueRequest(namespace=namespace, name=args[0]))
        return {"limit": info.limit, "waiters": info.waiters,
                "holders": [{"holder": h.grant.holder, "token": str(h.grant.fencing_token),
                             "slot": h.grant.slot} for h in info.holders],
                "queue": [r.holder for r in queue.requests]}
    if step == "invalid":  # bad input: priority out of range
        try:
            client.acquire("conformance-invalid", priority=5000)
            return {"field": "priority", "code": "OK"}
        except grpc.RpcError as e:
            return {"field": "priority", "code": e.code().name, "message": e.details()}
    raise SystemExit(f"unknown step {step}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])), flush=True)
