"""The steady mixed load of tests/faults/test_ha.py, as a client process of its own:
``python ha_load.py OUT_DIR PREFIX``, with ``EMQ_BROKER_URL`` listing every broker.

It cycles through the kinds below at a steady pace until ``OUT_DIR/stop`` exists,
then waits for the results of the jobs that have one and exits 0. Each kind:

- ``g``: guaranteed, no result; ``gr``: guaranteed with a result (get() must
  return it); ``gc``: guaranteed with a countdown; ``gf``: guaranteed, fails its
  first attempt and succeeds on its retry;
- ``p``: plain with a result (at most once: get() may raise JobLost after a
  failover); ``pn``: plain, no result.

A send that raises is written down (``errors.jsonl``: type, reason, time) and made
again under the same id a moment later (the load goes on meanwhile) until the
broker acknowledges it; each acknowledged send
is a line of ``accepted.jsonl`` with the time it returned (for a guaranteed job:
the broker's ACK, after its journal commit) and the client's count of broker
changes at that moment. ``results.jsonl``: each get(), its value or error.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

import django

KINDS = ("g", "p", "gr", "g", "pn", "gc", "g", "gf")
PACE = 0.004  # seconds between sends: a steady load, not a flood (2 shared cores)
RETRY_PAUSE = 0.05  # seconds before a refused or failed send is made again
RESULTS_WAIT = 30.0  # seconds for all the results together, once the sending stopped


def line(out: TextIO, **fields: Any) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()


def send(kind: str, key: str) -> Any:
    from tests.faults.fault_tasks import echo_g, flaky, plain, work

    if kind == "g":
        return work.apply_async((key, 0.005), job_id=key)
    if kind == "gr":
        return echo_g.apply_async((key,), job_id=key)
    if kind == "gc":
        return work.apply_async((key, 0.0), job_id=key, countdown=0.5)
    if kind == "gf":
        return flaky.apply_async((key,), job_id=key)
    if kind == "p":
        return plain.apply_async((key, 0.005), job_id=key)
    return plain.apply_async((key, 0.005), job_id=key, reply=False)


def main(out_dir: Path, prefix: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from emq_django.client import get_client

    stop = out_dir / "stop"
    handles: dict[str, tuple[str, Any]] = {}
    again: deque[tuple[float, str, str]] = deque()  # (when, kind, key): refused sends
    with (
        (out_dir / "accepted.jsonl").open("a") as accepted,
        (out_dir / "errors.jsonl").open("a") as errors,
    ):

        def attempt(kind: str, key: str) -> None:
            try:
                handle = send(kind, key)
            except Exception as exc:  # noqa: BLE001 - every error is the finding
                line(errors, key=key, kind=kind, t=time.time(), type=type(exc).__name__,
                     error=str(exc))  # fmt: skip
                again.append((time.monotonic() + RETRY_PAUSE, kind, key))
                return
            changes = getattr(get_client(), "broker_changes", None)
            line(accepted, key=key, kind=kind, t=time.time(), changes=changes)
            if kind in ("gr", "p"):
                handles[key] = (kind, handle)

        n = 0
        print("sending", flush=True)
        while not stop.exists():
            n += 1
            kind = KINDS[n % len(KINDS)]
            attempt(kind, f"{prefix}-{kind}-{n}")  # new jobs go on: plain ones keep flowing
            if again and again[0][0] <= time.monotonic():
                _, kind, key = again.popleft()  # a refused job, sent again under its id
                attempt(kind, key)
            time.sleep(PACE)
        deadline = time.monotonic() + RESULTS_WAIT
        while again and time.monotonic() < deadline:  # the last refused ones
            when, kind, key = again.popleft()
            time.sleep(max(0.0, when - time.monotonic()))
            attempt(kind, key)
    deadline = time.monotonic() + RESULTS_WAIT
    with (out_dir / "results.jsonl").open("a") as results:
        for key, (kind, handle) in handles.items():
            try:
                wait = max(0.1, deadline - time.monotonic())
                line(results, key=key, kind=kind, value=handle.get(timeout=wait))
            except Exception as exc:  # noqa: BLE001 - recorded, judged by the test
                line(results, key=key, kind=kind, type=getattr(exc, "type", type(exc).__name__),
                     error=str(exc))  # fmt: skip
    print("done", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
