"""The README's example, as written: its ```python file=NAME blocks are saved under their names, a real worker
(`celery -A reports worker`) runs the app, and send.py runs against it."""
import os
import re
import subprocess
import sys

from conftest import HERE, Proc, wait_until

README = os.path.join(HERE, "..", "README.md")


def readme_files():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    return dict(re.findall(r"```python file=(\S+)\n(.*?)```", text, flags=re.S))


def test_the_readme_example_runs(servers, reports, tmp_path):
    files = readme_files()
    assert set(files) == {"reports.py", "send.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    env = {"CELERY_BROKER_URL": f"{servers.redis_url}/5", "TUMBLER_ADDR": servers.address}
    before = reports.llen("test:readme-ready")
    (tmp_path / "ready.py").write_text(
        "import os, redis\nfrom celery.signals import worker_ready\n"
        "worker_ready.connect(lambda **_: redis.Redis.from_url(os.environ['TEST_REPORTS_URL'])"
        ".rpush('test:readme-ready', os.getpid()), weak=False)\n"
        "from reports import app\n")
    worker = Proc("celery-readme", [sys.executable, "-m", "celery", "-A", "ready", "worker", "-P", "solo",
                                    "-l", "warning", "--without-heartbeat", "--without-gossip", "--without-mingle"],
                  env={**env, "TEST_REPORTS_URL": f"{servers.redis_url}/4"}, cwd=str(tmp_path))
    try:
        def ready():
            assert worker.alive(), f"the README's worker exited:\n{worker.tail()}"
            return reports.llen("test:readme-ready") > before
        wait_until(f"the README's worker (log: {worker.log})", ready, 60)
        out = subprocess.run([sys.executable, "send.py"], cwd=str(tmp_path), env={**os.environ, **env},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        first, second = out.stdout.splitlines()
        assert re.fullmatch(r"report 42 2026-11-29, fencing token \d+", first), first
        assert re.fullmatch(r"report 42 2026-12-01, fencing token \d+", second), second
        assert int(second.rsplit(" ", 1)[1]) > int(first.rsplit(" ", 1)[1])
    finally:
        worker.stop()
