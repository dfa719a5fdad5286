#!/usr/bin/env python3
"""Writes helm/tumbler/README.md: the chart's summary and a table of every
value, generated from the `# --` comments of values.yaml (the helm-docs
convention: a comment block that starts with `# --` documents the key
below it; nested keys are joined with dots).

    helm/tools/values_table.py           # print the README
    helm/tools/values_table.py --write   # rewrite helm/tumbler/README.md
    helm/tools/values_table.py --check   # exit 1 when the README is stale

A mapping whose children carry their own `# --` comments gets a row of its
own (type object, no default) and one row per child; a mapping without
documented children (e.g. `labels: {}`) is one row with its whole default.
A key without a `# --` comment under a mapping whose other children have
one is an error: every value a user can set is documented.

Needs Python 3.10+ and PyYAML (helm/tests/run.sh installs it).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "tumbler"
README = CHART / "README.md"

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*|\"[^\"]+\"):(?P<rest>.*)$")
DOC = re.compile(r"^ *# -- ?(?P<text>.*)$")
MORE = re.compile(r"^ *#(?: (?P<text>.*))?$")


@dataclass
class Entry:
    path: str
    description: str | None
    line: int


class ValuesError(Exception):
    pass


def documented_keys(text: str) -> list[Entry]:
    """Every mapping key of values.yaml (list items aside), in order, with
    the `# --` comment block right above it, if any."""
    entries: list[Entry] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    comment: list[str] | None = None
    skip_below: int | None = None  # inside a block list: skip deeper lines
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            comment = None
            continue
        indent = len(line) - len(line.lstrip(" "))
        if skip_below is not None:
            if indent > skip_below or (indent == skip_below and stripped.startswith("- ")):
                continue
            skip_below = None
        if stripped.startswith("#"):
            doc = DOC.match(line)
            if doc:
                comment = [doc.group("text")]
            elif comment is not None:
                more = MORE.match(line)
                comment.append((more.group("text") or "") if more else "")
            continue
        match = KEY.match(line)
        if not match:
            if stripped.startswith("- "):
                # A list item under the previous key: part of its default.
                skip_below = indent
                comment = None
                continue
            raise ValuesError(f"values.yaml:{number}: cannot read {line!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match.group("key").strip('"')
        path = ".".join([k for _, k in stack] + [key])
        description = " ".join(part.strip() for part in comment).strip() if comment else None
        entries.append(Entry(path, description, number))
        comment = None
        rest = match.group("rest").split(" #", 1)[0].strip()
        if rest == "":
            stack.append((indent, key))
            # A block list right below: its items are the default.
            following = next((l for l in lines[number:] if l.strip() and not l.strip().startswith("#")), "")
            if following.strip().startswith("- "):
                stack.pop()
                skip_below = indent
    return entries


def lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(values_text: str) -> list[tuple[str, str, str, str]]:
    values = yaml.safe_load(values_text)
    entries = documented_keys(values_text)
    by_path = {e.path: e for e in entries}
    parents = {e.path.rsplit(".", 1)[0] for e in entries if "." in e.path and e.description}
    out = []
    problems = []
    for entry in entries:
        parent = entry.path.rsplit(".", 1)[0] if "." in entry.path else None
        if entry.description is None:
            if parent is None or parent in parents:
                problems.append(f"values.yaml:{entry.line}: {entry.path} has no `# --` comment")
            continue  # part of its parent's default
        if parent is not None and parent not in parents:
            continue
        if parent is not None and by_path[parent].description is None:
            problems.append(f"values.yaml:{by_path[parent].line}: {parent} has no `# --` comment")
        value = lookup(values, entry.path)
        if entry.path in parents:
            default = ""
        else:
            default = "`" + json.dumps(value, separators=(", ", ": ")) + "`"
        out.append((entry.path, type_name(value), default, entry.description))
    if problems:
        raise ValuesError("\n".join(problems))
    return out


def readme() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    table = rows((CHART / "values.yaml").read_text())
    lines = [
        f"# {chart['name']}",
        "",
        "<!-- Generated by helm/tools/values_table.py from Chart.yaml and values.yaml: edit those, then run"
        " `helm/tools/values_table.py --write`. helm/tests/run.sh fails while this file is stale. -->",
        "",
        " ".join(chart["description"].split()),
        "",
        f"Chart version {chart['version']}, app version {chart['appVersion']}, Kubernetes {chart['kubeVersion']}.",
        "Secure by default: authentication on (an admin token is generated when no tokens are given),"
        " a NetworkPolicy, and a PodDisruptionBudget; `insecure=true` turns authentication and the"
        " NetworkPolicy off for a trial.",
        "Installing, the Redis forms, authentication, TLS, probes, alerts and the dashboard:",
        "[helm/README.md](../README.md).",
        "",
        "## Values",
        "",
        "| Key | Type | Default | Description |",
        "| --- | --- | --- | --- |",
    ]
    for path, kind, default, description in table:
        lines.append(f"| `{path}` | {kind} | {cell(default)} | {cell(description)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    try:
        text = readme()
    except ValuesError as err:
        print(err, file=sys.stderr)
        return 1
    if argv[1:] == ["--write"]:
        README.write_text(text)
        return 0
    if argv[1:] == ["--check"]:
        if not README.exists() or README.read_text() != text:
            print(f"{README} is stale: run helm/tools/values_table.py --write", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
