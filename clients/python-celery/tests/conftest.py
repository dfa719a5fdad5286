"""Real servers for the tests: a redis-server (tumbler's data in db 0, Sidekiq's queues in db 1, Celery's broker
and results in 2 and 3, the tasks' reports in 4) and a `tumbler serve` on free loopback ports (never 6379), and
one real Celery worker (`celery -A tasks worker`, the prefork pool) for the whole run. Everything is started
here and stopped here, by pid. Logs go to $TUMBLER_TEST_LOGS (default: a new temporary directory).

TUMBLER_BIN: the server (default target/debug/tumbler, else target/release/tumbler, of this checkout).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
LOGS = os.environ.get("TUMBLER_TEST_LOGS") or tempfile.mkdtemp(prefix="tumbler-celery-tests.")
os.makedirs(LOGS, exist_ok=True)
NAMESPACE = "celery-test"
EXECUTION_TTL = 2.0  # s: the worker's execution lease (renewed every third)
RUN_HOLDER = re.compile(r"\A(?P<id>.+):[0-9a-f]{16}\Z")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, cond, timeout=15.0, every=0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Proc:
    """A process the tests started, with its log; stopped by its pid."""

    all = []

    def __init__(self, name, argv, env=None, cwd=None, stdin=subprocess.DEVNULL, stdout=None):
        self.name, self.log = name, os.path.join(LOGS, f"{name}.log")
        self._log = open(self.log, "ab")
        self.popen = subprocess.Popen(argv, env={**os.environ, **(env or {})}, cwd=cwd, stdin=stdin,
                                      stdout=stdout or self._log, stderr=self._log)
        self.pid = self.popen.pid
        Proc.all.append(self)

    def alive(self):
        return self.popen.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.alive():
            os.kill(self.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait()
        self._log.close()

    def tail(self, n=30):
        with open(self.log, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")


def wait_listening(proc, port, timeout=30):
    def up():
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False
    wait_until(f"{proc.name} on 127.0.0.1:{port} (log: {proc.log})", up, timeout)


def tumbler_bin():
    if os.environ.get("TUMBLER_BIN"):
        return os.environ["TUMBLER_BIN"]
    for build in ("debug", "release"):
        path = os.path.join(ROOT, "target", build, "tumbler")
        if os.path.exists(path):
            return path
    raise RuntimeError("no tumbler binary: set TUMBLER_BIN or build target/debug/tumbler")


class Servers:
    def __init__(self):
        self.redis_port = free_port()
        self.redis = Proc(f"redis-{self.redis_port}", ["redis-server", "--port", str(self.redis_port), "--bind",
                                                        "127.0.0.1", "--save", "", "--appendonly", "no"])
        wait_listening(self.redis, self.redis_port)
        self.tumbler_port = free_port()
        self.tumbler = Proc(f"tumbler-{self.tumbler_port}", [
            tumbler_bin(), "serve", "--listen", f"127.0.0.1:{self.tumbler_port}", "--http-listen", "off", "--no-auth",
            "--shutdown-drain-ms", "0", "--redis-url", f"redis://127.0.0.1:{self.redis_port}"])
        wait_listening(self.tumbler, self.tumbler_port)
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}"
        self.address = f"127.0.0.1:{self.tumbler_port}"
        self.env = {"TEST_REDIS_URL": self.redis_url, "TUMBLER_ADDR": self.address, "TUMBLER_NAMESPACE": NAMESPACE,
                    "TEST_EXECUTION_TTL": str(EXECUTION_TTL)}
        os.environ.update(self.env)


@pytest.fixture(scope="session")
def servers():
    s = Servers()
    yield s
    for proc in reversed(Proc.all):
        proc.stop()


@pytest.fixture(scope="session")
def tasks(servers):
    sys.path.insert(0, HERE)
    import tasks as module
    yield module
    # Results still pending unsubscribe from the result backend now, while its Redis runs.
    import gc
    gc.collect()
    module.app.close()


@pytest.fixture(scope="session")
def reports(servers):
    import redis
    return redis.Redis.from_url(f"{servers.redis_url}/4", decode_responses=True)


class Worker:
    """One `celery -A tasks worker` process (prefork pool), ready when its worker_ready signal reported."""

    def __init__(self, servers, reports, name, queues, concurrency=4):
        self.reports = reports
        before = reports.llen("test:ready")
        self.proc = Proc(f"celery-{name}", [
            sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork", "-c", str(concurrency),
            "-Q", queues, "-n", f"{name}@%h", "-l", "info", "--without-heartbeat", "--without-gossip",
            "--without-mingle"], env=servers.env, cwd=HERE)

        def ready():
            if not self.proc.alive():
                raise AssertionError(f"celery worker exited:\n{self.proc.tail()}")
            return reports.llen("test:ready") > before
        wait_until(f"the celery worker to be ready (log: {self.proc.log})", ready, timeout=60)

    def stop(self):
        self.proc.stop()


@pytest.fixture(scope="session")
def worker(servers, reports, tasks):
    w = Worker(servers, reports, "main", "tests")
    yield w
    w.stop()


@pytest.fixture(scope="session")
def client(servers, tasks):
    return tasks.tumbler_celery.client_for(tasks.app)


class Helpers:
    def __init__(self, client, reports):
        self.client, self.reports = client, reports

    def new_tag(self, prefix):
        return f"{prefix}-{os.urandom(3).hex()}"

    def events(self, tag, kind=None):
        evs = [json.loads(line) for line in self.reports.lrange(f"ev:{tag}", 0, -1)]
        return [e for e in evs if kind is None or e["e"] == kind]

    def wait_events(self, tag, kind, n=1, timeout=20):
        return wait_until(f"{n} {kind} event(s) of {tag}", lambda: len(self.events(tag, kind)) >= n and
                          self.events(tag, kind), timeout)

    def open_gate(self, tag, n=1):
        for _ in range(n):
            self.reports.rpush(f"gate:{tag}", "go")

    def holders(self, name):
        return [h.grant for h in self.client.inspect(name).holders]

    def wait_free(self, name, timeout=10):
        wait_until(f"{name} to be free", lambda: not self.holders(name), timeout)


@pytest.fixture(scope="session")
def h(client, reports):
    return Helpers(client, reports)
