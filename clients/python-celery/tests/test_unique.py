"""Unique tasks with a real Celery worker (prefork pool) and a real tumbler: the lock from enqueue to the end of
the run, the per-run holder and fencing token, duplicates (raise, result, drop), keys, until started, the queued
lease's timeout, retries, and an execution lease that frees the lock when the worker's process is killed."""
import os
import signal
import time

import pytest

from conftest import EXECUTION_TTL, RUN_HOLDER, wait_until
from tumbler_celery import Duplicate


def test_lock_from_enqueue_until_executed_with_a_per_run_holder_and_token(tasks, worker, h):
    tag = h.new_tag("executed")
    sent = tasks.until_executed.apply_async((tag, "gate"), queue="parked")  # no worker reads "parked"
    name = tasks.until_executed.tumbler_digest((tag, "gate"))
    [queued] = h.holders(name)
    assert queued.holder == sent.id  # the enqueue holds the lock under the task id
    with pytest.raises(Duplicate) as dup:
        tasks.until_executed.delay(tag, "gate")
    assert dup.value.task_id == sent.id and dup.value.digest == name
    h.client.acquire(name, "cleanup", takes_over=sent.id).release()  # the parked task gives way

    first = tasks.until_executed.delay(tag, "gate")
    [start] = h.wait_events(tag, "start")
    run = RUN_HOLDER.match(start["holder"])
    assert run and run.group("id") == first.id  # the run holds under <task id>:<run id>
    [held] = h.holders(name)
    assert held.holder == start["holder"] and held.fencing_token == start["token"]
    assert held.fencing_token > queued.fencing_token
    assert held.ttl_ms == EXECUTION_TTL * 1000  # the execution lease, not the queued one
    with pytest.raises(Duplicate) as dup:
        tasks.until_executed.delay(tag, "gate")
    assert dup.value.task_id == first.id
    h.open_gate(tag)
    assert first.get(timeout=15) == tag
    h.wait_free(name)  # released when the run ended, pinned to its token
    again = tasks.until_executed.delay(tag, 0)
    assert again.get(timeout=15) == tag
    tokens = [e["token"] for e in h.events(tag, "start")]
    assert tokens == sorted(tokens) and len(set(tokens)) == 2


def test_duplicates_return_the_holders_result_or_are_dropped_and_keys_choose_the_arguments(tasks, worker, h):
    tag = h.new_tag("keys")
    first = tasks.by_account.delay(tag, 1, "a")
    same = tasks.by_account.delay(tag, 1, "b")  # "note" is not a key: the same task
    assert same is not None and same.id == first.id  # on_duplicate="result": the holder's AsyncResult
    other = tasks.by_account.delay(tag, 2, "a")  # another account: another lock
    assert other.id != first.id
    h.wait_events(tag, "start", 2)
    h.open_gate(tag, 2)
    assert same.get(timeout=15) == tag and other.get(timeout=15) == tag
    assert sorted(e["note"] for e in h.events(tag, "start")) == ["a", "a"]

    tag = h.new_tag("drop")
    kept = tasks.dropping.delay(tag, "gate")
    assert tasks.dropping.delay(tag, "gate") is None  # on_duplicate="drop"
    assert tasks.until_executed.apply_async((tag, "gate"), unique={"on_duplicate": "drop"}) is not None  # another task
    h.open_gate(tag, 2)
    assert kept.get(timeout=15) == tag
    wait_until("both runs to end", lambda: len(h.events(tag, "end")) == 2)


def test_until_started_frees_the_lock_as_the_run_starts(tasks, worker, h):
    tag = h.new_tag("started")
    name = tasks.until_started.tumbler_digest((tag, "gate"))
    parked = tasks.until_started.apply_async((tag, "gate"), queue="parked")
    assert [g.holder for g in h.holders(name)] == [parked.id]
    with pytest.raises(Duplicate):
        tasks.until_started.delay(tag, "gate")
    h.client.acquire(name, "cleanup", takes_over=parked.id).release()

    first = tasks.until_started.delay(tag, "gate")
    [start] = h.wait_events(tag, "start")
    assert start["holder"] is None and h.holders(name) == []  # nothing held while it runs
    second = tasks.until_started.delay(tag, "gate")  # accepted: the first one has started
    h.wait_events(tag, "start", 2)
    h.open_gate(tag, 2)
    assert first.get(timeout=15) == tag and second.get(timeout=15) == tag


def test_the_queued_lease_ends_after_its_timeout(tasks, h):
    tag = h.new_tag("timeout")
    parked = tasks.until_executed.apply_async((tag, "gate"), queue="parked", unique={"timeout": 1.0})
    with pytest.raises(Duplicate) as dup:
        tasks.until_executed.apply_async((tag, "gate"), queue="parked")
    assert 0 < dup.value.countdown <= 1.0
    later = wait_until("the queued lease to end", lambda: _sent_or_none(tasks, tag), timeout=5)
    assert later.id != parked.id
    name = tasks.until_executed.tumbler_digest((tag, "gate"))
    assert [g.holder for g in h.holders(name)] == [later.id]
    h.client.acquire(name, "cleanup", takes_over=later.id).release()


def _sent_or_none(tasks, tag):
    try:
        return tasks.until_executed.apply_async((tag, "gate"), queue="parked", unique={"timeout": 5.0})
    except Duplicate:
        return None


