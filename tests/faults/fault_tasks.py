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


@emq.task(queue="faults", guarantee=True, reply=False, retries=2)
def poison(key: str, how: str = "exit") -> None:
    record("run", key)
    if how == "abort":
        os.abort()
    os._exit(1)


@emq.task(queue="faults", reply=False)
def dies_once(key: str) -> None:  # retries=0 without guarantee: at most once
    record("run", key)
    os._exit(1)


@emq.task(queue="faults", timeout=1, retries=0)
def late(key: str, seconds: float = 1.5) -> int:
    """Returns inside the kill grace (EMQ_KILL_GRACE=1 here): still a time-out."""
    record("run", key)
    time.sleep(seconds)
    record("done", key)
    return 7


@emq.task(queue="faults", timeout=1, retries=0)
def runs_on(key: str, seconds: float = 3.0) -> None:
    """Sleeps past its time limit; would record "done" if it ran on (it must not)."""
    record("run", key)
    time.sleep(seconds)
    record("done", key)


@emq.task(queue="faults", soft_timeout=0.5, timeout=30, retries=0)
def cleans_up(key: str, seconds: float = 20.0) -> None:
    """Catches its soft time limit to clean up, then lets it end the attempt."""
    record("run", key)
    try:
        time.sleep(seconds)
    except emq.SoftTimeLimitExceeded:
        record("cleanup", key)
        raise
    record("done", key)


@emq.task(queue="faults")
def plain(key: str, seconds: float = 0.2) -> str:  # a plain job: at most once, with a reply
    time.sleep(seconds)
    record("plain", key)
    return key


@emq.task(queue="faults", retries=0)
def once(key: str, seconds: float = 2.0) -> str:  # at most once, with a reply
    record("start", key)
    time.sleep(seconds)
    record("finish", key)
    return key


@emq.task(queue="faults", timeout=3, retries=1)
def dies_silently(key: str) -> None:
    """Kills its worker process: an EventMQ job manager sends no REPLY for it."""
    record("run", key)
    os._exit(1)


@emq.task(queue="faults", guarantee=True)
def echo_g(key: str) -> str:  # guaranteed, with a result its caller get()s
    record("done", key)
    return key


@emq.task(queue="faults", guarantee=True, reply=False, retries=1)
def flaky(key: str) -> None:
    """Fails its first attempt (a marker file per key, next to the history file,
    says it has run before), succeeds on its one retry: a job in its retry delay
    at a failover must keep that retry (its first failure counted once)."""
    marks = os.path.join(os.path.dirname(os.environ["EMQ_FAULT_HISTORY"]), "marks")
    os.makedirs(marks, exist_ok=True)
    try:
        os.close(os.open(os.path.join(marks, key), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        record("done", key)
        return
    record("failed", key)
    raise RuntimeError(f"{key} fails its first attempt")


@emq.task(queue="faults", guarantee=True, retries=0)
def chord_member(key: str, fails: bool) -> str:
    """A member of test_faults_workflows' chords: a failing one fails for good."""
    time.sleep(0.02)
    record("done", key)
    if fails:
        raise ValueError(f"{key} fails")
    return key


@emq.task(queue="faults", guarantee=True, retries=0)
def chord_callback(outcomes: list[object], key: str) -> dict[str, int]:
    record("done", key)
    errors = sum(1 for o in outcomes if isinstance(o, dict) and "error" in o)
    return {"members": len(outcomes), "errors": errors}
