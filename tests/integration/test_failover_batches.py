"""A ``map()`` of guaranteed jobs with results, under way when its broker is
replaced (issue 32, defect c): the jobs the broker that died had acknowledged are
claimed from the broker that took over (sent again under their ids), so that their
``get()`` returns. Real loopback sockets; both brokers are ROUTERs played by the
test, so that the failover falls at the exact moment: between two ACKs of one
batch."""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

from emq_django.client import Client
from emq_django.exceptions import JobLost
from emq_django.protocol import frames as F
from emq_django.protocol.batch import ack_id
from tests.integration.test_broker_incarnation import BODY, NEW, OLD, WAIT_MS, in_thread, router
from tests.integration.test_broker_incarnation import context as context  # the fixture
from tests.support import free_tcp_ports, wait_until
from tests.support.router_broker import job_ids

HEADERS = b"guarantee,reply-requested"
ACK_TIMEOUT = 8.0  # seconds: the batch's resends come every quarter of it


def take(sock: zmq.Socket[Any]) -> tuple[bytes, list[bytes]]:
    """The next message the client sent: (its identity, its frames)."""
    assert sock.poll(WAIT_MS), "nothing from the client"
    identity, *frames = sock.recv_multipart()
    return identity, frames


def test_a_map_under_way_claims_what_the_broker_that_died_had_acknowledged(
    context: zmq.Context[Any],
) -> None:
    one, two = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(2))
    client = Client(f"{one},{two}", ack_timeout=ACK_TIMEOUT, context=context, curve=None)
    ids = [client.new_id() for _ in range(3)]
    a, b, c = (i.encode() for i in ids)
    errors: list[BaseException] = []

    def mapper() -> None:
        try:
            client.send_batch("default", HEADERS, [BODY] * 3, ids, confirm=True)
        except BaseException as exc:  # what must never reach application code
            errors.append(exc)

    first = router(context, one)
    try:
        thread = in_thread(mapper)
        # broker 1 acknowledges a (the socket's first message, alone) and b, not c
        came: list[bytes] = []
        for expected in (a, b):
            while not came:
                identity, frames = take(first)
                came += job_ids(frames)
            assert came.pop(0) == expected
            first.send_multipart([identity, *F.encode_ack(ack_id(OLD, b"a" * 32), expected)])
        # c comes (with b, perhaps), then again (the batch's resend of what is
        # unanswered): by then the client has read b's ACK: b is not sent again
        seen = came
        while seen.count(c) < 2:
            _, frames = take(first)
            seen += job_ids(frames)
        assert b not in seen
    finally:
        first.close(linger=0)  # broker 1 dies; broker 2 takes over at the other address

    second = router(context, two)
    claimed: set[bytes] = set()
    done = threading.Event()

    def serve() -> None:
        """Broker 2: acknowledges every REQUEST (restored from the journal, or new)."""
        deadline = time.monotonic() + 3 * ACK_TIMEOUT
        while time.monotonic() < deadline and not done.is_set():
            if not second.poll(100):
                continue
            identity, *frames = second.recv_multipart()
            for job in job_ids(frames):
                claimed.add(job)
                second.send_multipart([identity, *F.encode_ack(ack_id(NEW, b"b" * 32), job)])

    try:
        server = in_thread(serve)
        thread.join(3 * ACK_TIMEOUT)
        assert errors == []
        # every job whose reply the client waits for is known to broker 2: a and b
        # (acknowledged by broker 1, restored from its journal) as well as c
        assert wait_until(lambda: {a, b, c} <= claimed, "broker 2 told of a, b, c", 2 * ACK_TIMEOUT)
    finally:
        done.set()
        server.join(WAIT_MS / 1000)
        client.close()
        second.close(linger=0)


# ---- b: jobs sent on a connection that died, another broker serving ---------------


