"""A worker process of our job manager is gone with several jobs in flight (credit,
batched REQUESTs): the broker holds them all under its job manager until that
says which one ran (no guess), and a job that runs at most once is never run
again when nobody says. The core through its harness (typed commands and effects), a fake clock.
"""

from __future__ import annotations

import json
from typing import Any

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import Answer, Deliver, Effect, Outcome
from tests.support.core_harness import CoreHarness, failed
from tests.unit.test_broker_core import INTERVAL, LIVENESS, MANAGER, slot_meta
from tests.unit.test_lifecycle import ready, reply, request, take, tick

LOST = failed("emq_django.exceptions.WorkerLost", ready=False, lost="exit code 1")
OK = Outcome(failed=False)  # a REPLY's "ok": no credit given back
DEADLINE = INTERVAL * LIVENESS
Out = list[Effect]


def make_core() -> CoreHarness:
    return CoreHarness(BrokerConfig(INTERVAL, LIVENESS, 100_000))


def inform(
    core: CoreHarness, ident: bytes, meta: dict[str, Any] | None = None, now: float = 0.0
) -> Out:
    return core.join(ident, meta=meta, now=now)


def requests_to(out: Out, ident: bytes) -> list[bytes]:
    """The attempt ids delivered to ``ident``."""
    return [e.job.attempt_id for e in out if isinstance(e, Deliver) and e.peer.identity == ident]


def answers_to(out: Out, client: bytes = b"client") -> list[Answer]:
    return [e for e in out if isinstance(e, Answer) and e.final and e.client.identity == client]


def replies_to(out: Out, client: bytes = b"client") -> dict[bytes, Answer]:
    return {a.job.id: a for a in answers_to(out, client)}


def ended(core: CoreHarness, manager: bytes, pid: int, now: float = 0.0) -> Out:
    return core.ended(manager, pid, "exit code 1", now=now)


def busy_slot(core: CoreHarness, jobs: dict[bytes, bytes]) -> None:
    """The job manager ``mgr`` with slot0 holding ``jobs`` (msgid -> headers), in
    order, and slot1 ready for one job (what goes back to the queue goes there)."""
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0", times=len(jobs))
    for msgid, headers in jobs.items():
        request(core, b"client", msgid, headers=headers)
    assert all(core.inflight[m + b"#1"].peer.identity == b"slot0" for m in jobs)
    inform(core, b"slot1", meta=slot_meta(1))


def lose_slot0(core: CoreHarness, now: float = 0.1) -> Out:
    """The broker finds slot0 unreachable before its job manager's word."""
    out = core.unreachable(b"slot0", now)
    assert b"slot0" not in core.peers
    return out


AT_MOST_ONCE = b"reply-requested"
RETRY_ONCE = b"reply-requested,retry-count:1"


def test_every_attempt_of_a_lost_process_is_held_until_its_manager_says_which_ran() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE, b"j3": AT_MOST_ONCE})
    out = lose_slot0(core)
    assert sorted(core.core.held) == [b"j1#1", b"j2#1", b"j3#1"]
    assert core.counters["requeued"] == core.counters["worker_lost"] == 0
    assert not replies_to(out)
    # its job manager: j1 finished (an answer that died in the process's socket,
    # sent again without its credit), j2 was running, j3 never started
    out = reply(core, b"mgr", b"j1#1", status=OK, now=0.2)
    out += ready(core, b"slot1", now=0.2)
    assert not requests_to(out, b"slot1")  # j3 is still held: nothing goes out yet
    out += reply(core, b"mgr", b"j2#1", status=LOST, body=b'{"error": {}}', now=0.3)
    answers = replies_to(out)
    assert (
        not answers[b"j1"].outcome.failed and answers[b"j2"].outcome.failed and b"j3" not in answers
    )
    assert [m for m in requests_to(out, b"slot1")] == [b"j3#2"]
    assert core.counters["requeued"] == 1 and core.counters["worker_lost"] == 1
    assert not core.core.held and not core.core.held_slots
    assert not core.core.managers["jm1"].inflight
    assert core.queues["default"].in_flight == 1  # j3, at slot1
    tick(core, 10.0, keep_alive=(b"mgr", b"slot1"))  # the deadline passes: nothing more
    assert core.counters["worker_lost"] == 1 and core.counters["failed"] == 1


