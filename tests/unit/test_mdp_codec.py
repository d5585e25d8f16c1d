"""The Majordomo codec: both framings, checked against majortomo 0.2.0's own code."""

from __future__ import annotations

import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from emq_django.exceptions import ProtocolError
from emq_django.protocol import mdp

W, C = mdp.WORKER, mdp.CLIENT


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        # majortomo's framing: a leading empty frame
        (
            [b"", C, b"\x02", b"echo", b"a", b"b"],
            mdp.ClientRequest(mdp.MAJORTOMO, "echo", b"", (b"a", b"b")),
        ),
        ([b"", C, b"\x02", b"echo"], mdp.ClientRequest(mdp.MAJORTOMO, "echo", b"", ())),
        ([b"", W, b"\x01", b"echo"], mdp.WorkerReady(mdp.MAJORTOMO, "echo")),
        (
            [b"", W, b"\x03", b"tok", b"", b"p"],
            mdp.WorkerReply(mdp.MAJORTOMO, False, b"tok", b"", (b"p",)),
        ),
        ([b"", W, b"\x04", b"tok", b""], mdp.WorkerReply(mdp.MAJORTOMO, True, b"tok", b"", ())),
        ([b"", W, b"\x05"], mdp.WorkerHeartbeat(mdp.MAJORTOMO)),
        ([b"", W, b"\x06"], mdp.WorkerDisconnect(mdp.MAJORTOMO)),
        # the draft's framing: the protocol name first, request ids
        ([C, b"\x01", b"echo", b"r1", b"x"], mdp.ClientRequest(mdp.DRAFT, "echo", b"r1", (b"x",))),
        ([W, b"\x01", b"echo"], mdp.WorkerReady(mdp.DRAFT, "echo")),
        (
            [W, b"\x03", b"tok", b"", b"r1", b"p"],
            mdp.WorkerReply(mdp.DRAFT, False, b"tok", b"r1", (b"p",)),
        ),
        (
            [W, b"\x04", b"tok", b"", b"r1", b"f"],
            mdp.WorkerReply(mdp.DRAFT, True, b"tok", b"r1", (b"f",)),
        ),
        ([W, b"PING"], mdp.WorkerHeartbeat(mdp.DRAFT)),
        ([W, b"\x06"], mdp.WorkerDisconnect(mdp.DRAFT)),
    ],
)
def test_decode_each_message_of_both_framings(frames: list[bytes], expected: mdp.Message) -> None:
    assert mdp.decode(frames) == expected


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b""], "at least 2 frames"),
        ([b"", C], "header and a command"),
        ([b"", b"MDPX01", b"\x02", b"s"], "unknown protocol header"),
        ([b"", C, b"\x09", b"s"], "unknown client command"),
        ([b"", C, b"\x02"], "names its service"),
        ([b"", C, b"\x02", b""], "service name has 1 to"),
        ([b"", C, b"\x02", b"x" * 256], "service name has 1 to"),
        ([b"", C, b"\x02", b"\xff\xfe"], "UTF-8"),
        ([b"", C, b"\x02", b"a\nb"], "printable"),
        ([C, b"\x01", b"echo"], "service and a request id"),
        ([C, b"\x01", b"echo", b""], "id or address"),
        ([b"", W, b"\x01"], "exactly one service"),
        ([b"", W, b"\x04", b"tok"], "client address and an empty frame"),
        ([b"", W, b"\x04", b"tok", b"x"], "client address and an empty frame"),
        ([W, b"\x04", b"tok", b""], "request id after the empty frame"),
        ([b"", W, b"\x07"], "unknown worker command"),
        ([W, b"PONG"], "unknown worker command"),
    ],
)
def test_decode_refuses_malformed_messages_with_a_reason(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason) as info:
        mdp.decode(frames)
    assert info.value.frames == frames


@given(st.lists(st.binary(max_size=12), max_size=8))
def test_decode_raises_only_protocol_error(frames: list[bytes]) -> None:
    try:
        mdp.decode(frames)
    except ProtocolError:
        pass


def test_draft_encoding_round_trips_through_a_draft_peer_view() -> None:
    # what a draft worker gets, and sends back for the same request
    request = mdp.worker_request(mdp.DRAFT, b"tok", b"r7", [b"body"])
    assert request == [W, mdp.REQUEST, b"tok", b"", b"r7", b"body"]
    reply = [W, mdp.FINAL, *request[2:5], b"done"]
    assert mdp.decode(reply) == mdp.WorkerReply(mdp.DRAFT, True, b"tok", b"r7", (b"done",))
    assert mdp.client_reply(mdp.DRAFT, False, "echo", b"r7", [b"p"]) == [
        C,
        b"\x02",
        b"echo",
        b"r7",
        b"p",
    ]
    assert mdp.worker_heartbeat(mdp.DRAFT) == [W, b"PONG"]


# ---- against the released peer's own code ---------------------------------------

majortomo = pytest.importorskip("majortomo")


def test_majortomo_client_parses_our_partial_and_final() -> None:
    from majortomo.client import Client

    for final in (False, True):
        command, body = Client._parse_message(
            mdp.client_reply(mdp.MAJORTOMO, final, "echo", b"", [b"a", b"b"])
        )
        assert command == (mdp.FINAL if final else mdp.PARTIAL)
        assert body == [b"a", b"b"]


def test_majortomo_worker_parses_our_request_heartbeat_and_disconnect() -> None:
    from majortomo.worker import Worker

    command, frames = Worker._verify_message(mdp.worker_request(mdp.MAJORTOMO, b"tok", b"", [b"x"]))
    assert (command, frames) == (mdp.REQUEST, [b"tok", b"", b"x"])
    assert Worker._verify_message(mdp.worker_heartbeat(mdp.MAJORTOMO))[0] == mdp.HEARTBEAT
    assert Worker._verify_message(mdp.worker_disconnect(mdp.MAJORTOMO))[0] == mdp.DISCONNECT


def test_what_majortomo_client_and_worker_send_decodes() -> None:
    """Their real sockets, on inproc: the client's REQUEST and the worker's READY,
    PARTIAL and FINAL reach a ROUTER and decode."""
    from majortomo.client import Client
    from majortomo.worker import Worker

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind("inproc://mdp-codec")
    client = Client("inproc://mdp-codec", zmq_context=ctx)
    worker = Worker("inproc://mdp-codec", b"echo", zmq_context=ctx)
    try:
        client.connect()
        client.send(b"echo", b"hello", b"world")
        ident, *frames = router.recv_multipart()
        assert mdp.decode(frames) == mdp.ClientRequest(
            mdp.MAJORTOMO, "echo", b"", (b"hello", b"world")
        )

        worker.connect()
        wid, *frames = router.recv_multipart()
        assert mdp.decode(frames) == mdp.WorkerReady(mdp.MAJORTOMO, "echo")
        worker.send_reply_partial(b"tok", [b"p1"])
        worker.send_reply_final(b"tok", [b"f"])
        assert mdp.decode(router.recv_multipart()[1:]) == mdp.WorkerReply(
            mdp.MAJORTOMO, False, b"tok", b"", (b"p1",)
        )
        assert mdp.decode(router.recv_multipart()[1:]) == mdp.WorkerReply(
            mdp.MAJORTOMO, True, b"tok", b"", (b"f",)
        )
    finally:
        client.close()
        worker.close()
        router.close()
        ctx.destroy(linger=0)
