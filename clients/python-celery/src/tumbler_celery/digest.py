"""Lock names (digests) of unique tasks, and the canonical JSON they hash.

Two forms:

- the task form (the default), this package's own::

      <prefix>:<hex SHA-256 of canonical JSON of {"args": {<name>: <value>, ...}, "task": <task name>}>

  ``args`` are the call's arguments bound to the task's signature (so
  ``add(1, b=2)`` and ``add(1, 2)`` are one task), or the ``keys`` chosen;

- the job form, shared with the Sidekiq gem (``lock_digest_form: :job``)
  and any other job system that writes it the same way::

      tumbler:job:<job name>:<hex SHA-256 of canonical JSON of [<arg>, ...]>

  the job's name and its lock arguments as a JSON array, positional.

Canonical JSON (both forms, and the gem's): JSON types only; object keys
sorted (by code point, which is UTF-8 byte order) at every level; no
whitespace; non-ASCII left unescaped (UTF-8), control characters as
``\\u00xx``; integers in decimal; floats as Ruby prints them (``0.1``,
``1.0``, ``1.0e+15``, ``1.0e-05``: the shortest digits that round-trip, in
fixed notation from 1e-4 up to below 1e15, else with an exponent). NaN and infinities are
refused.
"""
import hashlib
import json
import decimal
import math
import re

JOB_PREFIX = "tumbler:job:"
# A run's holder is "<task id>:<run id>" (16 hex digits), as the Sidekiq gem's "<jid>:<run id>".
_RUN_SUFFIX = re.compile(r":[0-9a-f]{16}\Z")


def canonical_json(value):
    """The canonical JSON text of ``value`` (see the module's doc): the same bytes Ruby's gem hashes."""
    out = []
    _write(value, out)
    return "".join(out)


def _write(value, out):
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, dict):
        items = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"canonical JSON: object keys must be strings, not {type(k).__name__} ({k!r})")
            items.append((k, v))
        items.sort(key=lambda kv: kv[0])
        out.append("{")
        for i, (k, v) in enumerate(items):
            if i:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _write(v, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _write(v, out)
        out.append("]")
    else:
        raise TypeError(f"canonical JSON: {type(value).__name__} is not a JSON type ({value!r}); "
                        "pass lock arguments as str, int, float, bool, None, list or dict")


def _float(f):
    """A float as Ruby's Float#to_s writes it: the shortest digits that round-trip (as Python's repr), in
    fixed notation from 1e-4 up to below 1e15 (``0.0001``, ``123456789012345.0``), else ``d.ddde+XX``."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"canonical JSON: {f!r} is not a JSON number")
    if f == 0.0:
        return "-0.0" if math.copysign(1.0, f) < 0 else "0.0"
    sign, raw, exponent = decimal.Decimal(repr(f)).as_tuple()
    decpt = len(raw) + exponent  # value = 0.<digits> * 10**decpt
    digits = "".join(map(str, raw)).rstrip("0") or "0"
    minus = "-" if sign else ""
    if 0 < decpt <= 15:
        whole, frac = digits[:decpt].ljust(decpt, "0"), digits[decpt:]
        return f"{minus}{whole}.{frac or '0'}"
    if -4 < decpt <= 0:
        return f"{minus}0.{'0' * -decpt}{digits}"
    exp = decpt - 1
    return f"{minus}{digits[0]}.{digits[1:] or '0'}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"


def sha256_hex(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def job_digest(name, args):
    """The job form: ``tumbler:job:<name>:<sha256 of canonical JSON of the args array>``.

    The Sidekiq gem gives the same name for a job with ``lock_digest_form: :job`` and ``lock_job_name: name``
    whose lock arguments are ``args``.
    """
    if not name or not isinstance(name, str):
        raise ValueError("job_name: a non-empty string names the logical job")
    return f"{JOB_PREFIX}{name}:{sha256_hex(canonical_json(list(args)))}"


def task_digest(prefix, task_name, args):
    """The task form: ``<prefix>:<sha256 of canonical JSON of {"args": args, "task": task_name}>``."""
    return f"{prefix}:{sha256_hex(canonical_json({'args': args, 'task': task_name}))}"


def job_of(holder):
    """The task (or Sidekiq job) id a grant's holder belongs to: ``<id>`` while it waits, ``<id>:<run>`` running."""
    return _RUN_SUFFIX.sub("", holder)
