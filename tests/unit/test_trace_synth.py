"""Synthetic traces: the broker's format, time order, hourly files, every outcome."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

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
