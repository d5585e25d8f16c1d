"""A guaranteed job refused with ``lease-lost`` (the broker lost its lease to
another: a failover under way) reaches no application code as an exception: the
client sends it again, and the next broker's ACK ends ``send()`` (issue 32).
Real loopback sockets; the broker is a ROUTER played by the test."""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from emq_django.client import Client
from emq_django.exceptions import JobRefused
from emq_django.protocol import frames as F
from emq_django.protocol.batch import ack_id
from tests.integration.test_broker_incarnation import BODY, OLD, WAIT_MS, in_thread, router
from tests.integration.test_broker_incarnation import context as context  # the fixture
from tests.support import free_tcp_ports


def refuse(sock: zmq.Socket[Any], code: str) -> bytes:
    """Take one REQUEST and refuse it with ``code``; returns its msgid."""
    assert sock.poll(WAIT_MS)
    identity, *frames = sock.recv_multipart()
    msgid = frames[3]
    error = F.Error(b"e" * 32, msgid, "journal x: the lease is no longer ours (epoch 3)", code)
    sock.send_multipart([identity, *error.encode()])
    return msgid


def test_a_guaranteed_job_refused_for_a_lost_lease_is_sent_again(
    context: zmq.Context[Any],
) -> None:
    (port,) = free_tcp_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    client = Client(url, ack_timeout=2.0, context=context, curve=None)
    broker = router(context, url)
    seen: list[bytes] = []

    def refuse_then_ack() -> None:
        seen.append(refuse(broker, "lease-lost"))
        assert broker.poll(WAIT_MS)  # the same job, again
        identity, *frames = broker.recv_multipart()
        seen.append(frames[3])
        broker.send_multipart([identity, *F.encode_ack(ack_id(OLD, b"a" * 32), frames[3])])

    try:
        thread = in_thread(refuse_then_ack)
        msgid = client.send("default", b"guarantee", BODY, confirm=True).encode()
        thread.join()
        assert seen == [msgid, msgid]
    finally:
        client.close()
        broker.close(linger=0)


def test_another_refusal_of_a_guaranteed_job_still_raises(context: zmq.Context[Any]) -> None:
    (port,) = free_tcp_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    client = Client(url, ack_timeout=2.0, context=context, curve=None)
    broker = router(context, url)
    try:
        thread = in_thread(lambda: refuse(broker, "journal-error") and None)
        with pytest.raises(JobRefused, match="lease is no longer ours"):
            client.send("default", b"guarantee", BODY, confirm=True)
        thread.join()
    finally:
        client.close()
        broker.close(linger=0)
