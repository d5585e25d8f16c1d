"""Free loopback ports for tests, and the port of an address."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Any

# Test ports come from below the kernel's ephemeral range (32768-60999 here): a port
# the kernel hands out for bind(port 0) is also one it may give any outgoing
# connection as its source port, between our check and the broker's bind (seen:
# "cannot bind ...: Address already in use" with other sessions' tests running).
# Left out: the product's defaults and the benchmark peers' ports in this range.
TEST_PORTS = range(20000, 32000)
TAKEN_PORTS = frozenset({25672})  # RabbitMQ's inter-node port
_handed_out: set[int] = set()  # this run's, never handed out twice
_port_rng = random.Random(int.from_bytes(os.urandom(8), "big"))  # runs side by side differ


def free_tcp_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct loopback ports free now, outside the ephemeral range, none handed
    out before in this run: each is checked with a bind (all held at once)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(100 * count):
            if len(sockets) == count:
                break
            if len(_handed_out) > len(TEST_PORTS) // 2:
                _handed_out.clear()  # a very long run: start over
            port = _port_rng.choice(TEST_PORTS)
            if port in _handed_out or port in TAKEN_PORTS:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
            _handed_out.add(port)
        assert len(sockets) == count, f"found {len(sockets)} of {count} free test ports"
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_tcp_port(host: str = "127.0.0.1") -> int:
    return free_tcp_ports(1, host)[0]


def private_broker_settings(tmp_path: Path, *, mdp: bool = False) -> Any:
    """``EmqSettings`` for a BrokerServer run in a test: eMQP, monitor and Event BUS
    on free loopback ports, the journal in ``tmp_path``; Majordomo only with ``mdp``,
    PZQ and mc0 off (their default ports may be another broker's on this machine).
    Its addresses are the settings' ``*_BIND`` fields."""
    from emq_django.conf import EmqSettings

    front, back, mon, mdp_bind, snap, pub, coll = (
        f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(7)
    )
    return EmqSettings(
        FRONTEND_BIND=front,
        BACKEND_BIND=back,
        MONITOR_BIND=mon,
        MDP_BIND=mdp_bind if mdp else "",
        PZQ_RECEIVE_BIND="",
        MC0_BIND="",
        BUS_SNAPSHOT_BIND=snap,
        BUS_PUBLISH_BIND=pub,
        BUS_COLLECT_BIND=coll,
        JOURNAL_PATH=str(tmp_path / "journal.sqlite3"),
    )


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def port_of(url: str) -> int:
    """The TCP port of a ``tcp://host:port`` address."""
    return int(url.rsplit(":", 1)[1])
