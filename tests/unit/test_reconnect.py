"""Our job manager and its worker processes connect again under new identities
after hearing nothing from the broker for a while (a broker stall: SIGSTOP, a VM
pause, swap): the broker knows them for the same ones, keeps their jobs theirs
and takes their word for which jobs they answered (issue 29, item 2). The core
with its eMQP ports, no sockets, a fake clock."""

from __future__ import annotations

from typing import Any

from tests.unit.test_broker_core import (
    AT_MOST_ONCE,
    INTERVAL,
    LIVENESS,
    MANAGER,
    busy_slot,
    inform,
    lose_slot0,
    make_core,
    replies_to,
    reply,
    requests_to,
    slot_meta,
    take,
    tick,
)

STALL = 8.0  # seconds the broker was stopped


def reconnect_slot0(core: Any, answered: list[str], now: float) -> Any:
    """slot0's process, connected again as ``slot0b``: its INFORM lists what it
    answered, then it sends those answers again (without their credit)."""
    out = inform(core, b"slot0b", meta={**slot_meta(0), "answered": answered}, now=now)
    for attempt in answered:
        out += reply(core, b"slot0b", attempt.encode(), status=b"ok", now=now)
    return out


def test_a_stall_of_the_broker_is_not_its_peers_silence() -> None:
    core = make_stalled_core()
    core.core.stalled(STALL, STALL)
    tick(core, STALL)
    assert {b"mgr", b"slot0", b"slot1"} <= set(core.peers)
    assert core.counters["worker_lost"] == core.counters["peers_expired"] == 0
    # peers that say nothing after it are dropped a liveness later, as usual
    tick(core, STALL + INTERVAL * LIVENESS + 0.5)
    assert not core.peers


def make_stalled_core() -> Any:
    """The job manager ``mgr``; slot0 holds j1, j2 and j3 (at most once)."""
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE, b"j3": AT_MOST_ONCE})
    take(core)
    return core


def test_a_worker_process_connected_again_keeps_its_jobs_and_its_word_is_taken() -> None:
    core = make_stalled_core()
    # the job manager and slot0's process connect again; slot0 had answered j1 (its
    # answer died with the old socket); j2 and j3 died unread in that socket
    out = inform(core, b"mgr-again", meta=MANAGER, now=0.5)
    out += reconnect_slot0(core, ["j1#1"], now=0.5)
    assert b"mgr" not in core.peers and b"slot0" not in core.peers
    answers = replies_to(out)
    assert list(answers) == [b"j1"] and not answers[b"j1"].failed
    # j2 and j3 never started: back to their queue uncounted, run by whoever is ready
    out = []
    for n in range(2):
        core.on_backend(b"slot0b", [b"", b"eMQP/1.0", b"READY", b"r%d" % n], 0.6)
    out += take(core)
    assert sorted(r.msgid for r in requests_to(out, b"slot0b")) == [b"j2#2", b"j3#2"]
    assert core.counters["worker_lost"] == 0 and core.counters["requeued"] == 2
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):  # the old identities are gone: nothing fails
        out += tick(core, now, keep_alive=(b"mgr-again", b"slot0b", b"slot1"))
    out += reply(core, b"slot0b", b"j2#2", now=5.1) + reply(core, b"slot0b", b"j3#2", now=5.1)
    answers = replies_to(out)
    assert sorted(answers) == [b"j2", b"j3"] and not any(r.failed for r in answers.values())
    assert core.counters["worker_lost"] == 0 and core.counters["failed"] == 0


def test_a_worker_process_dropped_before_it_connected_again_gets_its_held_jobs_back() -> None:
    core = make_stalled_core()
    lose_slot0(core, now=0.2)  # a heartbeat to its old identity was unroutable: held
    take(core)
    out = reconnect_slot0(core, ["j2#1"], now=0.5)
    answers = replies_to(out)
    assert list(answers) == [b"j2"] and not answers[b"j2"].failed
    assert not core.core.held and not core.core.held_slots
    assert core.counters["worker_lost"] == 0 and core.counters["requeued"] == 2
    assert sorted(j.id for j in core.queues["default"].pending) == [b"j1", b"j3"]


def test_a_late_answer_on_the_old_connection_still_counts_once() -> None:
    core = make_stalled_core()
    out = reply(core, b"slot0", b"j1#1", status=b"ok", now=0.4)  # arrived before the INFORM
    out += reconnect_slot0(core, ["j1#1"], now=0.5)  # and sent again: dropped
    answers = list(replies_to(out).values())
    assert len(answers) == 1 and core.counters["stale_replies"] == 1
    assert core.counters["succeeded"] == 1


def test_another_process_of_the_same_slot_takes_nothing_of_the_old_one() -> None:
    core = make_stalled_core()
    # a fresh process for slot 0 (another pid): the old one's jobs stay with it
    inform(core, b"slot0-new", meta={**slot_meta(0), "pid": 999, "answered": ["j1#1"]})
    assert b"slot0" in core.peers
    assert all(core.inflight[a].peer.identity == b"slot0" for a in (b"j1#1", b"j2#1"))


def test_a_control_connection_found_unreachable_waits_for_its_successor() -> None:
    """After a stall the broker may find the job manager's old control connection
    unreachable before it reads the new one's INFORM (a backlog of several turns):
    its worker processes, alive, are not dropped with it."""
    from tests.emqp_machine import BACKEND

    core = make_stalled_core()
    core.peer_unreachable(BACKEND, b"mgr", 0.5)
    assert b"slot0" in core.peers and core.counters["worker_lost"] == 0
    inform(core, b"mgr-again", meta=MANAGER, now=0.6)  # read in the next turn
    for now in (0.75, 1.0, 1.5):
        tick(core, now, keep_alive=(b"mgr-again", b"slot1"))
    assert b"mgr" not in core.peers and b"slot0" in core.peers
    assert core.counters["worker_lost"] == 0 and len(core.inflight) == 3


def test_a_control_connection_unreachable_for_good_goes_with_its_processes() -> None:
    from tests.emqp_machine import BACKEND

    core = make_stalled_core()
    core.peer_unreachable(BACKEND, b"mgr", 0.5)  # the job manager died
    out = []
    for now in (0.75, 1.0):
        out += tick(core, now, keep_alive=(b"slot1",))
    assert b"mgr" not in core.peers and b"slot0" not in core.peers
    assert core.counters["worker_lost"] == 3  # at most once, nobody to say: lost
    assert sorted(replies_to(out)) == [b"j1", b"j2", b"j3"]
