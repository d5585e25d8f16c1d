"""Dramatiq peer: RabbitMQ broker, Redis results backend for echo and for the
workflows of bench/workflow_bench.py (GroupCallbacks' barrier in Redis too)."""

from __future__ import annotations

import os
import sys

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiterBackend
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from bench.donesignal import mark_done

QUEUE = "dramatiq_bench"
BROKER_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

broker = RabbitmqBroker(url=BROKER_URL)
RESULTS = RedisBackend(url=REDIS_URL)
broker.add_middleware(Results(backend=RESULTS))
# a group's completion callback, for bench/workflow_bench.py only (it sets
# BENCH_DRAMATIQ_GROUPS): the fair benchmark's Dramatiq runs without it
if os.environ.get("BENCH_DRAMATIQ_GROUPS"):
    broker.add_middleware(GroupCallbacks(RedisRateLimiterBackend(url=REDIS_URL)))
    # A pipeline nests each next message in the one before: at Python's default
    # recursion limit (1,000) its first message fails to encode from about 500
    # steps (RecursionError). A Dramatiq user with a longer pipeline raises
    # the limit, in the producer and in the workers (this module is both's).
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop() -> None:
    mark_done()


@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def echo(x: object) -> object:
    return x


# bench/workflow_bench.py (the same three tasks in bench/emq_bench_tasks.py)
@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def wf_noop() -> None:
    return None


def wf_member(run: str, i: int) -> dramatiq.Message:
    """Member ``i`` of chord ``run``: its message id says which, so that the callback
    can find its result."""
    return wf_noop.message().copy(message_id=f"{run}-{i}")


@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def wf_count(run: str, n: int) -> int:
    """A group's completion callback. Dramatiq passes it no results: it reads the
    ``n`` members' from the results backend, in one Redis pipeline, and counts
    those that returned their None."""
    keys = [RESULTS.build_message_key(wf_member(run, i)) for i in range(n)]
    with RESULTS.client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.lindex(key, 0)
        raw = pipe.execute()
    if any(data is None for data in raw):
        missing = sum(1 for data in raw if data is None)
        raise RuntimeError(f"chord {run}: {missing} of {n} members' results are missing")
    results = [RESULTS.unwrap_result(RESULTS.encoder.decode(data)) for data in raw]
    return sum(1 for r in results if r is None)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def wf_add_one(x: int) -> int:
    return x + 1
