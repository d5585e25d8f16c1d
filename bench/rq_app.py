"""RQ peer: Redis; the tasks the SimpleWorkers import (``bench.rq_app.noop``)."""

from __future__ import annotations

import os

from bench.donesignal import mark_done

QUEUE = "rq_bench"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def noop() -> None:
    mark_done()


def echo(x: object) -> object:
    return x
