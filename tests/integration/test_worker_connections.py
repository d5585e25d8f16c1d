"""After each job a worker process closes the database connections left broken or
past their age (``close_old_connections``, as Django does after a request), from
the first connection the process opens on; before that there is nothing to close
and it does not ask Django (worker/execution.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections

import emq_django as emq
from emq_django.protocol.body import encode_result, encode_run_body
from emq_django.worker import execution

pytestmark = pytest.mark.django_db(transaction=True)


@emq.task(queue="default")
def open_a_connection() -> int:
    """Opens a connection of its own (the test database's is open already)."""
    conn = connections.create_connection("default")
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            return int(cursor.fetchone()[0])
    finally:
        conn.close()


@emq.task(queue="default")
def no_db() -> None:
    return None


def _body(name: str) -> bytes:
    return encode_run_body(__name__, name)


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A process that has opened no connection yet; counts close_old_connections."""
    calls: list[int] = []
    real = execution.close_old_connections

    def counted(**kwargs: object) -> None:
        calls.append(1)
        real(**kwargs)

    monkeypatch.setattr(execution._Connections, "opened", False)
    monkeypatch.setattr(execution, "close_old_connections", counted)
    yield calls


def test_no_close_before_the_process_opened_a_connection(closes: list[int]) -> None:
    outcome = execution.execute(_body("no_db"), b"job#1")
    assert not outcome.failed and outcome.body == encode_result(None) == b'{"value":null}'
    assert closes == [] and not execution._Connections.opened


def test_every_job_closes_old_connections_once_one_was_opened(closes: list[int]) -> None:
    outcome = execution.execute(_body("open_a_connection"), b"job#1")
    assert not outcome.failed and outcome.body == b'{"value":1}'
    assert execution._Connections.opened
    assert closes == [1]  # after the job that opened it
    execution.execute(_body("no_db"), b"job#2")
    assert closes == [1, 1]  # and after every job from then on


def test_a_connection_open_when_the_worker_starts_counts(closes: list[int]) -> None:
    connection.ensure_connection()  # opened before the worker process started
    execution.note_open_connections()
    assert execution._Connections.opened
    execution.execute(_body("no_db"), b"job#1")
    assert closes == [1]
