"""A batch (``Task.map()``) of more guaranteed jobs than the ACK window: the client
keeps at most ``EMQ_ACK_WINDOW`` of them unacknowledged at the broker, and the
window SLIDES: every ACK makes room for one more job at once (as publisher
confirms with a window of unconfirmed messages), not only once half the window
has been acknowledged. The broker is a ROUTER played by the test, over real
loopback sockets: it acknowledges one job only when the window is full, and all
the rest once every job has arrived, so that a client that waited for more than
one ACK before sending again would stall."""

from __future__ import annotations

import time
from typing import Any

import zmq

from emq_django.client import Client
from emq_django.protocol import frames as F
from emq_django.protocol.batch import ack_id
from tests.integration.test_broker_incarnation import BODY, OLD, WAIT_MS, in_thread, router
from tests.integration.test_broker_incarnation import context as context  # the fixture
from tests.support import free_tcp_ports
from tests.support.router_broker import job_ids

WINDOW = 10
JOBS = 45
ACK_TIMEOUT = 20.0  # seconds: a stalled window raises after it


def test_a_batch_over_the_window_slides_it_one_ack_at_a_time(
    context: zmq.Context[Any],
) -> None:
    (port,) = free_tcp_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    client = Client(url, ack_timeout=ACK_TIMEOUT, window=WINDOW, context=context, curve=None)
    ids = [client.new_id() for _ in range(JOBS)]
    errors: list[BaseException] = []
    returned: list[float] = []

    def mapper() -> None:
        try:
            client.send_batch("default", b"guarantee", [BODY] * JOBS, ids, confirm=True)
            returned.append(time.monotonic())
        except BaseException as exc:  # what must never reach application code
            errors.append(exc)

    broker = router(context, url)
    outstanding: list[bytes] = []  # received, not yet acknowledged, in order
    acked: set[bytes] = set()
    most = 0  # the most jobs ever unacknowledged at the broker

    def ack(identity: bytes, msgid: bytes) -> None:
        broker.send_multipart([identity, *F.encode_ack(ack_id(OLD, b"a" * 32), msgid)])
        acked.add(msgid)

    try:
        thread = in_thread(mapper)
        deadline = time.monotonic() + 3 * ACK_TIMEOUT
        while len(acked) < JOBS and time.monotonic() < deadline:
            if not broker.poll(100):
                continue
            identity, *frames = broker.recv_multipart()
            for msgid in job_ids(frames):  # (a REQUESTS: what fitted in the window)
                if msgid in acked:  # sent again before our ACK arrived: ACKed again
                    ack(identity, msgid)
                    continue
                if msgid not in outstanding:
                    outstanding.append(msgid)
                most = max(most, len(outstanding))
                if not acked or len(outstanding) + len(acked) == JOBS:
                    # the socket's first job waits alone; then, all are here: ACK them all
                    while outstanding:
                        ack(identity, outstanding.pop(0))
                elif len(outstanding) == WINDOW:  # a full window: room for one more
                    ack(identity, outstanding.pop(0))
        thread.join(WAIT_MS / 1000)
        assert errors == []
        assert returned, "send_batch did not return once every job was ACKed"
        assert acked == {i.encode() for i in ids}
        assert most == WINDOW  # the window was used, never exceeded
    finally:
        client.close()
        broker.close(linger=0)
