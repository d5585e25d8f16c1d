"""Liveness in BrokerCore: silent peers dropped and their attempts counted, busy
slots kept while their job manager lives, a job manager's word for its slots.
Typed commands in, typed effects out (tests/support/core_harness.py), fake ``now``;
the heartbeats on the wire are in test_broker_core.py."""

from __future__ import annotations

from emq_django.broker.effects import Acknowledge, Answer, Effect, Refuse
from tests.support.core_harness import failed
from tests.unit.test_broker_core import MANAGER, slot_meta
from tests.unit.test_held_attempts import answers_to, inform, make_core, requests_to
from tests.unit.test_lifecycle import ready, reply, request, tick

LOST_FLAG = failed(ready=False, lost="")  # a REPLY "failed,lost" from a job manager


def to_client(out: list[Effect], client: bytes = b"client") -> list[Effect]:
    return [
        e
        for e in out
        if isinstance(e, (Acknowledge, Answer, Refuse)) and e.client.identity == client
    ]


def test_silent_peer_is_dropped_and_its_jobs_go_to_another_peer() -> None:
    # the attempt it was running counts (issue 12): with a retry left it runs again
    core = make_core()
    inform(core, b"silent")
    ready(core, b"silent")
    request(core, b"client", b"j1", headers=b"reply-requested,retry-count:1")
    assert core.inflight[b"j1#1"].peer.identity == b"silent"
    inform(core, b"alive")
    ready(core, b"alive")
    for now in (1.0, 2.0):
        tick(core, now, keep_alive=(b"alive",))
    assert b"silent" in core.peers  # not yet: fewer than `liveness` intervals
    requeued: list[bytes] = []
    for now in (3.0, 11.0, 13.0):  # plain (EventMQ) peers: 3 s x liveness + 1; backoff
        requeued += requests_to(tick(core, now, keep_alive=(b"alive",)), b"alive")
    assert b"silent" not in core.peers
    assert core.counters["peers_expired"] == 1 and core.counters["worker_lost"] == 1
    assert core.counters["retried"] == 1
    assert requeued == [b"j1#2"]
    assert list(core.inflight) == [b"j1#2"]
    # the result of the second attempt still reaches the client with its own msgid
    out = reply(core, b"alive", b"j1#2", now=13.0)
    assert [(type(e), e.job.id) for e in to_client(out)] == [(Answer, b"j1")]  # type: ignore[union-attr]


def test_requeued_job_waits_when_no_other_peer_has_credit() -> None:
    core = make_core()
    inform(core, b"silent")
    ready(core, b"silent")
    request(core, b"client", b"j1", headers=b"retry-count:1")
    for now in (1.0, 2.0, 3.0, 11.0, 13.0):  # dropped at 11, retried after the backoff
        tick(core, now)
    assert not core.peers
    assert [j.id for j in core.queues["default"].pending] == [b"j1"]
    assert core.queues["default"].in_flight == 0
    inform(core, b"new", now=11.0)
    out = ready(core, b"new", now=13.0)
    assert requests_to(out, b"new") == [b"j1#2"]


def test_busy_slot_is_kept_while_its_manager_is_alive_and_dropped_with_it() -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    inform(core, b"slot1", meta=slot_meta(1))
    ready(core, b"slot0")
    request(core, b"client", b"long", headers=b"retry-count:1")
    assert core.inflight[b"long#1"].peer.identity == b"slot0"
    # slot0 is busy in a long job and silent; slot1 is idle and silent too
    for now in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        tick(core, now, keep_alive=(b"mgr",))
    assert b"slot0" in core.peers
    assert b"slot1" not in core.peers  # idle and silent: dropped as usual
    assert core.counters["requeued"] == 0
    # the manager goes silent too: both it and its busy slot go
    for now in (7.0, 8.0, 9.0, 10.0):
        tick(core, now)
    assert b"mgr" not in core.peers
    assert b"slot0" not in core.peers
    # the attempt it was running counts (issue 12; it used to be requeued uncounted)
    assert core.counters["worker_lost"] == 1 and core.counters["retried"] == 1
    tick(core, 12.0)  # after the backoff it waits for a job manager
    assert [j.id for j in core.queues["default"].pending] == [b"long"]


def test_busy_slot_whose_manager_is_gone_is_dropped() -> None:
    core = make_core()
    inform(core, b"slot0", meta=slot_meta(0, manager="other"))
    ready(core, b"slot0")
    request(core, b"client", b"long")
    for now in (1.0, 2.0, 3.0, 4.0):
        tick(core, now)
    assert b"slot0" not in core.peers
    # held a heartbeat limit more for a word from its job manager (which may connect
    # after it, as after a failover) or from the process connected again
    assert core.counters["worker_lost"] == 0 and list(core.core.held) == [b"long#1"]
    for now in (5.0, 6.0, 7.0, 8.0):
        tick(core, now)
    assert core.counters["worker_lost"] == 1  # its attempt counts: retries=0, so final
    assert core.counters["failed"] == 1 and len(core.dead) == 1


def test_manager_reply_failed_lost_drops_its_slot() -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0")
    request(core, b"client", b"doomed", headers=b"reply-requested")
    body = b'{"error": {"type": "WorkerLost", "message": "killed", "traceback": ""}}'
    out = reply(core, b"mgr", b"doomed#1", status=LOST_FLAG, body=body, now=0.5)
    assert b"slot0" not in core.peers
    assert b"mgr" in core.peers
    replies = answers_to(out)
    assert [(r.job.id, r.outcome.failed, r.body) for r in replies] == [(b"doomed", True, body)]
    assert core.counters["failed"] == 1 and core.counters["stale_replies"] == 0
    assert core.counters["requeued"] == 0  # answered as failed, not run again
    assert core.queues["default"].in_flight == 0 and not core.inflight


def test_another_managers_reply_for_a_slot_is_stale() -> None:
    core = make_core()
    inform(core, b"mgr2", meta={**MANAGER, "manager": "jm2"})
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0")
    request(core, b"client", b"j")
    reply(core, b"mgr2", b"j#1", status=LOST_FLAG)
    assert core.counters["stale_replies"] == 1
    assert b"slot0" in core.peers and b"j#1" in core.inflight
