"""Celery peer: RabbitMQ broker, fast settings, Redis (or RPC) results for echo and
for the workflows of bench/workflow_bench.py (a chord needs a result backend)."""

from __future__ import annotations

import os

from celery import Celery

from bench.donesignal import mark_done

QUEUE = "celery_bench"
BROKER_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
RESULT_BACKEND = os.environ.get("BENCH_CELERY_BACKEND", "redis://127.0.0.1:6379/1")

app = Celery("bench_celery", broker=BROKER_URL, backend=RESULT_BACKEND)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=False,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_CELERY_PREFETCH", "64")),
    worker_disable_rate_limits=True,
    worker_send_task_events=False,
    task_send_sent_event=False,
    task_track_started=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.noop", ignore_result=True)
def noop() -> None:
    mark_done()


@app.task(name="bench.echo")
def echo(x: object) -> object:
    return x


# bench/workflow_bench.py (the same three tasks in bench/emq_bench_tasks.py): a chord
# member keeps its result (a chord counts its members' results in the backend)
@app.task(name="bench.wf_noop")
def wf_noop() -> None:
    return None


@app.task(name="bench.wf_count")
def wf_count(results: list[object]) -> int:
    return sum(1 for r in results if r is None)


@app.task(name="bench.wf_add_one")
def wf_add_one(x: int) -> int:
    return x + 1
