"""Adding a protocol is one module and one line: the toy line protocol
(tests/toy_protocol.py) registered beside the broker's own ports serves a job,
end to end through the real core, on real sockets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from emq_django.broker.ports import PORTS, Port
from emq_django.broker.server import BrokerServer
from emq_django.protocol import PROTOCOL as P
from emq_django.protocol import Ack, Heartbeat, Request, decode
from tests.conftest import free_tcp_ports
from tests.toy_protocol import ToyLinePort, ToySettings

WAIT = 5.0

# the registration: the setting with its bind address, and the port's class
TOY_PORTS: tuple[tuple[str, type[Port]], ...] = (*PORTS, ("TOY_BIND", ToyLinePort))


@pytest.fixture
def toy_broker(tmp_path: Path) -> Iterator[tuple[BrokerServer, zmq.Context[Any], str, str]]:
    front, back, mon, toy = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(4))
    settings = ToySettings(
        FRONTEND_BIND=front,
        BACKEND_BIND=back,
        MONITOR_BIND=mon,
        TOY_BIND=toy,
        MDP_BIND="",
        PZQ_RECEIVE_BIND="",
        MC0_BIND="",
        BUS_SNAPSHOT_BIND="",
        HEARTBEAT_LIVENESS=25,
        JOURNAL_PATH=str(tmp_path / "journal.sqlite3"),
    )
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(settings, context=context, shutdown_grace=1.0, ports=TOY_PORTS)
    server.bind()
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    try:
        yield server, context, back, toy
    finally:
        server.request_shutdown()
        server.request_shutdown()
        thread.join(WAIT)
        alive = thread.is_alive()
        if not alive:
            server.close()
            context.destroy(linger=0)
        assert not alive, "the broker thread did not stop"
        assert server.internal_errors == 0


def _recv(sock: zmq.Socket[Any]) -> list[bytes]:
    assert sock.poll(int(WAIT * 1000)), "nothing received"
    frames: list[bytes] = sock.recv_multipart()
    return frames


def _recv_emqp(sock: zmq.Socket[Any], kind: type) -> Any:
    while True:
        cmd = decode(_recv(sock))
        if isinstance(cmd, kind):
            return cmd
        assert isinstance(cmd, Heartbeat), f"expected {kind.__name__}, got {cmd!r}"


def _socket(context: zmq.Context[Any], url: str, identity: bytes) -> zmq.Socket[Any]:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.identity = identity
    sock.connect(url)
    return sock


def test_a_toy_protocol_port_serves_a_job_through_the_core(
    toy_broker: tuple[BrokerServer, zmq.Context[Any], str, str],
) -> None:
    server, context, backend, toy = toy_broker
    assert any(isinstance(port, ToyLinePort) for port in server.ports)
    worker = _socket(context, backend, b"worker-1")
    client = _socket(context, toy, b"toy-client")
    try:
        # an eMQP worker of the default queue, with one credit
        worker.send_multipart([b"", P, b"INFORM", b"w-inform", b'[[10, "default"]]', b"worker"])
        _recv_emqp(worker, Ack)
        worker.send_multipart([b"", P, b"READY", b"ready-1"])

        client.send(b"RUN default 2+3")
        ok = _recv(client)
        assert ok[0].startswith(b"OK ")

        job = _recv_emqp(worker, Request)  # the core routed the toy's job by queue
        assert job.queue == "default" and job.body == b"2+3"
        worker.send_multipart([b"", P, b"REPLY", b"rep-1", b"5", job.msgid, b"ok,ready"])

        assert _recv(client) == [b"DONE 5"]

        client.send(b"NOPE")  # malformed: answered on the toy's own wire
        assert _recv(client)[0].startswith(b"ERR malformed")
    finally:
        worker.close(linger=0)
        client.close(linger=0)
