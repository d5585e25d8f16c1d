"""The job history: DatabaseRecorder's batched upserts, pruning, emq.result(), the
admin (filters, search, masked arguments, retry through the client API)."""

from __future__ import annotations

import importlib
import json
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

import emq_django as emq
from emq_django import monitor_client
from emq_django.exceptions import ResultTimeout, TaskFailed
from emq_django.results import actions
from emq_django.results.models import JobResult, JobStat
from emq_django.results.pruning import prune
from emq_django.results.recorder import DatabaseRecorder
from emq_django.worker.recording import JobRecord

pytestmark = pytest.mark.django_db(transaction=True)
# the Result handles live in emq_django.handles; emq.result() is the function
result_module = importlib.import_module("emq_django.handles")


def record(
    job_id: str = "job1",
    attempt: int = 1,
    *,
    value: Any = 42,
    error: tuple[str, str] | None = None,
    lost: bool = False,
    finished: float | None = None,
    task: str = "tests.e2e.spine_tasks.add",
    queue: str = "spine",
    args: list[Any] | None = None,
) -> JobRecord:
    finished = time.time() if finished is None else finished
    if error:
        body = json.dumps({"error": {"type": error[0], "message": error[1], "traceback": "tb"}})
    else:
        body = json.dumps({"value": value}, separators=(",", ":"))
    return JobRecord(
        job_id,
        attempt,
        "" if lost else task,
        "" if lost else queue,
        [] if lost else (args if args is not None else [40, 2]),
        {},
        finished - 0.01,
        finished,
        error is not None,
        error[0] if error else "",
        body.encode(),
        "vm:1",
        lost=lost,
    )


@pytest.fixture
def recorder() -> Any:
    r = DatabaseRecorder()
    yield r
    r.close()


def test_flush_writes_rows_and_stats(recorder: DatabaseRecorder) -> None:
    recorder.record(record("a", value={"x": [1, "é"]}))
    recorder.record(record("b", error=("ValueError", "bad")))
    assert JobResult.objects.count() == 0, "record() must not touch the database"
    recorder.flush()
    a, b = JobResult.objects.get(pk="a"), JobResult.objects.get(pk="b")
    assert (a.status, a.value(), a.decoded_args()) == ("succeeded", {"x": [1, "é"]}, ([40, 2], {}))
    assert (b.status, b.error_type, b.error, b.traceback) == ("failed", "ValueError", "bad", "tb")
    assert 0.009 < a.runtime < 0.011
    stat = JobStat.objects.get()
    assert (stat.queue, stat.succeeded, stat.failed) == ("spine", 1, 1)


def test_later_attempt_wins_and_lost_keeps_what_was_known(recorder: DatabaseRecorder) -> None:
    recorder.record(record("j", 2, value="second"))
    recorder.flush()
    recorder.record(record("j", 1, value="first, late"))
    recorder.flush()
    assert JobResult.objects.get(pk="j").value() == "second"
    recorder.record(record("j", 3, error=("TimeoutError", "killed"), lost=True))
    recorder.flush()
    row = JobResult.objects.get(pk="j")
    assert (row.status, row.attempts, row.task, row.queue) == (
        "timed_out",
        3,
        "tests.e2e.spine_tasks.add",
        "spine",
    )
    assert row.decoded_args() == ([40, 2], {})


def test_records_wait_while_the_database_fails(recorder: DatabaseRecorder, caplog: Any) -> None:
    recorder.record(record("kept"))
    recorder._connection()
    good = recorder._upsert
    recorder._upsert = "INSERT INTO no_such_table VALUES (%s)"
    recorder.flush()
    assert "could not record 1 finished jobs" in caplog.text
    assert not JobResult.objects.filter(pk="kept").exists()
    recorder._connection()
    recorder._upsert = good
    recorder.flush()
    assert JobResult.objects.filter(pk="kept").exists()


def test_prune_deletes_what_is_older_than_the_retention(recorder: DatabaseRecorder) -> None:
    now = time.time()
    for i in range(12):
        recorder.record(record(f"old{i}", finished=now - 7200 - i))
    recorder.record(record("new", finished=now - 10))
    recorder.flush()
    from django.db import connection

    assert prune(connection, retention=3600, now=now) == 12
    assert list(JobResult.objects.values_list("id", flat=True)) == ["new"]


def test_recorder_prunes_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_RESULTS_RETENTION", "60")
    r = DatabaseRecorder()
    r.record(record("ancient", finished=time.time() - 3600))
    r._next_prune = 0.0
    r.flush()  # writes, then prunes what it just wrote: older than 60 s
    r.close()
    assert not JobResult.objects.exists()


def test_emq_result_reads_the_history(recorder: DatabaseRecorder) -> None:
    recorder.record(record("ok", value=[1, 2]))
    recorder.record(record("bad", error=("ValueError", "nope")))
    recorder.flush()
    assert emq.result("ok").get(timeout=1) == [1, 2]
    with pytest.raises(TaskFailed) as info:
        emq.result("bad").get(timeout=1)
    assert (info.value.type, info.value.message) == ("ValueError", "nope")
    with pytest.raises(ResultTimeout):
        emq.result("missing").get(timeout=0.3)
    assert not emq.result("missing").ready()


class LostReplies:
    """A client whose REPLY never comes (the sending process restarted)."""

    def wait_reply(
        self, msgid: bytes, timeout: float | None, sent_at_change: int | None = None
    ) -> Any:
        time.sleep(min(timeout or 0, 0.05))
        raise ResultTimeout("no reply")


