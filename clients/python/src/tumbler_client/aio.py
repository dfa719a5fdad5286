"""The asyncio client: AsyncClient, AsyncLock, and ``async with client.lock(...)``
whose watchdog task keeps the grant alive.

Cancelling the task that awaits ``acquire`` cancels the RPC, so the server
drops the waiting request at once. When a scoped grant is lost, the task
running the block is cancelled and the block ends with LockLost.
"""
import asyncio
import time

import grpc

from . import _common as c
from . import errors
from .v1 import lock_pb2 as pb
from .v1 import lock_pb2_grpc as pb_grpc


class AsyncLock:
    """One grant, as ``Lock`` but with coroutines; ``lost`` is an asyncio.Event."""

    def __init__(self, client, name, grant, lease_end):
        self.client, self.name, self.grant = client, name, grant
        self._lost = None  # the asyncio.Event ``lost``, made when first asked for
        self.lost_reason = None
        self._limit = None  # the limit asked: a downgrade asks the same
        self._lease_end = lease_end

    @property
    def lost(self):
        """An asyncio.Event, set the moment the grant is known to be gone."""
        if self._lost is None:
            self._lost = asyncio.Event()
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

    async def extend(self, ttl_ms=None):
        """Reset the lease to ``ttl_ms`` from now (default: the grant's ttl). Raises LockLost."""
        sent = time.monotonic()
        resp = await self.client._call(self.client._unary.Extend, lambda: self._extend_request(ttl_ms))
        if resp.status != pb.EXTEND_STATUS_EXTENDED:
            self._mark_lost("not held")
            raise self.lost_error()
        self._renewed(resp.grant, sent)
        return self

    async def release(self):
        """Give the permit back (pinned to the fencing token); False when it was no longer held."""
        req = self._release_request()
        resp = await self.client._call(self.client._unary.Release, lambda: req)
        return resp.status == pb.RELEASE_STATUS_RELEASED

    async def downgrade(self):
        """Turn a write grant into a read grant at once: same fencing token, slot and lease; readers may join.

        Raises TumblerError (FAILED_PRECONDITION) on a plain lock, LockLost when the grant is gone.
        """
        req = c.acquire_request(self.client.namespace, self.name, self.holder, 0, self._limit, self.ttl_ms,
                                self.grant.kind, None, 0, None, None, "read")
        sent = time.monotonic()
        resp = await self.client._call(self.client._unary.Acquire, lambda: req)
        if resp.status == pb.ACQUIRE_STATUS_NOT_ACQUIRED or resp.grant.fencing_token != self.fencing_token:
            if resp.status != pb.ACQUIRE_STATUS_NOT_ACQUIRED:  # a new grant, not ours: give it back
                await self.client._call(self.client._unary.Release, lambda: pb.ReleaseRequest(
                    namespace=self.client.namespace, name=self.name, holder=self.holder,
                    fencing_token=resp.grant.fencing_token))
            self._mark_lost("not held")
            raise self.lost_error()
        self._renewed(resp.grant, sent)
        return self

    def check(self):
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

    async def watch(self):
        """The watchdog: Extend every third of the lease; returns when the grant is lost."""
        interval = self.ttl_ms / 3000.0
        next_at, attempt = time.monotonic() + interval, 0
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            sent = time.monotonic()
            timeout = max(0.05, min(interval, self._lease_end - sent))
            try:
                resp = await self.client._unary.Extend(self._extend_request(self.ttl_ms), timeout=timeout,
                                                     metadata=self.client._md)
            except grpc.RpcError as e:
                if time.monotonic() >= self._lease_end:
                    return self._mark_lost(f"renewals failed until the lease ran out ({e.code().name})")
                next_at = min(time.monotonic() + self.client.retry.delay(attempt), self._lease_end)
                attempt += 1
                continue
            if resp.status != pb.EXTEND_STATUS_EXTENDED:
                return self._mark_lost("not held")
            self._renewed(resp.grant, sent)
            next_at, attempt = sent + interval, 0


class AsyncLockSet(c.LockSetMixin, AsyncLock):
    """A multi-lock's grants, as ``LockSet`` but with coroutines: ``names``, ``holder``, ``grants``,
    ``fencing_token(name)``; ``extend()`` and ``release()`` act on the whole set; ``lost`` is an asyncio.Event."""


class _Scope:
    """``async with client.lock(...) as lock``: acquire, watchdog, cancel-on-loss, release."""

    def __init__(self, acquire, on_lost, cancel_on_loss):
        self.acquire, self.on_lost, self.cancel_on_loss = acquire, on_lost, cancel_on_loss
        self.lock = self.dog = self.body = None
        self.cancelled_body = False

    async def __aenter__(self):
        self.lock = await self.acquire()
        self.body = asyncio.current_task()
        self.dog = asyncio.ensure_future(self._guard())
        return self.lock

    async def _guard(self):
        await self.lock.watch()
        if self.on_lost is not None:
            self.on_lost(self.lock.lost_error())
        if self.cancel_on_loss and self.body is not None and not self.body.done():
            self.cancelled_body = True
            self.body.cancel()

    async def __aexit__(self, exc_type, exc, tb):
        self.dog.cancel()
        await asyncio.gather(self.dog, return_exceptions=True)
        if self.lock.lost.is_set():
            if self.cancelled_body and hasattr(self.body, "uncancel"):
                self.body.uncancel()  # the cancellation was ours: it becomes LockLost (Python 3.11+)
            if self.cancelled_body and exc_type is asyncio.CancelledError:
                raise self.lock.lost_error() from None
            raise self.lock.lost_error()
        await self.lock.release()
        return False


