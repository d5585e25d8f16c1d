"""Tasks for tests/e2e/test_spine.py, loaded by job managers through EMQ_IMPORTS.

Each job manager is started with SPINE_JM_NAME in its environment, so a task can
say which job manager (and which worker process) ran it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import emq_django as emq


def _where() -> dict[str, Any]:
    return {"name": os.environ.get("SPINE_JM_NAME", ""), "pid": os.getpid(), "ppid": os.getppid()}


@emq.task(queue="spine")
def whoami(tag: str = "") -> dict[str, Any]:
    return {"tag": tag, **_where()}


@emq.task(queue="spine")
def add(x: int, y: int) -> int:
    return x + y


@emq.task(queue="spine")
def boom(message: str) -> None:
    raise ValueError(message)


@emq.task(queue="spine")
def nap(seconds: float, tag: str = "", done_file: str = "") -> dict[str, Any]:
    """Sleep, then (optionally) write ``done_file``: proof the job ran to its end."""
    started = time.time()
    time.sleep(seconds)
    if done_file:
        Path(done_file).write_text(f"{tag} {os.getpid()}\n")
    return {"tag": tag, "started": started, "finished": time.time(), **_where()}


@emq.task(queue="spine-unserved", reply=False)
def forget(n: int) -> None:
    """Sent without reply, to a queue no job manager serves (test_refusals.py)."""
