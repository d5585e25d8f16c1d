"""The Django Tasks API against EmqTaskBackend, end to end.

One broker and one job manager (recording to a migrated SQLite database) serve the
whole module. Each test runs a `manage.py shell` snippet that uses only the public
API (@task, .enqueue(), .using(), get_result(), TaskResult.refresh()) and prints
what it saw as TAG=<json> lines. `make test` also runs this file on Django 6.0.
"""

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


def test_enqueue_runs_on_the_job_manager_and_get_result_reads_it_back(stack: Stack) -> None:
    out = stack.shell(
        """
        r = t.add.enqueue(2, 3)
        show("ENQUEUED", {"status": str(r.status), "id": r.id, "backend": r.backend,
                          "enqueued_at": r.enqueued_at})
        wait(r)
        show("FINAL", state(r))
        again = t.add.get_result(r.id)
        show("AGAIN", state(again))
        """
    )
    enqueued = tagged(out, "ENQUEUED")
    assert enqueued["status"] == "READY" and enqueued["backend"] == "default"
    assert enqueued["enqueued_at"] is not None
    final = tagged(out, "FINAL")
    assert final["status"] == "SUCCESSFUL" and final["value"] == 5
    assert final["attempts"] == 1 and final["workers"] == ["djt"]
    assert final["args"] == [2, 3] and final["errors"] == []
    assert final["started_at"] and final["finished_at"] and final["enqueued_at"]
    assert tagged(out, "AGAIN") == final

    # another process, which only knows the id, reads the same result
    later = stack.shell(
        f"""
        from {_api_module()} import default_task_backend
        show("OTHER", state(default_task_backend.get_result({final["id"]!r})))
        """
    )
    assert tagged(later, "OTHER")["value"] == 5


def test_a_failing_task_is_failed_with_its_exception_and_traceback(stack: Stack) -> None:
    out = stack.shell(
        """
        r = wait(t.fail.enqueue("no way"))
        show("FINAL", state(r))
        try:
            r.return_value
        except ValueError as exc:
            show("RAISES", str(exc))
        show("CLASS", r.errors[0].exception_class.__name__)
        """
    )
    final = tagged(out, "FINAL")
    assert final["status"] == "FAILED"
    [[path, tb]] = final["errors"]
    assert path == "builtins.ValueError" and "no way" in tb and "in fail" in tb
    assert tagged(out, "RAISES") == "Task failed"
    assert tagged(out, "CLASS") == "ValueError"


def test_statuses_go_ready_running_successful(stack: Stack) -> None:
    out = stack.shell(
        """
        seen = []
        r = t.nap.enqueue(1.5)
        seen.append(str(r.status))
        wait(r, seen=seen)
        show("SEEN", seen)
        show("FINAL", state(r))
        """
    )
    seen = tagged(out, "SEEN")
    order = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
    assert order == ["READY", "RUNNING", "SUCCESSFUL"], seen
    assert tagged(out, "FINAL")["value"]["slept"] == 1.5


def test_signals_enqueued_here_started_and_finished_in_the_worker(stack: Stack) -> None:
    out = stack.shell(
        """
        import os
        ok, bad = t.add.enqueue(1, 1), t.fail.enqueue("x")
        wait(ok), wait(bad)
        show("IDS", [ok.id, bad.id, os.getpid()])
        """
    )
    ok, bad, shell_pid = tagged(out, "IDS")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = stack.signals()
        if sum(1 for line in lines if line[0] == "finished" and line[2] in (ok, bad)) == 2:
            break
        time.sleep(0.05)
    for job, last in ((ok, "SUCCESSFUL"), (bad, "FAILED")):
        # name -> (status, pid); the worker may finish before the shell logs "enqueued"
        got = {name: (status, int(pid)) for name, pid, i, status in lines if i == job}
        assert len([line for line in lines if line[2] == job]) == 3, lines
        assert got["enqueued"] == ("READY", shell_pid)
        assert got["started"][0] == "RUNNING" and got["finished"][0] == last
        assert got["started"][1] == got["finished"][1] != shell_pid  # the worker process


def test_context_deferral_async_and_retries(stack: Stack) -> None:
    counter = stack.tmp / "flaky.count"
    out = stack.shell(
        f"""
        import datetime as dt
        from django.utils import timezone
        later = t.add.using(run_after=timezone.now() + dt.timedelta(seconds=2)).enqueue(4, 4)
        later.refresh()
        show("LATER_EARLY", str(later.status))
        ctx = t.with_context.enqueue("hi")
        coro = t.async_add.enqueue(20, 22)
        flaky = t.flaky.enqueue({str(counter)!r}, 1)
        show("CTX", state(wait(ctx)))
        show("LATER", state(wait(later)))
        show("LATER_RUN_AFTER", later.task.run_after)
        show("ASYNC", state(wait(coro)))
        show("FLAKY", state(wait(flaky)))
        """
    )
    ctx = tagged(out, "CTX")
    assert ctx["value"] == {"tag": "hi", "id": ctx["id"], "attempt": 1}
    assert tagged(out, "LATER_EARLY") == "READY"
    later = tagged(out, "LATER")
    assert later["value"] == 8 and later["started_at"] >= tagged(out, "LATER_RUN_AFTER")
    assert tagged(out, "ASYNC")["value"] == 42
    flaky = tagged(out, "FLAKY")
    assert flaky["status"] == "SUCCESSFUL" and flaky["value"] == 2 and flaky["attempts"] == 2


def test_refused_before_sending_priority_and_unknown_ids(stack: Stack) -> None:
    out = stack.shell(
        f"""
        from {_api_module()}.exceptions import {_invalid_task()} as Invalid
        from {_api_module()}.exceptions import TaskResultDoesNotExist
        try:
            t.add.using(priority=101)
        except Invalid as exc:
            show("PRIORITY", str(exc))
        try:
            t.add.get_result("no-such-job")
        except TaskResultDoesNotExist as exc:
            show("MISSING", str(exc))
        try:
            t.add.enqueue(object(), 1)
        except TypeError as exc:
            show("JSON", str(exc))
        """
    )
    assert "priority" in tagged(out, "PRIORITY")
    assert "no-such-job" in tagged(out, "MISSING")
    assert "Unsupported type" in tagged(out, "JSON")


def test_guaranteed_task_is_acked_and_runs(stack: Stack) -> None:
    path = stack.tmp / "guaranteed.txt"
    out = stack.shell(
        f"""
        r = t.touch_guaranteed.enqueue({str(path)!r}, "g1")
        show("FINAL", state(wait(r)))
        """
    )
    assert tagged(out, "FINAL")["value"] == "g1"
    assert path.read_text() == "g1\n"


def _api_module() -> str:
    try:
        import django.tasks  # noqa: F401

        return "django.tasks"
    except ImportError:
        return "django_tasks"


def _invalid_task() -> str:
    return "InvalidTask" if _api_module() == "django.tasks" else "InvalidTaskError"
