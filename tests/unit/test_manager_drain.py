"""Issue 35: ``MANAGER DRAIN <name>`` on the monitor channel. A drained job manager
finishes the job it runs and gets no new one (the other job managers of the queue
take them, a recycled worker process of it too gets none); ``MANAGER RESUME`` gives
it jobs again at once. EventMQ's job managers are refused with the reason, and the
command needs the admin role."""

from __future__ import annotations

import json
from typing import Any

import pytest

from emq_django.broker.effects import Deliver
from emq_django.broker.ports.monitor import MonitorPort
from emq_django.exceptions import ProtocolError
from emq_django.security.roles import ADMIN, MONITOR
from tests.support.core_harness import CoreHarness, of_type


def ask(port: MonitorPort, request: bytes, now: float = 0.0) -> Any:
    answer = port.answer(request, now)
    assert not answer.startswith(b"ERROR"), answer
    return json.loads(answer)


def delivered_to(effects: list[Any]) -> list[bytes]:
    return [d.peer.identity for d in of_type(effects, Deliver)]


def slot(h: CoreHarness, identity: bytes, manager: str, pid: int) -> None:
    meta = {"role": "slot", "manager": manager, "pid": pid, "incarnation": "i1"}
    h.join(identity, queues=((10, "q"),), meta=meta, now=0.0)


def test_a_drained_job_manager_finishes_its_job_and_others_take_the_queue() -> None:
    h = CoreHarness()
    slot(h, b"a-1", "jm-a", 1)
    h.ready(b"a-1", now=0.0)
    assert delivered_to(h.request(b"c", b"first", queue="q", now=1.0)) == [b"a-1"]
    port = MonitorPort(h.core)
    doc = ask(port, b"MANAGER DRAIN jm-a", now=2.0)
    assert doc == {"job_manager": "jm-a", "drained": True, "was_drained": False, "running": 1}
    # its running job finishes and counts; the credit it gives back takes nothing
    h.result(b"a-1", b"first#1", now=3.0)
    assert delivered_to(h.request(b"c", b"second", queue="q", now=4.0)) == []
    # a recycled worker process of the drained job manager gets nothing either
    slot(h, b"a-2", "jm-a", 2)
    assert delivered_to(h.ready(b"a-2", now=5.0)) == []
    # another job manager of the queue takes it
    slot(h, b"b-1", "jm-b", 3)
    assert delivered_to(h.ready(b"b-1", now=6.0)) == [b"b-1"]
    entry = {m["identity"]: m for m in ask(port, b"MONITOR JSON")["job_managers"]}
    assert entry["jm-a"]["drained"] is True and entry["jm-b"]["drained"] is False
    assert entry["jm-a"]["queues"] == [[10, "q"]]  # (its queues still shown)
    # resumed: the credit it gave while drained takes the waiting jobs at once
    h.request(b"c", b"third", queue="q", now=7.0)
    h.request(b"c", b"fourth", queue="q", now=7.0)
    doc = ask(port, b"MANAGER RESUME jm-a", now=8.0)
    assert doc["drained"] is False and doc["was_drained"] is True and doc["dispatched"] == 2
    assert ask(port, b"MANAGER DRAIN jm-a")["was_drained"] is False


def test_eventmq_and_unknown_job_managers_are_refused_with_the_reason() -> None:
    h = CoreHarness()
    h.join(b"emq-plain", queues=((10, "q"),), now=0.0)  # EventMQ's job manager
    port = MonitorPort(h.core)
    answer = port.answer(b"MANAGER DRAIN emq-plain", 0.0)
    assert answer.startswith(b"ERROR emq-plain is an EventMQ job manager"), answer
    assert b"SIGTERM" in answer
    assert port.answer(b"MANAGER DRAIN nosuch", 0.0) == (
        b"ERROR no job manager named nosuch is connected"
    )
    assert port.answer(b"MANAGER HALT x", 0.0).startswith(b"ERROR usage: MANAGER DRAIN")
    assert port.answer(b"MANAGER DRAIN", 0.0).startswith(b"ERROR usage")


def test_drain_needs_the_admin_role() -> None:
    port = MonitorPort(CoreHarness().core)
    reason = port.authorize("monitor", frozenset({MONITOR}), [b"MANAGER DRAIN jm-a"])
    assert reason == "MANAGER needs the admin role"
    assert port.authorize("monitor", frozenset({ADMIN}), [b"MANAGER DRAIN jm-a"]) is None


