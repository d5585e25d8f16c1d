"""Tasks for tests/e2e/test_failover.py. Each run appends a line to the file named by
``EMQ_FAILOVER_LOG`` (one O_APPEND write) before it does anything else, so that the
test sees a job running, and counts its runs."""

from __future__ import annotations

import json
import os
import time

import emq_django as emq


def record(key: str) -> None:
    line = json.dumps({"key": key, "pid": os.getpid(), "t": time.time()})
    fd = os.open(os.environ["EMQ_FAILOVER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def runs(key: str) -> int:
    try:
        with open(os.environ["EMQ_FAILOVER_LOG"]) as f:
            return sum(1 for line in f if json.loads(line)["key"] == key)
    except FileNotFoundError:
        return 0


@emq.task(queue="failover", guarantee=True)
def slow(key: str, seconds: float) -> str:
    """Runs across a failover (guaranteed): its outcome reaches the new broker."""
    record(key)
    time.sleep(seconds)
    return f"done {key}"


@emq.task(queue="failover")
def slow_plain(key: str, seconds: float) -> str:
    """The same, not guaranteed: at most once (JobLost after a failover)."""
    record(key)
    time.sleep(seconds)
    return f"done {key}"


@emq.task(queue="failover", guarantee=True)
def double(x: int) -> int:
    return 2 * x


@emq.task(queue="failover")
def triple(x: int) -> int:
    return 3 * x
