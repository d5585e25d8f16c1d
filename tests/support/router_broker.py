"""A broker played by the test: a ROUTER on a free loopback port, and our client
connected to it, for tests that script the broker's answers frame by frame."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from emq_django.client import Client
from emq_django.protocol import frames as F
from emq_django.protocol.batch import REQUESTS, decode_jobs
from tests.support.ports import free_tcp_ports

WAIT_MS = 5000


@contextmanager
def client_on_router(ack_timeout: float = 5.0) -> Iterator[tuple[Client, zmq.Socket[Any]]]:
    """Our client connected to a ROUTER the test answers from; closed after."""
    (port,) = free_tcp_ports(1)
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(f"tcp://127.0.0.1:{port}")
    client = Client(f"tcp://127.0.0.1:{port}", ack_timeout=ack_timeout, context=context, curve=None)
    try:
        yield client, router
    finally:
        client.close()
        router.close()
        context.destroy(linger=0)


def send_first(
    client: Client, router: zmq.Socket[Any], queue: str, headers: bytes, body: bytes
) -> tuple[Any, list[bytes]]:
    """``client.send`` of the connection's first job, which waits for its ACK: the
    test ACKs it as the broker would. Returns the job's id and the frames the
    ROUTER read (the peer's identity first)."""
    read: list[list[bytes]] = []

    def answer() -> None:
        assert router.poll(WAIT_MS)
        frames = router.recv_multipart()
        read.append(frames)
        router.send_multipart([frames[0], *F.encode_ack(b"a-1", frames[4])])

    helper = threading.Thread(target=answer)
    helper.start()
    job = client.send(queue, headers, body)
    helper.join()
    return job, read[0]


def job_ids(frames: list[bytes]) -> list[bytes]:
    """The msgids of the jobs a message to the broker carries: a REQUEST's one, a
    REQUESTS' each (a map() sends what fits in its window as one, once the ACKs
    bear the MARK), none for anything else."""
    if frames[2] == F.REQUEST:
        return [frames[3]]
    if frames[2] == REQUESTS:
        return [job[0] for job in decode_jobs(frames)]
    return []
