"""The client finds a restarted broker (a new incarnation) and fails the plain jobs
the old one had acknowledged with ``JobLost`` at once (issue 29, item 10). Real
loopback sockets; the broker is a ROUTER played by the test, bound again on the
same address to be "restarted"."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from emq_django.client import Client
from emq_django.exceptions import JobLost, ResultTimeout
from emq_django.protocol import frames as F
from emq_django.protocol.batch import ack_id
from tests.support import free_tcp_ports

BODY = b'["run",{"callable":"add","path":"pkg.tasks","args":[2,3],"kwargs":{}}]'
WAIT_MS = 5000
OLD, NEW = b"1" * 32, b"2" * 32


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    """A context of the test's own. Its teardown closes whatever socket a failed
    test left open (``destroy``): ``term`` would wait for it for ever, and no
    per-test timeout can interrupt libzmq there."""
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    for thread in THREADS:
        thread.join(WAIT_MS / 1000)  # they poll with a bound; none outlives it
    THREADS.clear()
    ctx.destroy(linger=0)


def router(context: zmq.Context[Any], url: str) -> zmq.Socket[Any]:
    """A ROUTER bound to ``url``. A socket closed on that address a moment ago may
    still hold it (libzmq closes in its I/O thread, after ``close`` returns): the
    bind is tried again until the address is free, for a bounded time."""
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        try:
            sock.bind(url)
            return sock
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                sock.close(linger=0)
                raise
            time.sleep(0.01)  # the old socket's I/O thread lets the address go


THREADS: list[threading.Thread] = []


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    THREADS.append(thread)
    return thread


def sent_and_acked(context: zmq.Context[Any], url: str, client: Client) -> bytes:
    """A plain job sent and ACKed by the broker's first incarnation, which then
    goes away (its socket closed); returns the job's msgid."""
    first = router(context, url)

    def ack() -> None:
        assert first.poll(WAIT_MS)
        identity, *frames = first.recv_multipart()
        first.send_multipart([identity, *F.encode_ack(ack_id(OLD, b"a" * 32), frames[3])])

    thread = in_thread(ack)
    msgid = client.send("default", b"reply-requested", BODY).encode()  # the first: ACKed
    thread.join()
    first.close(linger=0)
    return msgid


def answers_incarnation(sock: zmq.Socket[Any], incarnation: bytes) -> Callable[[], None]:
    def answer() -> None:
        assert sock.poll(WAIT_MS)
        identity, *frames = sock.recv_multipart()
        assert frames[2] == b"HEARTBEAT"  # connected again, the client asks
        sock.send_multipart([identity, *F.encode_incarnation(incarnation, time.time())])

    return answer


def test_a_plain_job_acknowledged_by_a_broker_that_restarted_is_lost_at_once(
    context: zmq.Context[Any],
) -> None:
    (port,) = free_tcp_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    client = Client(url, ack_timeout=5.0, context=context, curve=None)
    try:
        msgid = sent_and_acked(context, url, client)
        second = router(context, url)  # restarted: another incarnation
        thread = in_thread(answers_incarnation(second, NEW))
        with pytest.raises(JobLost) as lost:
            client.wait_reply(msgid, 30.0, sent_at_change=0)
        thread.join()
        assert lost.value.type == JobLost.TYPE and "restarted" in lost.value.message
        assert client.broker_changes == 1

        # a job sent after the change is the new broker's: not lost
        def ack_and_reply() -> None:
            assert second.poll(WAIT_MS)
            identity, *frames = second.recv_multipart()
            ack = F.encode_ack(ack_id(NEW, b"b" * 32), frames[3])
            second.send_multipart([identity, *ack])
            reply = F.encode_reply(b"r" * 32, b'{"value": 5}', frames[3], b"ok")
            second.send_multipart([identity, *reply])

        thread = in_thread(ack_and_reply)
        after = client.send("default", b"reply-requested", BODY).encode()
        assert client.wait_reply(after, 30.0, sent_at_change=1).body == b'{"value": 5}'
        thread.join()
        second.close(linger=0)
    finally:
        client.close()


def test_a_broker_connected_again_under_the_same_incarnation_loses_nothing(
    context: zmq.Context[Any],
) -> None:
    (port,) = free_tcp_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    client = Client(url, ack_timeout=5.0, context=context, curve=None)
    try:
        msgid = sent_and_acked(context, url, client)
        again = router(context, url)  # the same broker, reached again
        thread = in_thread(answers_incarnation(again, OLD))
        with pytest.raises(ResultTimeout):
            client.wait_reply(msgid, 3.0, sent_at_change=0)
        thread.join()
        assert client.broker_changes == 0
        again.close(linger=0)
    finally:
        client.close()
