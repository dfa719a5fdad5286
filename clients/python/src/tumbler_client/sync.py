"""The blocking client: Client, Lock, and the scoped ``with client.lock(...)``
whose watchdog thread keeps the grant alive.

Every call is retried on UNAVAILABLE with jittered back-off until its
deadline, with the same holder id, so a retried Acquire is the same request
to the server (which answers ALREADY_HELD with the same grant) and can
never take a second permit.
"""
import contextlib
import threading
import time

import grpc

from . import _common as c
from . import errors
from .v1 import lock_pb2 as pb
from .v1 import lock_pb2_grpc as pb_grpc


_LOST_LOCK = threading.Lock()


class Lock:
    """One grant: ``fencing_token``, ``slot``, ``holder``; ``extend()``, ``release()``.

    ``lost`` is a threading.Event set the moment the grant is known to be
    gone; ``check()`` raises LockLost once it is.
    """

    def __init__(self, client, name, grant, lease_end):
        self.client, self.name, self.grant = client, name, grant
        self._lost = None  # the threading.Event ``lost``, made when first asked for
        self.lost_reason = None
        self._limit = None  # the limit asked: a downgrade asks the same
        self._lease_end = lease_end  # local monotonic estimate of when the lease runs out
        self._watchdog = None

    @property
    def lost(self):
        """A threading.Event, set the moment the grant is known to be gone."""
        if self._lost is None:
            with _LOST_LOCK:
                if self._lost is None:
                    self._lost = threading.Event()
        return self._lost

    holder = property(lambda self: self.grant.holder)
    fencing_token = property(lambda self: self.grant.fencing_token)
    slot = property(lambda self: self.grant.slot)
    expires_at_ms = property(lambda self: self.grant.expires_at_ms)
    ttl_ms = property(lambda self: self.grant.ttl_ms)
    # "read" or "write" for a grant of a read/write lock, None for a plain lock's.
    mode = property(lambda self: c.mode_name(self.grant.mode))
    # The permits the grant holds (1 unless acquired with ``permits=k``), and its slots, one per permit.
    permits = property(lambda self: c.grant_permits(self.grant))
    slots = property(lambda self: c.grant_slots(self.grant))

    def extend(self, ttl_ms=None):
        """Reset the lease to ``ttl_ms`` from now (default: the grant's ttl). Raises LockLost."""
        sent = time.monotonic()
        resp = self.client._call(self.client._unary.Extend, lambda: self._extend_request(ttl_ms))
        if resp.status != pb.EXTEND_STATUS_EXTENDED:
            self._mark_lost("not held")
            raise self.lost_error()
        self._renewed(resp.grant, sent)
        return self

    def release(self):
        """Give the permit back (pinned to the fencing token); False when it was no longer held."""
        self.stop_keep_alive()
        req = self._release_request()
        resp = self.client._call(self.client._unary.Release, lambda: req)
        return resp.status == pb.RELEASE_STATUS_RELEASED

    def keep_alive(self, on_lost=None):
        """Start the watchdog: Extend every third of the lease; on loss set ``lost`` and call on_lost(LockLost)."""
        if self._watchdog is None:
            self._watchdog = _Watchdog(self, on_lost)
            self._watchdog.start()
        return self

    def stop_keep_alive(self):
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def downgrade(self):
        """Turn a write grant into a read grant at once: same fencing token, slot and lease; readers may join.

        Raises TumblerError (FAILED_PRECONDITION) on a plain lock, LockLost when the grant is gone.
        """
        req = c.acquire_request(self.client.namespace, self.name, self.holder, 0, self._limit, self.ttl_ms,
                                self.grant.kind, None, 0, None, None, "read")
        sent = time.monotonic()
        resp = self.client._call(self.client._unary.Acquire, lambda: req)
        if resp.status == pb.ACQUIRE_STATUS_NOT_ACQUIRED or resp.grant.fencing_token != self.fencing_token:
            if resp.status != pb.ACQUIRE_STATUS_NOT_ACQUIRED:  # a new grant, not ours: give it back
                self.client._call(self.client._unary.Release, lambda: pb.ReleaseRequest(
                    namespace=self.client.namespace, name=self.name, holder=self.holder,
                    fencing_token=resp.grant.fencing_token))
            self._mark_lost("not held")
            raise self.lost_error()
        self._renewed(resp.grant, sent)
        return self

    def check(self):
        """Raise LockLost if the grant is known to be gone."""
        if self.lost.is_set():
            raise self.lost_error()

    def lost_error(self):
        return errors.LockLost(self.name, self.holder, self.fencing_token, self.lost_reason or "lost")

    def _extend_request(self, ttl_ms):
        return pb.ExtendRequest(namespace=self.client.namespace, name=self.name, holder=self.holder,
                                ttl_ms=ttl_ms, fencing_token=self.fencing_token)

    def _release_request(self):
        return pb.ReleaseRequest(namespace=self.client.namespace, name=self.name, holder=self.holder,
                                 fencing_token=self.fencing_token)

    def _renewed(self, grant, sent):
        self.grant = grant
        self._lease_end = sent + grant.ttl_ms / 1000.0

    def _mark_lost(self, reason):
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    def __repr__(self):
        return f"Lock({self.name!r}, holder={self.holder!r}, token={self.fencing_token}, slot={self.slot})"


