"""Tasks for the EventMQ interop tests (tests/e2e/test_eventmq_interop.py).

Every function appends one line to the file named by ``$EMQ_INTEROP_MARKER`` (when
set), so a test can see from outside which jobs really ran, in any process.
"""

from __future__ import annotations

import os

import emq_django as emq

MARKER_ENV = "EMQ_INTEROP_MARKER"


def _mark(line: str) -> None:
    path = os.environ.get(MARKER_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{line}\n")


@emq.task
def record(tag: str) -> str:
    _mark(f"record {tag} pid={os.getpid()}")
    return tag


@emq.task
def add(x: int, y: int) -> int:
    _mark(f"add {x} {y}")
    return x + y


def unregistered(tag: str) -> str:
    """Importable, same module, but NOT an ``@emq.task``: job managers must refuse it."""
    _mark(f"unregistered {tag}")
    return tag
