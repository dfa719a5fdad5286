"""Drop-in bases for celery-once and celery-singleton users: the same task options, the lock in tumbler.

``from tumbler_celery.compat import QueueOnce, AlreadyQueued`` instead of ``from celery_once import …``;
``from tumbler_celery.compat import Singleton, DuplicateTaskError`` instead of ``from celery_singleton import …``.
See the README's migration notes for what maps to what.
"""
from .task import Duplicate, UniqueTask


class AlreadyQueued(Duplicate):
    """celery-once's error: ``countdown`` is the seconds until the holder's lease ends (if not renewed)."""


class DuplicateTaskError(Duplicate):
    """celery-singleton's error: ``task_id`` is the id of the task that holds the lock."""


class QueueOnce(UniqueTask):
    """celery-once's base: ``@app.task(base=QueueOnce, once={"keys": [...], "graceful": True, "timeout": 60,
    "unlock_before_run": False})``. A duplicate raises AlreadyQueued (``graceful``: returns None). The
    defaults come from ``app.conf.ONCE["settings"]["default_timeout"]`` when set (else one hour)."""

    once = None
    duplicate_error = AlreadyQueued

    def _class_options(self):
        from .task import once_options
        opts = {}
        conf_once = self._get_app().conf.get("ONCE") or self._get_app().conf.get("once") or {}
        timeout = (conf_once.get("settings") or {}).get("default_timeout")
        if timeout:
            opts["timeout"] = timeout
        opts.update(once_options(self.once or {}))
        return opts


class Singleton(UniqueTask):
    """celery-singleton's base: ``@app.task(base=Singleton, unique_on=[...], lock_expiry=60,
    raise_on_duplicate=False)``. A duplicate returns the holder's AsyncResult (``raise_on_duplicate``:
    raises DuplicateTaskError). App-wide: ``singleton_lock_expiry``, ``singleton_raise_on_duplicate``."""

    unique_on = None
    lock_expiry = None
    raise_on_duplicate = None
    duplicate_error = DuplicateTaskError

    def _class_options(self):
        conf = self._get_app().conf
        raise_on = self.raise_on_duplicate
        if raise_on is None:
            raise_on = conf.get("singleton_raise_on_duplicate") or False
        opts = {"on_duplicate": "raise" if raise_on else "result", "until": "executed"}
        expiry = self.lock_expiry if self.lock_expiry is not None else conf.get("singleton_lock_expiry")
        if expiry is not None:
            opts["timeout"] = expiry
        else:
            opts["timeout"] = (conf.get("tumbler_unique") or {}).get("max_ttl", 86400.0)  # singleton: no expiry
        if self.unique_on is not None:
            opts["keys"] = [self.unique_on] if isinstance(self.unique_on, str) else list(self.unique_on)
        return opts