def test_stop_drains_and_tells_the_control_connection_only() -> None:
    from emq_django.broker.effects import Stop
    from emq_django.protocol import frames as F
    from emq_django.protocol.decoding import decode

    h = CoreHarness()
    h.join(b"ctl", queues=((10, "q"),), meta={"role": "manager", "manager": "jm-a"}, now=0.0)
    slot(h, b"a-1", "jm-a", 1)
    h.ready(b"a-1", now=0.0)
    doc = ask(MonitorPort(h.core), b"MANAGER STOP jm-a", now=1.0)
    assert doc["stopping"] is True and doc["drained"] is True
    stops = of_type(h.take(), Stop)
    assert [s.peer.identity for s in stops] == [b"ctl"]
    assert delivered_to(h.request(b"c", b"after", queue="q", now=2.0)) == []
    # the frame, both ways; one frame short is a ProtocolError
    assert decode(F.Stop(b"m1").encode()) == F.Stop(b"m1")
    with pytest.raises(ProtocolError):
        decode(F.Stop(b"m1").encode()[:-1])


def test_resize_tells_the_control_connection_and_the_monitor_shows_it() -> None:
    from emq_django.broker.effects import Resize
    from emq_django.protocol import frames as F
    from emq_django.protocol.decoding import decode

    h = CoreHarness()
    meta = {"role": "manager", "manager": "jm-a", "incarnation": "i1", "concurrency": 1}
    meta["max_concurrency"] = 4
    h.join(b"ctl", queues=((10, "q"),), meta=meta, now=0.0)
    slot(h, b"a-1", "jm-a", 1)
    port = MonitorPort(h.core)
    doc = ask(port, b"MANAGER RESIZE jm-a 3", now=1.0)
    assert doc == {
        "job_manager": "jm-a",
        "concurrency": 3,
        "was": 1,
        "max_concurrency": 4,
        "processes": 1,
    }
    resizes = of_type(h.take(), Resize)
    assert [(r.peer.identity, r.concurrency) for r in resizes] == [(b"ctl", 3)]
    entry = {m["identity"]: m for m in ask(port, b"MONITOR JSON")["job_managers"]}
    assert entry["jm-a"]["concurrency"] == 3  # the processes follow as they join
    assert port.answer(b"MANAGER RESIZE jm-a 5", 2.0) == (
        b"ERROR jm-a can run from 1 to 4 worker processes (its --max-concurrency), not 5"
    )
    assert port.answer(b"MANAGER RESIZE jm-a x", 2.0).startswith(
        b"ERROR the number of worker processes must be a whole number"
    )
    assert of_type(h.take(), Resize) == []
    reason = port.authorize("monitor", frozenset({MONITOR}), [b"MANAGER RESIZE jm-a 2"])
    assert reason == "MANAGER needs the admin role"
    # the frame, both ways; no number, or 0, is a ProtocolError
    assert decode(F.Resize(b"m1", 12).encode()) == F.Resize(b"m1", 12)
    for bad in (b"", b"0", b"-1", b"01"):
        with pytest.raises(ProtocolError):
            decode([*F.Resize(b"m1", 1).encode()[:-1], bad])


def test_a_job_manager_from_before_resize_is_refused_with_the_reason() -> None:
    h = CoreHarness()
    h.join(b"ctl", queues=((10, "q"),), meta={"role": "manager", "manager": "jm-a"}, now=0.0)
    answer = MonitorPort(h.core).answer(b"MANAGER RESIZE jm-a 2", 0.0)
    assert answer == b"ERROR jm-a cannot be resized: it is a job manager from before RESIZE"


def test_resizing_stops_idle_processes_first_and_starts_in_free_slots() -> None:
    from emq_django.worker.resizing import capacity, to_start, to_stop

    class Table:
        def __init__(self, running: dict[int, bytes]) -> None:
            self.running = running

        def read(self, slot: int) -> tuple[bytes, float, float]:
            return self.running.get(slot, b""), 0.0, 0.0

    children = {101: 0, 102: 1, 103: 2}  # pid -> slot
    busy = Table({0: b"j#1", 2: b"k#1"})
    assert to_stop(children, set(), busy, 1) == [102, 101]  # the idle one first
    assert to_stop(children, {102}, busy, 1) == [101]  # (102 is stopping already)
    assert to_stop(children, set(), busy, 3) == []
    # growing while 102 is still stopping: its slot is taken, the free ones are used
    assert to_start(children, {102}, 5, 4) == [3, 4]
    assert to_start(children, {102}, 4, 4) == [3]  # no more free slots
    assert to_start(children, set(), 8, 2) == []
    assert capacity(2, 0) == 64 and capacity(100, 0) == 100 and capacity(2, 8) == 8
