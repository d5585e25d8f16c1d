"""A guaranteed job's reply is journaled with its done row, so that a broker that
takes over answers the client that sends the job again (issue 32: the old active
acknowledged, ran and journaled the job, then died before its reply reached the
client, whose ``get()`` then timed out against the new active)."""

from __future__ import annotations

from pathlib import Path

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Acknowledge, Answer, Effect, Outcome
from emq_django.broker.journal import Journal
from emq_django.broker.kept_replies import decode_reply, encode_reply
from tests.support.core_harness import CoreHarness, failed

WALL = 1_000_000.0
JM, CLIENT, AGAIN = b"jm", b"client", b"client-again"
VALUE = b'{"value": 3}'


def make_core() -> CoreHarness:
    return CoreHarness(
        BrokerConfig(heartbeat_interval=100.0, heartbeat_liveness=3),
        wall_offset=WALL,
        journal=True,
        seed=1,
    )


def finals(out: list[Effect], client: bytes) -> list[Answer]:
    return [e for e in out if isinstance(e, Answer) and e.final and e.client.identity == client]


def ran_then_died(tmp_path: Path, headers: bytes, outcome: Outcome, body: bytes) -> Journal:
    """Job ``g`` was acknowledged, ran and ended at the old broker, whose reply
    never reached the client: the journal as the old broker left it."""
    old = make_core()
    old.join(JM, meta={"role": "manager", "manager": "jm"})
    old.ready(JM)
    out = old.request(CLIENT, b"g", headers=headers)
    assert any(isinstance(e, Acknowledge) for e in out)
    old.result(JM, b"g#1", outcome, body, now=1.0)
    journal = Journal(tmp_path / "journal.sqlite3")
    journal.apply(old.journal_ops or [])
    return journal


def taken_over(journal: Journal) -> CoreHarness:
    core = make_core()
    core.restore(journal.load(), 10.0)
    return core


def test_the_new_broker_answers_a_job_the_old_one_ended_with_its_kept_reply(
    tmp_path: Path,
) -> None:
    journal = ran_then_died(tmp_path, b"guarantee,reply-requested", OK_READY, VALUE)
    core = taken_over(journal)
    out = core.request(AGAIN, b"g", headers=b"guarantee,reply-requested", now=11.0)
    assert any(isinstance(e, Acknowledge) for e in out)  # a duplicate: not run again
    (answer,) = finals(out, AGAIN)
    assert answer.body == VALUE and not answer.outcome.failed and answer.job.id == b"g"
    assert core.counters["duplicates"] == 1 and b"g" not in core.jobs
    # claimed: dropped from memory (the journal keeps it until the window prunes it)
    assert finals(core.request(AGAIN, b"g", headers=b"guarantee,reply-requested"), AGAIN) == []
    assert taken_over(journal).unclaimed  # a later failover has it again


def test_a_failure_is_kept_as_the_reply_with_its_status(tmp_path: Path) -> None:
    error = b'{"error": "boom"}'
    journal = ran_then_died(
        tmp_path, b"guarantee,reply-requested", failed("ValueError", raw=b"failed"), error
    )
    core = taken_over(journal)
    (answer,) = finals(core.request(AGAIN, b"g", headers=b"guarantee,reply-requested"), AGAIN)
    assert answer.body == error and answer.outcome.failed and answer.outcome.raw == b"failed"


def test_a_guaranteed_job_without_a_reply_keeps_no_reply(tmp_path: Path) -> None:
    journal = ran_then_died(tmp_path, b"guarantee", OK_READY, VALUE)
    (row,) = journal.load()
    assert row.state == "done" and row.body == b""
    assert not taken_over(journal).unclaimed


def test_the_encoding_round_trips_and_refuses_garbage() -> None:
    kept = decode_reply(encode_reply(True, b"failed,error:X", VALUE, (b"a", b"")))
    assert kept == (True, b"failed,error:X", VALUE, (b"a", b""))
    assert decode_reply(b"") is None and decode_reply(b"\x00\x00\x00\x09abc") is None
