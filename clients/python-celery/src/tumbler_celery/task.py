"""UniqueTask: a Celery task base whose calls are unique, with the lock in tumbler.

The life of a unique task's lock (``until="executed"``, the default):

1. ``apply_async`` (``delay``) takes the lock under the task id, for the
   queued lease (``timeout``, plus the countdown or eta). A duplicate finds
   it taken: it raises ``Duplicate``, gets the holder's ``AsyncResult``, or
   is dropped (``on_duplicate``). If the message cannot be published, the
   grant is given back (pinned to its token).
2. The run takes the grant over under a holder of its own,
   ``<task id>:<run id>`` (16 random hex digits), with a fencing token of
   its own, in one call: an Acquire with ``takes_over=<task id>``
   (decision 0083). Its lease is ``execution_ttl``, renewed every third of
   it by a watchdog thread, pinned to the run's token: a worker that dies
   stops renewing, and the lock frees when the lease ends.
3. When the run ends (success or failure) the grant is released, pinned to
   the run's token; ``self.retry()`` hands it back to the task id instead
   (again one Acquire with ``takes_over``, on the queued lease), so the
   retry stays unique while it waits.

``until="started"``: the run gives the task id's grant back as it starts
and holds nothing while it runs.
"""
import contextvars
import datetime
import inspect
import logging
import os
import secrets
import threading
import time
import uuid

from celery import Task

from tumbler_client import Client, NotAcquired, TumblerError

from . import digest as d

logger = logging.getLogger("tumbler_celery")

UNTIL = ("executed", "started")
ON_DUPLICATE = ("raise", "result", "drop")
ON_RUN_CONFLICT = ("drop", "raise")
DIGESTS = ("task", "job")
DEFAULTS = {
    "until": "executed",       # hold the lock until the task has run, or until it starts
    "timeout": 3600.0,         # s: the lock's lease while the task waits (queue, countdown, retry)
    "keys": None,              # argument names that make the task unique (None: all of them)
    "on_duplicate": "raise",   # raise Duplicate | "result": the holder's AsyncResult | "drop": None
    "on_run_conflict": "drop",  # a run whose lock another task took: "drop" (logged) | "raise" Duplicate
    "execution_ttl": 15.0,     # s: the run's lease, renewed every third while it runs
    "digest": "task",          # "task": <prefix>:<sha256>; "job": tumbler:job:<job_name>:<sha256> (shared with Sidekiq)
    "job_name": None,          # the logical job's name in the job form (None: the task's name)
    "prefix": "tumbler-celery",
    "max_ttl": 86400.0,        # s: the server's --max-ttl-ms (a longer lease is cut to it)
}
# When a run finds its lock held by another run of the same task (a redelivered message whose first run is
# paused, or was killed and its lease has not ended), it waits for that lease: execution_ttl plus this (s).
OTHER_RUN_GRACE_S = 2.0
HEADER = "tumbler_unique"

_current = contextvars.ContextVar("tumbler_celery_run", default=None)


class Duplicate(Exception):
    """The task is already queued or running with the same lock (``digest``), held for ``task_id``.

    ``countdown``: seconds until the holder's lease ends, if it is not renewed (celery-once's AlreadyQueued)."""

    def __init__(self, message, *, digest=None, task_id=None, countdown=None):
        super().__init__(message)
        self.digest, self.task_id, self.countdown = digest, task_id, countdown


def current_lock():
    """The tumbler_client ``Lock`` the running task holds (its ``fencing_token``, ``lost``, ``check()``), or None."""
    run = _current.get()
    return run.lock if run is not None else None


def current_fencing_token():
    lock = current_lock()
    return lock.fencing_token if lock is not None else None


# --- settings and the client


