"""Tasks for tests/e2e/test_attempts.py: jobs that kill their worker process, overrun
their time limit, or fail a few times. Each run appends a line to the file named by
``EMQ_ATTEMPT_LOG`` (one small O_APPEND write: lines never mix), before it does
anything else, so the test can count attempts that died."""

from __future__ import annotations

import json
import os
import time

import emq_django as emq


def record(kind: str, key: str) -> None:
    line = json.dumps({"kind": kind, "key": key, "pid": os.getpid(), "t": time.time()})
    fd = os.open(os.environ["EMQ_ATTEMPT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def runs(key: str) -> int:
    try:
        with open(os.environ["EMQ_ATTEMPT_LOG"]) as f:
            return sum(1 for line in f if json.loads(line)["key"] == key)
    except FileNotFoundError:
        return 0


@emq.task(queue="attempts", retries=2)
def poison(key: str, how: str) -> None:
    record("run", key)
    if how == "abort":
        os.abort()
    os._exit(1)


@emq.task(queue="attempts")
def dies_once(key: str) -> None:  # retries=0, not guaranteed: at most once
    record("run", key)
    os._exit(1)


@emq.task(queue="attempts")
def add(x: int, y: int) -> int:
    return x + y


@emq.task(queue="attempts", timeout=1)
def late(key: str, seconds: float = 1.6) -> int:
    """Returns during the kill grace (EMQ_KILL_GRACE > seconds - 1)."""
    record("run", key)
    time.sleep(seconds)
    return 7


@emq.task(queue="attempts", timeout=1)
def overrun(key: str, seconds: float = 60.0) -> int:
    record("run", key)
    time.sleep(seconds)
    return 7


@emq.task(queue="attempts")
def sleeper(key: str, seconds: float = 60.0) -> int:
    record("run", key)
    time.sleep(seconds)
    return 1


@emq.task(queue="attempts", retries=3)
def flaky(key: str, failures: int = 2) -> str:
    """Fails ``failures`` times, then succeeds."""
    record("run", key)
    if runs(key) <= failures:
        raise RuntimeError(f"{key}: failure {runs(key)}")
    return f"{key} ok"
