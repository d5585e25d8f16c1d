"""Tasks for tests/e2e/test_workflows.py, loaded by job managers through EMQ_IMPORTS.
Each run appends a line to a file in ``runs_dir``: the test counts runs across
the job manager's worker processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import emq_django as emq


def _record(runs_dir: str, line: str) -> None:
    fd = os.open(Path(runs_dir) / "runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write with O_APPEND: lines never mix
    finally:
        os.close(fd)


@emq.task(queue="wf")
def member(i: int, runs_dir: str) -> int:
    """Every seventh member fails for good (no retries)."""
    _record(runs_dir, f"member {i}")
    if i % 7 == 3:
        raise ValueError(f"member {i} failed")
    return i


@emq.task(queue="wf")
def collect(outcomes: list[object], runs_dir: str) -> dict[str, int]:
    _record(runs_dir, "callback")
    errors = [o for o in outcomes if isinstance(o, dict) and "error" in o]
    return {
        "members": len(outcomes),
        "errors": len(errors),
        "sum": sum(o for o in outcomes if isinstance(o, int)),
    }


@emq.task(queue="wf")
def on_failure(outcomes: list[object], runs_dir: str) -> None:
    _record(runs_dir, "on_error")


@emq.task(queue="wf", retries=2)
def flaky_step(value: int, runs_dir: str) -> int:
    """Fails on its first attempt, then adds one."""
    _record(runs_dir, f"flaky {value}")
    marker = Path(runs_dir) / f"flaky-{value}"
    if not marker.exists():
        marker.touch()
        raise ConnectionError("the first attempt fails")
    return value + 1


@emq.task(queue="wf")
def plus(value: int, n: int, runs_dir: str) -> int:
    _record(runs_dir, f"plus {value} {n}")
    return value + n


@emq.task(queue="wf")
def slow(value: int, runs_dir: str) -> int:
    """Runs until cancelled (its worker process is killed)."""
    _record(runs_dir, "slow started")
    time.sleep(120)
    return value


@emq.task(queue="wf", guarantee=True)
def kept_member(i: int, runs_dir: str) -> int:
    """A guaranteed chord member: takes a little while, every seventh fails."""
    _record(runs_dir, f"kept {i}")
    time.sleep(0.02)
    if i % 7 == 3:
        raise ValueError(f"member {i} failed")
    return i


@emq.task(queue="wf", guarantee=True)
def kept_collect(outcomes: list[object], runs_dir: str) -> dict[str, int]:
    _record(runs_dir, "kept callback")
    errors = [o for o in outcomes if isinstance(o, dict) and "error" in o]
    return {"members": len(outcomes), "errors": len(errors)}


@emq.task(queue="wf")
def counting(value: int, runs_dir: str) -> int:
    """A step that streams: three partial results, then its value doubled."""
    _record(runs_dir, f"counting {value}")
    for i in range(3):
        emq.partial({"counted": i})
    return 2 * value


@emq.task(queue="wf")
def square(i: int) -> int:
    return i * i


@emq.task(queue="wf")
def summing(values: list[int]) -> int:
    """A chord's callback that streams its progress: one partial per 2,000 values."""
    total = 0
    for n, value in enumerate(values, 1):
        total += value
        if n % 2000 == 0:
            emq.partial({"summed": n})
    return total
