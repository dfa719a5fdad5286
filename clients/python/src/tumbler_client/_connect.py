"""The Connect transport of the unary calls: binary protobuf
(``application/proto``) POSTed over kept-alive HTTP/1.1 connections to the
server's gRPC port, which serves Connect beside gRPC (docs/api.md, "Connect
and gRPC-Web on the gRPC port"). The server turns each request into the gRPC
call it stands for, so auth, validation, deadlines and errors are the same.

``ConnectStub`` and ``AsyncConnectStub`` have the generated stub's unary
methods (``stub.Acquire(request, timeout=..., metadata=...)``) and raise
``ConnectRpcError``, a ``grpc.RpcError`` with ``code()`` and ``details()``,
so the client's retry loop and error mapping treat both transports alike.

Why: one grpcio unary call costs this process several hundred
microseconds of its own (its C core's completion queue, thread hand-offs,
the GIL taken and given back); one request written to a socket and one
answer read from it cost a few tens (clients/python/README.md, "What a
call costs").

A connection is one caller's at a time (a pool: a thread or task takes an
idle one or opens one, and puts it back after a whole answer). The
request is one write with TCP_NODELAY, so no call waits on a delayed ACK.
``Connect-Timeout-Ms`` carries the deadline to the server, which answers
before it; the socket's own timeout is the deadline too. A connection cut
by a deadline or a cancellation is closed, never reused, and closing it
is how the server learns the caller is gone (a waiting Acquire leaves the
queue). A reused connection the server had closed while idle is replaced
and the request sent once more, only when nothing of an answer came back.
"""
import asyncio
import json
import math
import os
import select
import socket
import threading
import time

import grpc

from .v1 import lock_pb2 as pb

SERVICE = "tumbler.v1.LockService"

# Connect's error codes (the JSON body's "code") -> gRPC status codes.
_CODES = {code.name.lower(): code for code in grpc.StatusCode}
_CODES["canceled"] = grpc.StatusCode.CANCELLED
# What an HTTP status means when the body names no code (Connect's table, read backwards).
_HTTP_CODES = {400: grpc.StatusCode.INTERNAL, 401: grpc.StatusCode.UNAUTHENTICATED,
               403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.UNIMPLEMENTED,
               429: grpc.StatusCode.UNAVAILABLE, 502: grpc.StatusCode.UNAVAILABLE,
               503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.UNAVAILABLE}


