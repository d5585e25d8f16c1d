"""Tasks for the scheduler's end-to-end tests, loaded by job managers (EMQ_IMPORTS).

``tick`` appends ``<tag> <unix time> <pid>`` to the file named by
``$EMQ_SCHED_MARKER``: the job history the tests read.
"""

from __future__ import annotations

import os
import time

import emq_django as emq

MARKER_ENV = "EMQ_SCHED_MARKER"


@emq.task(queue="sched")
def tick(tag: str) -> str:
    path = os.environ.get(MARKER_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{tag} {time.time():.6f} {os.getpid()}\n")
    return tag
