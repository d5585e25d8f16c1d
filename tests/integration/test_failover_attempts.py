"""A guaranteed job's retries across a failover, with the journal on both back ends
(SQLite, PostgreSQL): the new broker counts each failure once, even when the
previous broker had given an attempt back unstarted, so that the job's attempt
numbers ran ahead of its count of failures (issue 32, fault scenario a: a flaky
job dead-lettered before it used its retries)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Deliver, Effect
from emq_django.broker.journal import Journal
from emq_django.broker.journal_pg import PgJournal
from tests.support.core_harness import CoreHarness, failed

WALL = 1_000_000.0
OLD_JM, NEW_JM = b"jm-old", b"jm-new"  # two job managers (their control connections)
CLIENT = b"client"
FLAKY = b"guarantee,reply-requested,retry-count:2"  # three runs at most
AnyJournal = Journal | PgJournal


@pytest.fixture(params=["sqlite", "postgres"])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], AnyJournal]]:
    """Opens the test's journal (again, as the broker that takes over does)."""
    opened: list[AnyJournal] = []
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""

    def opener() -> AnyJournal:
        journal: AnyJournal = PgJournal(url, name="test") if url else Journal(tmp_path / "j")
        opened.append(journal)
        return journal

    yield opener
    for journal in opened:
        journal.close()


def make_core() -> CoreHarness:
    return CoreHarness(
        BrokerConfig(heartbeat_interval=10_000.0, heartbeat_liveness=3),
        wall_offset=WALL,
        journal=True,
        seed=1,
    )


def manager(name: str) -> dict[str, Any]:
    return {"role": "manager", "manager": name}


def delivered(out: list[Effect], ident: bytes) -> list[bytes]:
    return [e.job.attempt_id for e in out if isinstance(e, Deliver) and e.peer.identity == ident]


def commit(core: CoreHarness, journal: AnyJournal) -> None:
    """The loop turn's journal commit (``server.py``)."""
    journal.apply(core.journal_ops or [])
    core.journal_ops = []


def failed_over_after_a_give_back(journal: Callable[[], AnyJournal]) -> CoreHarness:
    """Job ``r`` (guaranteed, two retries) went to OLD_JM as ``r#1``, which gave it
    back unstarted (its worker process was going away: not an attempt that counts);
    it ran as ``r#2`` and failed, which the old broker counted and journaled with
    its retry; then the old broker died, and a new one restored ``r`` once the
    retry was due. OLD_JM joined the new broker and handed over the outcome it
    answered last: ``r#2``'s failure, counted already."""
    old, first = make_core(), journal()
    old.join(OLD_JM, meta=manager("old"))
    old.request(CLIENT, b"r", headers=FLAKY)
    assert delivered(old.ready(OLD_JM), OLD_JM) == [b"r#1"]
    old.result(OLD_JM, b"r#1", failed(requeue=True, ready=False))
    assert old.jobs[b"r"].failures == 0 and old.counters["requeued"] == 1
    assert delivered(old.ready(OLD_JM), OLD_JM) == [b"r#2"]
    old.result(OLD_JM, b"r#2", failed("RuntimeError", ready=False), b"{}", now=1.0)
    assert old.jobs[b"r"].failures == 1 and not old.dead_letters()
    commit(old, first)
    core = make_core()
    core.restore(journal().load(), 1000.0)  # the retry is due: the job waits in its queue
    assert core.jobs[b"r"].failures == 1
    core.join(OLD_JM, meta=manager("old"), now=1000.0)
    core.result(OLD_JM, b"r#2", failed("RuntimeError", ready=False), b"{}", now=1000.0)
    return core


def test_a_job_given_back_unstarted_before_a_failover_gets_exactly_its_retries(
    journal: Callable[[], AnyJournal],
) -> None:
    core = failed_over_after_a_give_back(journal)
    assert core.counters["restored_outcomes"] == 0, "a counted failure was counted again"
    assert core.jobs[b"r"].failures == 1 and not core.dead_letters()
    # its two retries: the first ran at the old broker, so two runs are left here,
    # each numbered after every attempt the old broker made
    core.join(NEW_JM, meta=manager("new"), now=1000.0)
    runs: list[bytes] = []
    now = 1000.0
    out = core.ready(NEW_JM, now=now)
    while not core.dead_letters():
        assert len(runs) < 5, f"the job ran {runs} here and is not dead-lettered"
        attempts = delivered(out, NEW_JM)
        assert len(attempts) == 1, f"expected one attempt delivered, got {attempts}"
        runs += attempts
        core.result(NEW_JM, attempts[0], failed("RuntimeError"), b"{}", now=now)
        now += 1000.0  # past the retry's back-off
        out = core.tick(now, keep_alive=[OLD_JM, NEW_JM])
    assert runs == [b"r#3", b"r#4"]
    (letter,) = core.dead_letters()
    assert letter["attempts"] == 3


