"""BrokerServer in a thread, spoken to with real DEALER and REQ sockets on loopback TCP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq

from emq_django.broker.memory import Reclaimer
from emq_django.broker.server import BrokerServer
from emq_django.conf import EmqSettings
from emq_django.protocol import PROTOCOL, Ack, Error, Heartbeat, Kbye, Reply, Request, decode
from tests.support import free_tcp_ports, wait_until

P = PROTOCOL
BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [2, 3], "kwargs": {}}]'
INTERVAL = 0.2
WAIT = 5.0  # upper bound for an answer that should come at once


class CountingClock:
    """time.monotonic that counts its calls: the server loop reads it every turn."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return time.monotonic()


@dataclass
class Broker:
    server: BrokerServer
    context: zmq.Context[Any]
    frontend: str
    backend: str
    monitor: str
    clock: CountingClock
    thread: threading.Thread
    sockets: list[zmq.Socket[Any]] = field(default_factory=list)

    def socket(self, kind: int, url: str, identity: bytes | None = None) -> zmq.Socket[Any]:
        sock = self.context.socket(kind)
        sock.linger = 0
        if identity is not None:
            sock.identity = identity
        sock.connect(url)
        self.sockets.append(sock)
        return sock

    def client(self, identity: bytes | None = b"client-1") -> zmq.Socket[Any]:
        return self.socket(zmq.DEALER, self.frontend, identity)

    def worker(
        self, identity: bytes = b"worker-1", queues: bytes = b'[[10, "default"]]'
    ) -> zmq.Socket[Any]:
        sock = self.socket(zmq.DEALER, self.backend, identity)
        sock.send_multipart([b"", P, b"INFORM", identity + b"-inform", queues, b"worker"])
        ack = recv_command(sock, Ack)
        assert ack.ack_msgid == identity + b"-inform"
        return sock

    def ask_monitor(self, request: bytes) -> bytes:
        req = self.socket(zmq.REQ, self.monitor)
        req.send(request)
        assert req.poll(int(WAIT * 1000)), f"no monitor answer to {request!r}"
        answer: bytes = req.recv()
        return answer

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.ask_monitor(b"MONITOR JSON"))
        return doc


def recv_frames(sock: zmq.Socket[Any], timeout: float = WAIT) -> list[bytes]:
    assert sock.poll(int(timeout * 1000)), "nothing received"
    frames: list[bytes] = sock.recv_multipart()
    return frames


