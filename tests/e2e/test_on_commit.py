"""Sending on commit, end to end: a job enqueued on commit inside a transaction that
rolls back never runs; one inside a transaction that commits runs once. For
``delay_on_commit``, ``@emq.task(on_commit=True)`` and the Django Tasks API's
``.using(on_commit=True)``, with the real broker and job manager."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.djangotasks_stack import Stack, run_stack
from tests.e2e.test_spine import tagged

pytestmark = [pytest.mark.e2e, pytest.mark.djangotasks]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from run_stack(tmp_path_factory)


SNIPPET = """
from django.db import transaction
from {api}.exceptions import TaskResultDoesNotExist

path = {path!r}

class Rollback(Exception):
    pass

with transaction.atomic():
    emq_commit = t.emq_touch.delay_on_commit(path, "emq-commit")
    show("PENDING_INSIDE", emq_commit.sent is None)
    try:
        emq_commit.get(timeout=1)
    except Exception as exc:
        show("GET_INSIDE", type(exc).__name__)
    option_commit = t.emq_touch_on_commit.delay(path, "emq-option-commit")
    djt_commit = t.touch.using(on_commit=True).enqueue(path, "djt-commit")
    show("DJT_INSIDE", str(djt_commit.status))
    try:
        with transaction.atomic():  # a savepoint that rolls back, in a commit
            t.emq_touch.delay_on_commit(path, "emq-savepoint-rollback")
            raise Rollback
    except Rollback:
        pass

try:
    with transaction.atomic():
        t.emq_touch.delay_on_commit(path, "emq-rollback")
        t.emq_touch_on_commit.delay(path, "emq-option-rollback")
        djt_rollback = t.touch.using(on_commit=True).enqueue(path, "djt-rollback")
        raise Rollback
except Rollback:
    pass

show("VALUES", [emq_commit.get(timeout=15), option_commit.get(timeout=15)])
show("DJT", state(wait(djt_commit)))
try:
    t.touch.get_result(djt_rollback.id)
except TaskResultDoesNotExist:
    show("DJT_ROLLBACK", "does not exist")
# outside a transaction: sent at once
show("NOW", t.emq_touch.delay_on_commit(path, "emq-now").get(timeout=15))
"""


def test_on_commit_runs_once_after_commit_and_never_after_rollback(stack: Stack) -> None:
    path = stack.tmp / "on_commit.txt"
    api = "django.tasks" if _has_django_tasks() else "django_tasks"
    out = stack.shell(SNIPPET.format(api=api, path=str(path)))
    assert tagged(out, "PENDING_INSIDE") is True
    assert tagged(out, "GET_INSIDE") == "ResultUnavailable"
    assert tagged(out, "DJT_INSIDE") == "READY"
    assert tagged(out, "VALUES") == ["emq-commit", "emq-option-commit"]
    assert tagged(out, "DJT")["status"] == "SUCCESSFUL"
    assert tagged(out, "DJT_ROLLBACK") == "does not exist"
    assert tagged(out, "NOW") == "emq-now"
    time.sleep(1.0)  # room for a job that should not have been sent to show up
    ran = sorted(path.read_text().splitlines())
    assert ran == ["djt-commit", "emq-commit", "emq-now", "emq-option-commit"]


def _has_django_tasks() -> bool:
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        return False
    return True
