"""CURVE and ZAP roles on a BrokerServer in a thread: real sockets on loopback TCP,
the allow-list given in memory (the Django store is covered by tests/e2e/test_curve.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq

from emq_django import transport
from emq_django.broker.server import BrokerServer
from emq_django.client import Client
from emq_django.conf import EmqSettings
from emq_django.exceptions import BrokerUnavailable, HandshakeRefused
from emq_django.link import BrokerLink
from emq_django.monitor_client import query
from emq_django.protocol import PROTOCOL, Ack, Error, Heartbeat, Request, decode, mdp, pzq
from emq_django.security.allow import KeyEntry
from emq_django.security.keys import CurveKeys
from emq_django.transport import SocketOptions
from tests.support import free_tcp_ports, wait_until

P = PROTOCOL
BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [2, 3], "kwargs": {}}]'
WAIT = 5.0
REFUSED_WAIT = 1.0  # how long a refused connection is given to (not) answer


def key_pair() -> tuple[bytes, bytes]:
    public, secret = zmq.curve_keypair()
    return public, secret


@dataclass
class SecureBroker:
    server: BrokerServer
    context: zmq.Context[Any]
    urls: dict[str, str]
    server_public: bytes
    keys: list[KeyEntry]
    pairs: dict[str, tuple[bytes, bytes]]
    thread: threading.Thread
    sockets: list[zmq.Socket[Any]] = field(default_factory=list)

    def socket(
        self, kind: int, port: str, key: str | None, identity: bytes | None = None
    ) -> zmq.Socket[Any]:
        """A socket to ``port`` with the key named ``key`` (None: plain text)."""
        curve = None
        if key is not None:
            public, secret = self.pairs[key]
            curve = CurveKeys(public, secret, self.server_public)
        options = SocketOptions(identity=identity, curve=curve)
        sock = transport.connect(self.context, kind, self.urls[port], options)
        self.sockets.append(sock)
        return sock

    def status(self) -> dict[str, Any]:
        """The broker's status, asked on its monitor channel with the admin key (not
        ``server.status()``: the broker thread changes what it reads)."""
        doc: dict[str, Any] = json.loads(self.ask_monitor("ops", b"MONITOR JSON") or b"null")
        return doc

    def counters(self) -> dict[str, int]:
        counters: dict[str, int] = self.status()["counters"]
        return counters

    def ask_monitor(self, key: str | None, request: bytes, wait: float = WAIT) -> bytes | None:
        """The answer, or None when there is none: refused at the handshake (the
        monitor client says so at once, and never blocks sending on the refused
        socket, as a plain REQ's send did) or none within ``wait``."""
        curve = None if key is None else CurveKeys(*self.pairs[key], self.server_public)
        try:
            return query(self.urls["monitor"], request, wait, curve=curve)
        except BrokerUnavailable:
            return None


def recv_command(sock: zmq.Socket[Any], kind: type, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(int(left * 1000)):
            return None
        cmd = decode(sock.recv_multipart())
        if isinstance(cmd, kind):
            return cmd
        assert isinstance(cmd, Heartbeat), f"expected {kind.__name__}, got {cmd!r}"


ROLES = {
    "app": {"client"},
    "jm": {"worker"},
    "sched": {"scheduler"},
    "watch": {"monitor"},
    "ops": {"admin"},
}


@pytest.fixture
def secure_broker(tmp_path: Path) -> Iterator[SecureBroker]:
    ports = free_tcp_ports(7)
    front, back, mon, mdp, pzq_in, pzq_out, pzq_mon = (f"tcp://127.0.0.1:{p}" for p in ports)
    server_public, server_secret = key_pair()
    pairs = {name: key_pair() for name in [*ROLES, "stranger"]}
    keys = [KeyEntry(n, pairs[n][0].decode(), frozenset(r)) for n, r in ROLES.items()]
    settings = EmqSettings(
        FRONTEND_BIND=front,
        BACKEND_BIND=back,
        MONITOR_BIND=mon,
        MDP_BIND=mdp,
        PZQ_RECEIVE_BIND=pzq_in,
        PZQ_SEND_BIND=pzq_out,
        PZQ_MONITOR_BIND=pzq_mon,
        MC0_BIND="",  # off here: tests/integration/test_mc0_curve.py
        BUS_SNAPSHOT_BIND="",  # off: not on the default ports
        HEARTBEAT_INTERVAL=0.2,
        HEARTBEAT_LIVENESS=25,
        JOURNAL_PATH=str(tmp_path / "journal.sqlite3"),
        CURVE_SECRET_KEY=server_secret.decode(),
        KEYS_RELOAD=0.2,
    )
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(
        settings, context=context, shutdown_grace=1.0, load_keys=lambda: list(keys)
    )
    server.bind()
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    urls = {
        "frontend": front,
        "backend": back,
        "monitor": mon,
        "majordomo": mdp,
        "pzq-receive": pzq_in,
        "pzq-send": pzq_out,
    }
    broker = SecureBroker(server, context, urls, server_public, keys, pairs, thread)
    yield broker
    server.request_shutdown()
    server.request_shutdown()
    thread.join(WAIT)
    for sock in broker.sockets:
        sock.close(linger=0)
    assert not thread.is_alive()
    server.close()
    # destroy, not term: a socket a failed test left open would make term wait for
    # ever, and no per-test timeout can interrupt libzmq there
    context.destroy(linger=0)
    assert server.internal_errors == 0


def inform(sock: zmq.Socket[Any], msgid: bytes, peer_type: bytes = b"worker") -> None:
    sock.send_multipart([b"", P, b"INFORM", msgid, b'[[10, "default"]]', peer_type])


def send_refused(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
    """Send from a socket whose key the broker refuses at the handshake. Once libzmq
    has been refused, the socket may have no connection left to queue on, and a
    blocking send would wait forever (it did, when the refusal came before the
    send): what cannot be queued was refused all the same."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
    except zmq.Again:
        pass


def test_jobs_flow_with_curve(secure_broker: SecureBroker) -> None:
    b = secure_broker
    worker = b.socket(zmq.DEALER, "backend", "jm", identity=b"jm-1")
    inform(worker, b"inform-1")
    assert recv_command(worker, Ack) is not None
    worker.send_multipart([b"", P, b"READY", b"ready-1"])
    client = b.socket(zmq.DEALER, "frontend", "app", identity=b"app-1")
    client.send_multipart([b"", P, b"REQUEST", b"job-1", b"default", b"", BODY])
    assert recv_command(client, Ack).ack_msgid == b"job-1"
    request = recv_command(worker, Request)
    assert request is not None and request.body == BODY
    worker.send_multipart([b"", P, b"REPLY", b"reply-1", b"5", request.msgid, b"ok,ready"])
    # the client asked for no reply: the job is done when the counters say so
    wait_until(lambda: b.counters()["succeeded"] == 1, "the job to succeed")
    assert b.counters()["zap_admitted"] >= 2


def test_client_key_cannot_join_as_job_manager(secure_broker: SecureBroker) -> None:
    b = secure_broker
    client = b.socket(zmq.DEALER, "frontend", "app", identity=b"app-1")
    client.send_multipart([b"", P, b"REQUEST", b"job-1", b"default", b"", BODY])
    assert recv_command(client, Ack) is not None
    fake = b.socket(zmq.DEALER, "backend", "app", identity=b"fake-jm")
    send_refused(fake, [b"", P, b"INFORM", b"inform-fake", b'[[10, "default"]]', b"worker"])
    send_refused(fake, [b"", P, b"READY", b"ready-1"])
    assert recv_command(fake, Request, REFUSED_WAIT) is None
    assert b.counters()["zap_refused_role"] >= 1
    assert b.status()["job_managers"] == []


@pytest.mark.parametrize("key", [None, "stranger"])
def test_anonymous_monitor_cannot_cancel_or_purge(
    secure_broker: SecureBroker, key: str | None
) -> None:
    b = secure_broker
    assert b.ask_monitor(key, b"DEADLETTERS PURGE ALL", REFUSED_WAIT) is None
    assert b.ask_monitor(key, b"CANCEL some-job", REFUSED_WAIT) is None
    if key == "stranger":
        wait_until(lambda: b.counters()["zap_refused_unknown"] >= 2, "unknown keys counted")
    else:  # plain text: refused by libzmq's handshake, counted from the monitor events
        wait_until(lambda: b.counters()["handshake_failed"] >= 2, "plain text counted")
    assert b.counters()["cancelled"] == 0


def test_monitor_role_reads_but_cannot_change(secure_broker: SecureBroker) -> None:
    b = secure_broker
    doc = json.loads(b.ask_monitor("watch", b"MONITOR JSON") or b"null")
    assert doc["security"]["curve"] is True
    assert b.ask_monitor("watch", b"DEADLETTERS PURGE ALL") == (
        b"ERROR forbidden: DEADLETTERS needs the admin role"
    )
    assert (b.ask_monitor("watch", b"CANCEL job-1") or b"").startswith(b"ERROR forbidden")
    assert b.counters()["refused_forbidden"] == 2
    assert json.loads(b.ask_monitor("ops", b"DEADLETTERS PURGE ALL") or b"null") == {"purged": 0}
    assert b"cancelled" in (b.ask_monitor("ops", b"CANCEL job-1") or b"")


def test_client_key_cannot_inform_as_scheduler(secure_broker: SecureBroker) -> None:
    b = secure_broker
    fake = b.socket(zmq.DEALER, "frontend", "app", identity=b"fake-sched")
    inform(fake, b"inform-s", b"scheduler")
    error = recv_command(fake, Error)
    assert error is not None and "scheduler role" in error.reason and error.code == "forbidden"
    real = b.socket(zmq.DEALER, "frontend", "sched", identity=b"sched-1")
    inform(real, b"inform-r", b"scheduler")
    assert recv_command(real, Ack) is not None


def test_revoked_key_is_cut_off(secure_broker: SecureBroker) -> None:
    b = secure_broker
    worker = b.socket(zmq.DEALER, "backend", "jm", identity=b"jm-1")
    inform(worker, b"inform-1")
    assert recv_command(worker, Ack) is not None
    wait_until(lambda: len(b.status()["job_managers"]) == 1, "the job manager")
    b.keys[:] = [k for k in b.keys if k.name != "jm"]  # as if deleted from the table
    revoked_at = time.monotonic()
    wait_until(lambda: not b.status()["job_managers"], "the revoked job manager gone")
    assert time.monotonic() - revoked_at < 0.2 + 1.0
    worker.send_multipart([b"", P, b"READY", b"ready-1"])
    wait_until(lambda: b.counters()["dropped_revoked"] >= 1, "its messages dropped")
    assert b.counters()["peers_revoked"] == 1
    again = b.socket(zmq.DEALER, "backend", "jm", identity=b"jm-2")
    inform(again, b"inform-2")
    assert recv_command(again, Ack, REFUSED_WAIT) is None


def test_majordomo_roles(secure_broker: SecureBroker) -> None:
    b = secure_broker
    fake = b.socket(zmq.DEALER, "majordomo", "app", identity=b"fake-mdp-worker")
    fake.send_multipart([b"", mdp.WORKER, mdp.READY, b"echo"])
    wait_until(lambda: b.counters()["refused_forbidden"] == 1, "the client key's READY refused")
    real = b.socket(zmq.DEALER, "majordomo", "jm", identity=b"mdp-worker")
    real.send_multipart([b"", mdp.WORKER, mdp.READY, b"echo"])
    wait_until(lambda: len(b.status()["job_managers"]) == 1, "the Majordomo worker")
    client = b.socket(zmq.DEALER, "majordomo", "app", identity=b"mdp-client")
    client.send_multipart([mdp.CLIENT, b"\x01", b"echo", b"req-1", b"hello"])  # draft REQUEST
    wait_until(lambda: real.poll(0) and real.recv_multipart()[-1] == b"hello", "the request")
    assert b.counters()["refused_forbidden"] == 1


def test_pzq_sockets_are_curve_with_their_roles(secure_broker: SecureBroker) -> None:
    b = secure_broker
    intruder = b.socket(zmq.DEALER, "pzq-receive", "jm")
    send_refused(intruder, pzq.produce(b"m-0", [b"nope"]))
    assert not intruder.poll(int(REFUSED_WAIT * 1000))
    producer = b.socket(zmq.DEALER, "pzq-receive", "app")
    producer.send_multipart(pzq.produce(b"m-1", [b"payload"]))
    assert producer.poll(int(WAIT * 1000))
    assert producer.recv_multipart()[:2] == [b"m-1", pzq.OK]
    consumer = b.socket(zmq.ROUTER, "pzq-send", "jm")
    assert consumer.poll(int(WAIT * 1000)), "no delivery to the worker-key consumer"
    assert consumer.recv_multipart()[-1] == b"payload"
    assert b.counters()["zap_refused_role"] >= 1


# ---- a refused handshake is reported at once, with its reason ----------------------------


def curve_for(b: SecureBroker, key: str | None) -> CurveKeys | None:
    """The keys named ``key`` for the broker; ``wrong-server``: the app's pair with
    another server key; None: plain text."""
    if key is None:
        return None
    if key == "wrong-server":
        return CurveKeys(*b.pairs["app"], key_pair()[0])
    return CurveKeys(*b.pairs[key], b.server_public)


@pytest.mark.parametrize("key", ["jm", "stranger", None, "wrong-server"])
def test_client_is_told_why_the_broker_refused_it(secure_broker: SecureBroker, key: str) -> None:
    b = secure_broker
    # ACK time-out 30 s: a refusal seen only by the time-out would be BrokerUnavailable
    client = Client(b.urls["frontend"], ack_timeout=30, context=b.context, curve=curve_for(b, key))
    try:
        for confirm in (False, True):  # a fresh socket each time: refused again, not blocked
            with pytest.raises(HandshakeRefused) as refused:
                client.send("default", b"", BODY, confirm=confirm)
            exc, text = refused.value, str(refused.value)
            assert exc.url == b.urls["frontend"]
            if key in ("jm", "stranger"):
                assert (exc.kind, exc.code) == ("auth", 400)
                assert b.pairs[key][0].decode() in text and "the client role" in text
            elif key is None:  # plain text against CURVE
                assert exc.kind in ("protocol", "no-detail") and "EMQ_CURVE_SECRET_KEY" in text
            else:  # the broker cannot read our HELLO: it closes, libzmq says no more
                assert exc.kind == "no-detail" and "EMQ_CURVE_SERVER_KEY" in text
    finally:
        client.close()
    # the same client with the right key is admitted: nothing stays broken
    good = Client(b.urls["frontend"], ack_timeout=30, context=b.context, curve=curve_for(b, "app"))
    try:
        good.send("default", b"", BODY, confirm=True)
    finally:
        good.close()


def test_a_refused_client_says_how_it_read_the_server_key(secure_broker: SecureBroker) -> None:
    """The refusal says whether EMQ_CURVE_SERVER_KEY was taken as a key or read from
    a file (a 40-character path was once taken as a key; issue 29, item 17)."""
    from types import SimpleNamespace

    from emq_django.security.keys import process_keys

    b = secure_broker
    settings = SimpleNamespace(
        CURVE_SECRET_KEY=b.pairs["app"][1].decode(),
        CURVE_PUBLIC_KEY="",
        CURVE_SERVER_KEY=key_pair()[0].decode(),  # not the broker's
    )
    keys = process_keys(settings)
    client = Client(b.urls["frontend"], ack_timeout=30, context=b.context, curve=keys)
    try:
        with pytest.raises(HandshakeRefused, match="taken as the key itself"):
            client.send("default", b"", BODY, confirm=True)
    finally:
        client.close()


def test_link_with_a_refused_key_raises_from_poll(secure_broker: SecureBroker) -> None:
    b = secure_broker

    def link_with(key: str) -> BrokerLink:
        link = BrokerLink(
            b.context,
            b.urls["backend"],
            ((10, "default"),),
            "worker",
            {},
            heartbeat_interval=0.2,
            heartbeat_liveness=25,
            curve=curve_for(b, key),
        )
        link.connect()
        return link

    refused_link, admitted = link_with("app"), link_with("jm")
    try:
        with pytest.raises(HandshakeRefused) as refused:
            for _ in range(int(WAIT * 10)):  # a bound, so a missed refusal fails, not hangs
                refused_link.poll(0.1)
        assert (refused.value.kind, refused.value.code) == ("auth", 400)
        assert "the worker role" in str(refused.value)
        acked = False
        for _ in range(int(WAIT * 10)):  # its poll raises nothing; the INFORM is ACKed
            if admitted.poll(0.1) and any(isinstance(c, Ack) for c in admitted.messages()):
                acked = True
                break
        assert acked
        admitted.check_handshake()
        assert admitted.watch is not None and admitted.watch.succeeded
    finally:
        try:
            refused_link.close()
        finally:
            admitted.close()


def test_monitor_query_with_a_key_without_the_monitor_role(secure_broker: SecureBroker) -> None:
    b = secure_broker
    with pytest.raises(HandshakeRefused) as refused:
        query(b.urls["monitor"], b"MONITOR JSON", 30.0, curve=curve_for(b, "jm"))
    assert (refused.value.kind, refused.value.code) == ("auth", 400)
    assert "the monitor role" in str(refused.value)
