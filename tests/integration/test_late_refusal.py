"""A refusal that comes after a job's first answer (a copy of it sent again while its
ACK was awaited, refused by the broker after the first copy was saved) does not stand
for the job: the first answer does, and the job's REPLY is what its get() returns
(tests/faults/test_ha.py d met it: acknowledged guaranteed jobs whose get() raised
JobRefused). Real loopback sockets; the broker is a ROUTER played by the test."""

from __future__ import annotations

import logging

import pytest

from emq_django.protocol import frames as F
from tests.support.router_broker import WAIT_MS, client_on_router, send_first

BODY = b'["run",{"callable":"add","path":"pkg.tasks","args":[2,3],"kwargs":{}}]'


def test_a_refusal_read_after_the_jobs_ack_does_not_make_its_result_a_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="emq_django.client.inbox")
    with client_on_router() as (client, router):
        # the first message waits for its ACK: the test answers it as the broker would
        sent, frames = send_first(client, router, "default", b"reply-requested", BODY)
        job, peer = sent.encode(), frames[0]
        # the refusal of another copy of it, then an ACK of a second job: once the
        # client has that ACK it has read the refusal (one connection, in order)
        late = F.Error(b"e-1", job, "not saved: journal unreachable", "journal")
        router.send_multipart([peer, *late.encode()])
        second = client.send("default", b"", BODY).encode()
        assert router.poll(WAIT_MS)
        router.recv_multipart()
        router.send_multipart([peer, *F.encode_ack(b"a-2", second)])
        client.flush(timeout=5.0)
        assert client.take_reply(job) is None  # no REPLY yet, and no refusal raised
        dropped = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert dropped == [  # said, not silent
            f"job {job.decode()}: a copy sent again was refused "
            "(not saved: journal unreachable); its answer stands"
        ]
        router.send_multipart([peer, *F.encode_reply(b"r-1", b"5", job, b"ok")])
        reply = client.wait_reply(job, timeout=5.0)
        assert reply.body == b"5"