def test_get_falls_back_to_the_history(
    recorder: DatabaseRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(result_module, "HISTORY_FIRST_LOOK", 0.05)
    recorder.record(record("r1", value="from the db"))
    recorder.flush()
    handle = emq.Result("r1", "t", client=LostReplies())  # type: ignore[arg-type]
    assert handle.get(timeout=2) == "from the db"
    with pytest.raises(ResultTimeout):
        emq.Result("r2", "t", client=LostReplies()).get(timeout=0.3)  # type: ignore[arg-type]


# ---- admin -------------------------------------------------------------------


@pytest.fixture
def staff() -> Client:
    user = User.objects.create_superuser("admin", "a@example.com", "admin")
    c = Client()
    c.force_login(user)
    return c


def test_changelist_filters_and_search(recorder: DatabaseRecorder, staff: Client) -> None:
    recorder.record(record("abc123", task="pkg.t.one", queue="q1"))
    recorder.record(record("abd456", task="pkg.t.two", queue="q2", error=("ValueError", "x")))
    recorder.flush()
    url = "/admin/emq_results/jobresult/"
    for query, expected in (
        ("?status=failed", {"abd456"}),
        ("?queue=q1", {"abc123"}),
        ("?task=pkg.t.two", {"abd456"}),
        ("?finished=1h", {"abc123", "abd456"}),
        ("?finished=older", set()),
        ("?q=abc", {"abc123"}),
    ):
        # the rows the list shows, not strings searched in the whole page (a random
        # CSRF token may contain any short string: issue 29)
        shown = staff.get(url + query).context["cl"].result_list
        assert {r.id for r in shown} == expected, query


def test_arguments_are_masked_unless_asked(
    recorder: DatabaseRecorder, staff: Client, settings: Any
) -> None:
    # with dashes: no random token on the page can contain it
    secret = "hunter2-must-not-be-shown"
    recorder.record(record("secret", args=[secret]))
    recorder.flush()
    page = staff.get("/admin/emq_results/jobresult/secret/change/").content.decode()
    assert secret not in page and "masked" in page
    settings.EMQ_RESULTS_SHOW_ARGS = True
    page = staff.get("/admin/emq_results/jobresult/secret/change/").content.decode()
    assert secret in page


class FakeClient:
    broker_changes = 0  # the broker never restarted (Client.broker_changes)

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, queue: str, headers: bytes, body: bytes, **kw: Any) -> str:
        self.sent.append((queue, headers, body))
        return f"new{len(self.sent)}"


def test_retry_action_sends_through_the_client(
    recorder: DatabaseRecorder, staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeClient()
    monkeypatch.setattr("emq_django.client.get_client", lambda: fake)
    monkeypatch.setattr(actions, "get_client", lambda: fake)
    recorder.record(record("r-known", task="tests.e2e.spine_tasks.add", args=[1, 2]))
    recorder.record(record("r-other", task="other.mod.fn", queue="elsewhere", args=["x"]))
    recorder.flush()
    import tests.e2e.spine_tasks  # noqa: F401  (registers the task, as autodiscovery would)

    response = staff.post(
        "/admin/emq_results/jobresult/",
        {"action": "retry_jobs", "_selected_action": ["r-known", "r-other"]},
        follow=True,
    )
    assert "Sent again" in response.content.decode()
    sent = {q: (h, json.loads(b)) for q, h, b in fake.sent}
    assert sent["spine"][1] == [
        "run",
        {"callable": "add", "path": "tests.e2e.spine_tasks", "args": [1, 2], "kwargs": {}},
    ]
    assert b"task:other.mod.fn" in sent["elsewhere"][0]
    assert sent["elsewhere"][1][1]["args"] == ["x"]
    assert JobResult.objects.count() == 2, "retry sends jobs; it does not write rows"


def test_cancel_action_says_why_it_cannot(
    recorder: DatabaseRecorder, staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emq_django.exceptions import BrokerUnavailable

    def unreachable(*args: Any) -> bytes:
        raise BrokerUnavailable("broker unreachable at tcp://127.0.0.1:1")

    monkeypatch.setattr(monitor_client, "query", unreachable)
    recorder.record(record("c1"))
    recorder.flush()
    response = staff.post(
        "/admin/emq_results/jobresult/",
        {"action": "cancel_jobs", "_selected_action": ["c1"]},
        follow=True,
    )
    assert "Not cancelled: broker unreachable" in response.content.decode()
    assert JobResult.objects.get(pk="c1").status == "succeeded"


@pytest.mark.e2e
def test_cancel_action_names_every_row_a_live_broker_did_not_cancel(
    recorder: DatabaseRecorder,
    staff: Client,
    emq_processes: Any,
    emq_client_env: dict[str, str],
) -> None:
    recorder.record(record("done1"))
    recorder.record(record("done2", error=("ValueError", "bad")))
    recorder.flush()
    broker = emq_processes.start("emq_broker")
    emq_processes.wait_for_port(
        int(emq_client_env["EMQ_MONITOR_BIND"].rsplit(":", 1)[1]), proc=broker
    )
    response = staff.post(
        "/admin/emq_results/jobresult/",
        {"action": "cancel_jobs", "_selected_action": ["done1", "done2"]},
        follow=True,
    )
    page = response.content.decode()
    assert "done1 has already finished (succeeded)" in page
    assert "done2 has already finished (failed)" in page
    assert JobResult.objects.get(pk="done1").status == "succeeded"
