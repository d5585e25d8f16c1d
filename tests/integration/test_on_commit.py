"""Sending on commit, in this process under EMQ_EAGER (the tasks run inline when the
job would be sent). The end-to-end version is tests/e2e/test_on_commit.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import transaction

from emq_django.backends.compat import TaskResultDoesNotExist, TaskResultStatus
from emq_django.conf import reset_cached_settings
from emq_django.exceptions import ResultUnavailable
from emq_django.transaction import DeferredResult
from tests.e2e import djangotasks_tasks as t

pytestmark = [pytest.mark.djangotasks, pytest.mark.django_db(transaction=True)]


class Rollback(Exception):
    pass


@pytest.fixture
def ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("EMQ_EAGER", "1")
    reset_cached_settings()
    yield tmp_path / "ran.txt"
    monkeypatch.delenv("EMQ_EAGER")
    reset_cached_settings()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_delay_on_commit_waits_for_the_commit(ran: Path) -> None:
    with transaction.atomic():
        result = t.emq_touch.delay_on_commit(str(ran), "a")
        assert isinstance(result, DeferredResult) and result.sent is None
        assert lines(ran) == [] and not result.ready()
        with pytest.raises(ResultUnavailable, match="has not committed"):
            result.get(timeout=0)
    assert lines(ran) == ["a"]
    assert result.get(timeout=1) == "a"


def test_nothing_is_sent_when_the_transaction_rolls_back(ran: Path) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        t.emq_touch.delay_on_commit(str(ran), "rolled back")
        t.emq_touch_on_commit.delay(str(ran), "option rolled back")
        t.emq_touch.apply_async((str(ran), "per call"), on_commit=True)
        raise Rollback
    with transaction.atomic():
        with pytest.raises(Rollback), transaction.atomic():  # savepoint
            t.emq_touch.delay_on_commit(str(ran), "savepoint rolled back")
            raise Rollback
        t.emq_touch_on_commit.delay(str(ran), "committed")
    assert lines(ran) == ["committed"]


def test_outside_a_transaction_it_is_sent_at_once(ran: Path) -> None:
    result = t.emq_touch.delay_on_commit(str(ran), "now")
    assert not isinstance(result, DeferredResult)
    assert result.get(timeout=1) == "now" and lines(ran) == ["now"]
    assert t.emq_touch.apply_async((str(ran), "plain"), on_commit=False).get() == "plain"


def test_bad_timing_fails_at_once_not_at_commit(ran: Path) -> None:
    with transaction.atomic():
        with pytest.raises(ValueError, match="countdown or eta"):
            t.emq_touch.apply_async(
                (str(ran), "x"),
                on_commit=True,
                countdown=1,
                eta=object(),  # type: ignore[arg-type]
            )


def test_django_tasks_on_commit(ran: Path) -> None:
    with transaction.atomic():
        committed = t.touch.using(on_commit=True).enqueue(str(ran), "djt")
        assert committed.status == TaskResultStatus.READY and lines(ran) == []
    assert lines(ran) == ["djt"]
    assert t.touch.get_result(committed.id).return_value == "djt"
    with pytest.raises(Rollback), transaction.atomic():
        dropped = t.touch.using(on_commit=True).enqueue(str(ran), "dropped")
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        t.touch.get_result(dropped.id)
    assert lines(ran) == ["djt"]