class LockSet(c.LockSetMixin, Lock):
    """A multi-lock's grants, held and given back as one: ``names``, ``holder``, ``grants`` (one per name, in
    the order asked), ``fencing_token(name)``; ``extend()`` and ``release()`` act on the whole set, and
    ``keep_alive()`` renews it (one Extend naming the set every third of the lease). ``lost`` is set when the
    server answers that any lock of the set is no longer held (it then releases the others)."""


class _Watchdog(threading.Thread):
    """Extends the grant every third of its lease, pinned to its fencing token.

    NOT_HELD marks the lock lost at once. A failed renewal is retried with
    back-off; when the lease has run out without one, the lock is lost.
    """

    def __init__(self, lock, on_lost):
        super().__init__(name=f"tumbler-watchdog-{lock.name}", daemon=True)
        self.lock, self.on_lost = lock, on_lost
        self._halt = threading.Event()

    def stop(self):
        self._halt.set()
        if self is not threading.current_thread():
            self.join()

    def run(self):
        lock, client = self.lock, self.lock.client
        interval = lock.ttl_ms / 3000.0
        next_at, attempt = time.monotonic() + interval, 0
        while not self._halt.wait(max(0.0, next_at - time.monotonic())):
            sent = time.monotonic()
            timeout = max(0.05, min(interval, lock._lease_end - sent))
            try:
                resp = client._unary.Extend(lock._extend_request(lock.ttl_ms), timeout=timeout, metadata=client._md)
            except grpc.RpcError as e:
                if time.monotonic() >= lock._lease_end:
                    return self._lost(f"renewals failed until the lease ran out ({e.code().name})")
                next_at, attempt = min(time.monotonic() + client.retry.delay(attempt), lock._lease_end), attempt + 1
                continue
            if resp.status != pb.EXTEND_STATUS_EXTENDED:
                return self._lost("not held")
            lock._renewed(resp.grant, sent)
            next_at, attempt = sent + interval, 0

    def _lost(self, reason):
        if self._halt.is_set():
            return
        self.lock._mark_lost(reason)
        if self.on_lost is not None:
            self.on_lost(self.lock.lost_error())


@contextlib.contextmanager
def _scoped(acquire, on_lost):
    """Acquire, keep alive for the block, then release (or raise LockLost when the grant was lost)."""
    held = acquire()
    held.keep_alive(on_lost)
    try:
        yield held
    finally:
        held.stop_keep_alive()
        if held.lost.is_set():
            raise held.lost_error()
        held.release()


