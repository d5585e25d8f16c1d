"""Tasks for tests/e2e/test_django_tasks.py and test_on_commit.py, written with the
public Django Tasks API (django.tasks on Django 6.0, django-tasks on 5.2) and with
``@emq.task``. Job managers load them through EMQ_IMPORTS.

With DJT_SIGNAL_LOG set, every task_enqueued/started/finished signal this process
receives is appended to that file as ``<signal> <pid> <id> <status>``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import emq_django as emq
from emq_django.backends import emq_options

try:  # Django >= 6.0
    from django.tasks import TaskContext, task
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2 + django-tasks
    from django_tasks import TaskContext, task
    from django_tasks.signals import task_enqueued, task_finished, task_started

QUEUE = "djtasks"


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def _log_signal(name: str) -> Any:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        log = os.environ.get("DJT_SIGNAL_LOG")
        if log:
            _append(log, f"{name} {os.getpid()} {task_result.id} {task_result.status}")

    return receiver


_receivers = [_log_signal(n) for n in ("enqueued", "started", "finished")]
task_enqueued.connect(_receivers[0], dispatch_uid="djt-enqueued")
task_started.connect(_receivers[1], dispatch_uid="djt-started")
task_finished.connect(_receivers[2], dispatch_uid="djt-finished")


# ---- Django Tasks API -------------------------------------------------------------


@task(queue_name=QUEUE)
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name=QUEUE)
def fail(message: str) -> None:
    raise ValueError(message)


@task(queue_name=QUEUE)
def nap(seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"pid": os.getpid(), "slept": seconds}


@task(queue_name=QUEUE, takes_context=True)
def with_context(context: TaskContext, tag: str) -> dict[str, Any]:
    return {"tag": tag, "id": context.task_result.id, "attempt": context.attempt}


@task(queue_name=QUEUE)
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@emq_options(retries=2)
@task(queue_name=QUEUE)
def flaky(counter_file: str, failures: int) -> int:
    """Fails ``failures`` times (counted in ``counter_file``), then returns the attempt."""
    path = Path(counter_file)
    attempt = int(path.read_text() or "0") + 1 if path.exists() else 1
    path.write_text(str(attempt))
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} fails")
    return attempt


@emq_options(guarantee=True, timeout=30)
@task(queue_name=QUEUE)
def touch_guaranteed(path: str, tag: str) -> str:
    _append(path, tag)
    return tag


@task(queue_name=QUEUE)
def touch(path: str, tag: str) -> str:
    _append(path, tag)
    return tag


# ---- @emq.task ------------------------------------------------------------------------


@emq.task(queue=QUEUE)
def emq_touch(path: str, tag: str) -> str:
    _append(path, tag)
    return tag


@emq.task(queue=QUEUE, on_commit=True)
def emq_touch_on_commit(path: str, tag: str) -> str:
    _append(path, tag)
    return tag
