"""Tasks and receivers for tests/e2e/test_signals.py.

The receivers are connected when this module is imported (the job manager imports
it through EMQ_IMPORTS, so its worker processes have them); each appends one JSON
line per signal to the file named by ``EMQ_SIGNAL_LOG`` (one small O_APPEND write:
lines never mix), with the process id, so the test can tell the client's signals
from the worker's. One receiver of ``job_started`` always raises: the jobs must
not notice.
"""

from __future__ import annotations

import json
import os
from typing import Any

import emq_django as emq
from emq_django import signals


def _append(record: dict[str, Any]) -> None:
    path = os.environ.get("EMQ_SIGNAL_LOG")
    if not path:
        return  # (imported by a test that does not watch the signals)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


NAMES = {
    id(s): n
    for n, s in vars(signals).items()
    if n.startswith(("job_", "partial_")) and isinstance(s, signals.JobSignal)
}


def record(sender: Any, signal: signals.JobSignal, **kwargs: Any) -> None:
    exc = kwargs.get("exception")
    _append(
        {
            "signal": NAMES[id(signal)],
            "pid": os.getpid(),
            "sender": getattr(sender, "name", sender),
            "job_id": kwargs["job_id"],
            "attempt": kwargs["attempt"],
            "task": kwargs["task"],
            "queue": kwargs["queue"],
            "args": kwargs["args"],
            "kwargs": kwargs["kwargs"],
            "result": kwargs.get("result"),
            "value": kwargs.get("value"),
            "index": kwargs.get("index"),
            "error": kwargs.get("error"),
            "exception": repr(exc) if exc is not None else None,
            "delay": kwargs.get("delay"),
        }
    )


def broken(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("a receiver that raises")


for _signal in (
    signals.job_sent,
    signals.job_started,
    signals.job_succeeded,
    signals.job_failed,
    signals.job_retrying,
    signals.job_dead_lettered,
    signals.partial_sent,
):
    _signal.connect(record, dispatch_uid="signal_tasks.record")
signals.job_started.connect(broken, dispatch_uid="signal_tasks.broken")


def runs(key: str) -> int:
    path = os.environ["EMQ_SIGNAL_LOG"]
    with open(path) as f:
        return sum(
            1
            for line in f
            if (r := json.loads(line))["signal"] == "job_started" and r["job_id"] == key
        )


@emq.task(queue="signals")
def streams(key: str, n: int = 2) -> str:
    for i in range(n):
        emq.partial(i)
    return f"{key} done"


@emq.task(queue="signals", retries=3)
def flaky(key: str, failures: int = 2) -> str:
    """Fails ``failures`` times (its job_started lines count the runs), then succeeds."""
    if runs(key) <= failures:
        raise ValueError(f"{key}: failure {runs(key)}")
    return f"{key} ok"


@emq.task(queue="signals", retries=2)
def doomed(key: str) -> None:
    raise KeyError(key)
