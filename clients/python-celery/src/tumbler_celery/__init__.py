"""tumbler-celery: unique Celery tasks on the tumbler lock service.

``@app.task(base=UniqueTask, unique={...})`` makes a task unique: the lock is
taken when it is sent (under the task id), taken over by the run that
executes it (``<task id>:<run id>``, a fencing token of its own, an
execution lease renewed while it runs) and released when it has run (or as
it starts). ``compat`` has drop-in bases for celery-once (``QueueOnce``) and
celery-singleton (``Singleton``). The job digest form (``unique={"digest":
"job"}``) is shared with the Sidekiq gem: one uniqueness across both.
"""
from .digest import canonical_json, job_digest, job_of, task_digest
from .task import (DEFAULTS, Duplicate, UniqueTask, client_for, configure, current_fencing_token,
                   current_lock)

__all__ = ["UniqueTask", "Duplicate", "configure", "current_lock", "current_fencing_token", "client_for",
           "canonical_json", "job_digest", "task_digest", "job_of", "DEFAULTS"]
