"""The producer and consumer processes of ``bench/guaranteed_bench.py``.

    python -m bench.guaranteed_clients emq-producer --out FILE [...]
    python -m bench.guaranteed_clients rabbit-producer --out FILE [...]
    python -m bench.guaranteed_clients rabbit-consumer [...]

Each runs in its own process, so that a system's client library and its threads
live apart from the harness's. A producer runs the three phases of the benchmark
and writes its figures as JSON to ``--out``:

1. warm-up: ``--warmup`` jobs, waited for through the completion sink;
2. throughput: ``--jobs`` guaranteed jobs sent in one go with confirmations,
   through a sliding window of ``--window`` unconfirmed jobs on both sides, then
   waited for until every one has run (the sink's count);
3. acknowledgement latency: ``--latency-jobs`` jobs sent one at a time, each timed
   from the send to its acknowledgement (our broker's ACK after the journal's
   commit; RabbitMQ's publisher confirm), then waited for through the sink.

Every job does one thing when it runs: ``bench.donesignal.mark_done()``, the PUSH
every system of ``bench/run.py`` sends.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.clients import Sink  # noqa: E402

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
QUEUE = "emq-guaranteed-bench-qq"  # a quorum queue (a classic one may not take its name)
QUORUM = {"x-queue-type": "quorum"}
BODY = json.dumps({"task": "bench.noop", "args": [], "kwargs": {}}).encode()
STALL_MS = 30_000  # a phase that makes no progress for this long fails


def wait_done(sink: Sink, target: int, what: str) -> float:
    """Wait until the sink has counted ``target`` completions; their time."""
    last = -1
    while True:
        count = sink.wait(target, STALL_MS)
        if count >= target:
            return time.perf_counter()
        if count == last:
            raise SystemExit(f"{what}: stalled at {count} of {target} jobs run")
        last = count


def percentiles(samples_s: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p90/p99, mean and max, in milliseconds."""
    ordered = sorted(samples_s)
    n = len(ordered)

    def rank(p: float) -> float:
        return ordered[max(0, min(n - 1, int(-(-p * n // 100)) - 1))] * 1000

    return {
        "p50_ms": rank(50),
        "p90_ms": rank(90),
        "p99_ms": rank(99),
        "mean_ms": sum(ordered) / n * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def run_phases(
    args: argparse.Namespace,
    send_window: Callable[[int], None],
    send_one: Callable[[], None],
) -> dict[str, Any]:
    """The three phases, with ``send_window(n)`` (returns once ``n`` jobs are all
    confirmed) and ``send_one()`` (returns once its job is confirmed)."""
    sink = Sink(args.sink)
    sent = 0
    send_window(args.warmup)
    sent += args.warmup
    wait_done(sink, sent, "warm-up")
    started = time.perf_counter()
    send_window(args.jobs)
    confirmed = time.perf_counter()
    sent += args.jobs
    done = wait_done(sink, sent, "throughput")
    samples = []
    for _ in range(args.latency_jobs):
        t0 = time.perf_counter()
        send_one()
        samples.append(time.perf_counter() - t0)
    sent += args.latency_jobs
    wait_done(sink, sent, "latency")
    figures: dict[str, Any] = {
        "jobs_per_s": args.jobs / (done - started),
        "confirmed_per_s": args.jobs / (confirmed - started),
        "seconds": done - started,
    }
    if samples:
        figures["ack"] = percentiles(samples)
    return figures


# ---- emq: the public API of a guaranteed task -----------------------------------------


def emq_producer(args: argparse.Namespace) -> dict[str, Any]:
    """One ``Task.map()`` of the phase's calls keeps at most ``EMQ_ACK_WINDOW`` (the
    harness sets it to ``--window``) unacknowledged, sends more as ACKs arrive, and
    returns once the broker has ACKed them all (each ACK follows the journal's
    commit); ``delay()`` of a guaranteed task returns after its own ACK."""
    import django

    django.setup()
    from bench import emq_bench_tasks as tasks

    def send_window(n: int) -> None:
        tasks.noop_guaranteed.map([()] * n)

    return run_phases(args, send_window, tasks.noop_guaranteed.delay)


# ---- RabbitMQ: pika, publisher confirms, a quorum queue -------------------------------


def rabbit_producer(args: argparse.Namespace) -> dict[str, Any]:
    """Two connections: an asynchronous one (``SelectConnection``) that keeps a
    sliding window of ``--window`` unconfirmed publishes, RabbitMQ at its best; and a
    ``BlockingConnection`` with ``confirm_delivery()``, whose ``basic_publish``
    returns once the message is confirmed, for the latency phase."""
    import pika

    props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    blocking = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    one = blocking.channel()
    one.confirm_delivery()

    def send_one() -> None:
        one.basic_publish("", QUEUE, BODY, props, mandatory=True)

    def send_window(n: int) -> None:
        publish_confirmed(n, args.window, props)

    try:
        return run_phases(args, send_window, send_one)
    finally:
        blocking.close()


def publish_confirmed(n: int, window: int, props: Any) -> None:
    """Publish ``n`` persistent messages, at most ``window`` unconfirmed; return once
    RabbitMQ has confirmed them all."""
    import pika

    state = {"sent": 0, "confirmed": 0}
    unconfirmed: collections.deque[int] = collections.deque()  # delivery tags, in order
    channel: Any = None
    failure: list[str] = []

    def publish() -> None:
        while state["sent"] < n and len(unconfirmed) < window:
            channel.basic_publish("", QUEUE, BODY, props)
            state["sent"] += 1
            unconfirmed.append(state["sent"])  # tags count from 1 on a confirm channel

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            failure.append(f"nacked {method.delivery_tag}")
            connection.close()
            return
        if method.multiple:
            while unconfirmed and unconfirmed[0] <= method.delivery_tag:
                unconfirmed.popleft()
                state["confirmed"] += 1
        else:
            unconfirmed.remove(method.delivery_tag)
            state["confirmed"] += 1
        if state["confirmed"] == n:
            connection.close()
        else:
            publish()

    def on_channel(ch: Any) -> None:
        nonlocal channel
        channel = ch
        ch.confirm_delivery(on_confirm, callback=lambda _frame: publish())

    def on_fail(_conn: Any, error: Any) -> None:
        failure.append(str(error))
        connection.ioloop.stop()

    connection = pika.SelectConnection(
        pika.URLParameters(AMQP_URL),
        on_open_callback=lambda conn: conn.channel(on_open_callback=on_channel),
        on_open_error_callback=on_fail,
        on_close_callback=lambda _c, _r: connection.ioloop.stop(),
    )
    connection.ioloop.start()
    if failure or state["confirmed"] != n:
        raise SystemExit(f"rabbitmq producer: {failure or state}")


def rabbit_consumer(args: argparse.Namespace) -> None:
    """Manual acks: each message is acked after its job has run (``mark_done``)."""
    import pika

    from bench.donesignal import mark_done

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=args.prefetch)

    def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
        mark_done()
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(QUEUE, on_message, auto_ack=False)
    print("ready", flush=True)
    channel.start_consuming()


def declare_quorum_queue() -> None:
    """The durable quorum queue, declared and emptied (before each measurement)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True, arguments=QUORUM)
        channel.queue_purge(QUEUE)
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("emq-producer", "rabbit-producer", "rabbit-consumer"))
    parser.add_argument("--sink", default="", help="the completion sink's control URL")
    parser.add_argument("--out", default="", help="the producer's figures (JSON)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--latency-jobs", type=int, default=500)
    parser.add_argument("--prefetch", type=int, default=100)
    args = parser.parse_args()
    if args.role == "rabbit-consumer":
        rabbit_consumer(args)
        return
    figures = (emq_producer if args.role == "emq-producer" else rabbit_producer)(args)
    with open(args.out, "w") as f:
        json.dump(figures, f)


if __name__ == "__main__":
    main()