def test_at_most_once_jobs_are_never_run_again_when_the_word_never_comes() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": RETRY_ONCE, b"j3": AT_MOST_ONCE})
    ready(core, b"slot1", times=3)
    lose_slot0(core)
    take(core)
    out = tick(core, 1.0, keep_alive=(b"mgr", b"slot1"))
    assert not replies_to(out) and len(core.core.held) == 3  # not before the deadline
    out = []
    for now in (2.0, 3.0, 3.5):
        out += tick(core, now, keep_alive=(b"mgr", b"slot1"))
    # the oldest counts as the one that ran; j3 may have run too: it fails; j2 runs
    # again (it may run twice: it has a retry), uncounted
    answers = replies_to(out)
    assert sorted(answers) == [b"j1", b"j3"] and all(r.outcome.failed for r in answers.values())
    assert "may have started" in json.loads(answers[b"j3"].body)["error"]["message"]
    assert [m for m in requests_to(out, b"slot1")] == [b"j2#2"]
    assert core.core.inflight[b"j2#2"].failures == 0
    assert core.counters["worker_lost"] == 2 and core.counters["requeued"] == 1
    assert not core.core.held and not core.core.held_slots
    # the job manager's word, too late, is dropped
    out = reply(core, b"mgr", b"j3#1", status=LOST, now=4.0)
    assert not replies_to(out) and core.counters["stale_replies"] == 1


def test_at_most_once_jobs_are_never_run_again_when_the_job_manager_dies() -> None:
    core = make_core()
    busy_slot(core, {b"j1": RETRY_ONCE, b"j2": AT_MOST_ONCE, b"j3": RETRY_ONCE})
    lose_slot0(core)
    take(core)
    out = []
    for now in (1.0, 2.0, 3.0, 3.5):  # the job manager and slot1 go silent
        out += tick(core, now)
    assert b"mgr" not in core.peers
    answers = replies_to(out)
    assert sorted(answers) == [b"j2"] and answers[b"j2"].outcome.failed
    assert "job manager lost" in json.loads(answers[b"j2"].body)["error"]["message"]
    # j1 counts as the one that ran (retried after the backoff), j3 goes back uncounted
    assert core.counters["worker_lost"] == 2 and core.counters["retried"] == 1
    assert [j.id for j in core.queues["default"].pending] == [b"j3"]
    assert core.life.jobs[b"j3"].failures == 0
    assert not core.core.held and not core.core.held_slots


def test_ended_with_nothing_running_releases_the_held_attempts() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE})
    ready(core, b"slot1", times=2)
    lose_slot0(core)
    take(core)
    out = reply(core, b"mgr", b"j1#1", status=OK, now=0.2)  # sent again
    out += ended(core, b"mgr", pid=200, now=0.3)  # slot0's process: it ran nothing else
    assert not replies_to(out)[b"j1"].outcome.failed
    assert [m for m in requests_to(out, b"slot1")] == [b"j2#2"]
    assert core.counters["worker_lost"] == 0 and core.counters["requeued"] == 1
    assert not core.core.held and not core.core.held_slots


def test_ended_before_the_broker_noticed_drops_the_process_and_requeues_its_jobs() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE})
    ready(core, b"slot1", times=2)
    out = reply(core, b"mgr", b"j1#1", status=OK, now=0.2)  # answered for slot0
    out += ended(core, b"mgr", pid=200, now=0.3)
    assert b"slot0" not in core.peers and b"slot1" in core.peers
    assert not replies_to(out)[b"j1"].outcome.failed
    assert [m for m in requests_to(out, b"slot1")] == [b"j2#2"]
    assert core.counters["worker_lost"] == 0
    # another job manager's ENDED naming the same pid changes nothing
    inform(core, b"mgr2", meta={**MANAGER, "manager": "jm2"})
    ended(core, b"mgr2", pid=201)
    assert b"slot1" in core.peers and b"j2#2" in core.inflight


def test_an_answer_the_broker_has_is_dropped_when_sent_again() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE})
    out = reply(core, b"slot0", b"j1#1", status=OK, now=0.1)  # it arrived
    out += lose_slot0(core, now=0.2)
    # the job manager sends it again (it may have died in the socket), then the
    # lost answer of j2: the client gets one answer each
    out += reply(core, b"mgr", b"j1#1", status=OK, body=b'{"value": 99}', now=0.3)
    out += reply(core, b"mgr", b"j2#1", status=LOST, now=0.4)
    answers = answers_to(out)
    assert sorted(r.job.id for r in answers) == [b"j1", b"j2"]
    assert next(r for r in answers if r.job.id == b"j1").body == b'{"value": 3}'
    assert core.counters["stale_resends"] == 1 and core.counters["stale_replies"] == 0
    assert core.counters["succeeded"] == 1 and core.counters["worker_lost"] == 1


def test_a_held_attempt_cancelled_meanwhile_ends_cancelled_instead_of_running() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE})
    ready(core, b"slot1", times=2)
    lose_slot0(core)
    take(core)
    assert core.core.cancel(b"j2", 0.2) == "stopping"
    out = reply(core, b"mgr", b"j1#1", status=LOST, now=0.3)
    answers = replies_to(out)
    assert json.loads(answers[b"j2"].body)["error"]["type"] == "emq_django.exceptions.Cancelled"
    assert not requests_to(out, b"slot1")
    assert core.counters["cancelled"] == 1 and not core.core.inflight


