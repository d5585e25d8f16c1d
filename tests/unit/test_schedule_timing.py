"""``timing``: first runs, catch-up policies, interval phase; ``keys`` and ``inbound``:
EventMQ's schedule key and the SCHEDULE/UNSCHEDULE frames it sends. All pure."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from emq_django.exceptions import ProtocolError
from emq_django.protocol import frames as F
from emq_django.protocol.headers import parse_headers
from emq_django.scheduler.cron import CronError
from emq_django.scheduler.inbound import schedule_spec, unschedule_name
from emq_django.scheduler.keys import schedule_key, task_key
from emq_django.scheduler.timing import (
    CATCH_UP_ALL,
    CATCH_UP_NONE,
    CATCH_UP_ONCE,
    MAX_CATCH_UP,
    Due,
    Timing,
    first_run,
    on_due,
    tick_times,
)

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)


# ---- Timing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "not both or neither"),
        ({"interval": 5, "cron": "* * * * *"}, "not both or neither"),
        ({"interval": 0}, "must be > 0"),
        ({"interval": -1}, "must be > 0"),
        ({"cron": "* * *"}, "needs 5"),
        ({"interval": 5, "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ],
)
def test_timing_rejects(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Timing(**kwargs)  # type: ignore[arg-type]


def test_bad_cron_is_a_cron_error() -> None:
    with pytest.raises(CronError):
        Timing(cron="99 * * * *")


def test_timing_key_changes_with_timing_only() -> None:
    assert Timing(interval=5).key == Timing(interval=5.0).key
    assert Timing(interval=5).key != Timing(interval=6).key
    assert Timing(cron="0 * * * *").key != Timing(cron="0 * * * *", timezone="Europe/Berlin").key


@pytest.mark.parametrize(
    ("timing", "nohaste", "expected"),
    [
        (Timing(interval=1), False, T0),
        (Timing(interval=1), True, T0 + S),
        (Timing(interval=3600), True, T0 + 3600 * S),
        # a cron schedule waits for its next match, nohaste or not (issue 29 item 8)
        (Timing(cron="*/5 * * * *"), False, T0 + 300 * S),
        (Timing(cron="0 9 * * *", timezone="Europe/Berlin"), False, T0 + dt.timedelta(hours=19)),
        (Timing(cron="*/5 * * * *"), True, T0 + 300 * S),
        (Timing(cron="0 9 * * *", timezone="Europe/Berlin"), True, T0 + dt.timedelta(hours=19)),
    ],
)
def test_first_run(timing: Timing, nohaste: bool, expected: dt.datetime) -> None:
    assert first_run(timing, T0, nohaste) == expected


# ---- on_due: catch-up policies ------------------------------------------------------

EVERY_1 = Timing(interval=1)


@pytest.mark.parametrize(
    ("due", "now", "policy", "runs", "next_run", "missed"),
    [
        # on time (a little late): one run, next tick keeps the phase
        (T0, T0 + 0.2 * S, CATCH_UP_ONCE, 1, T0 + S, 0),
        (T0, T0 + 0.2 * S, CATCH_UP_NONE, 1, T0 + S, 0),
        (T0, T0 + 0.2 * S, CATCH_UP_ALL, 1, T0 + S, 0),
        (T0, T0, CATCH_UP_ONCE, 1, T0 + S, 0),
        # 10 s down: 11 ticks in [due, now]
        (T0, T0 + 10.5 * S, CATCH_UP_ONCE, 1, T0 + 11 * S, 10),
        (T0, T0 + 10.5 * S, CATCH_UP_NONE, 1, T0 + 11 * S, 10),  # tick T0+10 is current
        (T0, T0 + 10.5 * S, CATCH_UP_ALL, 11, T0 + 11 * S, 0),
        # back just before a tick: the catch-up run absorbs it (no two runs at once)
        (T0, T0 + 10.99 * S, CATCH_UP_ONCE, 1, T0 + 12 * S, 11),
        (T0, T0 + 10.6 * S, CATCH_UP_ONCE, 1, T0 + 12 * S, 11),
        (T0, T0 + 10.4 * S, CATCH_UP_ONCE, 1, T0 + 11 * S, 10),
        # on time, just before the next tick: no catch-up, nothing absorbed
        (T0, T0 + 0.9 * S, CATCH_UP_ONCE, 1, T0 + S, 0),
    ],
)
def test_on_due_interval(
    due: dt.datetime,
    now: dt.datetime,
    policy: str,
    runs: int,
    next_run: dt.datetime,
    missed: int,
) -> None:
    assert on_due(EVERY_1, due, now, policy) == Due(runs, next_run, missed)


def test_on_due_none_skips_all_when_even_the_latest_tick_is_late() -> None:
    plan = on_due(EVERY_1, T0, T0 + 10.5 * S, CATCH_UP_NONE, grace=0.3 * S)
    assert plan == Due(0, T0 + 11 * S, 11)


def test_on_due_interval_keeps_phase_over_long_outages() -> None:
    plan = on_due(Timing(interval=60), T0, T0 + dt.timedelta(days=3, seconds=7))
    assert plan.runs == 1
    assert plan.next_run == T0 + dt.timedelta(days=3, seconds=60)


def test_on_due_all_is_capped() -> None:
    plan = on_due(EVERY_1, T0, T0 + 5000 * S, CATCH_UP_ALL)
    assert plan.runs == MAX_CATCH_UP
    assert plan.next_run == T0 + 5001 * S


def test_on_due_cron() -> None:
    every5 = Timing(cron="*/5 * * * *")
    assert on_due(every5, T0, T0 + S) == Due(1, T0 + 300 * S, 0)
    # down from 12:00 to 12:31: ticks 12:00 .. 12:30 (7), one run, next 12:35
    assert on_due(every5, T0, T0 + 31 * 60 * S) == Due(1, T0 + 35 * 60 * S, 6)
    assert on_due(every5, T0, T0 + 31 * 60 * S, CATCH_UP_ALL).runs == 7
    assert on_due(every5, T0, T0 + 31 * 60 * S, CATCH_UP_NONE).runs == 0


def test_on_due_rejects_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown catch-up policy 'sometimes'"):
        on_due(EVERY_1, T0, T0, "sometimes")


# ---- EventMQ's schedule key -------------------------------------------------------


def test_schedule_key_matches_eventmq() -> None:
    """The example in docs/eventmq-wire.md, checked against ``Scheduler.schedule_hash``."""
    key = schedule_key("tasks_pkg.demo.tasks", "add", [1, 2], {}, [], {})
    assert key == "3d88375035ec5edf64fbcee5957ce82b4e6f8d07"
    assert task_key("tasks_pkg.demo.tasks.add", [1, 2]) == key


def test_schedule_key_depends_on_the_call_only() -> None:
    assert task_key("a.b", [1]) != task_key("a.b", [2])
    assert task_key("a.b", [], {"x": 1}) != task_key("a.b", [], {"x": 2})
    assert task_key("a.b", [], {"x": 1, "y": 2}) == task_key("a.b", [], {"y": 2, "x": 1})


def test_schedule_key_against_eventmq_itself() -> None:
    scheduler = pytest.importorskip("eventmq.scheduler", reason="make test installs eventmq")
    pytest.importorskip("redis", reason="EventMQ's scheduler module imports redis")
    body = json.dumps(
        [
            "run",
            {
                "callable": "f",
                "path": "p.q",
                "args": ["é", 1.5],
                "kwargs": {"k": [1]},
                "class_args": [],
                "class_kwargs": {},
            },
        ]
    )
    theirs = scheduler.Scheduler.schedule_hash(["default", "", "1", body, ""])
    assert theirs == schedule_key("p.q", "f", ["é", 1.5], {"k": [1]})


# ---- SCHEDULE / UNSCHEDULE frames ---------------------------------------------------


def body(
    path: str = "pkg.tasks", name: str = "add", args: list[object] | None = None, **extra: object
) -> bytes:
    spec = {
        "callable": name,
        "path": path,
        "args": args or [1, 2],
        "kwargs": {},
        "class_args": [],
        "class_kwargs": {},
        **extra,
    }
    return json.dumps(["run", spec]).encode()


def nine(
    cmd: bytes,
    headers: bytes,
    interval: bytes,
    cron: bytes = b"",
    queue: bytes = b"default",
    b: bytes | None = None,
) -> F.Schedule:
    decoded = F.decode([b"", b"eMQP/1.0", cmd, b"m1", queue, headers, interval, b or body(), cron])
    assert isinstance(decoded, F.Schedule)
    return decoded


def test_nine_frame_interval_schedule() -> None:
    spec = schedule_spec(nine(b"SCHEDULE", b"guarantee", b"60", queue=b"email"))
    assert spec.name == task_key("pkg.tasks.add", [1, 2])
    assert spec.task == "pkg.tasks.add"
    assert spec.timing == Timing(interval=60)
    assert (spec.queue, spec.guarantee, spec.nohaste, spec.max_runs) == ("email", True, False, None)
    assert spec.args == [1, 2]


def test_nine_frame_cron_schedule_with_headers() -> None:
    cmd = nine(
        b"SCHEDULE",
        b"nohaste,retry-count:2,timeout:30,run_count:5,tz:Europe/Berlin",
        b"-1",
        b"*/5 * * * *",
    )
    spec = schedule_spec(cmd, "UTC")
    assert spec.timing == Timing(cron="*/5 * * * *", timezone="Europe/Berlin")
    assert (spec.nohaste, spec.retries, spec.timeout, spec.max_runs) == (True, 2, 30.0, 5)


def test_cron_uses_the_default_time_zone() -> None:
    spec = schedule_spec(nine(b"SCHEDULE", b"", b"-1", b"0 3 * * *"), "America/New_York")
    assert spec.timing.timezone == "America/New_York"


@pytest.mark.parametrize(
    ("headers", "b", "expected"),
    [
        (b"interval:2", body(), Timing(interval=2)),
        (b"guarantee,cron:*/5 * * * *", body(), Timing(cron="*/5 * * * *")),
        (b"", body(interval_secs=7), Timing(interval=7)),
        (b"", body(cron="0,30 * * * *"), Timing(cron="0,30 * * * *")),
    ],
)
def test_seven_frame_schedule(headers: bytes, b: bytes, expected: Timing) -> None:
    cmd = F.decode([b"", b"eMQP/1.0", b"SCHEDULE", b"m1", b"default", headers, b])
    assert isinstance(cmd, F.Schedule) and cmd.interval is None
    spec = schedule_spec(cmd)
    assert spec.timing == expected
    assert spec.name == task_key("pkg.tasks.add", [1, 2]), "extra body keys are not in the key"


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (F.Schedule(b"m", "default", parse_headers(b""), body()), "needs an 'interval:N'"),
        (F.Schedule(b"m", "default", parse_headers(b"interval:x"), body()), "not a number"),
        (F.Schedule(b"m", "default", parse_headers(b""), body(), 0, ""), "must be > 0"),
        (F.Schedule(b"m", "default", parse_headers(b""), body(), -1, "bad"), "bad schedule timing"),
        (F.Schedule(b"m", "default", parse_headers(b""), b"[1]", 5, ""), "run"),
        (F.Schedule(b"m", "default", parse_headers(b"run_count:x"), body(), 5, ""), "run_count"),
    ],
)
def test_bad_schedules_raise_protocol_error(cmd: F.Schedule, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        schedule_spec(cmd)


def test_unschedule_names_the_same_key_whatever_the_timing() -> None:
    key = task_key("pkg.tasks.add", [1, 2])
    assert unschedule_name(nine(b"UNSCHEDULE", b"guarantee", b"-1")) == key
    assert unschedule_name(nine(b"UNSCHEDULE", b"", b"60", queue=b"email")) == key
    seven = F.decode([b"", b"eMQP/1.0", b"UNSCHEDULE", b"m1", b"default", b"", body()])
    assert isinstance(seven, F.Schedule) and unschedule_name(seven) == key


def test_tick_times_are_the_ticks_a_catch_up_stands_for() -> None:
    assert tick_times(EVERY_1, T0, 3) == [T0, T0 + S, T0 + 2 * S]
    assert tick_times(Timing(cron="*/5 * * * *"), T0, 2) == [T0, T0 + 300 * S]
