"""Issue 35's job manager page: jobs failed and memory per job manager in the
monitor's entry. The core through its eMQP ports (tests/emqp_machine.py), frames
in, a fake clock: ``jobs_done`` counts every finished attempt and ``jobs_failed``
those that failed, timed out or lost their process; the memory report rides on
our job manager's HEARTBEAT (protocol/memory_report.py)."""

from __future__ import annotations

import pytest

from emq_django.broker import monitor
from emq_django.exceptions import ProtocolError
from emq_django.protocol import PROTOCOL, decode
from emq_django.protocol.memory_report import decode_memory, encode_memory
from tests.emqp_machine import EmqpMachine
from tests.unit.test_broker_core import MANAGER, inform, make_core, ready, reply, request, slot_meta
from tests.unit.test_time_limits import GRACE, run_clock

LIMITED = b"timeout:3"


def entries(core: EmqpMachine, now: float = 0.0) -> dict[str, dict]:
    doc = monitor.snapshot(core.core, now, 1_700_000_000.0 + now, {})
    return {e["identity"]: e for e in doc["job_managers"]}


def test_failed_attempts_count_per_job_manager_beside_the_done_ones() -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    inform(core, b"legacy", b'[[10, "other"]]')
    ready(core, b"slot0", times=3)
    ready(core, b"legacy", times=2)
    for job in (b"ok", b"bad", b"slow"):
        request(core, b"client", job, headers=LIMITED if job == b"slow" else b"")
    request(core, b"client", b"theirs-ok", queue=b"other")
    request(core, b"client", b"theirs-bad", queue=b"other")
    reply(core, b"slot0", b"ok#1")
    reply(core, b"slot0", b"bad#1", status=b"failed,ready")
    reply(core, b"legacy", b"theirs-ok#1")
    reply(core, b"legacy", b"theirs-bad#1", status=b"failed,ready")
    ours = entries(core)["jm1"]
    assert (ours["jobs_done"], ours["jobs_failed"]) == (2, 1)
    theirs = entries(core)["legacy"]
    assert (theirs["jobs_done"], theirs["jobs_failed"]) == (2, 1)
    # "slow" never answers: past its time limit and the grace, a failed attempt
    run_clock(core, 0.5, 3.0 + GRACE + 5.0, alive=(b"mgr", b"slot0", b"legacy"))
    assert core.counters["time_limits"] == 1
    ours = entries(core)["jm1"]
    assert (ours["jobs_done"], ours["jobs_failed"]) == (3, 2)


def test_a_lost_process_counts_failed_and_the_figures_go_with_the_manager() -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0")
    request(core, b"client", b"j")
    # its job manager says the process died running it
    reply(core, b"mgr", b"j#1", status=b"failed,lost")
    assert (entries(core)["jm1"]["jobs_done"], entries(core)["jm1"]["jobs_failed"]) == (1, 1)
    key = core.core.managers and next(iter(core.core.managers))
    assert core.core.failed_by_manager == {key: 1}
    core.on_backend(b"mgr", [b"", PROTOCOL, b"DISCONNECT", b"bye"], 1.0)
    core.on_backend(b"slot0", [b"", PROTOCOL, b"DISCONNECT", b"bye"], 1.0)
    assert core.core.failed_by_manager == {} and core.core.done_by_manager == {}


def beat(core: EmqpMachine, ident: bytes, report: bytes | None, now: float = 1.0) -> None:
    frames = [b"", PROTOCOL, b"HEARTBEAT", ident + b"-hb", b"%f" % now]
    if report is not None:
        frames.append(report)
    core.on_backend(ident, frames, now)


def test_memory_rides_on_our_job_managers_heartbeat_and_the_last_is_kept() -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    inform(core, b"legacy", b'[[10, "other"]]')
    assert entries(core)["jm1"]["memory_bytes"] is None  # not reported yet
    beat(core, b"mgr", encode_memory(50_000_000, {4242: 80_000_000, 4243: 70_000_000}))
    ours = entries(core)["jm1"]
    assert ours["memory_bytes"] == 200_000_000
    assert ours["memory"] == {
        "job_manager": 50_000_000,
        "processes": {"4242": 80_000_000, "4243": 70_000_000},
    }
    beat(core, b"mgr", None, now=2.0)  # a heartbeat with no report: the last one stays
    assert entries(core)["jm1"]["memory_bytes"] == 200_000_000
    beat(core, b"legacy", None)  # EventMQ's sends none
    assert entries(core)["legacy"]["memory_bytes"] is None
    assert core.counters["protocol_errors"] == 0


@pytest.mark.parametrize(
    "report",
    [b"not json", b'{"rss": -1}', b'{"rss": 1, "processes": {"x": 2}}', b"{" + b" " * 20000 + b"}"],
)
def test_a_bad_memory_report_is_refused_with_its_reason(report: bytes) -> None:
    with pytest.raises(ProtocolError, match="memory report"):
        decode_memory(report, [])
    with pytest.raises(ProtocolError, match="memory report"):
        decode([b"", PROTOCOL, b"HEARTBEAT", b"m", b"1.0", report])
