"""A job's life in BrokerCore after it is accepted: retries with backoff, emq.Retry,
dead letters, run-after, de-duplication, the journal ops, the memory bound with spill
to disk, and restore from the journal. Pure: typed commands in, typed effects out
(tests/support/core_harness.py), fake ``now``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import (
    OK_READY,
    Acknowledge,
    Answer,
    Deliver,
    Effect,
    Outcome,
    Refuse,
)
from emq_django.broker.journal import Journal
from emq_django.broker.lifecycle import RETRY_REQUESTED_LIMIT
from emq_django.protocol.limits import DUPLICATE
from tests.support.core_harness import CoreHarness, failed

BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [1, 2], "kwargs": {}}]'
WALL = 1_000_000.0  # core.wall_offset: wall clock = now + WALL
# a long heartbeat interval: peers that never beat stay alive for the whole test, and
# next_deadline() is not cluttered by heartbeats and expiry checks
INTERVAL = 100.0
LIVENESS = 3
W = b"jm-1"
CLIENT = b"client"
FAIL = failed("ValueError")
OK = OK_READY

Out = list[Effect]


def make_core(journal: bool = False, trace: bool = False, **config: Any) -> CoreHarness:
    return CoreHarness(
        BrokerConfig(heartbeat_interval=INTERVAL, heartbeat_liveness=LIVENESS, **config),
        wall_offset=WALL,
        journal=journal,
        trace=trace,
        seed=1,
    )


# ---- typed commands in, typed effects out --------------------------------------


def inform(
    core: CoreHarness, ident: bytes, queues: Any = ((10, "default"),), now: float = 0.0
) -> Out:
    return core.join(ident, queues, now=now)


def ready(core: CoreHarness, ident: bytes, now: float = 0.0, times: int = 1) -> Out:
    return core.ready(ident, times, now=now)


def request(
    core: CoreHarness,
    client: bytes,
    msgid: bytes,
    queue: str = "default",
    headers: bytes = b"",
    now: float = 0.0,
) -> Out:
    return core.request(client, msgid, queue, headers, BODY, now=now)


def reply(
    core: CoreHarness,
    ident: bytes,
    attempt_id: bytes,
    status: Outcome = OK,
    body: bytes = b'{"value": 3}',
    now: float = 0.0,
) -> Out:
    return core.result(ident, attempt_id, status, body, now=now)


def tick(core: CoreHarness, now: float, keep_alive: tuple[bytes, ...] = ()) -> Out:
    return core.tick(now, keep_alive)


def take(core: CoreHarness) -> Out:
    return core.take()


def acks(out: Out, msgid: bytes, client: bytes = CLIENT) -> int:
    return sum(
        isinstance(e, Acknowledge) and e.client.identity == client and e.msgid == msgid for e in out
    )


def replies(out: Out, client: bytes = CLIENT) -> list[Answer]:
    return [e for e in out if isinstance(e, Answer) and e.final and e.client.identity == client]


def errors(out: Out, client: bytes = CLIENT) -> list[Refuse]:
    return [e for e in out if isinstance(e, Refuse) and e.client.identity == client]


def dispatched(out: Out, ident: bytes = W) -> list[bytes]:
    return [e.job.attempt_id for e in out if isinstance(e, Deliver) and e.peer.identity == ident]


def events(core: CoreHarness, job_id: bytes | None = None) -> list[tuple[Any, ...]]:
    """The trace lines as (event, ts, job, attempt, queue, task, jm, error, -, -, delay)."""
    assert core.trace is not None
    found = []
    for line in core.trace:
        e = json.loads(line)
        event = (
            e["event"],
            e["ts"],
            e["job"].encode(),
            e["attempt"],
            e["queue"],
            e["task"],
            e["jm"],
            e.get("error") or "",
            None,
            None,
            e.get("delay_us", 0) / 1e6,
        )
        if job_id is None or event[2] == job_id:
            found.append(event)
    return found


def ops_for(core: CoreHarness, job_id: bytes) -> list[tuple[Any, ...]]:
    assert core.journal_ops is not None
    return [op for op in core.journal_ops if len(op) > 1 and op[1] == job_id]


def fail_until_final(
    core: CoreHarness, first: list[bytes], status: Outcome, now: float = 0.0, limit: int = 20
) -> tuple[list[bytes], list[float], list[Answer], float]:
    """Answer every dispatch of one job with ``status``, waking the core exactly when
    each retry is due, until an answer is final (nothing more is delayed).

    Returns (attempt ids dispatched, delays between attempts, final answers to the client,
    the time of the last answer)."""
    attempts = list(first)
    delays: list[float] = []
    to_client: list[Answer] = []
    for _ in range(limit):
        assert attempts, "the job was never dispatched"
        out = reply(core, W, attempts[-1], status, body=b'{"error": "boom"}', now=now)
        to_client += replies(out)
        assert dispatched(out) == []  # a retry waits for its delay, even with credit
        if not len(core.delayed):
            return attempts, delays, to_client, now
        due = core.delayed.next_due()
        assert due > now
        delays.append(due - now)
        assert core.next_deadline() <= due
        early = tick(core, now + (due - now) * 0.99)
        assert dispatched(early) == [], "a retry was dispatched before its delay"
        now = due
        again = dispatched(tick(core, now))
        assert len(again) == 1, f"retry due at {due} was not dispatched: {again}"
        attempts += again
    raise AssertionError(f"still retrying after {limit} attempts")


# ---- retries with backoff, then dead letters -----------------------------------


@pytest.mark.parametrize("reply_requested", [True, False], ids=["reply", "no-reply"])
def test_failing_job_with_three_retries_runs_four_times_then_is_dead_lettered(
    reply_requested: bool,
) -> None:
    core = make_core(trace=True)
    inform(core, W)
    ready(core, W)
    headers = b"retry-count:3,task:pkg.tasks.add"
    if reply_requested:
        headers = b"reply-requested," + headers
    out = request(core, CLIENT, b"j1", headers=headers)
    assert acks(out, b"j1") == 1

    attempts, delays, to_client, _ = fail_until_final(core, dispatched(out), FAIL)

    assert attempts == [b"j1#1", b"j1#2", b"j1#3", b"j1#4"]
    assert len(delays) == 3
    assert delays[0] < delays[1] < delays[2], f"backoff does not grow: {delays}"
    # exponential from retry_base=1.0 with +-20% jitter
    for n, delay in enumerate(delays):
        assert 0.8 * 2**n <= delay <= 1.2 * 2**n
    retried = [e for e in events(core, b"j1") if e[0] == "retried"]
    assert [e[10] for e in retried] == pytest.approx(delays)
    assert {e[7] for e in retried} == {"ValueError"}
    assert [e[0] for e in events(core, b"j1")] == [
        "enqueued",
        "dispatched",
        "retried",
        "dispatched",
        "retried",
        "dispatched",
        "retried",
        "dispatched",
        "failed",
        "dead_lettered",
    ]
    assert [e[3] for e in events(core, b"j1") if e[0] == "dispatched"] == [1, 2, 3, 4]

    c = core.counters
    assert (c["retried"], c["failed"], c["dead_lettered"], c["dispatched"]) == (3, 1, 1, 4)
    assert c["succeeded"] == 0
    if reply_requested:
        assert [r.job.id for r in to_client] == [b"j1"]  # only the final one
        assert to_client[0].outcome.failed and to_client[0].body == b'{"error": "boom"}'
    else:
        assert to_client == []
    (letter,) = core.dead_letters()
    assert letter["id"] == "j1" and letter["attempts"] == 4 and letter["error"] == "ValueError"
    assert core.inflight == {} and len(core.delayed) == 0


def test_failing_job_without_retries_fails_once_and_is_forgotten() -> None:
    core = make_core(trace=True)
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1", headers=b"reply-requested")
    attempts, delays, to_client, _ = fail_until_final(core, dispatched(out), FAIL)
    assert attempts == [b"j1#1"] and delays == []
    assert [r.job.id for r in to_client] == [b"j1"]
    c = core.counters
    assert (c["failed"], c["retried"], c["dead_lettered"]) == (1, 0, 0)
    assert core.dead_letters() == []
    assert b"j1" not in core.jobs  # forgotten...
    assert b"j1" in core.recent  # ...but for its id, to de-duplicate a resend
    assert [e[0] for e in events(core, b"j1")][-1] == "failed"


def test_successful_retry_ends_the_job() -> None:
    core = make_core()
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"j1", headers=b"reply-requested,retry-count:3")
    assert replies(reply(core, W, b"j1#1", FAIL)) == []
    due = core.delayed.next_due()
    assert dispatched(tick(core, due)) == [b"j1#2"]
    out = reply(core, W, b"j1#2", OK, now=due)
    assert [r.job.id for r in replies(out)] == [b"j1"] and not replies(out)[0].outcome.failed
    c = core.counters
    assert (c["retried"], c["succeeded"], c["failed"], c["dead_lettered"]) == (1, 1, 0, 0)
    assert b"j1" not in core.jobs and core.dead_letters() == []


def test_timeout_failure_is_traced_as_timed_out() -> None:
    core = make_core(trace=True)
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1")
    fail_until_final(core, dispatched(out), failed("TimeoutError"))
    assert [(e[0], e[7]) for e in events(core, b"j1")][-1] == ("timed_out", "TimeoutError")


# ---- emq.Retry: retry / retry:<seconds> ------------------------------------------


def test_retry_with_seconds_uses_that_delay() -> None:
    core = make_core(trace=True)
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1", now=5.0)
    reply(core, W, dispatched(out)[0], failed("emq.Retry", retry=2.5), now=5.0)
    assert core.delayed.next_due() == pytest.approx(7.5)
    assert [e[10] for e in events(core, b"j1") if e[0] == "retried"] == [pytest.approx(2.5)]
    assert dispatched(tick(core, 7.49)) == []
    assert dispatched(tick(core, 7.5)) == [b"j1#2"]
    assert core.counters["retried"] == 1 and core.counters["failed"] == 0


def test_retry_status_written_by_the_worker_is_understood_by_the_broker() -> None:
    """The status frame comes from worker.execution.Outcome.status (emq.Retry(2.5))."""
    from emq_django.broker.ports.emqp_workers import outcome_of
    from emq_django.worker.execution import Outcome as WorkerOutcome

    status = WorkerOutcome(b"{}", True, "emq_django.exceptions.Retry", retry=2.5).status(True)
    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1")
    reply(core, W, dispatched(out)[0], outcome_of(status))  # the eMQP port's codec
    assert core.delayed.next_due() == pytest.approx(2.5)
    assert core.counters["retried"] == 1
    # emq.Retry() with no delay: the backoff
    bare = WorkerOutcome(b"{}", True, "emq_django.exceptions.Retry", retry=-1.0).status(True)
    assert dispatched(tick(core, 2.5)) == [b"j1#2"]
    reply(core, W, b"j1#2", outcome_of(bare), now=2.5)
    assert 2.5 + 0.8 * 2 <= core.delayed.next_due() <= 2.5 + 1.2 * 2
    assert core.counters["retried"] == 2


def test_a_failed_attempts_span_goes_with_the_job_to_its_retries() -> None:
    """Issue 35: the worker's failure REPLY names its span (``span:<traceparent>``,
    worker.execution.Outcome.status); the broker adds it to the job's headers as
    ``first-attempt`` for every later attempt, and keeps the first one."""
    from emq_django.broker.ports.emqp_workers import outcome_of
    from emq_django.worker.execution import Outcome as WorkerOutcome

    first = b"00-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-01"
    later = b"00-" + b"ab" * 16 + b"-" + b"ef" * 8 + b"-01"
    status = WorkerOutcome(b"{}", True, "ValueError", span=first).status(True)
    assert status == b"failed,ready,error:ValueError,span:" + first
    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1", headers=b"retry-count:3,task:t,traceparent:x")
    (job,) = [e.job for e in out if isinstance(e, Deliver)]
    reply(core, W, b"j1#1", outcome_of(status))
    assert job.headers.raw == b"retry-count:3,task:t,traceparent:x,first-attempt:" + first
    assert job.headers.get("first-attempt") == first.decode()
    assert job.headers.retry_count == 3 and job.headers.task == "t"
    again = tick(core, core.delayed.next_due())
    assert [e.job.headers.raw.endswith(b"first-attempt:" + first) for e in again] == [True]
    # a later failure naming another span (a worker that did not read the header)
    other = WorkerOutcome(b"{}", True, "ValueError", span=later).status(True)
    reply(core, W, b"j1#2", outcome_of(other), now=core.delayed.next_due())
    assert job.headers.raw.count(b"first-attempt") == 1
    assert job.headers.get("first-attempt") == first.decode()


SPAN = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


@pytest.mark.parametrize(
    ("status", "first"),
    [
        (b"failed,ready,error:ValueError", None),  # no span: an untraced worker's
        (b"failed,ready,span:00-zz-not-a-span-01", None),  # malformed: ignored
        (b"failed,ready,span:" + SPAN.upper().encode(), None),  # not W3C's lowercase
        (b"failed,span:" + SPAN.encode() + b",ready,error:E", SPAN),  # among other flags
    ],
)
def test_a_retry_keeps_only_a_valid_span(status: bytes, first: str | None) -> None:
    from emq_django.broker.ports.emqp_workers import outcome_of

    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1", headers=b"retry-count:1")
    (job,) = [e.job for e in out if isinstance(e, Deliver)]
    reply(core, W, b"j1#1", outcome_of(status))
    assert core.counters["retried"] == 1
    assert job.headers.get("first-attempt") == first
    assert job.headers.raw == (
        b"retry-count:1" if first is None else b"retry-count:1,first-attempt:" + first.encode()
    )


def test_bare_retry_without_retry_count_is_retried_up_to_the_limit() -> None:
    assert RETRY_REQUESTED_LIMIT == 3
    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1", headers=b"reply-requested")
    status = failed("emq_django.exceptions.Retry", retry=-1.0)
    attempts, delays, to_client, _ = fail_until_final(core, dispatched(out), status)
    assert attempts == [b"j1#1", b"j1#2", b"j1#3", b"j1#4"]
    assert delays[0] < delays[1] < delays[2]  # the backoff
    c = core.counters
    assert (c["retried"], c["failed"]) == (3, 1)
    assert [r.job.id for r in to_client] == [b"j1"]


def test_retry_count_header_wins_over_the_requested_limit() -> None:
    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"j1", headers=b"retry-count:5")
    attempts, delays, _, _ = fail_until_final(core, dispatched(out), failed(retry=0.5))
    assert len(attempts) == 6 and delays == [pytest.approx(0.5)] * 5


# ---- run-after ------------------------------------------------------------------


def test_run_after_holds_the_job_until_its_wall_time() -> None:
    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"later", headers=b"run-after:%.6f" % (WALL + 10.0), now=1.0)
    assert acks(out, b"later") == 1
    assert dispatched(out) == []  # the job manager has credit, but it is not time yet
    assert core.next_deadline() == pytest.approx(10.0)
    assert dispatched(tick(core, 9.99)) == []
    assert dispatched(tick(core, 10.0)) == [b"later#1"]
    assert core.next_deadline() > 10.0


def test_run_after_in_the_past_runs_at_once() -> None:
    core = make_core()
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"now", headers=b"run-after:%.6f" % (WALL - 5.0), now=1.0)
    assert dispatched(out) == [b"now#1"]


def test_run_after_waits_for_a_job_manager_when_none_is_ready() -> None:
    core = make_core()
    out = request(core, CLIENT, b"later", headers=b"run-after:%.6f" % (WALL + 3.0))
    assert acks(out, b"later") == 1
    tick(core, 3.0)
    assert [j.id for j in core.queues["default"].pending] == [b"later"]
    inform(core, W, now=4.0)
    assert dispatched(ready(core, W, now=4.0)) == [b"later#1"]


# ---- de-duplication by msgid ----------------------------------------------------


@pytest.mark.parametrize("stage", ["pending", "in-flight", "delayed", "completed", "failed"])
def test_a_resent_msgid_is_acked_again_but_makes_one_job(stage: str) -> None:
    core = make_core()
    headers = b""
    if stage != "pending":
        inform(core, W)
        ready(core, W)
    if stage == "delayed":
        headers = b"run-after:%.6f" % (WALL + 50.0)
    first = request(core, CLIENT, b"m1", headers=headers)
    assert acks(first, b"m1") == 1
    if stage == "completed":
        reply(core, W, b"m1#1", OK)
    if stage == "failed":
        reply(core, W, b"m1#1", FAIL)

    second = request(core, CLIENT, b"m1", headers=headers, now=1.0)

    assert acks(second, b"m1") == 1
    assert dispatched(second) == []  # even though the job manager may have credit again
    assert core.counters["duplicates"] == 1
    assert core.counters["received"] == 2
    jobs_dispatched = core.counters["dispatched"]
    assert jobs_dispatched == (0 if stage in ("pending", "delayed") else 1)
    assert len(core.queues["default"].pending) == (1 if stage == "pending" else 0)
    if stage == "delayed":
        assert len(core.delayed) == 1
        assert dispatched(tick(core, 50.0)) == [b"m1#1"]


def test_other_msgids_are_not_duplicates() -> None:
    core = make_core()
    for n in range(3):
        request(core, CLIENT, b"m%d" % n)
    assert core.counters["duplicates"] == 0
    assert len(core.queues["default"].pending) == 3


def test_a_finished_id_is_forgotten_after_the_dedupe_window() -> None:
    core = make_core(dedupe_window=30.0)
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"m1")
    reply(core, W, b"m1#1", OK)
    assert acks(request(core, CLIENT, b"m1", now=20.0), b"m1") == 1
    assert core.counters["duplicates"] == 1
    tick(core, 61.0)  # housekeeping expires the old ids
    assert b"m1" not in core.recent
    out = request(core, CLIENT, b"m1", now=61.0)
    assert dispatched(out) == [b"m1#1"]  # a new job
    assert core.counters["duplicates"] == 1


# ---- journal operations -----------------------------------------------------------


def test_guaranteed_job_is_put_in_the_journal_then_done() -> None:
    core = make_core(journal=True)
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"g1", headers=b"guarantee", now=2.0)
    (put,) = ops_for(core, b"g1")
    assert put[:6] == ("put", b"g1", "default", b"guarantee", BODY, "ready")
    assert put[6] == 0  # attempts
    assert put[8] == pytest.approx(WALL + 2.0)  # enqueued, wall clock
    reply(core, W, b"g1#1", OK, now=3.0)
    assert ops_for(core, b"g1")[1:] == [("done", b"g1", pytest.approx(WALL + 3.0))]


def test_guaranteed_retry_and_dead_letter_change_the_state_in_the_journal() -> None:
    core = make_core(journal=True)
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"g1", headers=b"guarantee,retry-count:1", now=2.0)
    reply(core, W, b"g1#1", FAIL, now=2.0)
    due = core.delayed.next_due()
    state = ops_for(core, b"g1")[1]
    assert state[:4] == ("state", b"g1", "delayed", 1)
    assert state[4] == pytest.approx(WALL + due)  # run again at, wall clock
    assert state[5] == "ValueError"
    assert dispatched(tick(core, due)) == [b"g1#2"]
    reply(core, W, b"g1#2", FAIL, now=due)
    dead = ops_for(core, b"g1")[2]
    assert dead[:4] == ("state", b"g1", "dead", 2) and dead[5] == "ValueError"
    assert len(ops_for(core, b"g1")) == 3


def test_delayed_guaranteed_job_is_put_as_delayed() -> None:
    core = make_core(journal=True)
    run_after = WALL + 30.0
    request(core, CLIENT, b"g1", headers=b"guarantee,run-after:%.6f" % run_after)
    (put,) = ops_for(core, b"g1")
    assert put[5] == "delayed" and put[7] == pytest.approx(run_after)


def test_jobs_that_are_not_guaranteed_write_nothing() -> None:
    core = make_core(journal=True)
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"n1", headers=b"retry-count:1")
    reply(core, W, b"n1#1", FAIL)
    assert dispatched(tick(core, core.delayed.next_due())) == [b"n1#2"]
    reply(core, W, b"n1#2", FAIL, now=5.0)
    request(core, CLIENT, b"n2", now=5.0)
    reply(core, W, b"n2#1", OK, now=5.0)
    request(core, CLIENT, b"n3", headers=b"run-after:%.6f" % (WALL + 30.0), now=5.0)
    assert core.journal_ops == []
    assert core.counters["dead_lettered"] == 1


def test_guarantee_without_a_journal_writes_nothing() -> None:
    core = make_core()
    request(core, CLIENT, b"g1", headers=b"guarantee")
    assert core.journal_ops is None
    assert [j.id for j in core.queues["default"].pending] == [b"g1"]


# ---- memory bound and spill to disk ------------------------------------------------


@pytest.mark.parametrize(
    "bound", [{"max_pending": 2}, {"max_queue_bytes": 2 * len(BODY)}], ids=["jobs", "bytes"]
)
def test_over_the_bound_plain_jobs_are_refused_and_guaranteed_ones_spill(
    bound: dict[str, Any],
) -> None:
    core = make_core(journal=True, **bound)
    for n in range(2):
        assert acks(request(core, CLIENT, b"p%d" % n), b"p%d" % n) == 1
    out = request(core, CLIENT, b"plain")
    assert acks(out, b"plain") == 0
    (err,) = errors(out)
    assert (err.msgid, err.code) == (b"plain", "queue-full")
    assert core.counters["refused"] == 1

    out = request(core, CLIENT, b"g1", headers=b"guarantee")
    assert acks(out, b"g1") == 1 and errors(out) == []
    (put,) = ops_for(core, b"g1")
    assert put[0] == "put" and put[5] == "spilled"
    queue = core.queues["default"]
    assert queue.spilled == 1 and core.counters["spilled"] == 1
    assert len(queue.pending) == 2  # the spilled job is not in memory
    assert core.spill_requests == set()
    # a resend of the spilled job is a duplicate
    assert acks(request(core, CLIENT, b"g1", headers=b"guarantee"), b"g1") == 1
    assert core.counters["duplicates"] == 1 and queue.spilled == 1


def test_spilled_jobs_are_restored_from_the_journal_when_the_queue_drains(
    tmp_path: Path,
) -> None:
    core = make_core(journal=True, max_pending=4)
    journal = Journal(tmp_path / "journal.sqlite3")
    for n in range(4):
        request(core, CLIENT, b"p%d" % n)
    for n in range(2):
        request(core, CLIENT, b"g%d" % n, headers=b"guarantee")
    assert core.queues["default"].spilled == 2
    journal.apply(core.journal_ops or [])
    core.journal_ops = []

    inform(core, W)
    assert dispatched(ready(core, W, times=2)) == [b"p0#1", b"p1#1"]
    assert core.spill_requests == set()  # 2 still waiting: not below half the bound
    assert dispatched(ready(core, W)) == [b"p2#1"]
    assert core.spill_requests == {"default"}  # 1 waiting, below 4 // 2

    rows = journal.load_spilled("default", 10)
    assert [r.id for r in rows] == [b"g0", b"g1"] and {r.state for r in rows} == {"spilled"}
    core.spill_requests.clear()
    core.restore_spilled("default", rows, 1.0)
    queue = core.queues["default"]
    assert queue.spilled == 0
    assert [j.id for j in queue.pending] == [b"p3", b"g0", b"g1"]  # in order
    assert [op[:3] for op in core.journal_ops or []] == [
        ("state", b"g0", "ready"),
        ("state", b"g1", "ready"),
    ]
    journal.apply(core.journal_ops or [])
    assert journal.load_spilled("default", 10) == []
    assert dispatched(ready(core, W, times=3, now=1.0)) == [b"p3#1", b"g0#1", b"g1#1"]
    # the restored job is a live job: a resend is still a duplicate, and it finishes
    reply(core, W, b"g0#1", OK, now=2.0)
    assert ops_for(core, b"g0")[-1][0] == "done"
    journal.close()


def test_every_spilled_job_is_eventually_restored(tmp_path: Path) -> None:
    """The server refills max(MAX_PENDING // 4, 1) rows per spill request. When the
    job manager has credit to spare, the refilled jobs are dispatched at once and the
    queue never holds any waiting job again: the rest must still be asked for."""
    max_pending = 4
    core = make_core(journal=True, max_pending=max_pending)
    journal = Journal(tmp_path / "journal.sqlite3")
    for n in range(max_pending):
        request(core, CLIENT, b"p%d" % n, headers=b"guarantee")
    for n in range(3):
        request(core, CLIENT, b"s%d" % n, headers=b"guarantee")
    assert core.queues["default"].spilled == 3

    def serve(out: Out, now: float) -> list[bytes]:
        """What BrokerServer._flush does, then the job manager answers everything."""
        done: list[bytes] = []
        for _ in range(100):
            journal.apply(core.journal_ops or [])
            core.journal_ops = []
            names, core.spill_requests = core.spill_requests, set()
            for name in names:
                rows = journal.load_spilled(name, max(max_pending // 4, 1))
                core.restore_spilled(name, rows, now)
            out = out + take(core)
            sent = dispatched(out)
            out = []
            if not sent and not core.spill_requests and not core.journal_ops:
                return done
            for attempt in sent:
                done.append(attempt)
                out += reply(core, W, attempt, OK, now=now)
        raise AssertionError("never settled")

    inform(core, W)
    ran = serve(ready(core, W, times=8), 1.0)
    ran += serve(ready(core, W, now=2.0), 2.0)  # and the job manager keeps asking
    ran += serve(tick(core, 3.0), 3.0)
    assert sorted(ran) == sorted(
        [b"p%d#1" % n for n in range(max_pending)] + [b"s%d#1" % n for n in range(3)]
    ), f"spilled jobs left on disk: {core.queues['default'].spilled}"
    assert core.queues["default"].spilled == 0
    journal.close()


# ---- restore from the journal ----------------------------------------------------


def test_a_new_core_restores_waiting_delayed_dead_and_done_jobs(tmp_path: Path) -> None:
    old = make_core(journal=True)
    inform(old, W)  # serves "default" only
    ready(old, W)
    # done
    request(old, CLIENT, b"done", headers=b"guarantee")
    reply(old, W, b"done#1", OK)
    # dead: one retry, two failures
    request(old, CLIENT, b"dead", headers=b"guarantee,retry-count:1,task:pkg.tasks.add")
    reply(old, W, b"dead#1", FAIL)
    due = old.delayed.next_due()
    assert dispatched(tick(old, due)) == [b"dead#2"]
    reply(old, W, b"dead#2", FAIL, now=due)
    # waiting on a queue nobody serves, and delayed
    request(old, CLIENT, b"ready", queue="later", headers=b"guarantee", now=due)
    run_after = WALL + 100.0
    request(old, CLIENT, b"delayed", queue="later", headers=b"guarantee,run-after:%.6f" % run_after)
    # not guaranteed: lost with the old core
    request(old, CLIENT, b"plain", queue="later", now=due)

    journal = Journal(tmp_path / "journal.sqlite3")
    journal.apply(old.journal_ops or [])
    assert journal.stats()["jobs"] == {"done": 1, "dead": 1, "ready": 1, "delayed": 1}

    core = make_core(journal=True)
    counts = core.restore(journal.load(), 10.0)
    assert counts == {"done": 1, "dead": 1, "ready": 1, "delayed": 1}

    assert [j.id for j in core.queues["later"].pending] == [b"ready"]
    assert [j.id for j in core.delayed.jobs()] == [b"delayed"]
    assert core.delayed.next_due() == pytest.approx(100.0)
    (letter,) = core.dead_letters()
    assert letter["id"] == "dead" and letter["queue"] == "default"
    assert letter["task"] == "pkg.tasks.add"
    assert (letter["attempts"], letter["error"]) == (2, "ValueError")
    assert letter["guaranteed"] is True
    # the done job's id is remembered: a resend is ACKed and makes no job
    out = request(core, CLIENT, b"done", headers=b"guarantee", now=10.0)
    assert acks(out, b"done") == 1 and core.counters["duplicates"] == 1
    assert b"done" not in core.jobs and ops_for(core, b"done") == []
    assert b"plain" not in core.jobs

    inform(core, b"jm-later", ((10, "later"),), now=11.0)
    out = ready(core, b"jm-later", now=11.0)
    assert dispatched(out, b"jm-later") == [b"ready#1"]
    ready(core, b"jm-later", now=11.0)
    assert dispatched(tick(core, 99.0), b"jm-later") == []
    out = tick(core, 100.0, keep_alive=(b"jm-later",))
    assert dispatched(out, b"jm-later") == [b"delayed#1"]
    # and they end in the journal like any job
    reply(core, b"jm-later", b"ready#1", OK, now=100.0)
    assert ops_for(core, b"ready") == [("done", b"ready", pytest.approx(WALL + 100.0))]
    journal.close()


def test_restore_forgets_done_ids_older_than_the_dedupe_window(tmp_path: Path) -> None:
    old = make_core(journal=True, dedupe_window=30.0)
    inform(old, W)
    ready(old, W)
    request(old, CLIENT, b"old", headers=b"guarantee")
    reply(old, W, b"old#1", OK)
    journal = Journal(tmp_path / "journal.sqlite3")
    journal.apply(old.journal_ops or [])
    core = make_core(journal=True, dedupe_window=30.0)
    core.restore(journal.load(), 31.0)
    assert b"old" not in core.recent
    journal.close()


def test_restored_spilled_jobs_are_asked_for(tmp_path: Path) -> None:
    old = make_core(journal=True, max_pending=1)
    request(old, CLIENT, b"p0", headers=b"guarantee")
    request(old, CLIENT, b"s0", headers=b"guarantee")
    assert old.queues["default"].spilled == 1
    journal = Journal(tmp_path / "journal.sqlite3")
    journal.apply(old.journal_ops or [])
    core = make_core(journal=True, max_pending=2)
    core.restore(journal.load(), 0.0)
    queue = core.queues["default"]
    assert [j.id for j in queue.pending] == [b"p0"] and queue.spilled == 1
    # 1 waiting is not below 2 // 2; it is once the job manager takes it
    inform(core, W)
    ready(core, W)
    assert core.spill_requests == {"default"}
    core.restore_spilled("default", journal.load_spilled("default", 10), 1.0)
    assert [j.id for j in queue.pending] == [b"s0"]
    journal.close()


# ---- dead letters ----------------------------------------------------------------


def dead_job(core: CoreHarness) -> float:
    inform(core, W)
    ready(core, W)
    out = request(core, CLIENT, b"x1", headers=b"retry-count:3,task:pkg.tasks.add")
    attempts, _, _, now = fail_until_final(core, dispatched(out), FAIL)
    assert len(attempts) == 4
    return now


def test_dead_letters_list_the_job() -> None:
    core = make_core()
    now = dead_job(core)
    assert core.dead_letters() == [
        {
            "id": "x1",
            "queue": "default",
            "task": "pkg.tasks.add",
            "attempts": 4,
            "error": "ValueError",
            "died_at": pytest.approx(WALL + now, abs=0.001),
            "guaranteed": False,
        }
    ]
    # still a live job: a resend is a duplicate
    assert acks(request(core, CLIENT, b"x1", now=now), b"x1") == 1
    assert core.counters["duplicates"] == 1


def test_requeued_dead_letter_runs_again_with_its_failures_reset() -> None:
    core = make_core(journal=True)
    now = dead_job(core)
    assert core.requeue_dead([b"nope"], now) == 0
    assert core.requeue_dead([b"x1"], now) == 1
    out = take(core)
    assert dispatched(out) == [b"x1#5"]  # the job manager had credit
    assert core.dead_letters() == []
    # it can fail 4 more times (3 retries) before it is dead again
    attempts, delays, _, now = fail_until_final(core, [b"x1#5"], FAIL, now=now)
    assert attempts == [b"x1#5", b"x1#6", b"x1#7", b"x1#8"]
    assert delays[0] < 1.2  # the backoff starts over
    c = core.counters
    assert (c["retried"], c["failed"], c["dead_lettered"]) == (6, 2, 2)
    assert [d["attempts"] for d in core.dead_letters()] == [4]


def test_requeued_guaranteed_dead_letter_is_ready_in_the_journal() -> None:
    core = make_core(journal=True)
    inform(core, W)
    request(core, CLIENT, b"g1", headers=b"guarantee,retry-count:0,task:t")
    ready(core, W)
    reply(
        core, W, b"g1#1", failed("ValueError", ready=False, retry=-1.0)
    )  # no ready: no credit back
    for _ in range(3):
        due = core.delayed.next_due()
        tick(core, due)  # waits: the job manager has no credit
        ready(core, W, now=due)
        attempt = core.jobs[b"g1"].attempt_id
        reply(core, W, attempt, failed("ValueError", ready=False, retry=-1.0), now=due)
    assert [d["id"] for d in core.dead_letters()] == ["g1"]
    assert ops_for(core, b"g1")[-1][:3] == ("state", b"g1", "dead")
    assert core.requeue_dead(None, 50.0) == 1
    assert ops_for(core, b"g1")[-1][:4] == ("state", b"g1", "ready", 0)
    assert [j.id for j in core.queues["default"].pending] == [b"g1"]


def test_purged_dead_letters_are_forgotten() -> None:
    core = make_core(journal=True)
    now = dead_job(core)
    core.journal_ops = []
    assert core.purge_dead(None, now) == 1
    assert core.dead_letters() == [] and len(core.dead) == 0
    assert b"x1" not in core.jobs
    assert b"x1" in core.recent
    assert core.journal_ops == []  # not guaranteed: nothing to write
    assert core.purge_dead(None, now) == 0


def test_purge_of_a_guaranteed_dead_letter_marks_it_done() -> None:
    core = make_core(journal=True)
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"g1", headers=b"guarantee,retry-count:1")
    reply(core, W, b"g1#1", FAIL)
    due = core.delayed.next_due()
    tick(core, due)
    reply(core, W, b"g1#2", FAIL, now=due)
    assert core.purge_dead([b"g1"], due) == 1
    assert ops_for(core, b"g1")[-1] == ("done", b"g1", pytest.approx(WALL + due))


def test_dead_letters_beyond_the_limit_drop_the_oldest() -> None:
    core = make_core(max_dead_letters=2)
    inform(core, W)
    ready(core, W)
    now = 0.0
    for n in range(3):
        out = request(core, CLIENT, b"x%d" % n, headers=b"retry-count:1", now=now)
        attempts, _, _, now = fail_until_final(core, dispatched(out), FAIL, now=now)
        assert len(attempts) == 2
    assert [d["id"] for d in core.dead_letters()] == ["x1", "x2"]
    assert core.dead.evicted == 1
    assert b"x0" not in core.jobs and b"x0" in core.recent


def test_a_guaranteed_job_failing_during_shutdown_keeps_its_retries() -> None:
    """A stopping broker dispatches no retry, but a guaranteed job that has retries
    left has not used them up: it stays in the journal to be retried by the next
    broker, instead of being dead-lettered."""
    core = make_core(journal=True)
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"g1", headers=b"guarantee,retry-count:3")
    core.begin_shutdown()
    take(core)
    reply(core, W, b"g1#1", FAIL, now=1.0)
    assert core.counters["dead_lettered"] == 0
    assert core.dead_letters() == []
    last = ops_for(core, b"g1")[-1]
    assert last[:4] == ("state", b"g1", "delayed", 1), f"journal says {last}"


# ---- cancel ---------------------------------------------------------------------


def test_cancel_a_waiting_job_removes_it_and_remembers_its_id() -> None:
    core = CoreHarness(BrokerConfig(), seed=1)
    core.request(b"c", b"j1", "q", b"", b"[]", now=0.0)
    assert core.cancel(b"j1", 1.0) == "cancelled"
    assert not core.queues["q"].pending and core.queues["q"].pending_bytes == 0
    assert core.counters["cancelled"] == 1
    assert core.cancel(b"j1", 2.0) == "unknown"
    core.take()
    core.request(b"c", b"j1", "q", b"", b"[]", now=3.0)  # a resend
    assert core.counters["duplicates"] == 1 and not core.queues["q"].pending


def test_cancel_of_a_job_that_never_started_says_so() -> None:
    """Cancelled "while it ran" was said of jobs that never started (issue 29,
    item 14): one waiting in its queue, and one a worker process gave back unstarted."""
    core = make_core()
    request(core, CLIENT, b"j1", headers=b"reply-requested")
    take(core)
    assert core.cancel(b"j1", 1.0) == "cancelled"
    got = replies(take(core))
    inform(core, W)
    ready(core, W)
    request(core, CLIENT, b"j2", headers=b"reply-requested")
    take(core)
    assert core.cancel(b"j2", 1.0) == "running"
    got += replies(
        reply(core, W, b"j2#1", status=failed(ready=False, requeue=True), body=b"{}", now=2.0)
    )
    assert [r.job.id for r in got] == [b"j1", b"j2"]
    for answer in got:
        error = json.loads(answer.body)["error"]
        assert error["type"] == "emq_django.exceptions.Cancelled"
        assert error["message"] == "the job was cancelled before it started"
    assert core.counters["cancelled"] == 2


def test_cancel_a_running_job_stops_its_retries() -> None:
    core = CoreHarness(BrokerConfig(), seed=1)
    core.join(b"w", [(10, "q")], now=0.0)
    core.ready(b"w", now=0.0)
    core.request(b"c", b"j1", "q", b"retry-count:3", b"[]", now=0.0)
    assert core.cancel(b"j1", 1.0) == "running"  # an EventMQ peer: it cannot be stopped
    core.result(b"w", b"j1#1", failed("E", ready=False), b"{}", now=2.0)
    # it ends as cancelled (it used to count as failed)
    assert core.counters["retried"] == 0 and core.counters["cancelled"] == 1
    assert len(core.delayed) == 0


@pytest.mark.parametrize("unique_for", [10, 0])
def test_a_cancelled_spilled_unique_job_ends_its_key_as_any_unique_job(unique_for: int) -> None:
    """A unique job waiting on disk (spilled: its headers are not in memory) and
    cancelled ends like a unique job cancelled in memory: its key is kept its
    unique-for from the cancel, then free (it was held for ever: every later job
    with the key refused as a duplicate of a cancelled one). With a unique-for the
    journal keeps its row, a done one, so a broker restarted meanwhile keeps the
    key too (PostgreSQL's plain done deletes the row)."""
    core = make_core(journal=True, max_pending=1)
    request(core, CLIENT, b"p0")
    headers = b"guarantee,unique:k,unique-for:%d" % unique_for
    assert acks(request(core, CLIENT, b"g1", headers=headers, now=1.0), b"g1") == 1
    assert core.queues["default"].spilled == 1
    core.journal_ops = []
    assert core.cancel(b"g1", 2.0) == "cancelled"
    assert [op[0] for op in ops_for(core, b"g1")] == ["reply" if unique_for else "done"]
    if unique_for:
        (refused,) = errors(request(core, CLIENT, b"g2", headers=headers, now=11.9))
        assert refused.code == DUPLICATE
    out = request(core, CLIENT, b"g3", headers=headers, now=12.0)
    assert acks(out, b"g3") == 1 and errors(out) == []