class Client:
    """``Client("127.0.0.1:50051")``. ``stub`` is the generated LockServiceStub for everything else.

    ``credentials``: grpc.ChannelCredentials for TLS (None: plaintext).
    ``token``: sent as ``authorization: Bearer <token>``. ``timeout``: the
    deadline (s) of calls that do not wait, retries included.
    """

    def __init__(self, target="127.0.0.1:50051", *, namespace="", credentials=None, token=None,
                 channel=None, timeout=10.0, retry=None, tls=None, transport="auto"):
        self.channel, self._connect = c.channel_and_unary(target, channel, credentials, tls, transport, aio=False)
        self.stub = pb_grpc.LockServiceStub(self.channel)
        # What carries the unary calls: the Connect stub, or the gRPC stub itself.
        self._unary = self._connect or self.stub
        self.namespace, self.timeout = namespace, timeout
        self.retry = retry or c.Retry()
        self._md = c.auth_metadata(token)

    def _call(self, rpc, make_request, deadline=None):
        """One RPC, retried on UNAVAILABLE until ``deadline`` (monotonic; default now + timeout)."""
        deadline = deadline or time.monotonic() + self.timeout
        attempt = 0
        while True:
            try:
                return rpc(make_request(), timeout=max(0.001, deadline - time.monotonic()), metadata=self._md)
            except grpc.RpcError as e:
                pause = min(self.retry.delay(attempt), deadline - time.monotonic() - 0.001)
                if not errors.is_retryable(e) or pause <= 0:
                    raise errors.from_rpc_error(e) from e
                time.sleep(pause)
                attempt += 1

    def acquire(self, name, holder=None, *, wait_ms=0, timeout=None, limit=None, ttl_ms=None, kind="",
                metadata=None, priority=0, queue_ttl_ms=None, fair=None, mode=None, prefer_readers=False,
                permits=None, takes_over=""):
        """Take a permit, waiting up to ``wait_ms`` in the server (0: try once); ``permits=k`` takes k of ``limit``.

        ``timeout`` (s) bounds the whole call, retries included; default
        wait_ms plus 5 s. ``holder`` defaults to a fresh id made here.
        ``takes_over``: a holder whose live grant this one takes over in the same step (decision 0083), sent
        as given (default empty: none).
        Returns a Lock (no watchdog: see ``lock()``/``keep_alive()``);
        raises LockBusy, LockTimeout, Deadlock, InvalidArgument, PermissionDenied, Unavailable.
        """
        acquiring = c.Acquiring(name, holder, wait_ms, timeout, lambda holder, wait: c.acquire_request(
            self.namespace, name, holder, wait, limit, ttl_ms, kind, metadata, priority, queue_ttl_ms, fair, mode,
            prefer_readers, permits, takes_over=takes_over))
        resp, lease_end = self._acquire(acquiring)
        lock = Lock(self, name, resp.grant, lease_end)
        lock._limit = limit
        return lock

    def acquire_all(self, names, holder=None, *, wait_ms=0, timeout=None, limit=None, ttl_ms=None, kind="",
                    metadata=None, queue_ttl_ms=None):
        """Take every lock of ``names`` (2 to 16 distinct names) or none, waiting up to ``wait_ms`` for the set.

        One holder, one lease and one wait for the whole set; each lock grants
        one permit under ``limit`` (default 1). While it waits it holds
        nothing, so callers asking overlapping sets in any order never
        deadlock. Returns a LockSet (no watchdog: see ``lock_all()``/
        ``keep_alive()``); raises LockBusy / LockTimeout (``name``: the names
        joined by commas), Deadlock, InvalidArgument (``names: …``), …
        """
        names = c.set_names(names)
        acquiring = c.Acquiring(",".join(names), holder, wait_ms, timeout, lambda holder, wait: c.set_request(
            self.namespace, names, holder, wait, limit, ttl_ms, kind, metadata, queue_ttl_ms))
        resp, lease_end = self._acquire(acquiring)
        return LockSet(self, names, resp, lease_end)

    def _acquire(self, acquiring):
        try:
            resp = self._call(self._unary.Acquire, acquiring.request, acquiring.deadline)
        except errors.TumblerError as e:
            timeout = acquiring.cut_by_deadline(e)
            if timeout is None:
                raise
            raise timeout from e
        return resp, acquiring.lease_end(resp)

    def lock(self, name, holder=None, *, ttl_ms=None, on_lost=None, **acquire_options):
        """``with client.lock("report", wait_ms=5000) as lock:`` held for the whole block.

        A watchdog thread extends the lease every ttl_ms/3 (default lease
        15 s). If the grant is lost, ``lock.lost`` is set, ``on_lost`` is
        called, and LockLost is raised when the block ends; otherwise the
        grant is released on exit, however the block ends.
        """
        return _scoped(lambda: self.acquire(name, holder, ttl_ms=ttl_ms or c.DEFAULT_HELPER_TTL_MS,
                                            **acquire_options), on_lost)

    def lock_all(self, names, holder=None, *, ttl_ms=None, on_lost=None, **acquire_options):
        """``with client.lock_all(["accounts/1", "accounts/2"], wait_ms=5000) as held:`` the set for the whole block.

        As ``lock()``: one watchdog renews the whole set every ttl_ms/3
        (default lease 15 s); ``held.lost`` is set and LockLost raised at the
        end of the block when any lock of it was lost; otherwise the set is
        released on exit. ``acquire_options`` as for ``acquire_all``.
        """
        return _scoped(lambda: self.acquire_all(names, holder, ttl_ms=ttl_ms or c.DEFAULT_HELPER_TTL_MS,
                                                **acquire_options), on_lost)

    def campaign(self, name, value="", **options):
        """Leader election: a Leadership kept alive by a watchdog, or None when not elected within ``wait_ms``.

        Options: ``candidate``, ``ttl_ms`` (default 15000), ``wait_ms`` (default 0: try once), ``timeout``,
        ``on_lost``, ``queue_ttl_ms``, ``kind``. See tumbler_client.election.
        """
        from . import election
        return election.campaign(self, name, value, **options)

    def leader(self, name):
        """The election's current pb.Leadership, or None when nobody leads."""
        from . import election
        return election.leader(self, name)

    def observe(self, name, timeout=None):
        """An iterator of the election's pb.LeaderChange (first: the current leader); ``.cancel()`` ends it."""
        from . import election
        return election.observe(self, name, timeout)

    def inspect(self, name):
        return self._call(self._unary.Inspect, lambda: pb.InspectRequest(namespace=self.namespace, name=name))

    def queue(self, name, max_entries=0):
        return self._call(self._unary.Queue, lambda: pb.QueueRequest(namespace=self.namespace, name=name,
                                                                   max_entries=max_entries))

    def close(self):
        if self._connect is not None:
            self._connect.close()
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
