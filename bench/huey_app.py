"""Huey peer: Redis storage (blocking dequeue, BLPOP result notification)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from huey import RedisHuey

from bench.donesignal import mark_done

NAME = "huey_bench"
_url = urlparse(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))

# blocking=True: workers BRPOP instead of polling; notify_result=True: result()
# .get(blocking=True) waits with BLPOP instead of sleeping with back-off.
huey = RedisHuey(
    NAME,
    host=_url.hostname or "127.0.0.1",
    port=_url.port or 6379,
    db=int((_url.path or "/0").lstrip("/") or 0),
    blocking=True,
    notify_result=True,
)


@huey.task()
def noop() -> None:  # returns None: Huey stores no result (store_none=False)
    mark_done()


@huey.task()
def echo(x: object) -> object:
    return x
