"""Issue 35: per task and queue, the jobs succeeded, failed, retried and
dead-lettered and the attempts' run-time histogram, counted where the broker
settles an attempt, read with the monitor channel's ``TASKS`` and rendered for
Prometheus by ``/emq/metrics``; on with ``EMQ_TASK_METRICS=true``."""

from __future__ import annotations

import json
from typing import Any

from emq_django.broker.effects import Deliver
from emq_django.broker.ports.monitor import MonitorPort
from emq_django.broker.state import BrokerConfig
from emq_django.results.metrics import render_tasks
from tests.support.core_harness import CoreHarness, failed, of_type


def tasks(h: CoreHarness) -> dict[str, Any]:
    return json.loads(MonitorPort(h.core).answer(b"TASKS", h.now))


def run(h: CoreHarness, worker: bytes, job: bytes, seconds: float, outcome: Any = None) -> None:
    """Deliver ``job``'s next attempt to ``worker`` and answer it ``seconds`` later."""
    (deliver,) = [d for d in of_type(h.take(), Deliver) if d.job.id == job] or [None]
    assert deliver is not None, f"{job!r} was not dispatched"
    h.now += seconds
    if outcome is None:
        h.result(worker, deliver.job.attempt_id, now=h.now)
    else:
        h.result(worker, deliver.job.attempt_id, outcome, now=h.now)


def test_counts_and_run_times_per_task_and_queue() -> None:
    h = CoreHarness(BrokerConfig(retry_base=0.001, retry_cap=0.001, task_metrics=True))
    h.join(b"w", queues=((10, "q"),), now=0.0)
    h.core.worker_ready(h.heard(b"w"), 0.0)
    h.core.client_request(h.client(b"c"), b"ok", "q", _headers(b"task:pkg.add"), b"[]", h.now)
    run(h, b"w", b"ok", 0.2)
    h.core.client_request(
        h.client(b"c"), b"bad", "q", _headers(b"task:pkg.boom,retry-count:1"), b"[]", h.now
    )
    run(h, b"w", b"bad", 3.0, failed("ValueError"))
    h.now += 1.0
    due = h.tick(h.now, keep_alive=[b"w"])  # the retry is due: dispatched again
    h.core.out.extend(due)
    run(h, b"w", b"bad", 0.004, failed("ValueError"))

    doc = tasks(h)
    assert doc["enabled"] is True
    by_task = {t["task"]: t for t in doc["tasks"]}
    add, boom = by_task["pkg.add"], by_task["pkg.boom"]
    assert add["queue"] == "q" and boom["queue"] == "q"
    assert (add["succeeded"], add["failed"], add["retried"], add["dead_lettered"]) == (1, 0, 0, 0)
    assert (boom["succeeded"], boom["failed"], boom["retried"], boom["dead_lettered"]) == (
        0,
        1,
        1,
        1,
    )
    assert add["run_count"] == 1 and abs(add["run_sum"] - 0.2) < 1e-9
    assert boom["run_count"] == 2 and abs(boom["run_sum"] - 3.004) < 1e-9
    buckets = dict(zip(doc["buckets"], boom["run_buckets"], strict=True))
    assert buckets[0.001] == 0 and buckets[0.005] == 1 and buckets[2.5] == 1 and buckets[5.0] == 2

    text = render_tasks(doc)
    assert 'emq_task_succeeded_total{task="pkg.add",queue="q"} 1' in text
    assert 'emq_task_dead_lettered_total{task="pkg.boom",queue="q"} 1' in text
    assert 'emq_task_retried_total{task="pkg.boom",queue="q"} 1' in text
    assert "# TYPE emq_task_run_seconds histogram" in text
    assert 'emq_task_run_seconds_bucket{task="pkg.boom",queue="q",le="0.005"} 1' in text
    assert 'emq_task_run_seconds_bucket{task="pkg.boom",queue="q",le="+Inf"} 2' in text
    assert 'emq_task_run_seconds_count{task="pkg.add",queue="q"} 1' in text


def test_off_with_the_setting_and_bad_input() -> None:
    h = CoreHarness(BrokerConfig())  # off by default
    assert tasks(h) == {"enabled": False, "buckets": [], "tasks": []}
    assert render_tasks(tasks(h)) == "" and render_tasks(None) == ""
    answer = MonitorPort(h.core).answer(b"TASKS everything", 0.0)
    assert answer.startswith(b"ERROR usage: TASKS")


def _headers(raw: bytes) -> Any:
    from emq_django.protocol.headers import parse_headers

    return parse_headers(raw)
