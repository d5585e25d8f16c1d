"""What only the PostgreSQL journal does (broker/journal_pg.py): fencing by the
lease's epoch, a fast and clear failure while PostgreSQL is down and recovery once
it is back, clear errors at start; on a cluster of the tests' own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from emq_django.broker.journal_pg import PgJournal
from emq_django.broker.lease import Lease
from emq_django.exceptions import JournalError, LeaseLost
from tests.support import wait_until
from tests.support.postgres import PgCluster

WALL = 1_000_000.0
TTL = 0.5


def put(job_id: bytes, state: str = "ready") -> tuple[Any, ...]:
    return ("put", job_id, "default", b"guarantee", b"body", state, 0, 0.0, WALL, WALL)


@pytest.fixture
def journal(pg_url: str) -> Iterator[PgJournal]:
    j = PgJournal(pg_url, name="broker-a")
    yield j
    j.close()


def rows(url: str) -> list[tuple[bytes, str]]:
    """What another connection sees: the committed jobs."""
    other = PgJournal(url, name="reader")
    try:
        return [(r.id, r.state) for r in other.load()]
    finally:
        other.close()


def ids(url: str) -> list[bytes]:
    return [job_id for job_id, _ in rows(url)]


def test_a_broker_that_lost_the_lease_cannot_commit(journal: PgJournal, pg_url: str) -> None:
    a = Lease(pg_url, "broker-a", TTL)
    b = Lease(pg_url, "broker-b", TTL)
    try:
        epoch = a.try_acquire()
        journal.fence(epoch, TTL)
        journal.apply([put(b"mine")])
        wait_until(b.try_acquire, "b takes the expired lease", timeout=5, interval=0.02)
        with pytest.raises(LeaseLost, match="another broker took over"):
            journal.apply([put(b"too-late"), ("done", b"mine", WALL)])
        assert rows(pg_url) == [(b"mine", "ready")]  # nothing of the fenced turn
        assert journal.errors == 1
    finally:
        a.close()
        b.close()


def test_each_commit_renews_the_lease(journal: PgJournal, pg_url: str) -> None:
    a = Lease(pg_url, "broker-a", TTL)
    b = Lease(pg_url, "broker-b", TTL)
    try:
        journal.fence(a.try_acquire(), TTL)
        deadline = time.monotonic() + 3 * TTL
        n = 0
        while time.monotonic() < deadline:  # commits only, no renew() for 3 TTLs
            journal.apply([put(b"%d" % n)])
            n += 1
            assert b.try_acquire() is None
            time.sleep(TTL / 5)
        assert a.renew() is True and a.epoch == 1
    finally:
        a.close()
        b.close()


def test_postgresql_down_fails_at_once_and_the_journal_recovers(
    pg_cluster: PgCluster, journal: PgJournal, pg_url: str
) -> None:
    journal.apply([put(b"before")])
    pg_cluster.stop("immediate")
    started = time.monotonic()
    for i in range(5):  # the first finds the connection broken, the others fail at once
        with pytest.raises(JournalError, match="unreachable"):
            journal.apply([put(b"during-%d" % i)])
    assert time.monotonic() - started < 1.0
    assert journal.stats()["error"]
    pg_cluster.start()

    def written() -> bool:
        try:
            journal.apply([put(b"after")])
        except JournalError:
            return False
        return True

    wait_until(written, "a commit once PostgreSQL is back", timeout=10)
    assert ids(pg_url) == [b"before", b"after"]
    assert journal.stats()["reconnects"] == 1


def test_wrong_url_no_database_or_no_permission_is_a_clear_error(pg_cluster: PgCluster) -> None:
    with pytest.raises(JournalError, match=r'database "nowhere" does not exist'):
        PgJournal(pg_cluster.url("nowhere"))
    port = pg_cluster.port
    free = port + 1 if port < 31999 else port - 1
    with pytest.raises(JournalError, match="Connection refused|connection to server"):
        PgJournal(f"postgresql://postgres@127.0.0.1:{free}/emq")
    pg_cluster.execute("DROP ROLE IF EXISTS emq_nobody")
    pg_cluster.execute("CREATE ROLE emq_nobody LOGIN")
    url = pg_cluster.create_database("emq_no_permission")
    try:
        with pytest.raises(JournalError, match="permission denied"):
            PgJournal(url.replace("postgres@", "emq_nobody@"))
    finally:
        pg_cluster.drop_database("emq_no_permission")


def test_a_new_journal_moves_the_old_tables_aside(journal: PgJournal, pg_url: str) -> None:
    journal.apply([put(b"old")])
    fresh = PgJournal(pg_url, new=True)
    try:
        assert fresh.load() == []
        fresh.apply([put(b"new")])
    finally:
        fresh.close()
    assert ids(pg_url) == [b"new"]
