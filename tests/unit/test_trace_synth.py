"""Synthetic traces: the broker's format, time order, hourly files, every outcome."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from emq_django.analytics.synth import SynthConfig, generate, write_trace

START = 1_772_359_000.0  # 2026-03-01 09:56:40 UTC
FIELDS = {"ts", "event", "job", "attempt", "task", "queue", "jm"}


def events(jobs: int = 3000, **kw: object) -> list[dict]:
    cfg = SynthConfig(jobs=jobs, start=START, rate=20.0, seed=3, **kw)  # type: ignore[arg-type]
    return [json.loads(line) for _, line in generate(cfg)]


def test_events_are_in_time_order_and_in_the_trace_format():
    evs = events()
    assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)
    for e in evs:
        assert FIELDS <= e.keys()
        if e["event"] == "dispatched":
            assert e["wait_us"] >= 0
        if e["event"] in ("succeeded", "failed", "timed_out"):
            assert 0 < e["run_us"] <= e["total_us"]
        if e["event"] == "timed_out":
            assert e["error"] == "TimeoutError"
        if e["event"] == "retried":
            assert e["delay_us"] > 0 and e["error"]
        assert (e["jm"] is None) == (e["event"] == "enqueued")


def test_every_kind_of_event_appears_and_attempts_follow_retries():
    evs = events(requeue_rate=0.01)
    kinds = Counter(e["event"] for e in evs)
    assert set(kinds) == {
        "enqueued",
        "dispatched",
        "succeeded",
        "failed",
        "timed_out",
        "requeued",
        "retried",
        "dead_lettered",
    }
    assert len({e["queue"] for e in evs}) >= 4 and None in {e["task"] for e in evs}
    by_job = defaultdict(list)
    for e in evs:
        by_job[e["job"]].append(e)
    for job_events in by_job.values():
        dispatches = [e["attempt"] for e in job_events if e["event"] == "dispatched"]
        assert dispatches == list(range(1, len(dispatches) + 1))
        assert job_events[0]["event"] == "enqueued"
        assert job_events[-1]["event"] in ("succeeded", "failed", "timed_out", "dead_lettered")


def test_same_seed_same_trace_and_drop_rate_loses_events():
    assert events(200) == events(200)
    assert len(events(2000, drop_rate=0.1)) < 0.95 * len(events(2000))


def test_write_trace_splits_by_utc_hour(tmp_path: Path):
    cfg = SynthConfig(jobs=2000, start=START, rate=5.0, seed=1)  # 400 s across 10:00
    counts = write_trace(generate(cfg), tmp_path)
    assert sorted(counts) == ["trace-20260301-09.jsonl", "trace-20260301-10.jsonl"]
    for name, n in counts.items():
        lines = (tmp_path / name).read_text().splitlines()
        assert len(lines) == n
        hour = int(name[-8:-6])
        assert {(json.loads(x)["ts"] // 3_600_000_000) % 24 for x in lines} == {hour}


# ---- the synthetic lines are the broker's ----------------------------------------


class Scripted:
    """A random source that tells each story: ``random()`` gives these values in
    turn (below the rates: a requeue, a failure), every time is 10 ms."""

    def __init__(self, randoms: list[float]) -> None:
        self.randoms = list(randoms)

    def random(self) -> float:
        return self.randoms.pop(0)

    def lognormvariate(self, mu: float, sigma: float) -> float:
        return 0.01

    def choice(self, seq: Any) -> Any:
        return seq[0]


def synth_story(randoms: list[float], retries: int, timeout: float = 0.0) -> list[dict]:
    from emq_django.analytics.synth import TaskProfile, _Job

    profile = TaskProfile(
        "pkg.tasks.add", "default", 1, 0.01, 0.0, 0.5, ("ValueError",), retries, timeout
    )
    cfg = SynthConfig(jobs=1, start=START, requeue_rate=0.5, managers={"default": ("jm-1",)})
    lines = _Job(cfg, Scripted(randoms), profile, "j1").build(int(START * 1e6))  # type: ignore[arg-type]
    return [json.loads(line) for _, line in lines]


def broker_story(steps: list[bytes], retries: int) -> list[dict]:
    """The broker core's trace of one job whose attempts end as ``steps`` says:
    a worker status, or b"lost" (its delivery could not leave: requeued)."""
    from emq_django.broker.ports.emqp_workers import outcome_of
    from tests.unit.test_lifecycle import (
        W,
        dispatched,
        inform,
        make_core,
        ready,
        reply,
        request,
        tick,
    )

    core = make_core(trace=True)
    inform(core, W)
    ready(core, W, times=len(steps))
    headers = b"task:pkg.tasks.add" + (b",retry-count:%d" % retries if retries else b"")
    attempt = dispatched(request(core, b"client", b"j1", headers=headers))
    now = 0.0
    for step in steps:
        assert len(attempt) == 1, attempt
        now += 1.0
        if step == b"lost":
            core.worker_unsent(core.peers[W], attempt[0], now)
            out = ready(core, W, now=now)
        else:
            out = reply(core, W, attempt[0], outcome_of(step), now=now)  # the port's codec
        attempt = dispatched(out)
        if not attempt and len(core.delayed):
            now = core.delayed.next_due()
            attempt = dispatched(tick(core, now))
    assert core.trace is not None
    return [json.loads(line) for line in core.trace]


def shape(lines: list[dict]) -> list[tuple]:
    """What must agree: each line's fields in order, its event, attempt, error and
    the end-of-job fields (times, ids and names differ)."""
    return [
        (
            tuple(e),
            e["event"],
            e["attempt"],
            e.get("error"),
            e.get("final"),
            e.get("retries"),
            e.get("requeues"),
        )
        for e in lines
    ]


FAIL = b"failed,ready,error:ValueError"
OK = b"ok,ready"
TIMEOUT = b"failed,ready,error:TimeoutError"


@pytest.mark.parametrize(
    ("steps", "randoms", "retries", "timeout"),
    [
        # (broker statuses, synth's random values: requeue?, then fail? per attempt)
        ([OK], [0.9, 0.9], 0, 0.0),
        ([FAIL, FAIL, OK], [0.9, 0.1, 0.9, 0.1, 0.9, 0.9], 2, 0.0),
        ([FAIL, FAIL], [0.9, 0.1, 0.9, 0.1], 1, 0.0),
        ([FAIL], [0.9, 0.1], 0, 0.0),
        ([TIMEOUT], [0.9], 0, 0.001),
        ([TIMEOUT, TIMEOUT], [0.9, 0.9], 1, 0.001),
        ([b"lost", OK], [0.1, 0.9, 0.9], 0, 0.0),
        ([b"lost", FAIL, OK], [0.1, 0.9, 0.1, 0.9, 0.9], 1, 0.0),
    ],
    ids=[
        "ok",
        "retried-ok",
        "dead-lettered",
        "failed",
        "timed-out",
        "timeouts-dead",
        "requeued-ok",
        "requeued-retried-ok",
    ],
)
def test_synthetic_jobs_are_traced_as_the_broker_traces_them(
    steps: list[bytes], randoms: list[float], retries: int, timeout: float
) -> None:
    broker = broker_story(steps, retries)
    assert shape(synth_story(randoms, retries, timeout)) == shape(broker)
    last = broker[-1]
    assert last["final"] is True and last["event"] in (
        "succeeded",
        "failed",
        "timed_out",
        "dead_lettered",
    )
    assert sum(e.get("final") is True for e in broker) == 1
