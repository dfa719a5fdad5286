"""The Connect transport of the unary calls (tumbler_client/_connect.py), blocking and asyncio, against a real
``tumbler serve`` over its own redis-server on free loopback ports (stopped by pid):

- a plaintext client sends its unary calls over Connect; a channel, grpc credentials or transport="grpc" keep gRPC;
- answers and errors are the gRPC transport's (InvalidArgument naming the field, LockBusy with the reply);
- connections are kept alive and reused; one the server closed is replaced without the caller seeing it;
- a deadline cuts a waiting call (LockTimeout); cancelling an asyncio task that waits closes its connection and
  the server drops the waiting request;
- a server that is gone is Unavailable after the retries, and the client works again once it is back.

    python tests/test_transport.py      # TUMBLER_BIN: the server binary (default target/debug/tumbler)
"""
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

import grpc

import tumbler_client as tc
from tumbler_client import _connect

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("TUMBLER_BIN") or os.path.join(ROOT, "target", "debug", "tumbler")
LOGS = tempfile.mkdtemp(prefix="tumbler-py-transport-")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(proc, port, what):
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited (logs in {LOGS})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} (logs in {LOGS})")


def spawn(name, argv):
    with open(os.path.join(LOGS, f"{name}.log"), "w") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def stop(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


REDIS_PORT = None
REDIS = None


def setUpModule():
    global REDIS, REDIS_PORT
    REDIS_PORT = free_port()
    REDIS = spawn("redis", ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no"])
    wait_listening(REDIS, REDIS_PORT, "redis-server")


def tearDownModule():
    stop(REDIS)


class Server:
    def __init__(self, port=None):
        self.port = port or free_port()
        self.proc = spawn(f"tumbler-{self.port}-{time.time():.0f}", [
            BIN, "serve", "--listen", f"127.0.0.1:{self.port}", "--http-listen", "off", "--no-auth",
            "--shutdown-drain-ms", "0", "--redis-url", f"redis://127.0.0.1:{REDIS_PORT}"])
        wait_listening(self.proc, self.port, "tumbler serve")

    addr = property(lambda self: f"127.0.0.1:{self.port}")

    def stop(self):
        stop(self.proc)


class BlockingTransport(unittest.TestCase):
    def setUp(self):
        self.server = Server()
        self.ns = f"py-connect-{uuid.uuid4().hex[:8]}"
        self.client = tc.Client(self.server.addr, namespace=self.ns, timeout=2)

    def tearDown(self):
        self.client.close()
        self.server.stop()

    def grpc_client(self):
        return tc.Client(self.server.addr, namespace=self.ns, transport="grpc")

    def test_plaintext_unary_calls_go_over_connect_and_the_rest_keeps_grpc(self):
        self.assertIsInstance(self.client._unary, _connect.ConnectStub)
        self.assertIs(self.grpc_client()._unary.__class__, tc.pb_grpc.LockServiceStub)
        channel = grpc.insecure_channel(self.server.addr)
        self.assertIs(tc.Client(self.server.addr, channel=channel)._connect, None)
        with self.assertRaises(TypeError):
            tc.Client("dns:///localhost:1", transport="connect")
        lock = self.client.acquire("a", ttl_ms=5000)
        self.assertGreater(lock.fencing_token, 0)
        self.assertEqual([h.grant.holder for h in self.grpc_client().inspect("a").holders], [lock.holder])
        again = self.client.acquire("a", lock.holder)
        self.assertEqual(again.fencing_token, lock.fencing_token)
        lock.extend(8000)
        self.assertTrue(lock.release())
        self.assertFalse(lock.release())

    def test_takes_over_is_passed_through_to_the_server(self):
        for i, c in enumerate((self.client, self.grpc_client())):
            queued = c.acquire(f"t{i}", f"job-{i}", ttl_ms=5000)
            run = c.acquire(f"t{i}", f"run-{i}", ttl_ms=5000, takes_over=f"job-{i}")
            self.assertGreater(run.fencing_token, queued.fencing_token)
            self.assertEqual([h.grant.holder for h in c.inspect(f"t{i}").holders], [f"run-{i}"])
            self.assertFalse(queued.release(), "the grant passed on")
            self.assertTrue(run.release())

    def test_errors_are_the_grpc_transports(self):
        for c in (self.client, self.grpc_client()):
            with self.assertRaises(tc.InvalidArgument) as e:
                c.acquire("b", limit=0, ttl_ms=1000)
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(e.exception.details.startswith("limit"), e.exception.details)
        held = self.grpc_client().acquire("b", ttl_ms=5000)
        with self.assertRaises(tc.LockBusy) as e:
            self.client.acquire("b")
        self.assertEqual(e.exception.response.holders, 1)
        held.release()

    def test_connections_are_kept_alive_and_one_the_server_closed_is_replaced(self):
        self.client.acquire("c", ttl_ms=5000).release()
        idle = self.client._connect._idle
        self.assertEqual(len(idle), 1)
        first = idle[0]
        for _ in range(10):
            self.client.acquire("c", ttl_ms=5000).release()
        self.assertEqual(idle, [first])
        first.sock.shutdown(socket.SHUT_WR)  # the server sees the connection end and closes its side
        time.sleep(0.1)
        self.client.acquire("c", ttl_ms=5000).release()
        self.assertEqual(len(idle), 1)
        self.assertIsNot(idle[0], first)

    def test_a_deadline_cuts_a_waiting_call(self):
        held = self.client.acquire("d", ttl_ms=10000)
        t0 = time.monotonic()
        with self.assertRaises(tc.LockTimeout):
            self.client.acquire("d", wait_ms=5000, timeout=0.5)
        self.assertLess(abs(time.monotonic() - t0 - 0.5), 0.4)
        self.assertTrue(held.release())

    def test_a_server_that_is_gone_is_unavailable_and_the_client_recovers(self):
        self.client.acquire("e", ttl_ms=1000).release()
        self.server.stop()
        t0 = time.monotonic()
        with self.assertRaises(tc.Unavailable):
            self.client.inspect("e")
        self.assertGreaterEqual(time.monotonic() - t0, 1.5)
        self.server = Server(self.server.port)
        self.assertTrue(self.client.acquire("e", ttl_ms=1000).release())


class AsyncTransport(unittest.TestCase):
    def setUp(self):
        self.server = Server()
        self.ns = f"py-aconnect-{uuid.uuid4().hex[:8]}"

    def tearDown(self):
        self.server.stop()

    def test_calls_errors_deadlines_and_cancellation(self):
        async def go():
            async with tc.AsyncClient(self.server.addr, namespace=self.ns, timeout=2) as client:
                self.assertIsInstance(client._unary, _connect.AsyncConnectStub)
                lock = await client.acquire("a", ttl_ms=30000)
                with self.assertRaises(tc.LockBusy):
                    await client.acquire("a")
                with self.assertRaises(tc.InvalidArgument) as e:
                    await client.acquire("b", limit=0)
                self.assertTrue(e.exception.details.startswith("limit"), e.exception.details)
                t0 = time.monotonic()
                with self.assertRaises(tc.LockTimeout):
                    await client.acquire("a", wait_ms=5000, timeout=0.5)
                self.assertLess(abs(time.monotonic() - t0 - 0.5), 0.4)
                waiter = asyncio.ensure_future(client.acquire("a", "waiter", wait_ms=5000))
                for _ in range(100):
                    if [r.holder for r in (await client.queue("a")).requests] == ["waiter"]:
                        break
                    await asyncio.sleep(0.02)
                waiter.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await waiter
                for _ in range(100):
                    if not (await client.queue("a")).requests:
                        break
                    await asyncio.sleep(0.02)
                self.assertEqual(list((await client.queue("a")).requests), [], "the server dropped the waiter")
                self.assertTrue(await lock.release())
                n = len(client._connect._idle)
                for _ in range(10):
                    await (await client.acquire("a", ttl_ms=1000)).release()
                self.assertEqual(len(client._connect._idle), n, "kept alive and reused")
        asyncio.run(go())


if __name__ == "__main__":
    sys.exit(unittest.main())