def configure(app, *, address=None, namespace=None, token=None, tls=None, **unique_defaults):
    """Point the app's unique tasks at tumbler: ``app.conf.tumbler_address`` (else $TUMBLER_ADDR, else
    127.0.0.1:50051), ``tumbler_namespace`` (else $TUMBLER_NAMESPACE, else "celery"), ``tumbler_token``,
    ``tumbler_tls``; keyword options the defaults of every unique task (``app.conf.tumbler_unique``)."""
    settings = {"tumbler_address": address, "tumbler_namespace": namespace, "tumbler_token": token,
                "tumbler_tls": tls}
    app.conf.update({k: v for k, v in settings.items() if v is not None})
    if unique_defaults:
        app.conf.tumbler_unique = {**(app.conf.get("tumbler_unique") or {}), **check_options(unique_defaults)}
    return app


_clients = {}
_clients_lock = threading.Lock()


def client_for(app):
    """This process's tumbler Client for ``app`` (made again in a forked child: sockets are not shared)."""
    conf = app.conf
    address = conf.get("tumbler_address") or os.environ.get("TUMBLER_ADDR") or "127.0.0.1:50051"
    namespace = conf.get("tumbler_namespace") or os.environ.get("TUMBLER_NAMESPACE") or "celery"
    token = conf.get("tumbler_token") or os.environ.get("TUMBLER_TOKEN")
    tls = conf.get("tumbler_tls")
    key = (os.getpid(), address, namespace, token, repr(tls))
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = Client(address, namespace=namespace, token=token, tls=tls)
    return client


def check_options(options):
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unique: unknown option(s) {', '.join(sorted(unknown))} (known: {', '.join(DEFAULTS)})")
    for name, allowed in (("until", UNTIL), ("on_duplicate", ON_DUPLICATE), ("on_run_conflict", ON_RUN_CONFLICT),
                          ("digest", DIGESTS)):
        if name in options and options[name] not in allowed:
            raise ValueError(f"unique: {name}={options[name]!r} is not one of {', '.join(map(repr, allowed))}")
    for name in ("timeout", "execution_ttl", "max_ttl"):
        if name in options and options[name] is not None and float(options[name]) <= 0:
            raise ValueError(f"unique: {name} must be a positive number of seconds, not {options[name]!r}")
    keys = options.get("keys")
    if isinstance(keys, str):
        options = {**options, "keys": [keys]}
    return options


def once_options(once):
    """celery-once's ``once={...}`` in this package's terms."""
    if not once:
        return {}
    out = {}
    if "keys" in once:
        out["keys"] = once["keys"]
    if "timeout" in once:
        out["timeout"] = once["timeout"]
    if "graceful" in once:
        out["on_duplicate"] = "drop" if once["graceful"] else "raise"
    if "unlock_before_run" in once:
        out["until"] = "started" if once["unlock_before_run"] else "executed"
    return out


def _ms(seconds):
    return max(1, int(round(seconds * 1000)))


