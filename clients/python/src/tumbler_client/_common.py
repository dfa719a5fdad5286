"""What the sync and asyncio clients share: request building, holder ids,
the retry back-off, and reading replies into Grant values or errors."""
import os
import random
import ssl
import tempfile
import time
from dataclasses import dataclass

import grpc

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
    """A holder id made by the client, so a retried Acquire is the same request to the server: 128 random bits."""
    return "py-" + os.urandom(16).hex()


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
                    mode=None, prefer_readers=False, permits=None, names=(), takes_over=""):
    # Only the fields given are set (a constructor call naming all of them costs several times more).
    req = pb.AcquireRequest(namespace=namespace, name=name, holder=holder, wait_ms=wait_ms)
    if limit is not None:
        req.limit = limit
    if ttl_ms is not None:
        req.ttl_ms = ttl_ms
    if kind:
        req.kind = kind
    if metadata:
        req.metadata.update(metadata)
    if priority:
        req.priority = priority
    if queue_ttl_ms is not None:
        req.queue_ttl_ms = queue_ttl_ms
    if fair is not None:
        req.fair = fair
    if mode is not None:
        req.mode = lock_mode(mode)
    if prefer_readers:
        req.prefer_readers = prefer_readers
    if permits is not None:
        req.permits = permits
    if names:
        req.names.extend(names)
    if takes_over:
        req.takes_over = takes_over
    return req


def set_request(namespace, names, holder, wait_ms, limit, ttl_ms, kind, metadata, queue_ttl_ms):
    """A multi-lock's Acquire: ``names`` set, ``name`` left empty."""
    return acquire_request(namespace, "", holder, wait_ms, limit, ttl_ms, kind, metadata, 0, queue_ttl_ms, None,
                           names=names)


def set_names(names):
    """The names of a multi-lock as a list (a lone string is refused: it would become its letters)."""
    if isinstance(names, str):
        raise TypeError(f"names: a list of lock names, not the string {names!r}")
    return list(names)


class Acquiring:
    """One Acquire as both clients send it: the holder fixed before the first try (a retry is the same
    request), each try asking only what is left of the wait; then the answer read."""

    def __init__(self, label, holder, wait_ms, timeout, build):
        self.label, self.holder, self.wait_ms, self._build = label, holder or new_holder(), wait_ms, build
        self.started = self.sent = time.monotonic()
        self.deadline = self.started + (timeout if timeout is not None else wait_ms / 1000.0 + DEADLINE_SLACK_S)

    def request(self):
        self.sent = time.monotonic()
        return self._build(self.holder, remaining_wait_ms(self.wait_ms, self.started, self.deadline))

    def cut_by_deadline(self, err):
        """LockTimeout for a call the deadline cut (DEADLINE_EXCEEDED); None for any other error."""
        if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.LockTimeout(self.label, None, f"{self.label}: not acquired before the deadline")
        return None

    def lease_end(self, resp):
        """Local monotonic estimate of the grant's lease end; raises LockBusy / LockTimeout when not acquired."""
        if resp.status == pb.ACQUIRE_STATUS_NOT_ACQUIRED:
            raise not_acquired(self.label, resp)
        return max(self.sent, time.monotonic() - 0.05) + resp.grant.ttl_ms / 1000.0