class AsyncClient:
    """``AsyncClient("127.0.0.1:50051")`` over grpc.aio; same options as ``Client``."""

    def __init__(self, target="127.0.0.1:50051", *, namespace="", credentials=None, token=None,
                 channel=None, timeout=10.0, retry=None, tls=None, transport="auto"):
        self.channel, self._connect = c.channel_and_unary(target, channel, credentials, tls, transport, aio=True)
        self.stub = pb_grpc.LockServiceStub(self.channel)
        # What carries the unary calls: the Connect stub, or the gRPC stub itself.
        self._unary = self._connect or self.stub
        self.namespace, self.timeout = namespace, timeout
        self.retry = retry or c.Retry()
        self._md = c.auth_metadata(token)

    async def _call(self, rpc, make_request, deadline=None):
        """One RPC, retried on UNAVAILABLE until ``deadline`` (monotonic; default now + timeout)."""
        deadline = deadline or time.monotonic() + self.timeout
        attempt = 0
        while True:
            try:
                return await rpc(make_request(), timeout=max(0.001, deadline - time.monotonic()), metadata=self._md)
            except grpc.RpcError as e:
                pause = min(self.retry.delay(attempt), deadline - time.monotonic() - 0.001)
                if not errors.is_retryable(e) or pause <= 0:
                    raise errors.from_rpc_error(e) from e
                await asyncio.sleep(pause)
                attempt += 1

    async def acquire(self, name, holder=None, *, wait_ms=0, timeout=None, limit=None, ttl_ms=None, kind="",
                      metadata=None, priority=0, queue_ttl_ms=None, fair=None, mode=None, prefer_readers=False,
                      permits=None, takes_over=""):
        """As ``Client.acquire``; cancelling the awaiting task cancels the wait in the server."""
        acquiring = c.Acquiring(name, holder, wait_ms, timeout, lambda holder, wait: c.acquire_request(
            self.namespace, name, holder, wait, limit, ttl_ms, kind, metadata, priority, queue_ttl_ms, fair, mode,
            prefer_readers, permits, takes_over=takes_over))
        resp, lease_end = await self._acquire(acquiring)
        lock = AsyncLock(self, name, resp.grant, lease_end)
        lock._limit = limit
        return lock

    async def acquire_all(self, names, holder=None, *, wait_ms=0, timeout=None, limit=None, ttl_ms=None, kind="",
                          metadata=None, queue_ttl_ms=None):
        """As ``Client.acquire_all``: an AsyncLockSet; cancelling the awaiting task cancels the wait in the server."""
        names = c.set_names(names)
        acquiring = c.Acquiring(",".join(names), holder, wait_ms, timeout, lambda holder, wait: c.set_request(
            self.namespace, names, holder, wait, limit, ttl_ms, kind, metadata, queue_ttl_ms))
        resp, lease_end = await self._acquire(acquiring)
        return AsyncLockSet(self, names, resp, lease_end)

    async def _acquire(self, acquiring):
        try:
            resp = await self._call(self._unary.Acquire, acquiring.request, acquiring.deadline)
        except errors.TumblerError as e:
            timeout = acquiring.cut_by_deadline(e)
            if timeout is None:
                raise
            raise timeout from e
        return resp, acquiring.lease_end(resp)

    def lock(self, name, holder=None, *, ttl_ms=None, on_lost=None, cancel_on_loss=True, **acquire_options):
        """``async with client.lock("report", wait_ms=5000) as lock:`` held for the whole block.

        A watchdog task extends the lease every ttl_ms/3 (default lease 15 s).
        On loss: ``lock.lost`` is set, ``on_lost(LockLost)`` is called, the
        task running the block is cancelled (unless cancel_on_loss=False)
        and the block ends with LockLost. Otherwise the grant is released on exit.
        """
        return _Scope(lambda: self.acquire(name, holder, ttl_ms=ttl_ms or c.DEFAULT_HELPER_TTL_MS, **acquire_options),
                      on_lost, cancel_on_loss)

    def lock_all(self, names, holder=None, *, ttl_ms=None, on_lost=None, cancel_on_loss=True, **acquire_options):
        """``async with client.lock_all([...], wait_ms=5000) as held:`` the set for the whole block, as ``lock()``."""
        return _Scope(lambda: self.acquire_all(names, holder, ttl_ms=ttl_ms or c.DEFAULT_HELPER_TTL_MS,
                                               **acquire_options), on_lost, cancel_on_loss)

    async def campaign(self, name, value="", **options):
        """Leader election, as ``Client.campaign``: an AsyncLeadership whose watchdog is a task, or None."""
        from . import election
        return await election.campaign_async(self, name, value, **options)

    async def leader(self, name):
        """The election's current pb.Leadership, or None when nobody leads."""
        from . import election
        return await election.leader_async(self, name)

    def observe(self, name, timeout=None):
        """An async iterator of the election's pb.LeaderChange (first: the current leader); ``.cancel()`` ends it."""
        from . import election
        return election.observe_async(self, name, timeout)

    async def inspect(self, name):
        return await self._call(self._unary.Inspect, lambda: pb.InspectRequest(namespace=self.namespace, name=name))

    async def queue(self, name, max_entries=0):
        return await self._call(self._unary.Queue, lambda: pb.QueueRequest(namespace=self.namespace, name=name,
                                                                         max_entries=max_entries))

    async def close(self):
        if self._connect is not None:
            await self._connect.close()
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
