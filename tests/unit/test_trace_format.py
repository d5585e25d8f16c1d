"""The trace writer's hand-built JSON lines equal json.dumps of docs/trace-format.md's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emq_django.broker import trace


def reference(
    event: tuple[Any, ...],
    wall_offset: float,
    final: bool | None = None,
    retries: int = 0,
    requeues: int = 0,
) -> str:
    kind, now, job_id, attempt, queue, task, manager, error, enqueued, dispatched, extra = event

    def us(seconds: float) -> int:
        return int(round(seconds * 1_000_000))

    line: dict[str, Any] = {
        "ts": us(now + wall_offset),
        "event": kind,
        "job": job_id.decode("utf-8", "replace"),
        "attempt": attempt,
        "task": task or None,
        "queue": queue,
        "jm": manager or None,
    }
    if kind == "dispatched":
        line["wait_us"] = us(now - enqueued)
    elif kind in ("succeeded", "failed", "timed_out", "dead_lettered"):
        line["run_us"] = us(now - dispatched)
        line["total_us"] = us(now - enqueued)
    elif kind == "retried":
        line["delay_us"] = us(extra)
    if final is not None:
        line["final"] = final
        if final and retries:
            line["retries"] = retries
        if final and requeues:
            line["requeues"] = requeues
    if error:
        line["error"] = error
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False)


def event(kind: str, job: bytes = b"3e174d1ddf5500000001", **kw: Any) -> tuple[Any, ...]:
    values: dict[str, Any] = {
        "now": 12.5,
        "attempt": 1,
        "queue": "default",
        "task": "project.demo.tasks.noop",
        "manager": "vm:28008",
        "error": "",
        "enqueued": 12.25,
        "dispatched": 12.375,
        "extra": 0.0,
    }
    values.update(kw)
    return (
        kind,
        values["now"],
        job,
        values["attempt"],
        values["queue"],
        values["task"],
        values["manager"],
        values["error"],
        values["enqueued"],
        values["dispatched"],
        values["extra"],
    )


def format_event(
    ev: tuple[Any, ...],
    wall_offset: float,
    final: bool | None = None,
    retries: int = 0,
    requeues: int = 0,
) -> str:
    """The broker's general formatter, given one event tuple."""
    kind, now, job_id, attempt, queue, task, manager, error, enqueued, dispatched, extra = ev
    job, where = trace.job_json(job_id), trace.where_fields(task, queue, manager)
    return trace.format_line(
        kind,
        now,
        wall_offset,
        job,
        attempt,
        where,
        error,
        enqueued,
        dispatched,
        extra,
        0,
        final,
        retries,
        requeues,
    )


def formatted(events: list[tuple[Any, ...]], wall_offset: float) -> list[str]:
    return [format_event(e, wall_offset) for e in events]


@pytest.mark.parametrize(
    "ev",
    [
        event("enqueued", attempt=0, manager=""),
        event("dispatched"),
        event("succeeded"),
        event("failed", error="pkg.mod.Error"),
        event("timed_out", error="TimeoutError"),
        event("requeued", error="PeerLost"),
        event("retried", error="ValueError", extra=1.5),
        event("dead_lettered", error="ValueError"),
        event("enqueued", task="", manager="", queue=""),
        event("failed", job=b'we"ird\\id\xff', queue='q"ü', task="a.b\n", manager="jm\t1"),
    ],
)
def test_line_equals_json_dumps(ev: tuple[Any, ...]) -> None:
    line = format_event(ev, 1.795e9)
    assert line == reference(ev, 1.795e9)
    assert json.loads(line)["event"] == ev[0]


@pytest.mark.parametrize(
    ("ev", "final", "retries", "requeues"),
    [
        (event("succeeded"), True, 0, 0),
        (event("succeeded", attempt=4), True, 2, 1),
        (event("failed", error="ValueError"), True, 0, 0),
        (event("timed_out", error="TimeoutError", attempt=3), False, 2, 0),
        (event("dead_lettered", error="TimeoutError", attempt=3), True, 2, 0),
        (event("cancelled", attempt=2), True, 0, 1),
    ],
)
def test_lines_that_end_an_attempt_say_whether_they_end_the_job(
    ev: tuple[Any, ...], final: bool, retries: int, requeues: int
) -> None:
    line = format_event(ev, 1.795e9, final, retries, requeues)
    assert line == reference(ev, 1.795e9, final, retries, requeues)
    doc = json.loads(line)
    assert doc["final"] is final
    assert doc.get("retries", 0) == (retries if final else 0)


