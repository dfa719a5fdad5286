"""Typed errors of tumbler_client, and the mapping from gRPC status codes.

Not getting a lock raises NotAcquired (LockBusy after a try-once request,
LockTimeout after a wait); a grant that ends while it is relied on raises
LockLost (NotLeader for a leadership). A wait that would close a cycle of
waiters raises Deadlock. gRPC failures become InvalidArgument, PermissionDenied,
Unavailable (after the retries ran out) or TumblerError.
"""
import grpc


class TumblerError(Exception):
    """Base of every error this package raises. ``code`` is the gRPC status code when there is one."""

    code = None
    details = ""


class NotAcquired(TumblerError):
    """The lock was not granted; ``response`` is the AcquireResponse (None when the deadline cut the call)."""

    busy = False
    timeout = False

    def __init__(self, name, response=None, message=None):
        holders = response.holders if response is not None else "?"
        super().__init__(message or f"{name}: not acquired ({type(self).__name__}, {holders} holder(s))")
        self.name, self.response = name, response


class LockBusy(NotAcquired):
    """A try-once request (wait_ms=0) found every permit taken, or fair waiters ahead."""

    busy = True


class LockTimeout(NotAcquired):
    """The wait (wait_ms, or the call's deadline) ended without a grant."""

    timeout = True


class LockLost(TumblerError):
    """The grant is gone (Extend answered NOT_HELD, or renewals failed past the lease): stop relying on it."""

    def __init__(self, name, holder, fencing_token, reason):
        token = f" (token {fencing_token})" if fencing_token is not None else ""  # a multi-lock's: None
        super().__init__(f"{name}: lock lost by {holder}{token}: {reason}")
        self.name, self.holder, self.fencing_token, self.reason = name, holder, fencing_token, reason


class NotLeader(LockLost):
    """The leadership is over: Proclaim or Extend answered that this candidate no longer leads with its term."""

    def __init__(self, name, candidate, term, reason):
        super().__init__(name, candidate, term, reason)
        self.candidate, self.term = candidate, term


class InvalidArgument(TumblerError, ValueError):
    """The server refused the request; ``details`` starts with the field (``priority: must be …``)."""


class PermissionDenied(TumblerError):
    """Missing, unknown or expired token (UNAUTHENTICATED), or one that may not do this (PERMISSION_DENIED)."""


class Unavailable(TumblerError):
    """The server or its Redis stayed unreachable until the call's deadline (retries included)."""


class Deadlock(TumblerError):
    """The wait was refused: it would close a cycle of waiters (gRPC ABORTED, ``details`` naming it:
    ``deadlock: holder "a" waits for lock "x" held by "b", …``). Nothing of the request stayed queued:
    release what the holder holds (or take locks in one global order) and try again."""


# Other ABORTED answers (a session resume race) say something else.
DEADLOCK_PREFIX = "deadlock: "


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def from_rpc_error(err):
    """The typed error for a grpc.RpcError (the original is its __cause__)."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, TumblerError)
    if code == grpc.StatusCode.ABORTED and (details or "").startswith(DEADLOCK_PREFIX):
        cls = Deadlock
    out = cls(f"{code.name if code else 'error'}: {details}")
    out.code, out.details = code, details or ""
    return out


def is_retryable(err):
    """UNAVAILABLE: the server was not reached or its Redis was down; nothing was applied."""
    return isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE
