"""Tasks for the fault-injection suite. Each execution appends one JSON line to the
file named by ``EMQ_FAULT_HISTORY`` (one small O_APPEND write: lines never mix)."""

from __future__ import annotations

import json
import os
import time

import emq_django as emq


def record(kind: str, key: str) -> None:
    line = json.dumps({"kind": kind, "key": key, "pid": os.getpid(), "t": time.time()})
    fd = os.open(os.environ["EMQ_FAULT_HISTORY"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@emq.task(queue="faults", guarantee=True, reply=False)
def work(key: str, seconds: float = 0.005) -> None:
    time.sleep(seconds)
    record("done", key)


@emq.task(queue="faults", guarantee=True, reply=False, timeout=2, retries=1)
def overrun(key: str, seconds: float = 30.0) -> None:
    record("start", key)
    time.sleep(seconds)
    record("done", key)


@emq.task(queue="faults", guarantee=True, reply=False, retries=3)
def always_fails(key: str) -> None:
    record("run", key)
    raise RuntimeError(f"{key} always fails")
