"""A broker that restored guaranteed jobs from the journal (a failover, a restart)
takes the outcome of an attempt the previous broker dispatched, once, and answers
the client that sends the job again to say it waits (issue 32, C)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Acknowledge, Answer, Deliver, Effect
from emq_django.broker.journal import Journal
from tests.support.core_harness import CoreHarness, failed

WALL = 1_000_000.0
OLD_JM, NEW_JM = b"jm-old", b"jm-new"  # two job managers (their control connections)
CLIENT, AGAIN = b"client", b"client-again"  # the same client before and after
GUARANTEED = b"guarantee,reply-requested"
VALUE = b'{"value": 3}'


def make_core() -> CoreHarness:
    return CoreHarness(
        BrokerConfig(heartbeat_interval=100.0, heartbeat_liveness=3),
        wall_offset=WALL,
        journal=True,
        seed=1,
    )


def manager(name: str) -> dict[str, Any]:
    return {"role": "manager", "manager": name}


def answers(out: list[Effect], client: bytes) -> list[bytes]:
    finals = [e for e in out if isinstance(e, Answer) and e.final]
    return [e.body for e in finals if e.client.identity == client]


def stale(core: CoreHarness) -> int:
    """Outcomes dropped (from a job manager's control connection: "resends")."""
    return core.counters["stale_replies"] + core.counters["stale_resends"]


def delivered(out: list[Effect], ident: bytes) -> list[bytes]:
    return [e.job.attempt_id for e in out if isinstance(e, Deliver) and e.peer.identity == ident]


def failed_over(tmp_path: Path) -> CoreHarness:
    """Job ``g`` (guaranteed, with a reply) ran at OLD_JM as ``g#1`` when its broker
    died: a new core restored it from the journal, and OLD_JM joined it again."""
    old = make_core()
    old.join(OLD_JM, meta=manager("old"))
    old.ready(OLD_JM)
    old.request(CLIENT, b"g", headers=GUARANTEED)
    journal = Journal(tmp_path / "journal.sqlite3")
    journal.apply(old.journal_ops or [])
    core = make_core()
    core.restore(journal.load(), 10.0)
    core.join(OLD_JM, meta=manager("old"), now=10.0)
    return core


def test_the_outcome_of_the_previous_brokers_attempt_completes_a_waiting_job(
    tmp_path: Path,
) -> None:
    core = failed_over(tmp_path)
    out = core.result(OLD_JM, b"g#1", OK_READY, VALUE, now=11.0)
    assert core.counters["restored_outcomes"] == 1 and stale(core) == 0
    assert b"g" not in core.jobs and not core.queues["default"].pending
    # nobody said it waits yet: kept, and answered when the client sends it again
    assert answers(out, CLIENT) == []
    out = core.request(AGAIN, b"g", headers=GUARANTEED, now=12.0)
    assert any(isinstance(e, Acknowledge) for e in out)
    assert answers(out, AGAIN) == [VALUE]
    assert answers(core.request(AGAIN, b"g", headers=GUARANTEED, now=13.0), AGAIN) == []


def test_a_client_that_said_it_waits_gets_the_outcome_when_it_comes(tmp_path: Path) -> None:
    core = failed_over(tmp_path)
    assert answers(core.request(AGAIN, b"g", headers=GUARANTEED, now=11.0), AGAIN) == []
    out = core.result(OLD_JM, b"g#1", OK_READY, VALUE, now=12.0)
    assert answers(out, AGAIN) == [VALUE]


def test_a_second_attempt_meanwhile_is_a_duplicate_whose_outcome_is_dropped(
    tmp_path: Path,
) -> None:
    core = failed_over(tmp_path)
    core.request(AGAIN, b"g", headers=GUARANTEED, now=11.0)
    core.join(NEW_JM, meta=manager("new"), now=11.0)
    assert delivered(core.ready(NEW_JM, now=11.0), NEW_JM) == [b"g#1"]  # (the same id)
    # the old attempt's failure does not end the one running here ...
    core.result(OLD_JM, b"g#1", failed("ValueError"), b"{}", now=12.0)
    assert core.counters["restored_outcomes"] == 0 and b"g" in core.jobs
    # ... its success does, once
    assert answers(core.result(OLD_JM, b"g#1", OK_READY, VALUE, now=13.0), AGAIN) == [VALUE]
    assert core.counters["restored_outcomes"] == 1
    assert answers(core.result(NEW_JM, b"g#1", OK_READY, b'{"value": 4}', now=14.0), AGAIN) == []
    assert stale(core) == 2


def test_a_broker_that_restored_nothing_still_drops_an_unknown_attempts_outcome() -> None:
    core = make_core()
    core.join(OLD_JM, meta=manager("old"))
    core.result(OLD_JM, b"g#1", OK_READY, VALUE, now=1.0)
    assert stale(core) == 1 and core.counters["restored_outcomes"] == 0


def failed_once_over(tmp_path: Path) -> CoreHarness:
    """Job ``r`` (guaranteed, one retry) failed as ``r#1`` at OLD_JM; the old broker
    counted that failure and journaled its retry (attempts=1), then died: a new core
    restored it after the retry's delay, and OLD_JM joined it again."""
    old = make_core()
    old.join(OLD_JM, meta=manager("old"))
    assert delivered(old.ready(OLD_JM), OLD_JM) == []
    old.request(CLIENT, b"r", headers=GUARANTEED + b",retry-count:1")
    old.result(OLD_JM, b"r#1", failed("RuntimeError"), b"{}", now=1.0)
    assert old.jobs[b"r"].failures == 1 and b"r" in old.jobs
    journal = Journal(tmp_path / "journal.sqlite3")
    journal.apply(old.journal_ops or [])
    core = make_core()
    core.restore(journal.load(), 1000.0)  # the retry is due: the job waits in its queue
    assert core.jobs[b"r"].failures == 1
    core.join(OLD_JM, meta=manager("old"), now=1000.0)
    return core


def test_a_handed_over_failure_the_previous_broker_counted_is_not_counted_again(
    tmp_path: Path,
) -> None:
    """Issue 32 (fault scenarios a, b, c): the job manager hands over the outcome of
    the attempt it answered last, which the old broker may well have had: its
    failure must not count twice (the job would be dead-lettered unrun)."""
    core = failed_once_over(tmp_path)
    core.result(OLD_JM, b"r#1", failed("RuntimeError", ready=False), b"{}", now=1001.0)
    assert core.counters["restored_outcomes"] == 0
    assert not core.dead_letters() and core.jobs[b"r"].failures == 1
    # it runs again, as an attempt numbered after those the journal counted
    core.join(NEW_JM, meta=manager("new"), now=1001.0)
    assert delivered(core.ready(NEW_JM, now=1001.0), NEW_JM) == [b"r#2"]
    out = core.result(NEW_JM, b"r#2", OK_READY, VALUE, now=1002.0)
    assert b"r" not in core.jobs and not core.dead_letters()
    assert answers(core.request(AGAIN, b"r", headers=GUARANTEED, now=1003.0), AGAIN) == [VALUE]
    assert answers(out, CLIENT) == []


def test_a_counted_failure_handed_over_after_the_retry_started_here_is_stale(
    tmp_path: Path,
) -> None:
    """The new broker ran the retry first: the old attempt's id is not its own
    attempt's (numbered after the journal's count), so that failure is dropped."""
    core = failed_once_over(tmp_path)
    core.join(NEW_JM, meta=manager("new"), now=1001.0)
    assert delivered(core.ready(NEW_JM, now=1001.0), NEW_JM) == [b"r#2"]
    core.result(OLD_JM, b"r#1", failed("RuntimeError", ready=False), b"{}", now=1002.0)
    assert not core.dead_letters() and core.jobs[b"r"].failures == 1
    assert answers(core.result(NEW_JM, b"r#2", OK_READY, VALUE, now=1003.0), CLIENT) == []
    assert b"r" not in core.jobs and not core.dead_letters()
