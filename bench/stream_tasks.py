"""The streaming task of bench/stream_latency.py, loaded by the job manager
through EMQ_IMPORTS."""

from __future__ import annotations

import time

import emq_django as emq


@emq.task(queue="stream")
def stamps(n: int, gap: float = 0.0) -> int:
    """``n`` partial results, each the monotonic clock (ns) read just before
    ``emq.partial`` (a clock every process on the machine shares), ``gap``
    seconds apart."""
    for _ in range(n):
        emq.partial(time.monotonic_ns())
        if gap:
            time.sleep(gap)
    return n
