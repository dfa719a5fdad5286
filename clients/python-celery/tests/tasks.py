"""The Celery app of the tests: `celery -A tasks worker` runs it as a real worker; the tests import it too and
send its tasks. Every task reports to Redis (lists ev:<tag>) when it starts and ends, with the holder and
fencing token of the lock it runs under and its process id."""
import json
import os
import time

import redis
from celery import Celery
from celery.signals import worker_ready

import tumbler_celery
from tumbler_celery import UniqueTask, current_lock
from tumbler_celery.compat import QueueOnce, Singleton

REDIS_URL = os.environ["TEST_REDIS_URL"]  # redis://127.0.0.1:<port>
app = Celery("tumbler_tests", broker=f"{REDIS_URL}/2", backend=f"{REDIS_URL}/3")
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_default_queue="tests",
    result_expires=600,
)
tumbler_celery.configure(app, address=os.environ["TUMBLER_ADDR"], namespace=os.environ["TUMBLER_NAMESPACE"],
                         execution_ttl=float(os.environ.get("TEST_EXECUTION_TTL", "2")))
_redis = {}


def r():
    """One Redis connection per process (the pool's children are forked)."""
    pid = os.getpid()
    if pid not in _redis:
        _redis[pid] = redis.Redis.from_url(f"{REDIS_URL}/4", decode_responses=True)
    return _redis[pid]


@worker_ready.connect
def _ready(**_):
    r().rpush("test:ready", os.getpid())


def probe(task, tag, hold, **extra):
    """Report the start (holder, token), hold (until a token on gate:<tag>, or seconds), report the end."""
    lock = current_lock()
    r().rpush(f"ev:{tag}", json.dumps({"e": "start", "id": task.request.id, "pid": os.getpid(),
                                        "holder": lock.holder if lock else None,
                                        "token": lock.fencing_token if lock else None,
                                        "retries": task.request.retries, "t": time.time(), **extra}))
    try:
        if hold == "gate":
            r().blpop(f"gate:{tag}", timeout=30)
        elif isinstance(hold, (int, float)):
            time.sleep(hold)
    finally:
        r().rpush(f"ev:{tag}", json.dumps({"e": "end", "id": task.request.id, "pid": os.getpid(),
                                            "lost": lock.lost.is_set() if lock else None,
                                            "token": lock.fencing_token if lock else None, "t": time.time()}))
    return tag


@app.task(bind=True, base=UniqueTask)
def until_executed(self, tag, hold):
    return probe(self, tag, hold)


@app.task(bind=True, base=UniqueTask, unique={"until": "started"})
def until_started(self, tag, hold):
    return probe(self, tag, hold)


@app.task(bind=True, base=UniqueTask, unique={"keys": ["tag", "account_id"], "on_duplicate": "result"})
def by_account(self, tag, account_id, note, hold="gate"):
    return probe(self, tag, hold, note=note)


@app.task(bind=True, base=UniqueTask, unique={"on_duplicate": "drop"})
def dropping(self, tag, hold):
    return probe(self, tag, hold)


@app.task(bind=True, base=UniqueTask)
def flaky(self, tag):
    """Fails on its first run and retries 1 s later (self.retry), then succeeds."""
    probe(self, tag, 0)
    if self.request.retries == 0:
        raise self.retry(countdown=1, max_retries=3)
    return "done"


@app.task(bind=True, base=QueueOnce, once={"keys": ["tag"], "graceful": False})
def once_task(self, tag, n, hold="gate"):
    return probe(self, tag, hold)


@app.task(bind=True, base=Singleton, unique_on=["tag"])
def singleton_task(self, tag, n, hold="gate"):
    return probe(self, tag, hold)


@app.task(bind=True, base=Singleton, unique_on="tag", raise_on_duplicate=True)
def singleton_raising(self, tag, hold="gate"):
    return probe(self, tag, hold)


# The logical job "reports.nightly", shared with the Sidekiq app of the cross-system test
# (tests/sidekiq_app.rb: CrossReportJob, lock_digest_form: :job).
@app.task(bind=True, base=UniqueTask, unique={"digest": "job", "job_name": "reports.nightly", "keys": ["account_id", "region"]})
def nightly_report(self, account_id, region, tag, hold="gate"):
    return probe(self, tag, hold, account_id=account_id, region=region)


@app.task(bind=True, base=UniqueTask, unique={"digest": "job", "job_name": "reports.nightly", "keys": ["account_id", "region"],
                                                "on_duplicate": "drop"})
def nightly_report_dropping(self, account_id, region, tag, hold="gate"):
    return probe(self, tag, hold, account_id=account_id, region=region)


@app.task(bind=True, base=UniqueTask)
def failing(self, tag):
    probe(self, tag, 0)
    raise RuntimeError(f"failing on purpose ({tag})")