def test_the_execution_lease_is_renewed_while_the_task_runs(tasks, worker, h):
    tag = h.new_tag("renewed")
    hold = EXECUTION_TTL * 2
    res = tasks.until_executed.delay(tag, hold)
    [start] = h.wait_events(tag, "start")
    name = tasks.until_executed.tumbler_digest((tag, hold))
    wait_until("past the first lease", lambda: h.events(tag, "end") or
               time.time() > start["t"] + EXECUTION_TTL + 0.5, timeout=10)
    assert [(g.holder, g.fencing_token) for g in h.holders(name)] == [(start["holder"], start["token"])]
    assert res.get(timeout=15) == tag
    [end] = h.events(tag, "end")
    assert end["lost"] is False
    h.wait_free(name)


def test_a_retry_waits_holding_the_lock_under_the_task_id_then_runs_with_a_new_token(tasks, worker, h):
    tag = h.new_tag("retry")
    res = tasks.flaky.delay(tag)
    name = tasks.flaky.tumbler_digest((tag,))
    [first] = h.wait_events(tag, "start")
    # While the retry waits (countdown 1 s) the task id holds the lock again: a duplicate is refused.
    wait_until("the grant handed back to the task id", lambda: [g.holder for g in h.holders(name)] == [res.id])
    assert len(h.events(tag, "start")) == 1
    with pytest.raises(Duplicate) as dup:
        tasks.flaky.delay(tag)
    assert dup.value.task_id == res.id
    assert res.get(timeout=15) == "done"
    first, second = h.events(tag, "start")
    assert second["retries"] == 1 and second["token"] > first["token"]
    assert RUN_HOLDER.match(second["holder"]).group("id") == res.id and second["holder"] != first["holder"]
    h.wait_free(name)


def test_a_killed_worker_process_frees_the_lock_when_its_execution_lease_ends(tasks, worker, h):
    tag = h.new_tag("sigkill")
    res = tasks.until_executed.delay(tag, "gate")
    name = tasks.until_executed.tumbler_digest((tag, "gate"))
    [start] = h.wait_events(tag, "start")
    assert start["pid"] != worker.proc.pid  # the prefork pool's child runs it
    os.kill(start["pid"], signal.SIGKILL)  # no release, no renewal
    killed_at = time.monotonic()
    with pytest.raises(Duplicate):  # still held by the dead run, until its lease ends
        tasks.until_executed.delay(tag, "gate")
    h.wait_free(name, timeout=EXECUTION_TTL + 3)
    freed_after = time.monotonic() - killed_at
    assert freed_after <= EXECUTION_TTL + 1.5
    assert h.events(tag, "end") == []
    again = tasks.until_executed.delay(tag, 0)  # either side can enqueue it again
    assert again.get(timeout=15) == tag
    with pytest.raises(Exception):
        res.get(timeout=10)  # the killed run's task failed (WorkerLostError)


def test_eager_mode_runs_under_the_lock_and_frees_it(tasks, h):
    tasks.app.conf.task_always_eager = True
    try:
        tag = h.new_tag("eager")
        res = tasks.until_executed.delay(tag, 0)
        assert res.get() == tag
        [start] = h.events(tag, "start")
        assert RUN_HOLDER.match(start["holder"]).group("id") == res.id
        assert h.holders(tasks.until_executed.tumbler_digest((tag, 0))) == []
    finally:
        tasks.app.conf.task_always_eager = False


def _redeliver(task, args, task_id):
    """The message of task_id sent again as it was, without taking the lock (as a broker redelivers it)."""
    from celery import Task
    headers = {"tumbler_unique": {"digest": task.tumbler_digest(args), "options": task.unique_options()}}
    return Task.apply_async(task, args, task_id=task_id, headers=headers, queue="tests")


def test_a_second_run_of_one_task_waits_for_the_first_runs_lease(tasks, worker, h):
    tag = h.new_tag("two-runs")
    args = (tag, 0)
    parked = tasks.until_executed.apply_async(args, queue="parked")
    name = tasks.until_executed.tumbler_digest(args)
    # A first run of it holds the lock (a paused process whose message went to another worker): its lease runs.
    first_run = h.client.acquire(name, f"{parked.id}:{'0' * 16}", ttl_ms=1500, takes_over=parked.id)
    _redeliver(tasks.until_executed, args, parked.id)
    [start] = h.wait_events(tag, "start")
    assert RUN_HOLDER.match(start["holder"]).group("id") == parked.id and start["holder"] != first_run.holder
    assert start["t"] * 1000 >= first_run.grant.expires_at_ms - 50  # it ran once the first run's lease ended
    assert start["token"] > first_run.fencing_token
    assert not first_run.release()  # the stale run's release (pinned to its token) frees nothing
    h.wait_free(name)


def test_a_run_whose_lock_another_task_took_is_dropped(tasks, worker, h):
    tag = h.new_tag("run-conflict")
    args = (tag, 0)
    lapsed = tasks.until_executed.apply_async(args, queue="parked", unique={"timeout": 0.3})
    name = tasks.until_executed.tumbler_digest(args)
    other = wait_until("the lapsed lock to be taken by another call",
                       lambda: _sent_or_none_with(tasks, args), timeout=5)
    _redeliver(tasks.until_executed, args, lapsed.id)
    assert lapsed.get(timeout=15) is None  # on_run_conflict="drop": not run
    assert h.events(tag) == []
    assert [g.holder for g in h.holders(name)] == [other.id]
    h.client.acquire(name, "cleanup", takes_over=other.id).release()


def _sent_or_none_with(tasks, args):
    try:
        return tasks.until_executed.apply_async(args, queue="parked")
    except Duplicate:
        return None


def test_a_failed_run_releases_the_lock(tasks, worker, h):
    tag = h.new_tag("failed")
    res = tasks.failing.delay(tag)
    with pytest.raises(RuntimeError):
        res.get(timeout=15)
    h.wait_free(tasks.failing.tumbler_digest((tag,)))
    assert tasks.failing.delay(tag).id != res.id  # accepted again
