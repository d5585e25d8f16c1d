"""Dramatiq peer: RabbitMQ broker, Redis results backend for echo."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from bench.donesignal import mark_done

QUEUE = "dramatiq_bench"
BROKER_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

broker = RabbitmqBroker(url=BROKER_URL)
broker.add_middleware(Results(backend=RedisBackend(url=REDIS_URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop() -> None:
    mark_done()


@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def echo(x: object) -> object:
    return x
