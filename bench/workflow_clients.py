"""The producer side of bench/workflow_bench.py, run as its own process per measurement.

    python -m bench.workflow_clients SYSTEM --kind chord|chain --n N [--limit S]
                                     [--pid ROLE:PID ...]

Warms up (a chord of 10 and a chain of 3, which also waits for the workers to be
up), then times one workflow of ``N`` from the first signature built to the
final result received here, and prints one JSON document on its last stdout
line. A workflow that fails or does not end within ``--limit`` seconds is
reported with its error (exit status 0: the harness records it).

- chord: ``N`` no-op members and a callback that gets their ``N`` results and
  returns how many were None (checked: ``N``);
- chain: ``N`` steps of ``add_one``, the first given 0, each given the previous
  step's result (checked: ``N``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from bench.clients import CpuWindow

WARM_UP = {"chord": 10, "chain": 3}
WARM_UP_LIMIT = 60.0


class Flows(Protocol):
    def chord(self, n: int) -> Any: ...
    def chain(self, n: int) -> Any: ...
    def result(self, handle: Any, timeout: float) -> Any: ...


class EmqFlows:
    """``emq.chord`` / ``emq.chain``: one REQUEST with the graph; the broker runs it."""

    def __init__(self) -> None:
        import django

        django.setup()
        import emq_django as emq
        from bench import emq_bench_tasks

        self.emq, self.t = emq, emq_bench_tasks

    def chord(self, n: int) -> Any:
        members = [self.t.wf_noop.s() for _ in range(n)]
        return self.emq.chord(members, self.t.wf_count.s()).delay()

    def chain(self, n: int) -> Any:
        rest = [self.t.wf_add_one.s() for _ in range(n - 1)]
        return self.emq.chain(self.t.wf_add_one.s(0), *rest).delay()

    def result(self, handle: Any, timeout: float) -> Any:
        return handle.get(timeout=timeout)


class CeleryFlows:
    """Celery's canvas: ``chord(header)(callback)`` (its counter and the members'
    results in the Redis result backend), ``chain(...).apply_async()`` (each
    message carries the rest of the chain)."""

    def __init__(self) -> None:
        from celery import chain, chord

        from bench import celery_app

        self.m, self._chain, self._chord = celery_app, chain, chord

    def chord(self, n: int) -> Any:
        members = [self.m.wf_noop.s() for _ in range(n)]
        return self._chord(members)(self.m.wf_count.s())

    def chain(self, n: int) -> Any:
        rest = [self.m.wf_add_one.s() for _ in range(n - 1)]
        return self._chain(self.m.wf_add_one.s(0), *rest).apply_async()

    def result(self, handle: Any, timeout: float) -> Any:
        return handle.get(timeout=timeout)


class DramatiqFlows:
    """Dramatiq's composition: a ``group`` with a completion callback (the
    GroupCallbacks middleware; the callback reads the members' results from the
    Results backend, bench/dramatiq_app.py), and a ``pipeline`` (each message
    carries the rest of it, nested)."""

    def __init__(self) -> None:
        import dramatiq

        from bench import dramatiq_app

        self.m, self.dramatiq = dramatiq_app, dramatiq

    def chord(self, n: int) -> Any:
        run = uuid.uuid4().hex
        members = [self.m.wf_member(run, i) for i in range(n)]
        callback = self.m.wf_count.message(run, n)
        chord = self.dramatiq.group(members)
        chord.add_completion_callback(callback)
        chord.run()
        return callback

    def chain(self, n: int) -> Any:
        # no argument of their own: the pipeline gives each the previous result
        rest = [self.m.wf_add_one.message_with_options() for _ in range(n - 1)]
        pipe = self.dramatiq.pipeline([self.m.wf_add_one.message(0), *rest])
        return pipe.run()

    def result(self, handle: Any, timeout: float) -> Any:
        # in slices of 4 s: redis-py's default socket timeout is 5 s, and a blocking
        # BRPOPLPUSH for longer fails with "Timeout reading from socket"
        from dramatiq.results import ResultTimeout

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return handle.get_result(block=True, timeout=int(min(4.0, max(left, 1.0)) * 1000))
            except ResultTimeout:
                if left <= 4.0:
                    raise

    def close(self) -> None:
        self.m.broker.close()


FLOWS: dict[str, Callable[[], Flows]] = {
    "emq": EmqFlows,
    "celery": CeleryFlows,
    "dramatiq": DramatiqFlows,
}


def measure(
    flows: Flows, kind: str, n: int, limit: float, roles: dict[str, list[int]]
) -> dict[str, Any]:
    """One workflow of ``n``, timed from its first signature to its result here;
    CPU of every role over that time (bench/clients.py's ``CpuWindow``)."""
    out: dict[str, Any] = {"n": n}
    sent = 0.0
    with CpuWindow(roles) as w:
        try:
            handle = getattr(flows, kind)(n)
            sent = time.perf_counter() - w.t0
            value = flows.result(handle, limit)
        except Exception as exc:  # a peer's failure is a figure too
            value, out["error"] = None, f"{type(exc).__name__}: {exc}"[:2000]
    if "error" not in out and value != n:
        out["error"] = f"wrong result: {value!r}, expected {n}"
    out["sent_s"] = sent  # until the send returned (0: it raised)
    out["seconds"] = w.elapsed
    if "error" in out:
        return out
    out["per_s"] = n / w.elapsed
    by_role = {g: v / n * 1e6 for g, v in w.cpu.items()}
    out["cpu_us_per_step_by_role"] = by_role
    out["cpu_us_per_step"] = sum(by_role.values())
    out["other_load_cores"] = w.other / w.elapsed
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("system", choices=sorted(FLOWS))
    ap.add_argument("--kind", choices=["chord", "chain"], required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds to wait for the result")
    ap.add_argument("--pid", action="append", default=[], help="ROLE:PID of a server process tree")
    opts = ap.parse_args(argv)
    roles: dict[str, list[int]] = {}
    for item in opts.pid:
        role, pid = item.split(":")
        roles.setdefault(role, []).append(int(pid))

    flows = FLOWS[opts.system]()
    try:
        for kind, n in WARM_UP.items():
            warm = measure(flows, kind, n, WARM_UP_LIMIT, roles)
            if "error" in warm:
                raise RuntimeError(f"warm-up {kind} of {n}: {warm['error']}")
        result = measure(flows, opts.kind, opts.n, opts.limit, roles)
    finally:
        close = getattr(flows, "close", None)
        if close is not None:
            close()
    result.update(system=opts.system, kind=opts.kind)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
