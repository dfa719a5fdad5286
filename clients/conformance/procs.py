"""Processes for the conformance driver: language steps that report JSON
lines, and the redis-server / tumbler servers the driver starts itself on
free loopback ports (stopped by pid, never by name).
"""
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.dirname(HERE)
ROOT = os.path.dirname(CLIENTS)
NAMESPACE = "conformance"
LANGS = ["python", "node", "go", "ruby", "rust", "perl", "java"]
# Languages with an examples program and a README example the driver runs
# (Rust's README example is compiled as clients/rust/examples/readme.rs, and
# tests/repo/crates.rs keeps the two the same).
EXAMPLE_LANGS = ["python", "node", "go", "ruby", "perl", "java"]
# Languages whose helpers run the leader-election part, in the order it
# rotates the roles through; OBSERVE_LANGS: those whose helpers observe.
# RESIGN_TAKES_LEADERSHIP: helpers whose resign takes the leadership by
# value (Rust's `Leadership::resign(self)`), so a second resign or a
# proclaim after it is a compile error there, not a call to check.
ELECTION_LANGS = ["python", "node", "go", "ruby", "rust", "perl", "java"]
OBSERVE_LANGS = ["python", "node", "go", "ruby", "rust", "perl", "java"]
RESIGN_TAKES_LEADERSHIP = ["rust"]
# Languages whose helpers run the read/write part (rw_hold, rw_wait), in
# the order it rotates the roles through (two readers, then a writer).
READ_WRITE_LANGS = ["python", "node", "go", "ruby", "rust", "perl", "java"]
# Languages whose helpers run the weighted part (weighted_hold,
# weighted_wait), in the order it rotates the roles through.
WEIGHTED_LANGS = ["python", "node", "go", "ruby", "rust", "perl", "java"]
# Languages whose helpers run the multi part (multi_hold, multi_wait,
# multi_release, multi_stale, deadlock_wait), in the order it rotates the
# roles through.
MULTI_LANGS = ["python", "node", "go", "ruby", "rust", "perl", "java"]


def commands(table):
    """argv prefix per language for the steps ("steps") or the examples ("examples") programs.

    The packages are the installed ones: the Python of the venv the driver
    runs in, NODE_PATH, GEM_HOME, and the Go programs built into
    $TUMBLER_GO_BIN, Rust's steps built by cargo into
    $TUMBLER_RUST_STEPS, the Perl distribution installed (make install)
    into $TUMBLER_PERL5LIB, and the Java jars on $TUMBLER_JAVA_CP
    (clients/test.sh sets these up).
    """
    rust = os.environ.get("TUMBLER_RUST_STEPS", os.path.join(ROOT, "target", "debug", "examples", "conformance_steps"))
    go_bin = os.environ.get("TUMBLER_GO_BIN", os.path.join(CLIENTS, "go", "bin"))
    py = os.environ.get("TUMBLER_PYTHON", "python3")
    perl = ["perl", "-I", os.environ.get("TUMBLER_PERL5LIB", os.path.join(CLIENTS, "perl", "lib"))]
    java = ["java", *JAVA_FLAGS, "-cp", java_class_path()]
    if table == "steps":
        return {"python": [py, os.path.join(CLIENTS, "python", "conformance_steps.py")],
                "node": ["node", os.path.join(CLIENTS, "node", "conformance_steps.js")],
                "go": [os.path.join(go_bin, "conformance-steps")],
                "ruby": ["ruby", os.path.join(CLIENTS, "ruby", "conformance_steps.rb")],
                "rust": [rust],
                "perl": perl + [os.path.join(CLIENTS, "perl", "conformance_steps.pl")],
                "java": java + ["ConformanceSteps"]}
    return {"python": [py, os.path.join(CLIENTS, "python", "examples.py")],
            "node": ["node", os.path.join(CLIENTS, "node", "examples.js")],
            "go": [os.path.join(go_bin, "examples")],
            "ruby": ["ruby", os.path.join(CLIENTS, "ruby", "examples.rb")],
            "perl": perl + [os.path.join(CLIENTS, "perl", "examples.pl")],
            "java": java + ["Examples"]}