def test_the_attempt_a_retry_was_journaled_after_survives_a_second_failover(
    journal: Callable[[], AnyJournal],
) -> None:
    """The broker that took over counts ``r#3``'s failure and journals it; the one
    after it takes the outcome of neither ``r#2`` nor ``r#3`` again."""
    core = failed_over_after_a_give_back(journal)
    core.join(NEW_JM, meta=manager("new"), now=1000.0)
    assert delivered(core.ready(NEW_JM, now=1000.0), NEW_JM) == [b"r#3"]
    core.result(NEW_JM, b"r#3", failed("RuntimeError", ready=False), b"{}", now=1001.0)
    assert core.jobs[b"r"].failures == 2
    commit(core, journal())
    third = make_core()
    third.restore(journal().load(), 5000.0)
    third.join(NEW_JM, meta=manager("new"), now=5000.0)
    for attempt in (b"r#2", b"r#3"):
        third.result(NEW_JM, attempt, failed("RuntimeError", ready=False), b"{}", now=5000.0)
    assert third.counters["restored_outcomes"] == 0 and not third.dead_letters()
    assert third.jobs[b"r"].failures == 2
    assert delivered(third.ready(NEW_JM, now=5000.0), NEW_JM) == [b"r#4"]
    third.result(NEW_JM, b"r#4", OK_READY, b"null", now=5001.0)
    assert b"r" not in third.jobs and not third.dead_letters()


# the jobs table as it was before ``last_attempt`` (SQLite's, then PostgreSQL's)
OLD_SQLITE_JOBS = (
    "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE,"
    " queue TEXT NOT NULL, headers BLOB NOT NULL, body BLOB, state TEXT NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0, run_after REAL NOT NULL DEFAULT 0,"
    " enqueued_at REAL NOT NULL, error TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL)"
)
OLD_PG_JOBS = (
    "CREATE TABLE emq_jobs (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " id bytea NOT NULL UNIQUE, queue text NOT NULL, headers bytea NOT NULL, body bytea,"
    " state text NOT NULL, attempts integer NOT NULL DEFAULT 0,"
    " run_after double precision NOT NULL DEFAULT 0, enqueued_at double precision NOT NULL,"
    " error text NOT NULL DEFAULT '', updated_at double precision NOT NULL)"
)
OLD_ROW = (b"r", "default", FLAKY, b"body", "delayed", 1, WALL + 30, WALL, "E", WALL)


def reopened_old_journal(opener: Callable[[], AnyJournal]) -> None:
    """A journal written before ``last_attempt`` opens with its rows (the count of
    failures standing for the attempt), and keeps the attempts journaled after."""
    journal = opener()
    (row,) = journal.load()
    assert (row.id, row.state, row.attempts, row.last_attempt) == (b"r", "delayed", 1, 0)
    core = make_core()
    core.restore([row], 0.0)
    assert (core.jobs[b"r"].failures, core.jobs[b"r"].attempt) == (1, 1)
    journal.apply([("state", b"r", "dead", 2, 0.0, "E", WALL + 40, 3)])
    (row,) = opener().load()
    assert (row.state, row.attempts, row.last_attempt) == ("dead", 2, 3)


def test_a_sqlite_journal_from_before_the_last_attempt_opens(tmp_path: Path) -> None:
    path = tmp_path / "j"
    db = sqlite3.connect(path)
    db.execute(OLD_SQLITE_JOBS)
    db.execute(
        "INSERT INTO jobs (id, queue, headers, body, state, attempts, run_after,"
        " enqueued_at, error, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        OLD_ROW,
    )
    db.commit()
    db.close()
    opened: list[Journal] = []

    def opener() -> Journal:
        opened.append(Journal(path))
        return opened[-1]

    try:
        reopened_old_journal(opener)
    finally:
        for journal in opened:
            journal.close()


def test_a_postgres_journal_from_before_the_last_attempt_opens(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(OLD_PG_JOBS)
        conn.execute(
            "INSERT INTO emq_jobs (id, queue, headers, body, state, attempts,"
            " run_after, enqueued_at, error, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            OLD_ROW,
        )
    opened: list[PgJournal] = []

    def opener() -> PgJournal:
        opened.append(PgJournal(pg_url, name="test"))
        return opened[-1]

    try:
        reopened_old_journal(opener)
    finally:
        for journal in opened:
            journal.close()