class ConnectRpcError(grpc.RpcError):
    """A failed Connect call, read as gRPC's: ``code()`` (grpc.StatusCode) and ``details()``."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ()

    def initial_metadata(self):
        return ()


class _Reused(Exception):
    """A reused connection gave no answer at all: send again on a fresh one."""


def split_target(target):
    """``"host:port"`` (or ``"[v6]:port"``) -> (host, port); None for targets only gRPC resolves (dns:///, unix:)."""
    if "/" in target or target.startswith("unix:"):
        return None
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def _unary_methods():
    """(name, response class) of every unary RPC of the service: the stub's methods this transport carries."""
    service = pb.DESCRIPTOR.services_by_name["LockService"]
    return [(m.name, getattr(pb, m.output_type.name)) for m in service.methods
            if not m.client_streaming and not m.server_streaming]


UNARY = _unary_methods()


def error_from_answer(status, body):
    """The ConnectRpcError of a non-200 answer: its JSON's code and message, else the HTTP status's code."""
    try:
        err = json.loads(body)
        code = _CODES.get(err.get("code"))
        message = err.get("message", "")
    except (ValueError, AttributeError):
        code, message = None, body.decode("utf-8", "replace")[:200]
    if code is None:
        code = _HTTP_CODES.get(status, grpc.StatusCode.UNKNOWN)
        message = message or f"HTTP {status}"
    return ConnectRpcError(code, message)


def _timeout_header(timeout):
    if timeout is None:
        return ""
    return f"Connect-Timeout-Ms: {min(9_999_999_999, max(1, math.ceil(timeout * 1000)))}\r\n"


def _metadata_headers(metadata):
    return "".join(f"{k}: {v}\r\n" for k, v in metadata) if metadata else ""


class _Head:
    """What every request of one stub starts with, per method (the head but its length, deadline and metadata)."""

    def __init__(self, authority):
        self.authority = authority
        self.prefix = {name: f"POST /{SERVICE}/{name} HTTP/1.1\r\nHost: {authority}\r\n"
                             f"Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
                       for name, _ in UNARY}

    def request(self, name, body, timeout, metadata):
        head = (f"{self.prefix[name]}Content-Length: {len(body)}\r\n{_timeout_header(timeout)}"
                f"{_metadata_headers(metadata)}\r\n")
        return head.encode("latin-1") + body


def parse_head(head):
    """(status, content-length or None, chunked, keep-alive) of a response head (bytes up to the blank line)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    status = int(parts[1])
    length, chunked, keep = None, False, parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            v = value.strip().lower()
            keep = v != b"close" if keep else v == b"keep-alive"
    return status, length, chunked, keep


class _Conn:
    """One HTTP/1.1 connection and what was read past the last answer."""

    def __init__(self, sock):
        self.sock, self.buf, self.used = sock, bytearray(), False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def stale(self):
        """True when an idle connection has something to read: the server closed it (or sent junk)."""
        if self.buf:
            return True
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _fill(self, deadline):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline")
            self.sock.settimeout(left)
        else:
            self.sock.settimeout(None)
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self.buf += data

    def _until(self, marker, deadline):
        start = 0
        while True:
            i = self.buf.find(marker, start)
            if i >= 0:
                return i
            start = max(0, len(self.buf) - len(marker) + 1)
            self._fill(deadline)

    def _take(self, n, deadline):
        while len(self.buf) < n:
            self._fill(deadline)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def roundtrip(self, request, deadline):
        """Send one request, read its whole answer: (status, body, keep-alive)."""
        self.sock.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
        self.sock.sendall(request)
        try:
            end = self._until(b"\r\n\r\n", deadline)
        except (ConnectionError, socket.timeout) as e:
            if self.used and not self.buf and not isinstance(e, socket.timeout):
                raise _Reused() from e
            raise
        status, length, chunked, keep = parse_head(bytes(self.buf[:end]))
        del self.buf[:end + 4]
        if chunked:
            body = bytearray()
            while True:
                i = self._until(b"\r\n", deadline)
                size = int(bytes(self.buf[:i]).split(b";")[0], 16)
                del self.buf[:i + 2]
                if size == 0:
                    self._until(b"\r\n", deadline)  # no trailers are sent: the last empty line
                    del self.buf[:2]
                    break
                body += self._take(size, deadline)
                self._take(2, deadline)
            body = bytes(body)
        elif length is not None:
            body = self._take(length, deadline)
        else:  # read to the end of the connection
            keep = False
            try:
                while True:
                    self._fill(deadline)
            except ConnectionResetError:
                pass
            body, self.buf = bytes(self.buf), bytearray()
        self.used = True
        return status, body, keep


class ConnectStub:
    """The unary methods of LockServiceStub over Connect (binary proto) on kept-alive HTTP/1.1 connections.

    ``ssl_context``: an ssl.SSLContext for TLS (None: plaintext); ``server_hostname`` the name its
    certificate is checked against (default: the host of the target).
    """

    def __init__(self, host, port, ssl_context=None, server_hostname=None, connect_timeout=None):
        self._addr = (host, port)
        self._ssl, self._server_hostname = ssl_context, server_hostname or host
        self._head = _Head(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        self._idle, self._lock, self._closed, self._pid = [], threading.Lock(), False, os.getpid()
        self._connect_timeout = connect_timeout
        for name, response in UNARY:
            setattr(self, name, self._method(name, response))

    def _method(self, name, response):
        def call(request, timeout=None, metadata=None):
            return self._unary(name, response, request, timeout, metadata)
        call.__name__ = name
        return call

    def _open(self, deadline):
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        sock = socket.create_connection(self._addr, timeout=left if self._connect_timeout is None
                                        else min(left or self._connect_timeout, self._connect_timeout))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            sock = self._ssl.wrap_socket(sock, server_hostname=self._server_hostname)
        return _Conn(sock)

    def _take(self, deadline):
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the idle connections are the parent's, leave them
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if not conn.stale():
                    return conn
                conn.close()
        return self._open(deadline)

    def _give_back(self, conn):
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _unary(self, name, response, request, timeout, metadata):
        deadline = None if timeout is None else time.monotonic() + timeout
        body = request.SerializeToString()
        for _ in range(2):
            try:
                conn = self._take(deadline)
            except socket.timeout as e:
                raise ConnectRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"connecting: {e}") from None
            except OSError as e:
                raise ConnectRpcError(grpc.StatusCode.UNAVAILABLE, f"connecting to {self._head.authority}: {e}") \
                    from None
            left = None if deadline is None else deadline - time.monotonic()
            try:
                status, answer, keep = conn.roundtrip(self._head.request(name, body, left, metadata), deadline)
            except _Reused:
                conn.close()
                continue
            except socket.timeout:
                conn.close()
                raise ConnectRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            except (OSError, ValueError, IndexError) as e:
                conn.close()
                raise ConnectRpcError(grpc.StatusCode.UNAVAILABLE, f"{self._head.authority}: {e}") from None
            except BaseException:  # KeyboardInterrupt and the like: the answer is unread, the connection spent
                conn.close()
                raise
            if keep:
                self._give_back(conn)
            else:
                conn.close()
            if status == 200:
                return response.FromString(answer)
            raise error_from_answer(status, answer)
        raise ConnectRpcError(grpc.StatusCode.UNAVAILABLE, f"{self._head.authority}: the connection was closed")

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def parse_answer(buf, eof=False):
    """A whole answer at the start of ``buf``: ((status, body, keep-alive), bytes used); None while incomplete.

    ``eof``: the connection has ended (an answer with neither length nor chunks ends there)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    status, length, chunked, keep = parse_head(bytes(buf[:end]))
    at = end + 4
    if length is not None:
        if len(buf) < at + length:
            return None
        return (status, bytes(buf[at:at + length]), keep), at + length
    if not chunked:
        return ((status, bytes(buf[at:]), False), len(buf)) if eof else None
    body = bytearray()
    while True:
        i = buf.find(b"\r\n", at)
        if i < 0:
            return None
        size = int(bytes(buf[at:i]).split(b";")[0], 16)
        if size == 0:
            if len(buf) < i + 4:
                return None
            return (status, bytes(body), keep), i + 4
        if len(buf) < i + 2 + size + 2:
            return None
        body += buf[i + 2:i + 2 + size]
        at = i + 2 + size + 2


class _AsyncConn(asyncio.Protocol):
    """One HTTP/1.1 connection as an asyncio protocol: a call writes its request and awaits one future, which
    data_received resolves once the whole answer is in (no stream reader between them)."""

    def __init__(self):
        self.transport, self.buf, self.waiter = None, bytearray(), None
        self.used = self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buf += data
        self._answer()

    def eof_received(self):
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc):
        self.closed = True
        if self._answer(eof=True):
            return
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self.used and not self.buf:
                waiter.set_exception(_Reused())
            else:
                waiter.set_exception(exc or ConnectionResetError("the server closed the connection"))

    def _answer(self, eof=False):
        waiter = self.waiter
        if waiter is None or waiter.done():
            return False
        try:
            got = parse_answer(self.buf, eof)
        except (ValueError, IndexError) as e:
            waiter.set_exception(e)
            return True
        if got is None:
            return False
        answer, used = got
        del self.buf[:used]
        waiter.set_result(answer)
        return True

    def close(self):
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def stale(self):
        return self.closed or bool(self.buf) or self.transport.is_closing()

    async def roundtrip(self, request):
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            answer = await self.waiter
        finally:
            self.waiter = None
        self.used = True
        return answer