# Java's steps start a JVM each: the client compiler only and the serial
# collector start it fastest for these short programs.
JAVA_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k"]


def java_class_path():
    """The built Java client and its conformance programs: $TUMBLER_JAVA_CP (clients/test.sh builds them with
    clients/java/build.sh into its work directory), else clients/java/build/."""
    built = os.path.join(CLIENTS, "java", "build")
    return os.environ.get("TUMBLER_JAVA_CP", os.pathsep.join(
        os.path.join(built, jar) for jar in ("tumbler-client.jar", "tumbler-conformance.jar")))


class Step:
    """One language step as its own process. Its JSON lines are read as they
    come: event() returns the next one, result() the last one after it exits."""

    def __init__(self, lang, args, addr, table="steps", report=None, commands_in=False):
        """commands_in: the step reads commands from its stdin (send()), one a line."""
        self.lang, self.args, self.report = lang, [str(a) for a in args], report
        self.proc = subprocess.Popen(commands(table)[lang] + [addr, NAMESPACE] + self.args, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.PIPE if commands_in else None,
                                     text=True, cwd=ROOT)
        self.lines, self.err = queue.Queue(), []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append, False), daemon=True).start()

    @staticmethod
    def _pump(stream, sink, mark_end):
        for line in stream:
            sink(line)
        if mark_end:
            sink(None)

    def _fail(self, what, detail):
        if self.report:
            self.report(self.lang, False, f"step {' '.join(self.args)}: {what}", detail)

    def event(self, timeout=30):
        """The next JSON line printed by the step (None if it ends or stays silent)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            if line is None:
                self.lines.put(None)
                break
            if line.strip():
                return json.loads(line)
        self._fail("no event", "".join(self.err)[-800:])
        return None

    def send(self, line):
        """One command to a step started with commands_in; False when it has exited already."""
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def ask(self, line, timeout=30):
        """send() a command, then the JSON line that answers it."""
        return self.event(timeout) if self.send(line) else None

    def close(self):
        """Ends a commands_in step's input (it finishes as on "exit")."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def poll_event(self):
        """The next JSON line if one is already there, else None (never waits)."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return None
            if line is None:
                self.lines.put(None)
                return None
            if line.strip():
                return json.loads(line)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.close()

    def result(self, timeout=60):
        self.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.err.append("\n(timed out)")
        lines = []
        while True:  # up to the pump's end-of-output mark
            try:
                line = self.lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            if line.strip():
                lines.append(line)
        if self.proc.returncode != 0 or not lines:
            self._fail(f"exited {self.proc.returncode}", ("".join(self.err) or "".join(lines)).strip()[-800:])
            return None
        try:
            return json.loads(lines[-1])
        except ValueError:
            self._fail("printed no JSON", lines[-1])
            return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(proc, port, what, log, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    stop(proc)
    raise SystemExit(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s; see {log}")


def log_file(name):
    return open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tumbler-conformance-{name}.log"), "w")


def start_dev(binary, *flags):
    """`tumbler dev` (its own private redis-server) on a free port: (proc, addr)."""
    port = free_port()
    log = log_file(f"dev-{port}")
    proc = subprocess.Popen([binary, "dev", "--listen", f"127.0.0.1:{port}", "--http-listen", "off", *flags],
                            stdout=log, stderr=log)
    wait_listening(proc, port, "tumbler dev", log.name)
    return proc, f"127.0.0.1:{port}"


def start_redis():
    port = free_port()
    log = log_file(f"redis-{port}")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=log, stderr=log)
    wait_listening(proc, port, "redis-server", log.name)
    return proc, port


def start_serve(binary, port, redis_port, *flags):
    """`tumbler serve` on a given port against the driver's redis-server (extra `flags` added)."""
    log = log_file(f"serve-{port}-{int(time.time() * 1000)}")
    proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--http-listen", "off", "--no-auth",
                             "--redis-url", f"redis://127.0.0.1:{redis_port}", *flags], stdout=log, stderr=log)
    wait_listening(proc, port, "tumbler serve", log.name)
    return proc


def stop(proc, sig=signal.SIGTERM):
    """Stops one process this driver started, by its pid."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
