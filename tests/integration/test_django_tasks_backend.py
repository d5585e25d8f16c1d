"""EmqTaskBackend in this process: validation, emq's options, discovery, and
EMQ_EAGER runs (no broker). The end-to-end tests are tests/e2e/test_django_tasks.py."""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from emq_django import registry
from emq_django.backends.backend import EmqTaskBackend
from emq_django.backends.compat import (
    SOURCE,
    InvalidTaskError,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from emq_django.backends.discovery import register_django_tasks
from emq_django.backends.options import JobOptions
from emq_django.backends.tasks import EmqTask, emq_options
from emq_django.conf import reset_cached_settings
from tests.e2e import djangotasks_tasks as t
from tests.integration import test_broker_server as base

pytestmark = pytest.mark.djangotasks

EMQ = {"BACKEND": "emq_django.backends.EmqTaskBackend", "QUEUES": []}
start_broker = base.start_broker  # the fixture: a BrokerServer in a thread


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("EMQ_EAGER", "1")
    reset_cached_settings()
    yield
    monkeypatch.delenv("EMQ_EAGER")
    reset_cached_settings()


def test_tasks_are_emq_tasks_with_their_options() -> None:
    assert isinstance(t.add, EmqTask)
    assert isinstance(t.add.get_backend(), EmqTaskBackend)
    assert (t.flaky.retries, t.flaky.guarantee) == (2, None)
    assert (t.touch_guaranteed.guarantee, t.touch_guaranteed.timeout) == (True, 30)
    moved = t.flaky.using(queue_name="other", timeout=5, on_commit=True)
    assert (moved.queue_name, moved.retries, moved.timeout, moved.on_commit) == (
        "other",
        2,
        5,
        True,
    )


def test_options_come_from_the_task_then_the_backend_then_emq() -> None:
    tasks = {"default": {**EMQ, "OPTIONS": {"retries": 5, "TIMEOUT": 9, "guarantee": True}}}
    with override_settings(TASKS=tasks):
        backend = task_backends["default"]
        assert backend.job_options(t.add) == JobOptions(True, 5, 9, False)
        assert backend.job_options(t.flaky.using(guarantee=False)) == JobOptions(False, 2, 9)
    assert task_backends["default"].job_options(t.add) == JobOptions()


def test_soft_timeout_is_an_option_like_the_others() -> None:
    tasks = {"default": {**EMQ, "OPTIONS": {"timeout": 9, "soft_timeout": 8}}}
    with override_settings(TASKS=tasks):
        backend = task_backends["default"]
        assert backend.job_options(t.add).soft_timeout == 8
        assert backend.job_options(t.add.using(soft_timeout=2)).soft_timeout == 2
    with pytest.raises(ValueError, match="soft_timeout must be a number >= 0"):
        t.add.using(soft_timeout=-1)


def test_bad_options_are_refused_with_their_name() -> None:
    with pytest.raises(ValueError, match="retries must be a number >= 0"):
        t.add.using(retries=-1)
    with pytest.raises(ValueError, match=r"unknown emq option\(s\) \['colour'\]"):
        emq_options(colour="red")
    with override_settings(TASKS={"default": {**EMQ, "OPTIONS": {"guarantee": "yes"}}}):
        with pytest.raises(ImproperlyConfigured, match='TASKS\\["default"\\]\\["OPTIONS"\\]'):
            task_backends["default"]


def test_priority_is_supported_and_its_range_checked() -> None:
    assert EmqTaskBackend.supports_priority is True
    assert t.add.using(priority=10).priority == 10
    with pytest.raises(InvalidTaskError, match="priority"):
        t.add.using(priority=101)


def test_queues_are_checked_when_the_backend_lists_them() -> None:
    with override_settings(TASKS={"default": {**EMQ, "QUEUES": ["default", "email"]}}):
        t.add.using(queue_name="email")
        with pytest.raises(InvalidTaskError, match="Queue 'djtasks' is not valid"):
            t.add.using(queue_name="djtasks")


MODULE = """
from {api} import task

@task(queue_name="djtasks")
def ours():
    return 1

@task(backend="dummy")
def theirs():
    return 2

not_a_task = len
"""


@pytest.fixture
def mixed_module() -> Iterator[str]:
    api = "django.tasks" if SOURCE == "django.tasks" else "django_tasks"
    dummy = f"{api}.backends.dummy.DummyBackend"
    name = "tests.integration._djt_mixed_tasks"
    with override_settings(TASKS={"default": EMQ, "dummy": {"BACKEND": dummy}}):
        module = types.ModuleType(name)
        module.__file__ = f"<{name}>"
        sys.modules[name] = module
        exec(
            compile(textwrap.dedent(MODULE.format(api=api)), module.__file__, "exec"), vars(module)
        )
        try:
            yield name
        finally:
            del sys.modules[name]
            for key in [k for k in registry.names() if k.startswith(name)]:
                del registry._tasks[key]


def test_discovery_registers_only_tasks_on_an_emq_backend(mixed_module: str) -> None:
    assert register_django_tasks([mixed_module]) == [f"{mixed_module}.ours"]
    assert registry.find(f"{mixed_module}.ours") is not None
    assert registry.find(f"{mixed_module}.theirs") is None


def test_eager_runs_inline_with_the_signals(eager: None) -> None:
    seen: list[tuple[str, str]] = []

    def receiver(name: str) -> Any:
        def got(sender: Any, task_result: Any, **kwargs: Any) -> None:
            assert sender is EmqTaskBackend
            seen.append((name, str(task_result.status)))

        return got

    receivers = [receiver(n) for n in ("enqueued", "started", "finished")]
    for signal, r in zip((task_enqueued, task_started, task_finished), receivers, strict=True):
        signal.connect(r)
    try:
        ok = t.add.enqueue(2, 2)
        bad = t.fail.enqueue("eager")
    finally:
        for signal, r in zip((task_enqueued, task_started, task_finished), receivers, strict=True):
            signal.disconnect(r)
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 4
    assert t.add.get_result(ok.id).return_value == 4
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class is ValueError
    assert seen == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "FAILED"),
    ]


