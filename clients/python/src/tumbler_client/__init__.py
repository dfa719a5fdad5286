"""tumbler_client: the Python client of the tumbler lock service.

``Client`` (blocking) and ``AsyncClient`` (asyncio) wrap the stubs generated
from tumbler/v1/lock.proto when the package was built (``tumbler_client.v1``):
acquire with a wait and retries, scoped locks kept alive by a watchdog
(``with client.lock(...)`` / ``async with``), fencing tokens and slots,
multi-locks (``client.acquire_all`` / ``client.lock_all``: several locks,
all or none), typed errors (``Deadlock`` for a wait that would close a
cycle), and leader election (``client.campaign``, ``leader``, ``observe``).
``client.stub`` is the generated stub for every other RPC.
"""
from ._common import DEFAULT_HELPER_TTL_MS, Retry
from .aio import AsyncClient, AsyncLock, AsyncLockSet
from .election import AsyncLeadership, AsyncObserver, Leadership, Observer
from .errors import (Deadlock, InvalidArgument, LockBusy, LockLost, LockTimeout, NotAcquired, NotLeader,
                     PermissionDenied, TumblerError, Unavailable)
from .sync import Client, Lock, LockSet
from .v1 import lock_pb2 as pb
from .v1 import lock_pb2_grpc as pb_grpc

__all__ = ["Client", "Lock", "LockSet", "AsyncClient", "AsyncLock", "AsyncLockSet", "Retry", "TumblerError",
           "NotAcquired", "LockBusy", "LockTimeout", "LockLost", "NotLeader", "Deadlock", "Leadership", "Observer",
           "AsyncLeadership", "AsyncObserver", "InvalidArgument", "PermissionDenied", "Unavailable", "pb", "pb_grpc",
           "DEFAULT_HELPER_TTL_MS"]
