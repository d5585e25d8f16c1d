"""The monitor client given a failover list (``EMQ_MONITOR_URL=tcp://a,tcp://b``):
the active broker's answer, not a standby's, and a dead address costs nothing.
Real REP sockets on loopback stand where the brokers' monitor ports stand."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from emq_django.exceptions import BrokerUnavailable
from emq_django.monitor_client import query
from tests.support import free_tcp_ports

STANDBY = json.dumps({"ha": {"role": "standby", "active": "b2"}}).encode()
ACTIVE = json.dumps({"ha": {"role": "active", "active": "b2"}, "queues": []}).encode()


class Monitors:
    """Monitor ports that answer every request with a fixed answer, each in a
    thread of its own that alone touches its socket (libzmq's rule)."""

    def __init__(self) -> None:
        self.context: zmq.Context[Any] = zmq.Context()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def serve(self, port: int, answer: bytes) -> None:
        bound = threading.Event()

        def run() -> None:
            sock = self.context.socket(zmq.REP)
            sock.linger = 0
            sock.bind(f"tcp://127.0.0.1:{port}")
            bound.set()
            try:
                while not self.stop.is_set():
                    if sock.poll(50):
                        sock.recv()
                        sock.send(answer)
            finally:
                sock.close(linger=0)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        assert bound.wait(5)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.context.destroy(linger=0)


@pytest.fixture
def monitors() -> Iterator[Monitors]:
    m = Monitors()
    yield m
    m.close()


def test_the_active_brokers_answer_not_the_standbys(monitors: Monitors) -> None:
    standby, active = free_tcp_ports(2)
    monitors.serve(standby, STANDBY)
    monitors.serve(active, ACTIVE)
    url = f"tcp://127.0.0.1:{standby},tcp://127.0.0.1:{active}"
    for _ in range(5):  # whichever answers first
        assert query(url, b"MONITOR JSON", timeout=5.0, curve=None) == ACTIVE


def test_a_dead_address_in_the_list_is_no_wait(monitors: Monitors) -> None:
    dead, active = free_tcp_ports(2)
    monitors.serve(active, ACTIVE)
    url = f"tcp://127.0.0.1:{dead},tcp://127.0.0.1:{active}"
    assert query(url, b"MONITOR JSON", timeout=5.0, curve=None) == ACTIVE


def test_only_standbys_answer_the_standby_naming_the_active(monitors: Monitors) -> None:
    dead, standby = free_tcp_ports(2)
    monitors.serve(standby, STANDBY)
    url = f"tcp://127.0.0.1:{dead},tcp://127.0.0.1:{standby}"
    assert query(url, b"MONITOR JSON", timeout=0.5, curve=None) == STANDBY
    with pytest.raises(BrokerUnavailable, match="no monitor channel answered"):
        query(f"tcp://127.0.0.1:{dead},tcp://127.0.0.1:{dead}", timeout=0.3, curve=None)
