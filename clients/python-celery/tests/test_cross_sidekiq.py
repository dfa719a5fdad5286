"""One uniqueness across Sidekiq and Celery: a real Sidekiq process (Debian's ruby-sidekiq, the tumbler-sidekiq
gem) and the real Celery worker, against one tumbler. The logical job "reports.nightly" of account 42 in "eu"
is CrossReportJob on the Ruby side (tests/sidekiq_app.rb) and nightly_report on the Python side (tests/tasks.py),
both with the job digest form: while one side's job holds the lock (queued or running), the other side's
enqueue is refused or dropped, as configured; once it has run, either side can enqueue it again.

Ruby: the installed gems (GEM_HOME, as clients/test.sh installs them), else this checkout's sources."""
import json
import os
import subprocess

import pytest

from conftest import HERE, ROOT, RUN_HOLDER, Proc, wait_until
from tumbler_celery import Duplicate, job_digest

LOGICAL = ("reports.nightly", [42, "eu"])


def ruby_env(servers):
    env = dict(servers.env)
    if subprocess.run(["ruby", "-e", 'gem "tumbler-sidekiq"; gem "tumbler-client"'], capture_output=True).returncode:
        clients = os.path.join(ROOT, "clients")
        if not os.path.exists(os.path.join(clients, "ruby", "lib", "tumbler", "v1", "lock_services_pb.rb")):
            subprocess.run([os.path.join(clients, "ruby", "generate.sh")], check=True)
        lib = [os.path.join(clients, "ruby", "lib"), os.path.join(clients, "ruby-sidekiq", "lib")]
        env["RUBYLIB"] = ":".join(lib + ([os.environ["RUBYLIB"]] if os.environ.get("RUBYLIB") else []))
    return env


@pytest.fixture(scope="module")
def sidekiq(servers, reports):
    env = ruby_env(servers)
    sidekiq_bin = subprocess.run(["ruby", "-e", 'print Gem.bin_path("sidekiq", "sidekiq")'], env={**os.environ, **env},
                                 capture_output=True, text=True, check=True).stdout
    before = reports.llen("test:sidekiq-ready")
    proc = Proc("sidekiq-cross", ["ruby", sidekiq_bin, "-r", os.path.join(HERE, "sidekiq_app.rb"), "-q", "cross",
                                  "-c", "2", "-t", "1"], env=env, cwd=HERE)

    def ready():
        assert proc.alive(), f"sidekiq exited:\n{proc.tail()}"
        return reports.llen("test:sidekiq-ready") > before
    wait_until(f"sidekiq to start (log: {proc.log})", ready, timeout=60)
    yield proc
    proc.stop()


class Pusher:
    """A Ruby process that pushes CrossReportJob as a Sidekiq client (tests/sidekiq_pusher.rb)."""

    def __init__(self, env):
        self.proc = Proc("sidekiq-pusher", ["ruby", os.path.join(HERE, "sidekiq_pusher.rb")], env=env, cwd=HERE,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._answer()

    def _answer(self):
        while True:
            line = self.proc.popen.stdout.readline().decode()
            assert line, f"the pusher exited:\n{self.proc.tail()}"
            if line.startswith("@@ "):
                return json.loads(line[3:])

    def push(self, *args, on_conflict=None):
        req = {"args": list(args), **({"on_conflict": on_conflict} if on_conflict else {})}
        self.proc.popen.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.popen.stdin.flush()
        return self._answer()

    def stop(self):
        self.proc.popen.stdin.close()
        self.proc.stop()


@pytest.fixture(scope="module")
def pusher(servers, tasks):
    p = Pusher(ruby_env(servers))
    yield p
    p.stop()


def test_both_sides_name_the_same_lock(tasks):
    name = job_digest(*LOGICAL)
    assert tasks.nightly_report.tumbler_digest((42, "eu", "any-tag")) == name
    assert tasks.nightly_report_dropping.tumbler_digest((42, "eu", "other", 0)) == name


def test_a_ruby_enqueued_job_holds_the_lock_against_celery_and_the_other_way_round(tasks, worker, sidekiq, pusher, h):
    name = job_digest(*LOGICAL)
    h.wait_free(name)

    # Sidekiq enqueues: the lock is held under its jid, then by its run (<jid>:<run id>).
    tag = h.new_tag("ruby-first")
    jid = pusher.push(42, "eu", tag, "gate")["jid"]
    assert jid
    with pytest.raises(Duplicate) as dup:  # Celery refuses the same logical job (on_duplicate="raise")...
        tasks.nightly_report.delay(42, "eu", h.new_tag("refused"))
    assert dup.value.task_id == jid and dup.value.digest == name
    [start] = h.wait_events(tag, "start")
    assert start["side"] == "sidekiq" and RUN_HOLDER.match(start["holder"]).group("id") == jid
    assert [(g.holder, g.fencing_token) for g in h.holders(name)] == [(start["holder"], start["token"])]
    assert tasks.nightly_report_dropping.delay(42, "eu", h.new_tag("dropped")) is None  # ...or drops it
    assert tasks.nightly_report.delay(43, "eu", h.new_tag("other"), 0).get(timeout=15)  # another account: its own
    h.open_gate(tag)
    h.wait_events(tag, "end")
    h.wait_free(name)

    # Once it has run, Celery can enqueue it; now Sidekiq is refused while the Celery task holds it.
    tag = h.new_tag("python-next")
    res = tasks.nightly_report.delay(42, "eu", tag)
    assert pusher.push(42, "eu", h.new_tag("dropped"), 0) == {"jid": None}  # on_conflict: :log drops it
    [start] = h.wait_events(tag, "start")
    assert RUN_HOLDER.match(start["holder"]).group("id") == res.id
    assert [g.holder for g in h.holders(name)] == [start["holder"]]
    raised = pusher.push(42, "eu", h.new_tag("raised"), 0, on_conflict="raise")
    assert raised["error"] == "Tumbler::Sidekiq::Conflict", raised
    h.open_gate(tag)
    assert res.get(timeout=15) == tag
    h.wait_free(name)

    # And Sidekiq again, once the Celery task has run.
    tag = h.new_tag("ruby-again")
    jid = pusher.push(42, "eu", tag, 0)["jid"]
    assert jid
    [end] = h.wait_events(tag, "end")
    assert end["lost"] is False
    h.wait_free(name)
    assert [e["side"] for e in h.events(tag)] == ["sidekiq", "sidekiq"]


def test_a_celery_job_waiting_in_its_queue_holds_the_lock_against_sidekiq(tasks, sidekiq, pusher, h):
    name = job_digest(*LOGICAL)
    h.wait_free(name)
    parked = tasks.nightly_report.apply_async((42, "eu", h.new_tag("parked")), queue="parked")
    assert [g.holder for g in h.holders(name)] == [parked.id]  # the enqueue holds under the task id
    assert pusher.push(42, "eu", h.new_tag("dropped"), 0) == {"jid": None}
    h.client.acquire(name, "cleanup", takes_over=parked.id).release()
    tag = h.new_tag("after")
    assert pusher.push(42, "eu", tag, 0)["jid"]
    h.wait_events(tag, "end")
    h.wait_free(name)
