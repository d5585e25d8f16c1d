"""A watched socket whose broker is gone never stops its context's I/O thread.

libzmq sends socket-monitor events blocking: about 2,000 unread events stopped the
I/O thread of the socket's context for good (found when the publisher's context
froze in a full test run: every later ``emq.publish`` of the process went
nowhere). The publisher's watch asks for CONNECT_RETRIED, which comes every
reconnect interval while nobody listens, so once the outcome it wants is known
(a handshake succeeded, or nobody listens) it stops asking. Here the reconnect
interval is 1 ms, so those 2,000 events would come within a few seconds. Since
then the watch's pipe has no high-water mark either, which also covers events
that never stop coming (a handshake failing on every reconnect)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from emq_django import pubsub, transport
from emq_django.exceptions import HandshakeRefused
from tests.support import free_tcp_port

RETRIES_WINDOW = 5.0  # seconds of 1 ms reconnects: well past 2,000 events


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def io_thread_works(ctx: zmq.Context[Any]) -> bool:
    """A message crosses a loopback TCP pair of ``ctx`` (its I/O thread moves it)."""
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send(b"ping")
        return bool(pull.poll(5000)) and pull.recv() == b"ping"
    finally:
        push.close(linger=0)
        pull.close(linger=0)


def watched(ctx: zmq.Context[Any], url: str) -> tuple[zmq.Socket[Any], transport.HandshakeWatch]:
    """A DEALER watched as the publisher's is, retrying every 1 ms."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.reconnect_ivl = 1
    watch = transport.HandshakeWatch(
        sock, url, None, events=transport.HANDSHAKE_EVENTS | transport.CONNECT_RETRIED
    )
    sock.connect(url)
    return sock, watch


def test_nobody_listening_then_left_unread(context: zmq.Context[Any]) -> None:
    sock, watch = watched(context, f"tcp://127.0.0.1:{free_tcp_port()}")
    watch.wait_outcome(5.0)
    assert watch.unreached and not watch.succeeded
    time.sleep(RETRIES_WINDOW)  # nobody reads the watch meanwhile
    assert io_thread_works(context), "the context's I/O thread stopped"
    watch.check()  # what waits is read without error
    sock.close(linger=0)
    watch.close()


def test_broker_gone_after_a_handshake_then_left_unread(context: zmq.Context[Any]) -> None:
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    sock, watch = watched(context, f"tcp://127.0.0.1:{port}")
    sock.send(b"hello")
    watch.wait_outcome(5.0)
    assert watch.succeeded
    assert router.poll(5000)
    router.close(linger=0)  # the broker goes away; the socket retries every 1 ms
    time.sleep(RETRIES_WINDOW)
    assert io_thread_works(context), "the context's I/O thread stopped"
    sock.close(linger=0)
    watch.close()


@pytest.fixture
def failing() -> Iterator[tuple[zmq.Context[Any], zmq.Socket[Any], transport.HandshakeWatch]]:
    """A watched CURVE DEALER (client context, its socket, its watch) whose every
    reconnect's handshake fails without a reason, every 1 ms: a wrong server key,
    so the server (another context) cannot read our HELLO and closes."""
    server_ctx: zmq.Context[Any] = zmq.Context()
    client_ctx: zmq.Context[Any] = zmq.Context()
    try:
        router = server_ctx.socket(zmq.ROUTER)
        router.linger = 0
        router.curve_server = True
        router.curve_secretkey = zmq.curve_keypair()[1]
        port = router.bind_to_random_port("tcp://127.0.0.1")
        sock = client_ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.reconnect_ivl = 1
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = zmq.curve_keypair()[0]  # not the server's
        watch = transport.HandshakeWatch(sock, f"tcp://127.0.0.1:{port}", None)
        sock.connect(f"tcp://127.0.0.1:{port}")
        yield client_ctx, sock, watch
        watch.close()
        sock.close(linger=0)
        router.close(linger=0)
    finally:
        client_ctx.destroy(linger=0)
        server_ctx.destroy(linger=0)


def test_handshakes_failing_in_a_loop_left_unread(
    failing: tuple[zmq.Context[Any], zmq.Socket[Any], transport.HandshakeWatch],
) -> None:
    """A watch that asks for handshake events only, never read, while every
    reconnect's handshake fails: one event per reconnect, with no end. The
    watch's pipe has no high-water mark, so they queue instead of stopping the
    I/O thread (the owner reads them on its next ``check()``)."""
    client_ctx, _, watch = failing
    time.sleep(RETRIES_WINDOW)  # nobody reads the watch meanwhile
    assert io_thread_works(client_ctx), "the context's I/O thread stopped"
    with pytest.raises(HandshakeRefused) as refused:  # what waits is read, and says why
        watch.check()
    assert refused.value.kind == "no-detail", refused.value


def test_a_closed_watch_of_a_socket_still_failing_handshakes(
    failing: tuple[zmq.Context[Any], zmq.Socket[Any], transport.HandshakeWatch],
) -> None:
    """``close()`` stops the socket's monitor before closing the pipe: libzmq keeps
    a closed socket's monitor until it reaps the socket, and an event for a pipe
    nobody reads any more stopped the context's I/O thread for good (a refused
    publisher, closed and retried, left a test's process connecting nowhere). Here
    the socket stays open after its watch is closed, failing a handshake every
    1 ms: no event may go anywhere."""
    client_ctx, _, watch = failing
    time.sleep(0.2)  # failing already
    watch.close()
    time.sleep(1.0)  # about a thousand more failed handshakes
    assert io_thread_works(client_ctx), "the context's I/O thread stopped"


def test_a_snapshot_request_on_a_refused_socket_never_blocks(context: zmq.Context[Any]) -> None:
    """A DEALER whose handshake was refused, and which has no pipe to send into: a
    blocking send waits for ever. ``subscribe()`` hung so in test_curve under load
    (a plain-text client, CURVE ports), in the blocking send of its first snapshot
    request. ``immediate`` gives a socket with no pipe deterministically here (none
    before a handshake succeeds). The request is dropped instead; the watch says why."""
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    router.curve_server = True
    router.curve_secretkey = zmq.curve_keypair()[1]
    port = router.bind_to_random_port("tcp://127.0.0.1")
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.immediate = True
    url = f"tcp://127.0.0.1:{port}"
    watch = transport.HandshakeWatch(sock, url, None)
    sock.connect(url)
    with pytest.raises(HandshakeRefused) as refused:
        for _ in range(100):
            if watch.pair.poll(100):
                watch.check()
    assert refused.value.kind == "protocol", refused.value
    assert not sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT  # a blocking send would wait for ever
    pubsub._ask_snapshot(sock, [b"", b"request"])  # returns
    sock.close(linger=0)
    watch.close()
    router.close(linger=0)
