"""The mc0 port as a CURVE server (as the reference brokers require): a
BrokerServer in a thread with EMQ_CURVE_SECRET_KEY and an in-memory allow-list,
real sockets on loopback TCP, and the pyzmq connector of tests/mc0_client.py with
CURVE keys. A plain-text connector and an unknown key get nothing; a key without
the publisher role cannot PUT."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq

from emq_django.broker.server import BrokerServer
from emq_django.conf import EmqSettings
from emq_django.security.allow import KeyEntry
from tests.mc0_client import Mc0Client, Mc0Refused
from tests.support import free_tcp_ports

WAIT = 5.0
REFUSED_WAIT = 1.0  # how long a refused connector is given to (not) answer
ROLES = {
    "node": {"publisher", "subscriber"},
    "listener": {"subscriber"},
    "app": {"client"},  # a key of the broker, but not for mc0
    "watch": {"monitor"},
}


@dataclass
class Mc0Broker:
    server: BrokerServer
    context: zmq.Context[Any]
    url: str
    monitor_url: str
    server_public: bytes
    pairs: dict[str, tuple[bytes, bytes]]
    clients: list[Mc0Client] = field(default_factory=list)

    def connector(self, key: str | None) -> Mc0Client:
        """A connector with the key named ``key`` (None: plain text)."""
        curve = None
        if key is not None:
            public, secret = self.pairs[key]
            curve = (self.server_public, public, secret)
        c = Mc0Client(self.context, self.url, curve=curve)
        self.clients.append(c)
        return c

    def counters(self) -> dict[str, int]:
        """Asked on the monitor channel with a monitor key (not ``server.status()``:
        the broker thread changes what it reads)."""
        public, secret = self.pairs["watch"]
        req: zmq.Socket[Any] = self.context.socket(zmq.REQ)
        req.linger = 0
        req.curve_serverkey, req.curve_publickey, req.curve_secretkey = (
            self.server_public,
            public,
            secret,
        )
        try:
            req.connect(self.monitor_url)
            req.send(b"MONITOR JSON")
            assert req.poll(int(WAIT * 1000)), "no answer from the monitor channel"
            counters: dict[str, int] = json.loads(req.recv())["counters"]
            return counters
        finally:
            req.close(linger=0)


@pytest.fixture
def mc0_broker(tmp_path: Path) -> Iterator[Mc0Broker]:
    front, back, mon, mc0 = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(4))
    server_public, server_secret = zmq.curve_keypair()
    pairs = {name: zmq.curve_keypair() for name in [*ROLES, "stranger"]}
    keys = [KeyEntry(n, pairs[n][0].decode(), frozenset(r)) for n, r in ROLES.items()]
    settings = EmqSettings(
        FRONTEND_BIND=front,
        BACKEND_BIND=back,
        MONITOR_BIND=mon,
        MDP_BIND="",
        PZQ_RECEIVE_BIND="",
        BUS_SNAPSHOT_BIND="",
        MC0_BIND=mc0,
        JOURNAL_PATH=str(tmp_path / "journal.sqlite3"),
        CURVE_SECRET_KEY=server_secret.decode(),
    )
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(
        settings, context=context, shutdown_grace=1.0, load_keys=lambda: list(keys)
    )
    server.bind()
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    broker = Mc0Broker(server, context, mc0, mon, server_public, pairs)
    yield broker
    server.request_shutdown()
    server.request_shutdown()
    thread.join(WAIT)
    for c in broker.clients:
        c.close()
    assert not thread.is_alive()
    server.close()
    context.destroy(linger=0)
    assert server.internal_errors == 0


def test_curve_connectors_subscribe_and_put(mc0_broker: Mc0Broker) -> None:
    b = mc0_broker
    sub, pub = b.connector("node"), b.connector("node")
    for c in (sub, pub):
        c.connect(ttl_ms=30_000)
    sub.sub("mcollective.nodes")
    pub.put("mcollective.nodes", b"encrypted on the wire")
    (got,) = sub.messages(1, timeout=WAIT)
    assert got.positional == [b"encrypted on the wire"]
    assert b.counters()["zap_admitted"] >= 2


@pytest.mark.parametrize("key", [None, "stranger", "app"])
def test_plain_text_unknown_and_wrong_role_connectors_get_nothing(
    mc0_broker: Mc0Broker, key: str | None
) -> None:
    b = mc0_broker
    c = b.connector(key)
    with pytest.raises(TimeoutError):
        c.request(b"CONNECT", [(b"VERSION", b"0.2"), (b"TTL", b"30000")], timeout=REFUSED_WAIT)
    assert b.counters()["mc0_connects"] == 0  # no session began


def test_subscriber_key_cannot_put(mc0_broker: Mc0Broker) -> None:
    b = mc0_broker
    listener = b.connector("listener")
    listener.connect(ttl_ms=30_000)
    listener.sub("t")  # subscriber: allowed
    with pytest.raises(Mc0Refused, match="forbidden: PUT needs the publisher role"):
        listener.request(b"PUT", [(b"TOPIC", b"t")], b"body")
    assert listener.recv(timeout=0.3, verb=b"MESSAGE") is None
    counters = b.counters()
    assert counters["refused_forbidden"] == 1
    assert counters["mc0_puts"] == 0