def fast_line(ev: tuple[Any, ...], wall_offset: float) -> str:
    """The broker's faster path for the three lines every job has."""
    kind, now, job_id, attempt, queue, task, manager, error, enqueued, dispatched, extra = ev
    job, where = trace.job_json(job_id), trace.where_fields(task, queue, manager)
    wall = now + wall_offset
    if kind == "enqueued":
        return trace.enqueued_line(wall, job, attempt, where)
    if kind == "dispatched":
        return trace.dispatched_line(wall, job, attempt, where, now - enqueued)
    assert kind == "succeeded"
    retries, requeues = extra
    return trace.succeeded_line(
        wall, job, attempt, where, now - dispatched, now - enqueued, 0, retries, requeues
    )


@pytest.mark.parametrize("kind", ["enqueued", "dispatched", "succeeded"])
@given(
    job=st.binary(min_size=1, max_size=30),
    text=st.text(max_size=20),
    now=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    attempt=st.integers(min_value=0, max_value=1000),
    counts=st.tuples(st.integers(0, 3), st.integers(0, 3)),
)
def test_the_fast_lines_equal_the_reference(
    kind: str, job: bytes, text: str, now: float, attempt: int, counts: tuple[int, int]
) -> None:
    ev = event(kind, job=job, queue=text, task=text, manager=text, now=now, attempt=attempt)
    if kind != "succeeded":
        assert fast_line(ev, 1.795e9) == reference(ev, 1.795e9)
        return
    # a succeeded line always ends its job: final, and the job's counts
    line = fast_line(ev[:-1] + (counts,), 1.795e9)
    assert line == reference(ev, 1.795e9, True, *counts)


@given(
    job=st.binary(min_size=1, max_size=30),
    text=st.text(max_size=20),
    now=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_any_strings_make_valid_json(job: bytes, text: str, now: float) -> None:
    ev = event("failed", job=job, queue=text, task=text, manager=text, error=text, now=now)
    assert format_event(ev, 1.795e9) == reference(ev, 1.795e9)


def test_writer_appends_lines_to_the_hours_file(tmp_path: Path) -> None:
    writer = trace.TraceWriter(tmp_path)
    writer.write(formatted([event("enqueued", attempt=0), event("dispatched")], 1.795e9))
    writer.write([])
    writer.write(formatted([event("succeeded")], 1.795e9))
    writer.close()
    (name,) = [p.name for p in tmp_path.iterdir()]
    assert name.startswith("trace-") and name.endswith(".jsonl")
    lines = (tmp_path / name).read_text().splitlines()
    assert [json.loads(x)["event"] for x in lines] == ["enqueued", "dispatched", "succeeded"]
    assert writer.written == 3 and writer.dropped == 0


def test_writer_starts_a_new_file_each_hour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_795_222_799.5]  # 30 min past some hour, minus half a second
    monkeypatch.setattr(trace.time, "time", lambda: clock[0])
    writer = trace.TraceWriter(tmp_path)
    writer.write(formatted([event("enqueued", attempt=0)], 0.0))
    clock[0] += 3600
    writer.write(formatted([event("dispatched")], 0.0))
    writer.close()
    assert len(list(tmp_path.iterdir())) == 2


@pytest.mark.parametrize(
    ("identity", "shown"),
    [
        (b"7f3e2a10-1b2c-4d5e-8f90-a1b2c3d4e5f6", "7f3e2a10-1b2c-4d5e-8f90-a1b2c3d4e5f6"),
        (b"jm-1", "jm-1"),
        (b"\x00k\x8bEg", "006b8b4567"),  # libzmq's own identity
        ("é".encode(), "c3a9"),
    ],
)
def test_a_peer_is_named_alike_in_the_trace_and_the_monitor(identity: bytes, shown: str) -> None:
    """An EventMQ job manager's identity (a uuid4 string) that starts with a digit was
    hex in the trace and text in emq_status (issue 29, item 18)."""
    from emq_django.broker.state import show_identity

    assert show_identity(identity) == shown
