"""Confirmed-and-acked messages per second: our PZQ port against RabbitMQ, in one run.

    .venv/bin/python bench/pzq_bench.py [--messages 100000] [--body-size 1000]
        [--window 1000] [--consumers 2] [--prefetch 500] [--rounds 3]
        [--only emq,rabbitmq] [--journal-sync normal] [--json FILE]

Each round runs every system once, in alternation, on the same work:

- one producer process sends ``--messages`` messages of ``--body-size`` bytes with
  confirmations, at most ``--window`` unconfirmed at a time: PZQ's '1' answers
  (the message is in our journal), RabbitMQ's publisher confirms (persistent
  messages, ``delivery_mode=2``, on a durable queue);
- ``--consumers`` consumer processes ack each message, one by one: PZQ's
  ``[pzq id, msg id, '1']``, RabbitMQ's ``basic_ack`` (manual acks, ``basic_qos``
  prefetch ``--prefetch`` each; our broker's own in-flight limit,
  ``EMQ_PZQ_MAX_INFLIGHT``, is set to ``--prefetch`` times the consumers);
- the figure is messages / seconds from the producer's first send to the last
  ack, every message confirmed. The consumers report their acks to this process
  in batches, and at once whenever they have nothing left to read, so that the
  end is seen when it happens.

Our broker is ``manage.py emq_broker`` on fresh loopback ports with its journal
on (a fresh file per round, ``EMQ_JOURNAL_SYNC`` as ``--journal-sync``).
RabbitMQ is the one on ``BENCH_AMQP_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``); its queue is purged before each round.
The producer and consumer code for both lives here, as subcommands, written from
the PZQ document and pika's documentation.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import (  # noqa: E402
    PYTHON,
    REPO,
    ServerSet,
    base_env,
    cpu_delta,
    find_system_pids,
    free_port,
    tree_cpu,
)

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
QUEUE = "emq-pzq-bench"
REPORT_EVERY = 500  # acks a consumer counts before it reports (or when idle)


# ---- the report channel: children PUSH (kind, value, monotonic time) ----------------


def reporter(url: str) -> Callable[[str, int], None]:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.linger = 5000
    sock.connect(url)

    def report(kind: str, value: int) -> None:
        sock.send_json([kind, value, time.monotonic()])

    return report


# ---- PZQ (our broker) ------------------------------------------------------------


def pzq_producer(args: argparse.Namespace) -> None:
    report = reporter(args.report)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = 0
    sock.connect(args.url)
    body = b"x" * args.body_size
    n, window = args.messages, args.window
    sent = confirmed = 0
    report("start", 0)
    while confirmed < n:
        while sent < n and sent - confirmed < window:
            sock.send_multipart([b"%d" % sent, b"", body])
            sent += 1
        if not sock.poll(30_000):
            raise SystemExit(f"pzq producer: no answer in 30 s ({confirmed} of {n} confirmed)")
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if frames[1] != b"1":
                raise SystemExit(f"pzq producer: refused {frames!r}")
            confirmed += 1
    report("confirmed", confirmed)


def pzq_consumer(args: argparse.Namespace) -> None:
    report = reporter(args.report)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 1000
    sock.rcvhwm = sock.sndhwm = 0
    sock.connect(args.url)
    seen: set[bytes] = set()
    unreported = 0
    report("ready", 0)
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            if unreported:
                report("acked", unreported)
                unreported = 0
            sock.poll()
            continue
        # [pzq id, msg id, sent µs, ack timeout µs, '', body...]
        sock.send_multipart([frames[0], frames[1], b"1"])
        if frames[1] not in seen:  # a redelivery is acked but not counted again
            seen.add(frames[1])
            unreported += 1
            if unreported >= REPORT_EVERY:
                report("acked", unreported)
                unreported = 0


def start_emq(servers: ServerSet, args: argparse.Namespace, tmp: str, tree: str = REPO) -> str:
    receive, send = free_port(), free_port()
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_BACKEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MONITOR_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MDP_BIND="",
        EMQ_PZQ_RECEIVE_BIND=f"tcp://127.0.0.1:{receive}",
        EMQ_PZQ_SEND_BIND=f"tcp://127.0.0.1:{send}",
        EMQ_PZQ_MONITOR_BIND="",
        EMQ_PZQ_MAX_INFLIGHT=str(args.prefetch * args.consumers),
        EMQ_JOURNAL_PATH=os.path.join(tmp, "journal.sqlite3"),
        EMQ_JOURNAL_SYNC=args.journal_sync,
        EMQ_TRACE_DIR="",
    )
    env["PYTHONPATH"] = tree
    argv = [PYTHON, os.path.join(tree, "manage.py"), "emq_broker"]
    servers.start("emq-broker", "broker", argv, env)
    wait_port(receive)
    wait_port(send)
    return f"tcp://127.0.0.1:{receive} tcp://127.0.0.1:{send}"


def wait_port(port: int, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


# ---- RabbitMQ (pika) ---------------------------------------------------------------


def rabbit_producer(args: argparse.Namespace) -> None:
    """Publisher confirms on pika's asynchronous connection, so that a window of
    publishes is outstanding (BlockingConnection would wait for each confirm)."""
    import pika

    report = reporter(args.report)
    body = b"x" * args.body_size
    props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    n, window = args.messages, args.window
    state = {"sent": 0, "confirmed": 0}
    unconfirmed: collections.deque[int] = collections.deque()  # delivery tags, in order
    channel: Any = None

    def publish() -> None:
        while state["sent"] < n and len(unconfirmed) < window:
            channel.basic_publish("", QUEUE, body, props)
            state["sent"] += 1
            unconfirmed.append(state["sent"])  # tags count from 1 on a confirm channel

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            raise SystemExit(f"rabbitmq producer: nacked {method.delivery_tag}")
        tag = method.delivery_tag
        if method.multiple:
            while unconfirmed and unconfirmed[0] <= tag:
                unconfirmed.popleft()
                state["confirmed"] += 1
        else:
            unconfirmed.remove(tag)
            state["confirmed"] += 1
        if state["confirmed"] == n:
            report("confirmed", n)
            connection.close()
        else:
            publish()

    def on_confirm_ok(_frame: Any) -> None:
        report("start", 0)
        publish()

    def on_channel(ch: Any) -> None:
        nonlocal channel
        channel = ch
        ch.confirm_delivery(on_confirm, callback=on_confirm_ok)

    def on_open(conn: Any) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_fail(_conn: Any, error: Any) -> None:
        raise SystemExit(f"rabbitmq producer: {error}")

    connection = pika.SelectConnection(
        pika.URLParameters(AMQP_URL),
        on_open_callback=on_open,
        on_open_error_callback=on_fail,
        on_close_callback=lambda _c, _r: connection.ioloop.stop(),
    )
    connection.ioloop.start()


def rabbit_consumer(args: argparse.Namespace) -> None:
    import pika

    report = reporter(args.report)
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=args.prefetch)
    unreported = 0

    def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
        nonlocal unreported
        ch.basic_ack(method.delivery_tag)
        unreported += 1
        if unreported >= REPORT_EVERY:
            report("acked", unreported)
            unreported = 0

    channel.basic_consume(QUEUE, on_message, auto_ack=False)
    report("ready", 0)
    while True:
        connection.process_data_events(time_limit=1)  # returns once it has dispatched
        if unreported:
            report("acked", unreported)
            unreported = 0


def start_rabbitmq(_servers: ServerSet, _args: argparse.Namespace, _tmp: str) -> str:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.queue_purge(QUEUE)
    connection.close()
    return ""


SYSTEMS: dict[str, tuple[Callable[[ServerSet, argparse.Namespace, str], str], str]] = {
    "emq": (start_emq, "pzq"),
    "rabbitmq": (start_rabbitmq, "rabbit"),
}


# ---- one measurement ---------------------------------------------------------------


def measure(name: str, args: argparse.Namespace, logs: str) -> dict[str, float]:
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    report_port = pull.bind_to_random_port("tcp://127.0.0.1")
    report_url = f"tcp://127.0.0.1:{report_port}"
    servers = ServerSet(logs)
    if name == "emq-base":  # the same broker from another tree (--base-tree)
        start, kind = (lambda s, a, t: start_emq(s, a, t, args.base_tree)), "pzq"
    else:
        start, kind = SYSTEMS[name]
    common = [
        "--report",
        report_url,
        "--messages",
        str(args.messages),
        "--body-size",
        str(args.body_size),
        "--window",
        str(args.window),
        "--prefetch",
        str(args.prefetch),
    ]
    me = os.path.abspath(__file__)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pzq-bench-") as tmp:
        try:
            urls = start(servers, args, tmp).split()
            receive_url, send_url = (urls + ["", ""])[:2]
            for i in range(args.consumers):
                argv = [PYTHON, me, f"{kind}-consumer", "--url", send_url, *common]
                servers.start(f"{name}-consumer-{i}", "workers", argv, base_env())
            ready = 0
            while ready < args.consumers:
                ready += receive(pull, servers, "ready")[0] == "ready"
            broker_pids = [s.pid for s in servers.servers if s.role == "broker"]
            broker_pids = broker_pids or find_system_pids("beam.smp")  # RabbitMQ's
            broker_cpu = tree_cpu(broker_pids)
            client_cpu = tree_cpu([s.pid for s in servers.servers if s.role == "workers"])
            argv = [PYTHON, me, f"{kind}-producer", "--url", receive_url, *common]
            servers.start(f"{name}-producer", "workers", argv, base_env())
            started = confirmed_at = last_ack = 0.0
            acked = 0
            while acked < args.messages or not confirmed_at:
                what, value, t = receive(pull, servers)
                if what == "start":
                    started = t
                elif what == "confirmed":
                    confirmed_at = t
                elif what == "acked":
                    acked += value
                    last_ack = t
            broker_s = cpu_delta(broker_cpu, tree_cpu(broker_pids))
            client_s = cpu_delta(
                client_cpu, tree_cpu([s.pid for s in servers.servers if s.role == "workers"])
            )
        finally:
            servers.stop_all()
            pull.close()
    elapsed = last_ack - started
    return {
        "msgs_per_s": args.messages / elapsed,
        "seconds": elapsed,
        "confirmed_after_s": confirmed_at - started,
        "acked": acked,
        "broker_cpu_us_per_msg": broker_s / args.messages * 1e6,
        "clients_cpu_us_per_msg": client_s / args.messages * 1e6,
        "load_before": load_before,
    }


def receive(pull: zmq.Socket[Any], servers: ServerSet, expect: str = "") -> list[Any]:
    deadline = time.monotonic() + 300
    while not pull.poll(1000):
        for server in servers.servers:
            if not server.alive():
                raise RuntimeError(f"{server.name} exited:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing reported in 300 s (waiting for {expect or 'progress'})")
    return list(pull.recv_json())


# ---- main ------------------------------------------------------------------------

RATIOS = (("emq", "rabbitmq"), ("emq", "emq-base"), ("emq-base", "rabbitmq"))


def table_row(
    label: str, rate: dict[str, float], names: list[str], pairs: list[tuple[str, str]]
) -> str:
    return (
        f"{label:>6s} "
        + " ".join(f"{rate[n]:10,.0f}" for n in names)
        + "".join(f" {rate[a] / rate[b]:18.2f}" for a, b in pairs)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-size", type=int, default=1000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="emq,rabbitmq")
    parser.add_argument("--journal-sync", choices=("normal", "full"), default="normal")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--base-tree",
        help="another checkout of emq-django: adds the system emq-base, its broker",
    )
    parser.add_argument("--url", default="")
    parser.add_argument("--report", default="")
    args = parser.parse_args()
    roles = {
        "pzq-producer": pzq_producer,
        "pzq-consumer": pzq_consumer,
        "rabbit-producer": rabbit_producer,
        "rabbit-consumer": rabbit_consumer,
    }
    if args.role in roles:
        roles[args.role](args)
        return
    names = [n for n in args.only.split(",") if n]
    if args.base_tree and "emq-base" not in names:
        names.append("emq-base")
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    logs = tempfile.mkdtemp(prefix="pzq-bench-logs-")
    print(
        f"{args.messages:,} messages of {args.body_size} B, window {args.window}, "
        f"{args.consumers} consumers, prefetch {args.prefetch} each, "
        f"emq journal sync {args.journal_sync}",
        flush=True,
    )
    for round_ in range(args.rounds):
        order = names if round_ % 2 == 0 else names[::-1]  # alternate who goes first
        for name in order:
            figures = measure(name, args, logs)
            runs[name].append(figures)
            print(
                f"round {round_ + 1} {name:9s} {figures['msgs_per_s']:9,.0f} msgs/s "
                f"({figures['seconds']:.1f} s; all confirmed after "
                f"{figures['confirmed_after_s']:.1f} s; CPU µs/msg broker "
                f"{figures['broker_cpu_us_per_msg']:.0f}, clients "
                f"{figures['clients_cpu_us_per_msg']:.0f}; load {figures['load_before']:.1f})",
                flush=True,
            )
    print(f"\nconfirmed-and-acked msgs/s, {args.rounds} rounds:")
    pairs = [(a, b) for a, b in RATIOS if a in names and b in names]
    print(
        f"{'round':>6s} "
        + " ".join(f"{n:>10s}" for n in names)
        + "".join(f" {a + '/' + b:>18s}" for a, b in pairs)
    )
    for i in range(args.rounds):
        rate = {n: runs[n][i]["msgs_per_s"] for n in names}
        print(table_row(str(i + 1), rate, names, pairs))
    medians = {n: statistics.median(r["msgs_per_s"] for r in runs[n]) for n in names}
    print(table_row("median", medians, names, pairs))
    if args.keep_logs:
        print(f"logs: {logs}")
    else:
        import shutil

        shutil.rmtree(logs, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