def test_held_attempts_follow_their_job_manager_when_it_connects_again() -> None:
    core = make_core()
    busy_slot(core, {b"j1": AT_MOST_ONCE, b"j2": AT_MOST_ONCE})
    ready(core, b"slot1", times=2)
    inform(core, b"mgr-again", meta=MANAGER, now=0.5)  # the same run, a new connection
    lose_slot0(core, now=2.0)  # held under mgr, until 5.0
    for now in (1.0, 2.0, 3.0, 3.5):
        tick(core, now, keep_alive=(b"mgr-again", b"slot1"))
    assert b"mgr" not in core.peers
    assert sorted(core.core.held) == [b"j1#1", b"j2#1"]  # waiting still, under the new one
    out = reply(core, b"mgr-again", b"j2#1", status=LOST, now=3.6)
    assert replies_to(out)[b"j2"].outcome.failed
    assert [m for m in requests_to(out, b"slot1")] == [b"j1#2"]
    assert not core.core.held


def test_eventmq_job_managers_keep_the_old_rule_every_job_counts() -> None:
    core = make_core()
    inform(core, b"legacy")
    ready(core, b"legacy", times=2)
    request(core, b"client", b"j1", headers=AT_MOST_ONCE)
    request(core, b"client", b"j2", headers=RETRY_ONCE)
    out = core.unreachable(b"legacy", 0.1)
    assert not core.core.held
    assert sorted(replies_to(out)) == [b"j1"]  # j2 has a retry
    assert core.counters["worker_lost"] == 2 and core.counters["retried"] == 1


# ---- a worker process that reaches a new broker before its job manager -------------
# After a failover a worker process's old socket may INFORM the new active broker (a
# message it had queued for the old one), take a job, and close a moment later when
# the process connects afresh (link.BrokerLink.moved): the broker finds it
# unreachable before its job manager has connected. CI saw one guaranteed job die
# that way at three failovers in a row (tests/faults/test_ha.py a).


def lone_slot_with_a_job(core: CoreHarness, headers: bytes = RETRY_ONCE) -> None:
    """slot0 of jm1, whose job manager has not connected, holds j1."""
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0")
    request(core, b"client", b"j1", headers=headers)
    assert core.inflight[b"j1#1"].peer.identity == b"slot0"


def test_a_process_lost_before_its_manager_connected_is_held_for_its_word() -> None:
    core = make_core()
    lone_slot_with_a_job(core)
    out = lose_slot0(core)
    assert core.counters["worker_lost"] == 0 and not replies_to(out)
    assert list(core.core.held) == [b"j1#1"]
    # the same process connects again (a fresh socket): it never had j1
    out = inform(core, b"slot0-2", meta=slot_meta(0), now=0.2)
    out += ready(core, b"slot0-2", now=0.2)
    assert requests_to(out, b"slot0-2") == [b"j1#2"]
    assert core.core.inflight[b"j1#2"].failures == 0
    assert core.counters["worker_lost"] == 0 and core.counters["requeued"] == 1
    assert not core.core.held and not core.core.held_slots


def test_a_process_lost_before_its_manager_connected_answers_what_it_ran() -> None:
    core = make_core()
    lone_slot_with_a_job(core)
    lose_slot0(core)
    # it had run j1: its fresh socket names the answer and sends it again
    inform(core, b"slot0-2", meta={**slot_meta(0), "answered": ["j1#1"]}, now=0.2)
    out = reply(core, b"slot0-2", b"j1#1", status=OK, now=0.2)
    assert not replies_to(out)[b"j1"].outcome.failed
    assert core.counters["worker_lost"] == 0 and core.counters["requeued"] == 0
    assert not core.core.held and not core.core.inflight


def test_a_process_lost_before_its_manager_connected_waits_under_it_when_it_comes() -> None:
    core = make_core()
    lone_slot_with_a_job(core)
    lose_slot0(core)
    inform(core, b"mgr", meta=MANAGER, now=0.2)  # its job manager connects: the word is its
    assert core.core.inflight[b"j1#1"].peer is core.core.managers["jm1"]
    out = ended(core, b"mgr", 200, now=0.3)  # slot0's process ended: j1 never started
    out += inform(core, b"slot1", meta=slot_meta(1), now=0.3)
    out += ready(core, b"slot1", now=0.3)
    assert requests_to(out, b"slot1") == [b"j1#2"]
    assert core.counters["worker_lost"] == 0


def test_a_process_lost_before_its_manager_connected_fails_its_attempt_when_nobody_says() -> None:
    core = make_core()
    lone_slot_with_a_job(core, AT_MOST_ONCE)
    lose_slot0(core)
    out = tick(core, 1.0)
    assert not replies_to(out)  # not before the deadline
    out = []
    for now in (2.0, 3.0, 3.5):
        out += tick(core, now)
    assert replies_to(out)[b"j1"].outcome.failed
    assert core.counters["worker_lost"] == 1
    assert not core.core.held and not core.core.held_slots and not core.core.inflight
