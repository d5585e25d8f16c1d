"""The PZQ port end to end: a producer and a consumer written from the document
(specs/pzq-sockets-and-formats.txt; tests/pzq_client.py) with plain pyzmq, through a
real broker process: ack, nack, ack time-outs, dead letters, MONITOR, expiry, a
restart with unacknowledged messages, malformed input, and volume."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from tests.e2e.test_spine import monitor
from tests.pzq_client import Consumer, Delivery, Producer, close_all, connect
from tests.support import EmqProcesses, ManagedProcess, port_of, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


# ---- raw sockets (the producer and consumer are in tests/pzq_client.py) ----------


def _socket(ctx: zmq.Context[Any], kind: int, url: str) -> zmq.Socket[Any]:
    return connect(ctx, kind, url)  # closed by the ``ctx`` fixture


def pzq_monitor(env: dict[str, str]) -> dict[str, str]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.linger = 0
    sock.connect(env["EMQ_PZQ_MONITOR_BIND"])
    try:
        sock.send(b"MONITOR")
        assert sock.poll(5000), "MONITOR unanswered"
        text = sock.recv().decode()
    finally:
        sock.close()
    pairs = (line.split(":", 1) for line in text.split("\n"))
    return {k.strip(): v.strip() for k, v in pairs}


def emq_monitor(env: dict[str, str], request: bytes) -> Any:
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.linger = 0
    sock.connect(env["EMQ_MONITOR_URL"])
    try:
        sock.send(request)
        assert sock.poll(5000)
        return json.loads(sock.recv())
    finally:
        sock.close()


# ---- fixtures -----------------------------------------------------------------------


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    close_all()
    context.destroy(linger=0)


def start_pzq_broker(
    procs: EmqProcesses, env: dict[str, str], name: str = "broker", **extra: str
) -> ManagedProcess:
    proc = start_broker(procs, env, name=name, extra_env=extra)
    for key in ("EMQ_PZQ_RECEIVE_BIND", "EMQ_PZQ_SEND_BIND", "EMQ_PZQ_MONITOR_BIND"):
        procs.wait_for_port(port_of(env[key]), proc=proc)
    return proc


def produce(producer: Producer, n: int, prefix: bytes = b"m") -> list[bytes]:
    ids = [b"%s%d" % (prefix, i) for i in range(n)]
    for msg_id in ids:
        producer.send(msg_id, b"body-" + msg_id)
    answers = producer.answers(n)
    assert all(status == b"1" for status, _ in answers.values()), answers
    return ids


# ---- tests --------------------------------------------------------------------------


def test_ack_nack_and_ack_timeout(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_pzq_broker(emq_processes, emq_env, EMQ_PZQ_ACK_TIMEOUT="1.0")
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    produce(producer, 3)
    first = [consumer.recv() for _ in range(3)]
    assert all(d is not None for d in first)
    by_body = {d.body[0]: d for d in first if d is not None}
    assert set(by_body) == {b"body-m0", b"body-m1", b"body-m2"}
    d0, d1, d2 = by_body[b"body-m0"], by_body[b"body-m1"], by_body[b"body-m2"]
    assert d0.timeout_us == 1_000_000 and abs(d0.sent_us / 1e6 - time.time()) < 5
    consumer.ack(d0)
    consumer.ack(d1, ok=False)  # nack: again at once
    t0 = time.monotonic()
    again = consumer.recv(timeout=0.8)
    assert again is not None and again.msg_id == d1.msg_id and again.body == [b"body-m1"]
    consumer.ack(again)
    late = consumer.recv(timeout=3.0)  # d2 was never acked: after its 1 s time-out
    assert late is not None and late.msg_id == d2.msg_id
    assert time.monotonic() - t0 >= 0.5
    consumer.ack(late)
    assert consumer.recv(timeout=1.5) is None  # the acked ones never come back
    figures = wait_until(lambda: (f := pzq_monitor(emq_env))["messages"] == "0" and f, "all acked")
    assert figures["messages_inflight"] == "0"
    counters = monitor(emq_env)["counters"]
    assert counters["lease_expired"] == 1 and counters["succeeded"] == 3


def test_dead_letters_after_max_deliveries(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_pzq_broker(emq_processes, emq_env, EMQ_PZQ_MAX_DELIVERIES="3")
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    produce(producer, 1, b"poison")
    seen = []
    for _ in range(3):
        d = consumer.recv()
        assert d is not None
        seen.append(d.msg_id)
        consumer.ack(d, ok=False)
    assert len(set(seen)) == 1
    assert consumer.recv(timeout=1.0) is None  # the fourth delivery never comes
    letters = emq_monitor(emq_env, b"DEADLETTERS LIST")
    assert letters["count"] == 1
    (letter,) = letters["dead_letters"]
    assert letter["queue"] == "pzq" and letter["attempts"] == 3 and letter["error"] == "Nack"
    assert emq_monitor(emq_env, b"DEADLETTERS REQUEUE ALL") == {"requeued": 1}
    d = consumer.recv()
    assert d is not None and d.msg_id == seen[0] and d.body == [b"body-poison0"]
    consumer.ack(d)


def test_monitor_answers_the_six_keys(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_pzq_broker(emq_processes, emq_env, EMQ_PZQ_MAX_INFLIGHT="2")
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    produce(producer, 5)
    before = pzq_monitor(emq_env)
    assert before["messages"] == "5" and before["messages_inflight"] == "0"
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    held = [consumer.recv(), consumer.recv()]  # the in-flight limit is 2: no third
    assert all(held) and consumer.recv(timeout=0.5) is None
    figures = pzq_monitor(emq_env)
    for key in (
        "messages",
        "messages_inflight",
        "messages_in_flight",
        "db_size",
        "inflight_db_size",
        "syncs",
        "expired_messages",
    ):
        assert key in figures, key
    assert figures["messages"] == "5"
    assert figures["messages_inflight"] == figures["messages_in_flight"] == "2"
    assert figures["inflight_db_size"] == str(2 * len(b"body-m0"))
    assert int(figures["db_size"]) > 0 and int(figures["syncs"]) >= 1
    assert figures["expired_messages"] == "0"
    for d in held:
        assert d is not None
        consumer.ack(d)
    for _ in range(3):
        d = consumer.recv()
        assert d is not None
        consumer.ack(d)
    wait_until(lambda: pzq_monitor(emq_env)["messages"] == "0", "all acked")


def test_messages_older_than_max_age_expire(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_pzq_broker(emq_processes, emq_env, EMQ_PZQ_MAX_AGE="0.5")
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    produce(producer, 3, b"old")  # nobody consumes: they wait
    time.sleep(1.0)
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    produce(producer, 1, b"new")
    d = consumer.recv()
    assert d is not None and d.body == [b"body-new0"]
    consumer.ack(d)
    assert consumer.recv(timeout=1.0) is None
    assert pzq_monitor(emq_env)["expired_messages"] == "3"


def test_restart_after_kill_delivers_unacked_messages_again(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    broker = start_pzq_broker(emq_processes, emq_env)
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    ids = produce(producer, 50)
    acked = set()
    for _ in range(20):  # 20 in flight, 10 of them acked
        d = consumer.recv()
        assert d is not None
        if len(acked) < 10:
            consumer.ack(d)
            acked.add(d.body[0])
    wait_until(lambda: monitor(emq_env)["counters"]["succeeded"] == 10, "10 acks")
    # the monitor answers as it reads, and the loop turn that counted the last ack
    # commits it to the journal at the turn's end: a reply in that same turn may
    # leave first (a kill -9 then, on a loaded machine, lost the acks). A second
    # question is read in a later turn, so its answer means the acks are on disk.
    monitor(emq_env)
    emq_processes.send_signal(broker, signal.SIGKILL)
    emq_processes.wait_for_exit(broker)
    start_pzq_broker(emq_processes, emq_env, name="broker-2")
    bodies = set()
    while len(bodies) < 40:
        d = consumer.recv(timeout=15.0)
        assert d is not None, f"only {len(bodies)} of 40 delivered again"
        bodies.add(d.body[0])
        consumer.ack(d)
    assert bodies == {b"body-" + i for i in ids} - acked


def test_malformed_messages_are_counted_and_the_broker_lives(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    broker = start_pzq_broker(emq_processes, emq_env)
    rng = random.Random(15)
    receive = _socket(ctx, zmq.DEALER, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    shapes = [
        lambda: [b""],  # no id
        lambda: [b"id-%d" % rng.randrange(10**6)],  # no delimiter
        lambda: [b"id", b"header"],  # no delimiter
        lambda: [b"id", b""],  # no body
        lambda: [b"x" * 300, b"", b"body"],  # id too long
        lambda: [rng.randbytes(rng.randrange(1, 40))],
    ]
    answered = 0
    for i in range(10_000):
        frames = shapes[i % len(shapes)]()
        receive.send_multipart(frames)
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    produce(producer, 1, b"good")
    d = consumer.recv()
    assert d is not None and d.body == [b"body-good0"]
    consumer.ack(d)
    counters = wait_until(
        lambda: (c := monitor(emq_env)["counters"])["protocol_errors"] >= 10_000 and c,
        "10,000 malformed messages counted",
    )
    assert counters["protocol_errors"] == 10_000
    while receive.poll(200):
        frames = receive.recv_multipart()
        assert frames[1] == b"0"
        answered += 1
    assert answered > 0
    assert broker.alive()


def test_many_messages_move_through_with_acks(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    n = int(os.environ.get("PZQ_E2E_MESSAGES", "100000"))
    start_pzq_broker(emq_processes, emq_env)
    producer = Producer(ctx, emq_env["EMQ_PZQ_RECEIVE_BIND"])
    consumer = Consumer(ctx, emq_env["EMQ_PZQ_SEND_BIND"])
    window = 2000
    sent = confirmed = received = 0
    seen: set[bytes] = set()
    t0 = time.monotonic()
    deadline = t0 + 150
    poller = zmq.Poller()
    poller.register(producer.sock, zmq.POLLIN)
    poller.register(consumer.sock, zmq.POLLIN)
    while received < n or confirmed < n:
        assert time.monotonic() < deadline, f"sent {sent} confirmed {confirmed} got {received}"
        while sent < n and sent - confirmed < window:
            producer.send(b"%d" % sent, b"%d" % sent)
            sent += 1
        for sock, _ in poller.poll(1000):
            for _ in range(1000):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if sock is producer.sock:
                    assert frames[1] == b"1", frames
                    confirmed += 1
                else:
                    d = Delivery(frames)
                    consumer.ack(d)
                    if d.body[0] not in seen:
                        seen.add(d.body[0])
                        received += 1
    elapsed = time.monotonic() - t0
    print(f"PZQ e2e: {n} messages confirmed and acked in {elapsed:.1f} s ({n / elapsed:.0f}/s)")
    assert len(seen) == n
    wait_until(lambda: pzq_monitor(emq_env)["messages"] == "0", "all acked", timeout=30)
