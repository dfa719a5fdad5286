"""What the sync and asyncio clients share: request building, holder ids,
the retry back-off, and reading replies into Grant values or errors."""
import random
import time
import uuid
from dataclasses import dataclass

from . import errors
from .v1 import lock_pb2 as pb

# Extra seconds on the RPC deadline beyond wait_ms, so the server's own
# TIMEOUT reply (sent just before the deadline) wins over DEADLINE_EXCEEDED.
DEADLINE_SLACK_S = 5.0
# The lease a scoped helper asks for when the caller names none. The
# watchdog renews it every third, so it only bounds how long a crashed
# holder keeps the lock.
DEFAULT_HELPER_TTL_MS = 15000
# Reconnect soon after a server restart. gRPC's own back-off (1 s, growing
# by 1.6 up to 120 s) can outlast a short lease: a watchdog's renewals then
# fail fast on a channel still waiting to reconnect to a server that is back.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass
class Retry:
    """Back-off for UNAVAILABLE: full jitter, ``initial_s`` doubling up to ``max_s``, until the call's deadline."""

    initial_s: float = 0.05
    max_s: float = 1.0
    multiplier: float = 2.0

    def delay(self, attempt):
        return random.uniform(0, min(self.max_s, self.initial_s * self.multiplier ** attempt))


def new_holder():
    """A holder id made by the client, so a retried Acquire is the same request to the server."""
    return "py-" + uuid.uuid4().hex


_MODES = {None: pb.LOCK_MODE_UNSPECIFIED, "read": pb.LOCK_MODE_READ, "write": pb.LOCK_MODE_WRITE,
          pb.LOCK_MODE_UNSPECIFIED: pb.LOCK_MODE_UNSPECIFIED, pb.LOCK_MODE_READ: pb.LOCK_MODE_READ,
          pb.LOCK_MODE_WRITE: pb.LOCK_MODE_WRITE}
_MODE_NAMES = {pb.LOCK_MODE_READ: "read", pb.LOCK_MODE_WRITE: "write"}


def lock_mode(mode):
    """``"read"``, ``"write"`` (or the pb.LOCK_MODE_* value) -> the enum value; None: a plain lock."""
    try:
        return _MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"mode: {mode!r} is not 'read', 'write' or None") from None


def mode_name(mode):
    """A grant's pb.LockMode as ``"read"`` / ``"write"``; None for a plain lock's."""
    return _MODE_NAMES.get(mode)


def acquire_request(namespace, name, holder, wait_ms, limit, ttl_ms, kind, metadata, priority, queue_ttl_ms, fair,
                    mode=None, prefer_readers=False, permits=None):
    return pb.AcquireRequest(namespace=namespace, name=name, holder=holder, limit=limit, ttl_ms=ttl_ms,
                             kind=kind, metadata=metadata or {}, wait_ms=wait_ms, queue_ttl_ms=queue_ttl_ms,
                             priority=priority, fair=fair, mode=lock_mode(mode), prefer_readers=prefer_readers,
                             permits=permits)


def grant_permits(grant):
    """The permits a grant holds: 1 unless its Acquire asked more."""
    return max(1, grant.permits)


def grant_slots(grant):
    """A grant's slots, one per permit, ascending (``[slot]`` for a one-permit grant)."""
    return list(grant.slots) or [grant.slot]


def remaining_wait_ms(request_wait_ms, started, deadline):
    """A retry waits only what is left of the caller's wait and deadline."""
    left = min(request_wait_ms / 1000.0 - (time.monotonic() - started), deadline - time.monotonic() - 0.05)
    return max(0, int(left * 1000))


def not_acquired(name, resp):
    if resp.reason == pb.NOT_ACQUIRED_REASON_BUSY:
        return errors.LockBusy(name, resp)
    return errors.LockTimeout(name, resp)


def auth_metadata(token):
    return (("authorization", f"Bearer {token}"),) if token else None