class AsyncConnectStub:
    """As ConnectStub, for asyncio: each method is a coroutine function; a cancelled call closes its connection."""

    def __init__(self, host, port, ssl_context=None, server_hostname=None):
        self._addr = (host, port)
        self._ssl, self._server_hostname = ssl_context, (server_hostname or host) if ssl_context else None
        self._head = _Head(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        self._idle, self._closed = [], False
        for name, response in UNARY:
            setattr(self, name, self._method(name, response))

    def _method(self, name, response):
        async def call(request, timeout=None, metadata=None):
            return await self._unary(name, response, request, timeout, metadata)
        call.__name__ = name
        return call

    async def _take(self):
        while self._idle:
            conn = self._idle.pop()
            if not conn.stale():
                return conn
            conn.close()
        _, conn = await asyncio.get_running_loop().create_connection(
            _AsyncConn, *self._addr, ssl=self._ssl, server_hostname=self._server_hostname)
        sock = conn.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    async def _unary(self, name, response, request, timeout, metadata):
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        expired = []

        def expire():
            expired.append(True)
            task.cancel()

        timer = loop.call_later(timeout, expire) if timeout is not None else None
        deadline = None if timeout is None else time.monotonic() + timeout
        body = request.SerializeToString()
        conn = None
        try:
            for _ in range(2):
                try:
                    conn = await self._take()
                except OSError as e:
                    raise ConnectRpcError(grpc.StatusCode.UNAVAILABLE,
                                          f"connecting to {self._head.authority}: {e}") from None
                left = None if deadline is None else max(0.001, deadline - time.monotonic())
                try:
                    status, answer, keep = await conn.roundtrip(self._head.request(name, body, left, metadata))
                except _Reused:
                    conn.close()
                    conn = None
                    continue
                except (OSError, ValueError, IndexError) as e:
                    conn.close()
                    conn = None
                    raise ConnectRpcError(grpc.StatusCode.UNAVAILABLE, f"{self._head.authority}: {e}") from None
                if keep and not self._closed:
                    self._idle.append(conn)
                else:
                    conn.close()
                conn = None
                if status == 200:
                    return response.FromString(answer)
                raise error_from_answer(status, answer)
            raise ConnectRpcError(grpc.StatusCode.UNAVAILABLE, f"{self._head.authority}: the connection was closed")
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()  # the server sees the connection go and drops the call (a waiter leaves the queue)
            if expired:
                if hasattr(task, "uncancel"):
                    task.uncancel()
                raise ConnectRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def close(self):
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
