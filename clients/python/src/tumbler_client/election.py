"""Leader election: ``client.campaign(...)`` returns a Leadership kept by the
same watchdog as a Lock (Extend pinned to the term), ``client.leader(name)``
and ``client.observe(name)``; AsyncLeadership and AsyncObserver are the same
for AsyncClient.

An election is a fair lock of limit 1 on the server: the leader is its
holder (``candidate``), the term its fencing token.
"""
import asyncio
import time

import grpc

from . import _common as c
from . import errors
from .aio import AsyncLock
from .sync import Lock
from .v1 import lock_pb2 as pb


class Leadership(Lock):
    """One term of this process as the leader: ``name``, ``candidate``, ``term``, ``value``.

    A Lock whose holder is the candidate and whose fencing token is the term,
    so ``lost`` (a threading.Event), ``lost_reason``, ``check()`` and the
    watchdog (``keep_alive``) work as for a lock. ``proclaim(value)`` and
    ``resign()`` act only with this term.
    """

    def __init__(self, client, name, leader, lease_end, secret=""):
        super().__init__(client, name, _grant(leader), lease_end)
        self.leader = leader  # the pb.Leadership as last told by the server
        # The secret only the winning Campaign was told: Proclaim and Resign need it.
        self.secret = secret
        self.resigned = False

    candidate = property(lambda self: self.leader.candidate)
    term = property(lambda self: self.leader.term)
    value = property(lambda self: self.leader.value)

    def proclaim(self, value):
        """Replace the leader's value. NOT_LEADER marks the leadership lost and raises NotLeader."""
        resp = self.client._call(self.client._unary.Proclaim, lambda: pb.ProclaimRequest(
            namespace=self.client.namespace, name=self.name, candidate=self.candidate, term=self.term, value=value,
            secret=self.secret))
        if resp.status != pb.PROCLAIM_STATUS_PROCLAIMED:
            self._mark_lost("not the leader")
            raise self.not_leader()
        self.leader = resp.leader
        return self

    def resign(self):
        """Step down (stops the watchdog): the next candidate is elected at once.

        True when this call ended the term; False when it was over already
        (resigned before, or lost). Safe to call more than once.
        """
        self.stop_keep_alive()
        if self.resigned:
            return False
        resp = self.client._call(self.client._unary.Resign, lambda: pb.ResignRequest(
            namespace=self.client.namespace, name=self.name, candidate=self.candidate, term=self.term,
            secret=self.secret))
        self.resigned = True
        return resp.status == pb.RESIGN_STATUS_RESIGNED

    release = resign

    def not_leader(self):
        return errors.NotLeader(self.name, self.candidate, self.term, self.lost_reason or "not the leader")

    def lost_error(self):
        return self.not_leader()

    def __repr__(self):
        return f"Leadership({self.name!r}, candidate={self.candidate!r}, term={self.term}, value={self.value!r})"


class Observer:
    """The leader changes of one election (pb.LeaderChange), as an iterator.

    The first is the leader when the stream started (``event == "current"``).
    ``cancel()`` (or leaving a ``with`` block) ends the stream; the iteration
    then stops.
    """

    def __init__(self, call):
        self._call = call
        self.cancelled = False

    def __iter__(self):
        try:
            for change in self._call:
                yield change
        except grpc.RpcError as e:
            if self.cancelled or e.code() == grpc.StatusCode.CANCELLED:
                return
            raise errors.from_rpc_error(e) from e

    def cancel(self):
        self.cancelled = True
        self._call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


def _grant(leader):
    return pb.Grant(holder=leader.candidate, fencing_token=leader.term, slot=1, acquired_at_ms=leader.elected_at_ms,
                    expires_at_ms=leader.expires_at_ms, ttl_ms=leader.ttl_ms)


class AsyncLeadership(AsyncLock):
    """As Leadership, with coroutines; ``lost`` is an asyncio.Event. The watchdog is a task that resign() ends."""

    def __init__(self, client, name, leader, lease_end, secret=""):
        super().__init__(client, name, _grant(leader), lease_end)
        self.leader = leader
        self.secret = secret  # only the winning Campaign was told it: Proclaim and Resign need it
        self.resigned = False
        self._dog = None

    candidate = property(lambda self: self.leader.candidate)
    term = property(lambda self: self.leader.term)
    value = property(lambda self: self.leader.value)

    def keep_alive(self, on_lost=None):
        """Start the watchdog task (once); on loss ``lost`` is set and on_lost(NotLeader) is called."""
        async def guard():
            await self.watch()
            if on_lost is not None:
                on_lost(self.lost_error())

        if self._dog is None:
            self._dog = asyncio.ensure_future(guard())
        return self

    async def stop_keep_alive(self):
        if self._dog is not None:
            self._dog.cancel()
            await asyncio.gather(self._dog, return_exceptions=True)
            self._dog = None

    async def proclaim(self, value):
        """Replace the leader's value. NOT_LEADER marks the leadership lost and raises NotLeader."""
        resp = await self.client._call(self.client._unary.Proclaim, lambda: pb.ProclaimRequest(
            namespace=self.client.namespace, name=self.name, candidate=self.candidate, term=self.term, value=value,
            secret=self.secret))
        if resp.status != pb.PROCLAIM_STATUS_PROCLAIMED:
            self._mark_lost("not the leader")
            raise self.lost_error()
        self.leader = resp.leader
        return self

    async def resign(self):
        """Step down and end the watchdog; True when this call ended the term. Safe to call more than once."""
        await self.stop_keep_alive()
        if self.resigned:
            return False
        resp = await self.client._call(self.client._unary.Resign, lambda: pb.ResignRequest(
            namespace=self.client.namespace, name=self.name, candidate=self.candidate, term=self.term,
            secret=self.secret))
        self.resigned = True
        return resp.status == pb.RESIGN_STATUS_RESIGNED

    release = resign

    def lost_error(self):
        return errors.NotLeader(self.name, self.candidate, self.term, self.lost_reason or "not the leader")

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.resign()