def test_discovery_looks_in_every_apps_tasks_module_and_emq_imports() -> None:
    from django.utils.module_loading import autodiscover_modules

    from emq_django.backends.discovery import task_modules

    autodiscover_modules("tasks")
    found = task_modules(["tests.e2e.djangotasks_tasks", "not.imported.anywhere"])
    assert "project.demo.tasks" in found and "tests.e2e.djangotasks_tasks" in found
    assert "not.imported.anywhere" not in found
    assert "tests.e2e.djangotasks_tasks.add" in register_django_tasks(
        ["tests.e2e.djangotasks_tasks"]
    )
    assert registry.find("tests.e2e.djangotasks_tasks.add") is not None


@pytest.mark.django_db
def test_jobs_the_broker_refused_leave_no_ready_state(
    start_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs go without reply; the broker (its queue holds 3, nobody serves it)
    refuses the rest: the enqueue() that hears of it raises JobsRefused, and the
    refused jobs are not left READY for ever."""
    from emq_django.backends.models import TaskState
    from emq_django.client import reset_client
    from emq_django.exceptions import JobsRefused

    broker = start_broker(MAX_PENDING=3)
    monkeypatch.setenv("EMQ_BROKER_URL", broker.frontend)
    reset_cached_settings()
    reset_client()
    try:
        sent = []
        with pytest.raises(JobsRefused) as refused:
            for n in range(5000):  # the client reads its answers at least every 1000 jobs
                sent.append(t.add.enqueue(n, n).id)
        assert refused.value.job_ids == sent[3 : 3 + len(refused.value.job_ids)]
        states = set(TaskState.objects.values_list("pk", flat=True))
        assert states == set(sent[:3]) | set(sent[3 + refused.value.count :])
    finally:
        reset_client()
        reset_cached_settings()
