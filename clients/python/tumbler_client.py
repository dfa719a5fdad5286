"""A thin helper over tumbler's generated gRPC stubs.

The stubs are the API (``client.stub`` is a ``LockServiceStub``, messages are
in ``tumbler.v1.lock_pb2``); this module only adds what every caller writes
anyway: acquire with a wait and a deadline, a context manager that always
releases, extend, and the grant's fencing token and slot.
"""
from __future__ import annotations

import contextlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.exists(os.path.join(_HERE, "tumbler", "v1", "lock_pb2_grpc.py")):
    import generate as _generate  # noqa: E402  (stubs are built from proto/, never committed)

    _generate.generate(_HERE)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import grpc  # noqa: E402
from tumbler.v1 import lock_pb2 as pb  # noqa: E402,F401
from tumbler.v1 import lock_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["Client", "Lock", "NotAcquired", "LockLost", "pb", "pb_grpc"]

# Extra seconds on the RPC deadline beyond wait_ms, so the server's own
# TIMEOUT reply (sent just before the deadline) wins over DEADLINE_EXCEEDED.
DEADLINE_SLACK_S = 5.0


class NotAcquired(Exception):
    """The lock was not granted (reason BUSY or TIMEOUT); ``.response`` has the details."""

    def __init__(self, name, response):
        reason = pb.NotAcquiredReason.Name(response.reason)
        super().__init__(f"{name}: not acquired ({reason}, {response.holders} holder(s))")
        self.response = response
        self.busy = response.reason == pb.NOT_ACQUIRED_REASON_BUSY
        self.timeout = response.reason == pb.NOT_ACQUIRED_REASON_TIMEOUT


class LockLost(Exception):
    """Extend answered NOT_HELD: the lease is gone, stop working on what it protected."""


class Lock:
    """One grant: ``fencing_token``, ``slot``, ``holder``; ``extend()`` and ``release()``."""

    def __init__(self, client, name, grant):
        self.client, self.name, self.grant = client, name, grant

    holder = property(lambda self: self.grant.holder)
    fencing_token = property(lambda self: self.grant.fencing_token)
    slot = property(lambda self: self.grant.slot)
    expires_at_ms = property(lambda self: self.grant.expires_at_ms)

    def extend(self, ttl_ms=None):
        """Reset the lease to ``ttl_ms`` from now (default: the grant's ttl). Raises LockLost."""
        resp = self.client.stub.Extend(
            pb.ExtendRequest(namespace=self.client.namespace, name=self.name, holder=self.holder,
                             ttl_ms=ttl_ms, fencing_token=self.fencing_token),
            timeout=self.client.timeout)
        if resp.status != pb.EXTEND_STATUS_EXTENDED:
            raise LockLost(f"{self.name}: lease of {self.holder} lost")
        self.grant = resp.grant
        return self

    def release(self):
        """Give the permit back; False when it was no longer held (expired)."""
        resp = self.client.stub.Release(
            pb.ReleaseRequest(namespace=self.client.namespace, name=self.name, holder=self.holder,
                              fencing_token=self.fencing_token),
            timeout=self.client.timeout)
        return resp.status == pb.RELEASE_STATUS_RELEASED

    def __repr__(self):
        return f"Lock({self.name!r}, holder={self.holder!r}, token={self.fencing_token}, slot={self.slot})"


class Client:
    """``Client("127.0.0.1:50051")``; ``client.stub`` is the generated stub for anything else."""

    def __init__(self, target="127.0.0.1:50051", namespace="", channel=None, timeout=10.0):
        self.channel = channel or grpc.insecure_channel(target)
        self.stub = pb_grpc.LockServiceStub(self.channel)
        self.namespace = namespace
        self.timeout = timeout  # deadline (s) of the calls that do not wait

    def acquire(self, name, holder="", *, wait_ms=0, timeout=None, limit=None, ttl_ms=None,
                kind="", metadata=None, priority=0, queue_ttl_ms=None, fair=None):
        """Take a permit; wait up to ``wait_ms`` in the server (0: try once).

        ``timeout`` (seconds) is the RPC deadline, which also bounds the wait;
        default: wait_ms plus a little. Returns a Lock, or raises NotAcquired.
        """
        req = pb.AcquireRequest(namespace=self.namespace, name=name, holder=holder, limit=limit,
                                ttl_ms=ttl_ms, kind=kind, metadata=metadata or {}, wait_ms=wait_ms,
                                queue_ttl_ms=queue_ttl_ms, priority=priority, fair=fair)
        if timeout is None:
            timeout = wait_ms / 1000.0 + DEADLINE_SLACK_S
        resp = self.stub.Acquire(req, timeout=timeout)
        if resp.status == pb.ACQUIRE_STATUS_NOT_ACQUIRED:
            raise NotAcquired(name, resp)
        return Lock(self, name, resp.grant)

    @contextlib.contextmanager
    def lock(self, name, holder="", **kwargs):
        """``with client.lock("reports", wait_ms=5000) as lock:`` — always released on exit."""
        held = self.acquire(name, holder, **kwargs)
        try:
            yield held
        finally:
            held.release()

    def inspect(self, name):
        return self.stub.Inspect(pb.InspectRequest(namespace=self.namespace, name=name),
                                 timeout=self.timeout)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
