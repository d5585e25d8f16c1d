"""Tasks for tests/e2e/test_priority.py. Each run appends one line to the file named
by ``EMQ_FLOW_LOG`` (one small O_APPEND write: lines never mix) when it starts, so the
test reads the order in which jobs started."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import emq_django as emq


def record(key: str, **more: object) -> None:
    line = json.dumps({"key": key, "t": time.time(), **more})
    fd = os.open(os.environ["EMQ_FLOW_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def started() -> list[dict[str, object]]:
    try:
        text = Path(os.environ["EMQ_FLOW_LOG"]).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines()]


@emq.task(queue="flow", reply=False)
def mark(key: str, sent: float = 0.0, seconds: float = 0.0) -> None:
    record(key, sent=sent)
    if seconds:
        time.sleep(seconds)  # the job's own body: its length is the point


@emq.task(queue="flow", reply=False)
def gate(key: str, path: str) -> None:
    """Runs until ``path`` exists (the test opens the gate)."""
    record(key)
    while not os.path.exists(path):
        time.sleep(0.02)


@emq.task(queue="flow", reply=False, unique=True)
def once(key: str) -> None:
    """A unique task (tests/e2e/test_unique.py): keyed by its arguments."""
    record(key)


PACE = 20  # jobs per second (tests/e2e/test_flow_control.py)


@emq.task(queue="flow", reply=False, rate_limit=f"{PACE}/s")
def paced(key: str) -> None:
    """At most PACE a second, over every job manager (the broker's token bucket)."""
    record(key)


@emq.task(
    queue="flow",
    reply=False,
    max_concurrency=1,
    concurrency_key=lambda key, customer, gate="": customer,
)
def per_customer(key: str, customer: str, gate: str = "") -> None:
    """One job per customer at a time; a start and an end line, and in between it
    waits for ``gate`` (a file) when one is named."""
    record(key, customer=customer, phase="start")
    while gate and not os.path.exists(gate):
        time.sleep(0.02)
    record(key, customer=customer, phase="end")


@emq.task(queue="flow", reply=False)
def fails(key: str) -> None:
    """Fails (retries=0: one failed attempt)."""
    record(key)
    raise ValueError(f"{key} fails on purpose")