def recv_command(sock: zmq.Socket[Any], kind: type, timeout: float = WAIT) -> Any:
    """The next command of type ``kind``, skipping HEARTBEATs (they come at any time)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind.__name__} received"
        cmd = decode(recv_frames(sock, left))
        if isinstance(cmd, kind):
            return cmd
        assert isinstance(cmd, Heartbeat), f"expected {kind.__name__}, got {cmd!r}"


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """Start a BrokerServer thread with the given settings; stop it twice and join."""
    started: list[Broker] = []

    def start(**overrides: Any) -> Broker:
        front, back, mon, mdp, snap, pub, coll = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(7))
        # a generous liveness (5 s): test peers that do not heartbeat are not dropped
        # when the machine is slow; expiry itself is covered by the core's unit tests
        options: dict[str, Any] = {
            "HEARTBEAT_INTERVAL": INTERVAL,
            "HEARTBEAT_LIVENESS": 25,
            "JOURNAL_PATH": str(tmp_path / f"journal-{len(started)}.sqlite3"),
            "MDP_BIND": mdp,
            "PZQ_RECEIVE_BIND": "",  # off: tests/e2e/test_pzq.py covers it
            "MC0_BIND": "",  # off: tests/e2e/test_mc0.py covers it
            "BUS_SNAPSHOT_BIND": snap,  # the Event BUS (tests/integration/test_eventbus.py)
            "BUS_PUBLISH_BIND": pub,
            "BUS_COLLECT_BIND": coll,
        }
        settings = EmqSettings(
            FRONTEND_BIND=front, BACKEND_BIND=back, MONITOR_BIND=mon, **{**options, **overrides}
        )
        context: zmq.Context[Any] = zmq.Context()
        clock = CountingClock()
        server = BrokerServer(settings, context=context, clock=clock, shutdown_grace=2.0)
        server.bind()
        thread = threading.Thread(target=server.run, name="broker", daemon=True)
        thread.start()
        started.append(Broker(server, context, front, back, mon, clock, thread))
        return started[-1]

    yield start
    for running in started:
        running.server.request_shutdown()
        running.server.request_shutdown()
        running.thread.join(WAIT)
        alive = running.thread.is_alive()
        for sock in running.sockets:
            sock.close(linger=0)
        if not alive:
            running.server.close()
            running.context.destroy(linger=0)
        assert not alive, "the broker thread did not stop"
        assert running.server.internal_errors == 0


@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker()


def send_request(
    client: zmq.Socket[Any], msgid: bytes, queue: bytes = b"default", headers: bytes = b""
) -> None:
    client.send_multipart([b"", P, b"REQUEST", msgid, queue, headers, BODY])


# ---- clients and workers -----------------------------------------------------


def test_client_request_gets_ack(broker: Broker) -> None:
    client = broker.client()
    send_request(client, b"req-1")
    ack = recv_command(client, Ack)
    assert ack.ack_msgid == b"req-1"


def test_client_without_identity_gets_ack(broker: Broker) -> None:
    # libzmq's automatic identities are binary: EventMQ's router crashed on them
    client = broker.client(identity=None)
    send_request(client, b"req-anon")
    assert recv_command(client, Ack).ack_msgid == b"req-anon"


def test_worker_receives_the_request_and_its_reply_reaches_the_client(broker: Broker) -> None:
    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"ready-1"])
    client = broker.client()
    send_request(client, b"req-2", headers=b"reply-requested,timeout:30")
    assert recv_command(client, Ack).ack_msgid == b"req-2"

    job = recv_command(worker, Request)
    assert job.queue == "default" and job.body == BODY
    assert job.headers.reply_requested and job.headers.timeout == 30.0
    worker.send_multipart([b"", P, b"REPLY", b"rep-1", b'{"value": 5}', job.msgid, b"ok,ready"])

    answer = recv_command(client, Reply)
    assert answer.request_msgid == b"req-2"
    assert answer.body == b'{"value": 5}'
    assert not answer.failed


def test_job_waits_for_a_worker_that_connects_later(broker: Broker) -> None:
    client = broker.client()
    send_request(client, b"early", queue=b"email", headers=b"reply-requested")
    recv_command(client, Ack)
    worker = broker.worker(b"mailer", b'[[40, "email"]]')
    worker.send_multipart([b"", P, b"READY", b"r"])
    job = recv_command(worker, Request)
    assert job.queue == "email" and job.msgid.startswith(b"early")
    worker.send_multipart([b"", P, b"REPLY", b"x", b'{"value": 1}', job.msgid])
    assert recv_command(client, Reply).request_msgid == b"early"


def test_worker_gets_heartbeats(broker: Broker) -> None:
    worker = broker.worker()
    beats = 0
    while beats < 3:  # three in a row: the broker keeps beating at its interval
        cmd = decode(recv_frames(worker, WAIT))
        assert isinstance(cmd, Heartbeat)
        beats += 1
        worker.send_multipart([b"", P, b"HEARTBEAT", b"hb-%d" % beats, b"%f" % time.time()])


def test_queue_full_is_refused_with_error(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(MAX_PENDING=1)
    client = broker.client()
    send_request(client, b"one", queue=b"nobody")
    assert recv_command(client, Ack).ack_msgid == b"one"
    send_request(client, b"two", queue=b"nobody")
    err = recv_command(client, Error)
    assert (err.ref_msgid, err.code) == (b"two", "queue-full")


def test_malformed_messages_are_counted_and_the_broker_keeps_serving(broker: Broker) -> None:
    client = broker.client()
    bad = [
        [b"garbage"],
        [b"", P, b"NOPE", b"m"],
        [b"", P, b"REQUEST", b"m", b"\xff", b"", b"b"],
        [b"x" * 2000, b"\xff\xfe"],
    ]
    for frames in bad:
        client.send_multipart(frames)
    # the two that name a msgid are answered (issue 12: they used to get nothing)
    codes = {recv_command(client, Error).code for _ in range(2)}
    assert codes == {"unknown-command", "bad-queue-name"}
    worker_port = broker.socket(zmq.DEALER, broker.backend, b"w-bad")
    worker_port.send_multipart([b"", P, b"INFORM", b"m", b"{}", b"worker"])
    send_request(client, b"after")
    assert recv_command(client, Ack).ack_msgid == b"after"
    wait_until(
        lambda: broker.status()["counters"]["protocol_errors"] >= len(bad) + 1,
        "protocol_errors to count the bad messages",
    )
    assert broker.status()["counters"]["protocol_errors"] == len(bad) + 1


def test_shutdown_sends_kbye_to_workers(broker: Broker) -> None:
    worker = broker.worker()
    broker.server.request_shutdown()
    recv_command(worker, Kbye)
    broker.thread.join(WAIT)  # nothing in flight: it stops by itself
    assert not broker.thread.is_alive()


# ---- monitor -----------------------------------------------------------------


def test_monitor_answers_key_value_lines(broker: Broker) -> None:
    client = broker.client()
    for n in range(2):
        send_request(client, b"wait-%d" % n, queue=b"unserved")
        recv_command(client, Ack)
    text = broker.ask_monitor(b"MONITOR").decode()
    lines = dict(line.split(": ", 1) for line in text.splitlines())
    assert lines["messages"] == "2"
    assert lines["messages_inflight"] == "0"
    assert lines["queue.unserved.depth"] == "2"
    assert "protocol_errors" in lines


def test_monitor_json_describes_queues_job_managers_and_counters(broker: Broker) -> None:
    worker = broker.worker(b"worker-j", b'[[40, "email"], [10, "default"]]')
    worker.send_multipart([b"", P, b"READY", b"r1"])
    worker.send_multipart([b"", P, b"READY", b"r2"])
    client = broker.client()
    send_request(client, b"in-flight", queue=b"email")
    recv_command(client, Ack)
    recv_command(worker, Request)
    doc = broker.status()
    queues = {q["name"]: q for q in doc["queues"]}
    assert queues["email"]["in_flight"] == 1 and queues["email"]["depth"] == 0
    assert [e["identity"] for e in queues["default"]["job_managers"]] == ["worker-j"]
    (manager,) = doc["job_managers"]
    assert manager["identity"] == "worker-j" and manager["busy"] == 1
    assert manager["free_slots"] == 1
    assert doc["counters"]["received"] == 1 and doc["counters"]["dispatched"] == 1
    assert doc["in_flight"] == 1


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"HELLO", id="hello"),
        pytest.param(b"\xff\x00\xfe", id="binary"),
        pytest.param(b"MONITOR XML", id="unknown-format"),
        pytest.param(b"", id="empty"),
        pytest.param(b"x" * 1000, id="long-request"),  # a REQ peer hangs if nothing answers
    ],
)
def test_monitor_answers_garbage_with_an_error_line(broker: Broker, garbage: bytes) -> None:
    answer = broker.ask_monitor(garbage)
    assert answer.startswith(b"ERROR")
    assert b"messages: " in broker.ask_monitor(b"MONITOR")  # still serving


def test_monitor_survives_dealer_garbage(broker: Broker) -> None:
    dealer = broker.socket(zmq.DEALER, broker.monitor, b"m-dealer")
    dealer.send_multipart([b"\xff" * 100, b"", b"MONITOR"])
    dealer.send_multipart([b"x" * 1_000_000])
    dealer.send(b"")
    assert b"messages: " in broker.ask_monitor(b"monitor")  # case-insensitive


# ---- idle --------------------------------------------------------------------


def test_idle_broker_loop_wakes_only_for_its_timers(broker: Broker) -> None:
    broker.ask_monitor(b"MONITOR")  # the loop is running
    worker = broker.worker()  # a peer, so heartbeats and expiry have work to do
    start_calls, start = broker.clock.calls, time.monotonic()
    intervals = 5
    deadline = start + intervals * INTERVAL
    while time.monotonic() < deadline:  # keep the worker alive, as a real one would
        if worker.poll(50):
            worker.recv_multipart()
            worker.send_multipart([b"", P, b"HEARTBEAT", b"hb", b"%f" % time.time()])
    calls = broker.clock.calls - start_calls
    elapsed_intervals = (time.monotonic() - start) / INTERVAL
    # a heartbeat plus 4 expiry checks per interval, a few clock reads per turn, and one
    # turn per heartbeat received; a 1 ms busy poll would make ~200 turns per interval
    assert calls / elapsed_intervals < 60, f"{calls} clock reads in {elapsed_intervals:.1f}"


# ---- memory ------------------------------------------------------------------


def test_broker_gives_memory_back_once_a_backlog_drained(broker: Broker) -> None:
    # thresholds a small backlog reaches; the default ones wait for 50,000 jobs
    broker.server.reclaimer = Reclaimer(min_drop=300, interval=0.0, check_every=0.05, quiet=50)
    client = broker.client()
    n = 1000
    for i in range(n):
        send_request(client, b"mem-%d" % i)
    acked = {recv_command(client, Ack).ack_msgid for _ in range(n)}
    assert len(acked) == n
    assert broker.status()["memory"]["jobs"] == n

    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"r"])
    for k in range(n):
        job = recv_command(worker, Request)
        worker.send_multipart([b"", P, b"REPLY", b"x%d" % k, b"null", job.msgid, b"ok,ready"])

    def reclaimed() -> bool:
        memory = broker.status()["memory"]
        return bool(memory["reclaims"] >= 1 and memory["jobs"] == 0)

    wait_until(reclaimed, "a reclaim once the backlog drained")
    memory = broker.status()["memory"]
    assert memory["recent_ids"] == n and memory["rss_bytes"] > 0
    # the de-duplication window outlived the compaction: a resent job is not run again
    send_request(client, b"mem-7")
    assert recv_command(client, Ack).ack_msgid == b"mem-7"
    deadline = time.monotonic() + 0.5
    while worker.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        assert isinstance(decode(worker.recv_multipart()), Heartbeat)  # no second run
    assert broker.status()["counters"]["duplicates"] == 1