class AsyncObserver:
    """The leader changes of one election as an async iterator; ``cancel()`` (or ``async with``) ends it."""

    def __init__(self, call):
        self._call = call
        self.cancelled = False

    async def __aiter__(self):
        try:
            async for change in self._call:
                yield change
        except asyncio.CancelledError:
            if not self.cancelled:
                raise
        except grpc.RpcError as e:
            if self.cancelled or e.code() == grpc.StatusCode.CANCELLED:
                return
            raise errors.from_rpc_error(e) from e

    def cancel(self):
        self.cancelled = True
        self._call.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.cancel()


async def campaign_async(client, name, value="", *, candidate=None, ttl_ms=None, wait_ms=0, timeout=None,
                         on_lost=None, queue_ttl_ms=None, kind=""):
    """As campaign() for an AsyncClient; cancelling the awaiting task cancels the wait in the server."""
    candidate = candidate or c.new_holder()
    ttl_ms = ttl_ms or c.DEFAULT_HELPER_TTL_MS
    started = time.monotonic()
    deadline = started + (timeout if timeout is not None else wait_ms / 1000.0 + c.DEADLINE_SLACK_S)
    sent = [started]

    def request():
        sent[0] = time.monotonic()
        return pb.CampaignRequest(namespace=client.namespace, name=name, candidate=candidate, value=value,
                                  ttl_ms=ttl_ms, wait_ms=c.remaining_wait_ms(wait_ms, started, deadline),
                                  queue_ttl_ms=queue_ttl_ms, kind=kind)

    try:
        resp = await client._call(client._unary.Campaign, request, deadline)
    except errors.TumblerError as e:
        if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return None
        raise
    if not resp.elected:
        return None
    lease_end = max(sent[0], time.monotonic() - 0.05) + resp.leader.ttl_ms / 1000.0
    return AsyncLeadership(client, name, resp.leader, lease_end, resp.secret).keep_alive(on_lost)


async def leader_async(client, name):
    resp = await client._call(client._unary.Leader, lambda: pb.LeaderRequest(namespace=client.namespace, name=name))
    return resp.leader if resp.HasField("leader") else None


def observe_async(client, name, timeout=None):
    return AsyncObserver(client.stub.Observe(pb.LeaderRequest(namespace=client.namespace, name=name),
                                             timeout=timeout, metadata=client._md))


def campaign(client, name, value="", *, candidate=None, ttl_ms=None, wait_ms=0, timeout=None, on_lost=None,
             queue_ttl_ms=None, kind="", keep_alive=True):
    """Wait up to ``wait_ms`` in the election's queue to be elected.

    Returns a Leadership whose watchdog extends the lease every third of
    ``ttl_ms`` (default 15 s), or None when not elected within the wait.
    ``candidate`` defaults to an id made here before the first try, so a
    retried Campaign is the same candidacy (same term when it already leads).
    """
    candidate = candidate or c.new_holder()
    ttl_ms = ttl_ms or c.DEFAULT_HELPER_TTL_MS
    started = time.monotonic()
    deadline = started + (timeout if timeout is not None else wait_ms / 1000.0 + c.DEADLINE_SLACK_S)
    sent = [started]

    def request():
        sent[0] = time.monotonic()
        return pb.CampaignRequest(namespace=client.namespace, name=name, candidate=candidate, value=value,
                                  ttl_ms=ttl_ms, wait_ms=c.remaining_wait_ms(wait_ms, started, deadline),
                                  queue_ttl_ms=queue_ttl_ms, kind=kind)

    try:
        resp = client._call(client._unary.Campaign, request, deadline)
    except errors.TumblerError as e:
        if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return None
        raise
    if not resp.elected:
        return None
    lease_end = max(sent[0], time.monotonic() - 0.05) + resp.leader.ttl_ms / 1000.0
    held = Leadership(client, name, resp.leader, lease_end, resp.secret)
    if keep_alive:
        held.keep_alive(on_lost)
    return held


def leader(client, name):
    """The current pb.Leadership (candidate, term, value, expires_at_ms, …), or None when nobody leads."""
    resp = client._call(client._unary.Leader, lambda: pb.LeaderRequest(namespace=client.namespace, name=name))
    return resp.leader if resp.HasField("leader") else None


def observe(client, name, timeout=None):
    """An Observer of the election's leader changes (``timeout`` s bounds the whole stream; None: no bound)."""
    call = client.stub.Observe(pb.LeaderRequest(namespace=client.namespace, name=name), timeout=timeout,
                               metadata=client._md)
    return Observer(call)
