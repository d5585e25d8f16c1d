"""ACKs naming several msgids (the ``acks`` header flag), on real loopback sockets.

The broker is driven turn by turn from the test (no thread), so that what one
turn accepted is known exactly; the client talks to a ROUTER played by the test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from emq_django.broker.ports.emqp_clients import ACK_DELAY, EmqpClientPort
from emq_django.broker.server import BrokerServer
from emq_django.protocol import PROTOCOL as P
from emq_django.protocol import frames as F
from emq_django.protocol.headers import parse_headers
from tests.support import private_broker_settings
from tests.support.router_broker import client_on_router, send_first

BODY = b'["run",{"callable":"add","path":"pkg.tasks","args":[2,3],"kwargs":{}}]'
WAIT_MS = 5000


def request(msgid: bytes, headers: bytes) -> list[bytes]:
    return F.encode_request(msgid, b"default", headers, BODY)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BrokerServer]:
    settings = private_broker_settings(tmp_path, mdp=True)
    context: zmq.Context[Any] = zmq.Context()
    srv = BrokerServer(settings, context=context, shutdown_grace=1.0)
    srv.bind()
    srv.test_context = context  # type: ignore[attr-defined]
    srv.test_sockets = []  # type: ignore[attr-defined]
    yield srv
    for sock in srv.test_sockets:  # type: ignore[attr-defined]
        sock.close(linger=0)
    srv.close()
    context.destroy(linger=0)


def client_port(srv: BrokerServer) -> EmqpClientPort:
    return next(p for p in srv.ports if isinstance(p, EmqpClientPort))


def connected_dealer(srv: BrokerServer, identity: bytes) -> zmq.Socket[Any]:
    """A DEALER whose first REQUEST the broker has read and ACKed (so that the
    broker can route to it)."""
    port = client_port(srv)
    sock = srv.sockets[port]
    dealer = srv.test_context.socket(zmq.DEALER)  # type: ignore[attr-defined]
    dealer.linger = 0
    srv.test_sockets.append(dealer)  # type: ignore[attr-defined]
    dealer.identity = identity
    dealer.connect(port.address)
    dealer.send_multipart(request(identity + b"-hello", b""))
    assert sock.poll(WAIT_MS), "the broker got nothing"
    frames = sock.recv_multipart()
    port.handle(frames[0], frames[1:], time.monotonic())
    srv._flush()
    assert dealer.poll(WAIT_MS), "no ACK"
    ack = F.decode(dealer.recv_multipart())
    assert type(ack) is F.Ack and ack.ack_msgid == identity + b"-hello"
    return dealer


def one_turn(srv: BrokerServer, identity: bytes, requests: list[list[bytes]]) -> None:
    """The broker reads ``requests`` from ``identity`` in one turn, then flushes,
    and flushes again once the lazy ACKs it held are due (``ACK_DELAY``)."""
    port = client_port(srv)
    now = time.monotonic()
    for frames in requests:
        port.handle(identity, frames, now)
    srv._flush()
    time.sleep(ACK_DELAY * 1.5)
    srv._flush()


def messages(dealer: zmq.Socket[Any]) -> list[list[bytes]]:
    """Every message that has come, waiting for the first."""
    assert dealer.poll(WAIT_MS), "nothing came"
    out = [dealer.recv_multipart()]
    while dealer.poll(200):
        out.append(dealer.recv_multipart())
    return out


def test_a_flagged_client_gets_one_ack_per_turn_naming_every_msgid(server: BrokerServer) -> None:
    dealer = connected_dealer(server, b"client-a")
    ids = [b"job-%d" % i for i in range(5)]
    one_turn(server, b"client-a", [request(m, b"acks") for m in ids])
    (ack,) = messages(dealer)
    assert ack[:3] == [b"", P, F.ACK] and ack[3]
    assert ack[4:] == ids


def test_a_lazy_ack_waits_for_the_next_message_to_its_client_or_its_delay(
    server: BrokerServer,
) -> None:
    """A job that asked for a reply and is not marked guaranteed, from a client with
    the flag: its ACK is held (to go with the job's reply, one wake-up of the
    client), not sent at once; a message to the same client takes it along, in
    order; else it goes when due."""
    dealer = connected_dealer(server, b"client-l")
    port = client_port(server)
    port.handle(b"client-l", request(b"job-1", b"acks,reply-requested"), time.monotonic())
    server._flush()
    assert not dealer.poll(100), "the lazy ACK went at once"
    # a refusal to the same client (as a REPLY would) takes the held ACK first
    bad = F.encode_request(b"job-bad", b"", b"acks", BODY)
    port.handle(b"client-l", bad, time.monotonic())
    server._flush()
    got = messages(dealer)
    assert [m[2] for m in got] == [F.ACK, F.ERROR]
    assert got[0][4:] == [b"job-1"]
    # alone, it goes once due, from the loop's flush after ACK_DELAY
    port.handle(b"client-l", request(b"job-2", b"acks,reply-requested"), time.monotonic())
    server._flush()
    assert not dealer.poll(0)
    time.sleep(ACK_DELAY * 1.5)
    server._flush()
    (ack,) = messages(dealer)
    assert ack[2] == F.ACK and ack[4:] == [b"job-2"]


def test_a_guaranteed_job_and_the_last_flush_do_not_hold_acks(server: BrokerServer) -> None:
    """A sender of a guaranteed job waits for its ACK: it goes in the same turn, as
    does a job without a reply to go with. The broker's last flush (stopping) sends
    every held ACK."""
    dealer = connected_dealer(server, b"client-g")
    port = client_port(server)
    port.handle(b"client-g", request(b"job-g", b"acks,reply-requested,guarantee"), time.monotonic())
    server._flush()
    (ack,) = messages(dealer)
    assert ack[2] == F.ACK and ack[4:] == [b"job-g"]
    port.handle(b"client-g", request(b"job-n", b"acks"), time.monotonic())  # no reply
    server._flush()
    (ack,) = messages(dealer)
    assert ack[2] == F.ACK and ack[4:] == [b"job-n"]
    port.handle(b"client-g", request(b"job-l", b"acks,reply-requested"), time.monotonic())
    server._flush()
    assert not dealer.poll(100)
    server._flush(last=True)
    (ack,) = messages(dealer)
    assert ack[4:] == [b"job-l"]


def test_a_client_without_the_flag_gets_the_documents_ack_per_job(server: BrokerServer) -> None:
    dealer = connected_dealer(server, b"client-b")
    ids = [b"job-%d" % i for i in range(3)]
    one_turn(server, b"client-b", [request(m, b"reply-requested") for m in ids])
    acks = messages(dealer)
    assert [len(a) for a in acks] == [5, 5, 5]
    assert [F.decode(a).ack_msgid for a in acks] == ids  # type: ignore[union-attr]


def test_held_acks_go_before_a_refusal_to_the_same_client(server: BrokerServer) -> None:
    dealer = connected_dealer(server, b"client-c")
    bad = F.encode_request(b"job-bad", b"", b"acks", BODY)  # an empty queue name: refused
    one_turn(server, b"client-c", [request(b"job-1", b"acks"), bad, request(b"job-2", b"acks")])
    got = messages(dealer)
    assert [m[2] for m in got] == [F.ACK, F.ERROR, F.ACK]
    assert got[0][4:] == [b"job-1"] and got[2][4:] == [b"job-2"]
    assert F.decode(got[1]).ref_msgid == b"job-bad"  # type: ignore[union-attr]


def test_the_client_flags_its_requests_and_takes_an_ack_of_several() -> None:
    with client_on_router() as (client, router):
        # the first message waits for its ACK: the test answers it as the broker would
        _, frames = send_first(client, router, "default", b"reply-requested", BODY)
        assert parse_headers(frames[6]).acks
        ids = [client.send("default", b"", BODY) for _ in range(3)]
        seen = []
        while len(seen) < 3:
            assert router.poll(WAIT_MS)
            frames = router.recv_multipart()
            assert frames[6] == b"acks"  # the flag on a REQUEST without other headers
            seen.append(frames[4])
        assert seen == [i.encode() for i in ids]
        router.send_multipart([frames[0], *F.encode_acks(b"a-2", seen)])
        client.flush(timeout=5.0)  # returns: every job acknowledged by the one ACK
        assert not client._pending
