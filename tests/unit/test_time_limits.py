"""The broker ends an attempt that has run past its time limit and a grace with no
answer, whoever runs it (issue 29, item 5): an EventMQ job manager whose worker
process died sends no REPLY and stays connected. The core with its eMQP ports, no
sockets, a fake clock."""

from __future__ import annotations

import json
from typing import Any

from emq_django.protocol import Reply
from emq_django.protocol.frames import Kill
from tests.emqp_machine import BACKEND, FRONTEND
from tests.unit.test_broker_core import (
    MANAGER,
    inform,
    make_core,
    ready,
    reply,
    request,
    requests_to,
    sent_to,
    slot_meta,
    take,
    tick,
)

GRACE = 10.0  # BrokerConfig's default time_limit_grace
LIMITED = b"reply-requested,timeout:3,retry-count:1"


def replies(out: Any) -> list[Reply]:
    return [c for c in sent_to(out, FRONTEND, b"client") if isinstance(c, Reply)]


def run_clock(core: Any, start: float, end: float, alive: tuple[bytes, ...]) -> Any:
    out = []
    now = start
    while now <= end:
        out += tick(core, now, keep_alive=alive)
        now += 0.5
    return out


def test_an_eventmq_attempt_with_no_reply_ends_past_its_time_limit_and_grace() -> None:
    core = make_core()
    inform(core, b"legacy")
    ready(core, b"legacy")
    request(core, b"client", b"j", headers=LIMITED)
    out = run_clock(core, 0.5, 3.0 + GRACE - 0.5, alive=(b"legacy",))
    assert b"j#1" in core.inflight and not replies(out)  # within the grace: it may answer
    out = run_clock(core, 3.0 + GRACE, 3.0 + GRACE + 1.0, alive=(b"legacy",))
    assert b"j#1" not in core.inflight and not replies(out)  # a time-out: retried once
    assert core.counters["time_limits"] == 1 and core.counters["retried"] == 1
    # its job manager started another worker process, which says READY
    ready(core, b"legacy", now=16.0)
    out = run_clock(core, 16.0, 16.0 + 3.0 + GRACE + 1.0, alive=(b"legacy",))
    (answer,) = replies(out)
    error = json.loads(answer.body)["error"]
    assert error["type"] == "TimeoutError" and "time limit of 3 s" in error["message"]
    assert core.counters["time_limits"] == 2 and core.counters["failed"] == 1
    assert not core.inflight
    # the REPLY that comes at last is stale
    reply(core, b"legacy", b"j#1", now=40.0)
    assert core.counters["stale_replies"] == 1


def test_a_job_sent_ahead_to_our_worker_process_is_timed_from_when_it_can_start() -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0", times=2)
    request(core, b"client", b"j1", headers=LIMITED)
    request(core, b"client", b"j2", headers=LIMITED)
    # j1 runs 10 s (within its limit and the grace), then j2: not timed out meanwhile
    run_clock(core, 0.5, 10.0, alive=(b"mgr", b"slot0"))
    reply(core, b"slot0", b"j1#1", status=b"ok", now=10.0)
    out = run_clock(core, 10.5, 20.0, alive=(b"mgr", b"slot0"))
    assert core.counters["time_limits"] == 0 and b"j2#1" in core.inflight
    # j2 never answers: ended past 10 + 3 + grace; its job manager is asked to kill it
    out = run_clock(core, 20.5, 10.0 + 3.0 + GRACE + 3.0, alive=(b"mgr", b"slot0"))
    assert core.counters["time_limits"] == 1 and b"j2#1" not in core.inflight
    kills = [c for c in sent_to(out, BACKEND, b"mgr") if isinstance(c, Kill)]
    assert [k.attempt_id for k in kills] == [b"j2#1"]
    assert not requests_to(out, b"slot0")


def test_attempts_without_a_time_limit_are_never_ended_by_the_broker() -> None:
    core = make_core()
    inform(core, b"legacy")
    ready(core, b"legacy")
    request(core, b"client", b"j", headers=b"reply-requested")
    run_clock(core, 0.5, 60.0, alive=(b"legacy",))
    assert b"j#1" in core.inflight and core.counters["time_limits"] == 0
    take(core)