class LockSetMixin:
    """What LockSet and AsyncLockSet add to a Lock: the set's ``names`` and ``grants`` (one per name, in the
    order asked, each with its own fencing token). Its Extend and Release name the set, each lock pinned to the
    token it was granted (``fencing_tokens``), so a late release of this set never touches a newer set of the
    same holder. ``grant`` is the grant whose lease ends first."""

    def __init__(self, client, names, resp, lease_end):
        grants = list(resp.grants)
        # The set's lease is as long as its shortest.
        super().__init__(client, ",".join(names), min(grants, key=lambda g: g.expires_at_ms, default=resp.grant),
                         lease_end)
        self.names, self.grants = list(names), grants

    def fencing_token(self, name):
        """The fencing token of the lock ``name`` of the set (None: not in the set)."""
        return next((g.fencing_token for g in self.grants if g.name == name), None)

    @property
    def fencing_tokens(self):
        """Each lock's fencing token, in the order of ``names``."""
        return [self.fencing_token(name) for name in self.names]

    def _extend_request(self, ttl_ms):
        return pb.ExtendRequest(namespace=self.client.namespace, holder=self.holder, ttl_ms=ttl_ms, names=self.names,
                                fencing_tokens=self.fencing_tokens)

    def _release_request(self):
        return pb.ReleaseRequest(namespace=self.client.namespace, holder=self.holder, names=self.names,
                                 fencing_tokens=self.fencing_tokens)

    def downgrade(self):
        raise TypeError("a multi-lock has no read/write mode to downgrade")

    def lost_error(self):
        return errors.LockLost(self.name, self.holder, None, self.lost_reason or "lost")

    def __repr__(self):
        tokens = ", ".join(f"{g.name}={g.fencing_token}" for g in self.grants)
        return f"{type(self).__name__}({self.names!r}, holder={self.holder!r}, tokens: {tokens})"


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


TRANSPORTS = ("auto", "connect", "grpc")


def tls_settings(tls):
    """``tls=`` -> (grpc.ChannelCredentials, ssl.SSLContext): the same roots and client certificate for both.

    ``tls``: True (the system's roots) or a dict of PEM ``root_certificates``, ``private_key``,
    ``certificate_chain`` (bytes or str), as grpc.ssl_channel_credentials takes them.
    """
    opts = {} if tls is True else dict(tls)
    unknown = set(opts) - {"root_certificates", "private_key", "certificate_chain"}
    if unknown:
        raise TypeError(f"tls: unknown {', '.join(sorted(unknown))} (root_certificates, private_key, certificate_chain)")
    pem = {k: (v.encode() if isinstance(v, str) else v) for k, v in opts.items() if v}
    if ("private_key" in pem) != ("certificate_chain" in pem):
        raise ValueError("tls: private_key and certificate_chain go together")
    creds = grpc.ssl_channel_credentials(**pem)
    ctx = ssl.create_default_context(cadata=pem["root_certificates"].decode() if "root_certificates" in pem else None)
    ctx.set_alpn_protocols(["http/1.1"])
    if "certificate_chain" in pem:
        # ssl loads a client certificate from files only: written for the call, then removed.
        with tempfile.TemporaryDirectory() as d:
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            for path, data in ((cert, pem["certificate_chain"]), (key, pem["private_key"])):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
    return creds, ctx


def channel_and_unary(target, channel, credentials, tls, transport, aio):
    """The client's gRPC channel (streams, ``client.stub``) and what carries its unary calls.

    ``transport="auto"``: Connect (binary proto over kept-alive HTTP/1.1, see _connect.py) when it can
    carry them with the channel's own security: no ``channel`` or grpc ``credentials`` given (those are
    opaque: only gRPC can use them) and a ``host:port`` target; gRPC otherwise. ``"grpc"``: always gRPC.
    ``"connect"``: Connect, or TypeError when it cannot be.
    Returns (channel, connect stub or None).
    """
    from . import _connect
    if transport not in TRANSPORTS:
        raise ValueError(f"transport: {transport!r} is not one of {', '.join(TRANSPORTS)}")
    if tls is not None and (credentials is not None or channel is not None):
        raise TypeError("tls: give tls= or credentials= / channel=, not both")
    ctx = None
    if tls is not None and tls is not False:
        credentials, ctx = tls_settings(tls)
    g = grpc.aio if aio else grpc
    if channel is None:
        channel = (g.secure_channel(target, credentials, options=CHANNEL_OPTIONS) if credentials is not None
                   else g.insecure_channel(target, options=CHANNEL_OPTIONS))
        own = ctx is not None or credentials is None
    else:
        own = False
    addr = _connect.split_target(target) if own else None
    if transport == "grpc" or (transport == "auto" and addr is None):
        return channel, None
    if addr is None:
        raise TypeError("transport='connect' needs a host:port target and no channel= or credentials= "
                        "(give TLS as tls=)")
    stub = (_connect.AsyncConnectStub if aio else _connect.ConnectStub)(*addr, ssl_context=ctx)
    return channel, stub
