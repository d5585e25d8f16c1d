"""Tasks for tests/e2e/test_stream.py and bench/stream_latency.py, loaded by job
managers through EMQ_IMPORTS."""

from __future__ import annotations

import time
from collections.abc import Generator
from pathlib import Path

import emq_django as emq


def _wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


@emq.task(queue="stream")
def gated(n: int, gate_dir: str) -> Generator[str, None, str]:
    """Yield ``part-<i>``, then wait for the test to create ``go-<i>`` before
    producing the next: a partial the test sees proves it came before the next
    one was produced."""
    for i in range(n):
        (Path(gate_dir) / f"produced-{i}").touch()
        yield f"part-{i}"
        _wait_for(Path(gate_dir) / f"go-{i}")
    return f"done-{n}"


@emq.task(queue="stream")
def calls_partial(n: int) -> int:
    for i in range(n):
        emq.partial({"i": i})
    return n


@emq.task(queue="stream")
def fails_after(n: int) -> Generator[int, None, None]:
    yield from range(n)
    raise ValueError(f"failed after {n} partials")


@emq.task(queue="stream")
def plain_add(x: int, y: int) -> int:
    return x + y


@emq.task(queue="stream", retries=1)
def flaky_stream(marker: str) -> Generator[str, None, str]:
    """Attempt 1 yields one value, then fails; attempt 2 yields two and succeeds."""
    path = Path(marker)
    if not path.exists():
        path.touch()
        yield "first-try"
        raise RuntimeError("first attempt fails")
    yield "second-a"
    yield "second-b"
    return "ok"


@emq.task(queue="stream")
def stamps(n: int, gap: float = 0.0005) -> int:
    """``n`` partials, each the monotonic clock (ns) when ``emq.partial`` was called
    (the clock is shared by every process on one machine): bench/stream_latency.py."""
    for _ in range(n):
        emq.partial(time.monotonic_ns())
        if gap:
            time.sleep(gap)
    return n
