"""Completion counter for the peers (Celery, Dramatiq) that have no monitor.

A finished task adds one to a process-local counter (a lock and an integer,
well under a microsecond); a daemon thread per worker process adds the
increase to a Redis key every 5 ms. The producer polls that key. So the task
itself stays a no-op apart from the increment, and no Redis round trip is paid
per task.
"""

from __future__ import annotations

import os
import threading
import time

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
FLUSH_INTERVAL = 0.005

_lock = threading.Lock()
_count = 0
_owner_pid = 0


def mark_done(key: str) -> None:
    global _count
    if _owner_pid != os.getpid():
        _start_flusher(key)
    with _lock:
        _count += 1


def _start_flusher(key: str) -> None:
    global _owner_pid, _count
    with _lock:
        if _owner_pid == os.getpid():
            return
        _owner_pid = os.getpid()
        _count = 0  # a forked child does not inherit its parent's count
    threading.Thread(
        target=_flush_forever, args=(key,), name="bench-donecount", daemon=True
    ).start()


def _flush_forever(key: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    sent = 0
    while True:
        time.sleep(FLUSH_INTERVAL)
        current = _count
        if current != sent:
            client.incrby(key, current - sent)
            sent = current


def read_done(client: object, key: str) -> int:
    value = client.get(key)  # type: ignore[attr-defined]
    return int(value) if value else 0