class UniqueTask(Task):
    """``@app.task(base=UniqueTask, unique={"keys": ["account_id"], "on_duplicate": "result"})``.

    ``unique``: options (``DEFAULTS``); False makes the task an ordinary one. Per call:
    ``task.apply_async(args, unique={...})`` (or celery-once's ``once={...}``).
    """

    unique = None
    # What a duplicate raises (the compat classes name celery-once's and celery-singleton's).
    duplicate_error = Duplicate

    # --- options

    def _class_options(self):
        return {}

    def unique_options(self, per_call=None, once=None):
        """The options in force: the defaults, the app's ``tumbler_unique``, the task's, the call's."""
        if self.unique is False or (per_call is False):
            return None
        merged = dict(DEFAULTS)
        merged.update(check_options(dict(self._get_app().conf.get("tumbler_unique") or {})))
        merged.update(check_options(self._class_options()))
        merged.update(check_options(dict(self.unique or {})))
        merged.update(check_options(once_options(once)))
        merged.update(check_options(dict(per_call or {})))
        return merged

    # --- digests

    def lock_args(self, args, kwargs, keys=None):
        """The call's arguments bound to the task's signature (defaults applied), as a dict, in signature
        order; only ``keys`` when given."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        try:
            bound = inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError:
            # Not the task's signature (it would fail when run): take the arguments as they are.
            values = {str(i): v for i, v in enumerate(args)}
            values.update(kwargs)
        else:
            bound.apply_defaults()
            values = dict(bound.arguments)
        if keys is None:
            return values
        missing = [k for k in keys if k not in values]
        if missing:
            raise TypeError(f"unique: keys {missing} are not arguments of {self.name} ({list(values)})")
        return {k: values[k] for k in keys}

    def tumbler_digest(self, args=None, kwargs=None, options=None):
        """The lock's name for a call of this task (see tumbler_celery.digest)."""
        opts = options or self.unique_options()
        values = self.lock_args(args, kwargs, opts["keys"])
        if opts["digest"] == "job":
            return d.job_digest(opts["job_name"] or self.name, list(values.values()))
        return d.task_digest(opts["prefix"], self.name, values)

    # --- enqueue

    def apply_async(self, args=None, kwargs=None, task_id=None, producer=None, link=None, link_error=None,
                    shadow=None, **options):
        per_call, once = options.pop("unique", None), options.pop("once", None)
        run = _current.get()
        headers = dict(options.pop("headers", None) or {})
        carried = headers.get(HEADER)
        if run is not None and task_id == run.task_id and run.task is self:
            # self.retry() of the running task: hand its grant back to the task id for the wait.
            opts, name = run.options, run.digest
        elif carried and task_id:  # a message sent again as it was (a replaced or re-published task)
            opts, name = carried["options"], carried["digest"]
        else:
            opts = self.unique_options(per_call, once)
            if opts is None:
                return super().apply_async(args, kwargs, task_id=task_id, producer=producer, link=link,
                                           link_error=link_error, shadow=shadow, headers=headers or None,
                                           **options)
            name = self.tumbler_digest(args, kwargs, opts)
        task_id = task_id or str(uuid.uuid4())
        headers[HEADER] = {"digest": name, "options": opts}
        client = client_for(self._get_app())
        ttl = min(float(opts["timeout"]) + _delay(options), float(opts["max_ttl"]))
        takes_over = run.holder if run is not None and task_id == run.task_id else ""
        try:
            lock = client.acquire(name, task_id, ttl_ms=_ms(ttl), kind=f"celery_{opts['until']}",
                                  metadata={"task": self.name, "task_id": task_id}, takes_over=takes_over)
        except NotAcquired as e:
            return self._duplicate(client, name, opts, e)
        if takes_over:
            run.handed_back = True
        sent = False
        try:
            result = super().apply_async(args, kwargs, task_id=task_id, producer=producer, link=link,
                                         link_error=link_error, shadow=shadow, headers=headers, **options)
            sent = True
            return result
        finally:
            if not sent and not takes_over:
                _release_quietly(client, name, task_id, lock.fencing_token)

    def _duplicate(self, client, name, opts, err):
        holder = _holder_of(client, name)
        task_id = d.job_of(holder) if holder else None
        countdown = None
        if err.response is not None and err.response.next_expiry_at_ms:
            countdown = max(0.0, err.response.next_expiry_at_ms / 1000.0 - time.time())
        how = opts["on_duplicate"]
        logger.info("tumbler-celery: %s %s: %s is held by %s", "dropping" if how == "drop" else "duplicate",
                    self.name, name, holder or "?")
        if how == "drop":
            return None
        if how == "result" and task_id:
            return self.AsyncResult(task_id)
        raise self.duplicate_error(f"{self.name}: already queued or running as {task_id or '?'} ({name})",
                                   digest=name, task_id=task_id, countdown=countdown)

    # --- run

    def __call__(self, *args, **kwargs):
        req = self.request
        carried = (req.headers or {}).get(HEADER) if isinstance(req.headers, dict) else None
        carried = carried or getattr(req, HEADER, None)
        if req.called_directly or not req.id or not carried:
            # Called as a function, or sent without the lock (send_task, an older message): no lock.
            return super().__call__(*args, **kwargs)
        opts, name = carried["options"], carried["digest"]
        client = client_for(self._get_app())
        if opts["until"] == "started":
            _release_quietly(client, name, req.id)
            return super().__call__(*args, **kwargs)
        run = _Run(self, client, name, req.id, opts)
        if not run.take():
            return self._run_conflict(run)
        run.lock.keep_alive(run.on_lost)
        token = _current.set(run)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _current.reset(token)
            run.finish()

    def _run_conflict(self, run):
        holder = _holder_of(run.client, run.digest)
        msg = f"{self.name}[{run.task_id}]: {run.digest} is held by {holder or '?'}"
        if run.options["on_run_conflict"] == "raise":
            raise self.duplicate_error(msg, digest=run.digest, task_id=d.job_of(holder) if holder else None)
        logger.warning("tumbler-celery: not running %s (dropped)", msg)
        return None