def test_jobs_lost_on_a_dead_connection_raise_nothing_while_another_broker_serves(
    context: zmq.Context[Any],
) -> None:
    """Broker 1 goes silent (paused or cut off: nothing it reads is acknowledged)
    after broker 2 has taken over and the client has already seen broker 2's
    incarnation, and before the client's connection to broker 1 is dropped: the
    plain jobs sent on it meanwhile are lost (at most once: their ``get()`` raises
    ``JobLost``), and no send raises ``BrokerUnavailable`` while broker 2 serves
    (issue 32, defect b)."""
    one, two = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(2))
    client = Client(f"{one},{two}", ack_timeout=2.0, context=context, curve=None)
    first = router(context, one)
    second: zmq.Socket[Any] | None = None
    server: threading.Thread | None = None
    done = threading.Event()
    acked: list[bytes] = []

    def serve() -> None:
        """Broker 2: acknowledges and answers every job, and says its incarnation
        (as our broker's ACKs do: the client's question may have gone to broker 1)."""
        assert second is not None
        while not done.is_set():
            if not second.poll(100):
                continue
            identity, *frames = second.recv_multipart()
            if frames[2] == b"HEARTBEAT":
                second.send_multipart([identity, *F.encode_incarnation(NEW, time.time())])
            elif frames[2] == b"REQUEST":
                acked.append(frames[3])
                second.send_multipart([identity, *F.encode_ack(b"b" * 32, frames[3])])
                second.send_multipart([identity, *F.encode_incarnation(NEW, time.time())])
                reply = F.encode_reply(b"r" * 32, b'{"value": 5}', frames[3], b"ok")
                second.send_multipart([identity, *reply])

    try:
        # broker 1 takes the first job and says its incarnation (ACKs without the
        # MARK, as an EventMQ broker's: one REQUEST per job, none coalesced)
        def answer_first() -> None:
            identity, frames = take(first)
            first.send_multipart([identity, *F.encode_ack(b"a" * 32, frames[3])])
            first.send_multipart([identity, *F.encode_incarnation(OLD, time.time())])

        thread = in_thread(answer_first)
        client.send("default", b"guarantee", BODY, confirm=True)
        thread.join()
        second = router(context, two)  # broker 2 took over; broker 1 still connected
        server = in_thread(serve)
        while client.broker_changes == 0:  # until the client has seen broker 2
            client.send("default", b"guarantee", BODY, confirm=True)
        # plain jobs, one connection after the other: half of them to broker 1
        plain = [client.send("default", b"reply-requested", BODY).encode() for _ in range(8)]
        first.close(linger=0)  # broker 1's connection is dropped at last
        # guaranteed sends go on, well past the plain jobs' ack_timeout: none raises
        until = time.monotonic() + 3 * client.ack_timeout
        while time.monotonic() < until:
            client.send("default", b"guarantee", BODY, confirm=True)
        outcomes = []
        for msgid in plain:
            try:
                client.wait_reply(msgid, 10.0, sent_at_change=client.broker_changes)
                outcomes.append("value")
            except JobLost:
                outcomes.append("lost")
        assert "lost" in outcomes, outcomes  # the ones broker 1 read
        assert [m for m, o in zip(plain, outcomes, strict=True) if o == "value"] == [
            m for m in plain if m in acked
        ]
    finally:
        done.set()
        if server is not None:
            server.join(WAIT_MS / 1000)
        client.close()
        first.close(linger=0)
        if second is not None:
            second.close(linger=0)


def test_claims_sent_on_a_connection_dropped_later_are_sent_again(
    context: zmq.Context[Any],
) -> None:
    """At the change of broker, the client claims the replies it waits for (each
    guaranteed job sent again under its id). Broker 1 still connected then, silent,
    some claims go to it; once that connection is dropped they are sent again, so
    that broker 2 is told of every one."""
    one, two = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(2))
    client = Client(f"{one},{two}", ack_timeout=2.0, context=context, curve=None)
    first = router(context, one)
    second: zmq.Socket[Any] | None = None
    server: threading.Thread | None = None
    done = threading.Event()
    told: set[bytes] = set()

    def serve() -> None:
        """Broker 2: acknowledges every job and says its incarnation."""
        assert second is not None
        while not done.is_set():
            if not second.poll(100):
                continue
            identity, *frames = second.recv_multipart()
            if frames[2] == b"REQUEST":
                told.add(frames[3])
                second.send_multipart([identity, *F.encode_ack(b"b" * 32, frames[3])])
                second.send_multipart([identity, *F.encode_incarnation(NEW, time.time())])

    try:
        # broker 1 acknowledges two guaranteed jobs with a reply (then awaited)
        def acknowledge_two() -> None:
            for n in range(2):
                identity, frames = take(first)
                first.send_multipart([identity, *F.encode_ack(b"a" * 32, frames[3])])
                if n == 0:
                    first.send_multipart([identity, *F.encode_incarnation(OLD, time.time())])

        thread = in_thread(acknowledge_two)
        awaited = [
            client.send("default", b"guarantee,reply-requested", BODY, confirm=True).encode()
            for _ in range(2)
        ]
        thread.join()
        second = router(context, two)  # broker 2 took over; broker 1 still connected
        server = in_thread(serve)
        while client.broker_changes == 0:  # the change: both claims go, one per connection
            client.send("default", b"guarantee", BODY, confirm=True)
        first.close(linger=0)  # broker 1's connection is dropped at last
        # the client notices on its next wait (here: a guaranteed send's)
        deadline = time.monotonic() + 3 * client.ack_timeout
        while not set(awaited) <= told and time.monotonic() < deadline:
            client.send("default", b"guarantee", BODY, confirm=True)
        assert set(awaited) <= told
    finally:
        done.set()
        if server is not None:
            server.join(WAIT_MS / 1000)
        client.close()
        first.close(linger=0)
        if second is not None:
            second.close(linger=0)
