"""celery-once's and celery-singleton's task options on tumbler (a real worker), and the digest forms: the job
form's pinned vector (the Sidekiq gem's options_test.rb pins the same one) and the canonical JSON."""
import pytest

from tumbler_celery import canonical_json, job_digest, job_of, task_digest
from tumbler_celery.compat import AlreadyQueued, DuplicateTaskError

# The same logical job gives the same name in Ruby (lock_digest_form: :job) and here.
PINNED = ("tumbler:job:reports.nightly:"
          "73bf39470cd107b5057bd3d406ee5944e57a3acf3cd36f6d145fa6da49f51557")


def test_the_job_form_is_pinned():
    assert job_digest("reports.nightly", [42, {"region": "Zürich", "at": 1.5e20, "tags": ["a", None, True]}]) == PINNED
    assert job_digest("reports.nightly", (42, {"tags": ["a", None, True], "at": 1.5e20, "region": "Zürich"})) == PINNED


def test_canonical_json_writes_what_ruby_writes():
    assert canonical_json({"b": [1, 2.5, None], "a": {"é": True, "d": "x\u0001/"}}) == \
        '{"a":{"d":"x\\u0001/","é":true},"b":[1,2.5,null]}'
    floats = [1.0, 0.1, 1e15, 123456789012345.0, 1e-4, 1e-5, 1.5e20, -2.5e-7, 0.0, 2.0 ** 60]
    assert canonical_json(floats) == ("[1.0,0.1,1.0e+15,123456789012345.0,0.0001,1.0e-05,1.5e+20,-2.5e-07,0.0,"
                                      "1.152921504606847e+18]")
    with pytest.raises(ValueError):
        canonical_json(float("nan"))
    with pytest.raises(TypeError):
        canonical_json({1: "a"})


def test_the_task_form_and_holders():
    assert task_digest("p", "t", {"a": 1}) == task_digest("p", "t", {"a": 1})
    assert task_digest("p", "t", {"a": 1}) != task_digest("p", "u", {"a": 1})
    assert job_of("0b5a-uuid:0123456789abcdef") == "0b5a-uuid" and job_of("0b5a-uuid") == "0b5a-uuid"


def test_signature_binding_and_keys(tasks):
    t = tasks.by_account
    assert t.tumbler_digest(("x", 1, "a")) == t.tumbler_digest(("x",), {"account_id": 1, "note": "b"})
    assert t.lock_args(("x", 1, "a"), None) == {"tag": "x", "account_id": 1, "note": "a", "hold": "gate"}
    with pytest.raises(TypeError):
        t.apply_async(("x", 1, "a"), unique={"keys": ["nope"]})
    with pytest.raises(ValueError):
        t.apply_async(("x", 1, "a"), unique={"on_duplicate": "ignore"})


def test_queue_once_raises_already_queued_or_is_graceful(tasks, worker, h):
    tag = h.new_tag("once")
    first = tasks.once_task.delay(tag, 1)
    with pytest.raises(AlreadyQueued) as dup:
        tasks.once_task.delay(tag, 2)  # keys=["tag"]: n does not count
    assert dup.value.task_id == first.id and dup.value.countdown > 0
    assert tasks.once_task.apply_async((tag, 3), once={"graceful": True}) is None
    h.open_gate(tag)
    assert first.get(timeout=15) == tag
    h.wait_free(tasks.once_task.tumbler_digest((tag, 1)))
    assert tasks.once_task.delay(tag, 4, 0).get(timeout=15) == tag


def test_singleton_returns_the_running_tasks_result_or_raises(tasks, worker, h):
    tag = h.new_tag("singleton")
    first = tasks.singleton_task.delay(tag, 1)
    again = tasks.singleton_task.delay(tag, 2)  # unique_on=["tag"]
    assert again.id == first.id
    raising = tasks.singleton_raising.delay(tag)
    with pytest.raises(DuplicateTaskError) as dup:
        tasks.singleton_raising.delay(tag)
    assert dup.value.task_id == raising.id
    h.wait_events(tag, "start", 2)
    h.open_gate(tag, 2)
    assert again.get(timeout=15) == tag and raising.get(timeout=15) == tag