class _Run:
    """One execution of a unique task: its holder ``<task id>:<run id>``, its grant and fencing token."""

    def __init__(self, task, client, digest, task_id, options):
        self.task, self.client, self.digest, self.task_id, self.options = task, client, digest, task_id, options
        self.holder = f"{task_id}:{secrets.token_hex(8)}"
        self.lock = None
        self.handed_back = False

    def take(self):
        """The task id's grant taken over by the run in one call; or, when the task id holds none (the queued
        lease ended), the lock taken as usual. Held by another run of this task: wait for that run's lease."""
        ttl_ms = _ms(float(self.options["execution_ttl"]))
        try:
            self.lock = self._acquire(ttl_ms, 0)
            return True
        except NotAcquired:
            pass
        holder = _holder_of(self.client, self.digest)
        if holder is None or d.job_of(holder) != self.task_id:
            # Free again already (retry once), or another task's.
            if holder is not None:
                return False
            try:
                self.lock = self._acquire(ttl_ms, 0)
                return True
            except NotAcquired:
                return False
        try:
            self.lock = self._acquire(ttl_ms, ttl_ms + _ms(OTHER_RUN_GRACE_S))
            return True
        except NotAcquired:
            return False

    def _acquire(self, ttl_ms, wait_ms):
        return self.client.acquire(self.digest, self.holder, ttl_ms=ttl_ms, wait_ms=wait_ms, takes_over=self.task_id,
                                   kind=f"celery_{self.options['until']}",
                                   metadata={"task": self.task.name, "task_id": self.task_id})

    def on_lost(self, err):
        logger.warning("tumbler-celery: %s[%s] lost its lock while running: %s", self.task.name, self.task_id, err)

    def finish(self):
        """The run's end: the watchdog stops; the grant is released, pinned to the run's token (unless a
        retry handed it back to the task id, or it was lost)."""
        self.lock.stop_keep_alive()
        if self.handed_back or self.lock.lost.is_set():
            return
        _release_quietly(self.client, self.digest, self.holder, self.lock.fencing_token)


def _release_quietly(client, name, holder, token=None):
    from tumbler_client import pb
    try:
        req = pb.ReleaseRequest(namespace=client.namespace, name=name, holder=holder)
        if token:
            req.fencing_token = token
        resp = client._call(client._unary.Release, lambda: req)
        return resp.status == pb.RELEASE_STATUS_RELEASED
    except TumblerError as e:
        logger.warning("tumbler-celery: could not release %s for %s: %s", name, holder, e)
        return False


def _holder_of(client, name):
    """The first live holder of the lock (None: free)."""
    try:
        holders = client.inspect(name).holders
    except TumblerError:
        return None
    return holders[0].grant.holder if holders else None


def _delay(options):
    """Seconds until a task sent with ``countdown`` or ``eta`` is due (0 for one due now)."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if eta is not None:
        if isinstance(eta, str):
            eta = datetime.datetime.fromisoformat(eta)
        now = datetime.datetime.now(eta.tzinfo) if eta.tzinfo else datetime.datetime.now()
        return max(0.0, (eta - now).total_seconds())
    return 0.0
