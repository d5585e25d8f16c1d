"""Fuzz the real `manage.py emq_broker` with 10,000 malformed and random messages.

Valid traffic runs alongside: a client whose REQUESTs must still be ACKed and answered,
and a job manager (in a thread, heartbeating) that must still get the work.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from emq_django.exceptions import ProtocolError
from emq_django.protocol import PROTOCOL, Ack, Heartbeat, Reply, Request, decode
from tests.support import EmqProcesses, ManagedProcess, port_of

pytestmark = pytest.mark.e2e

P = PROTOCOL
SEED = 20261121
MESSAGES = 10_000
HUGE = 1_000_000
VALID_QUEUE = b"fuzz-valid"  # never named by the fuzzer: only the valid job manager serves it
BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [1, 2], "kwargs": {}}]'
COMMANDS = [
    b"ACK",
    b"REPLY",
    b"HEARTBEAT",
    b"DISCONNECT",
    b"KBYE",
    b"KBAI",
    b"REQUEST",
    b"PUBLISH",
    b"SCHEDULE",
    b"UNSCHEDULE",
    b"INFORM",
    b"READY",
    b"ERROR",
]
FUZZ_QUEUES = [b"default", b"email", b"fq-1", b"fq-2"]


# ---- the fuzzer ----------------------------------------------------------------


def _valid(rng: random.Random) -> list[bytes]:
    msgid = b"fz-%d" % rng.randrange(10**9)
    queue = rng.choice(FUZZ_QUEUES)
    return rng.choice(
        [
            [
                b"",
                P,
                b"REQUEST",
                msgid,
                queue,
                rng.choice([b"", b"reply-requested", b"guarantee"]),
                BODY,
            ],
            [
                b"",
                P,
                b"INFORM",
                msgid,
                rng.choice([b"", b'[[10, "fq-1"]]', b'[[40, "email"]]']),
                b"worker",
            ],
            [b"", P, b"INFORM", msgid, b"", b"scheduler"],
            [b"", P, b"READY", msgid],
            [b"", P, b"HEARTBEAT", msgid, b"%f" % time.time()],
            [b"", P, b"REPLY", msgid, b'{"value": 1}', b"stale-%d#1" % rng.randrange(100), b"ok"],
            [b"", P, b"SCHEDULE", msgid, queue, b"guarantee", b"60", BODY, b""],
            [b"", P, b"UNSCHEDULE", msgid, queue, b"guarantee", b"-1", BODY, b"* * * * *"],
            [b"", P, b"PUBLISH", msgid, b"topic", b"", b"news"],
            [b"", P, b"DISCONNECT", msgid],
            [b"", P, b"KBYE", msgid],
            [b"", P, b"ACK", msgid, b"x"],
        ]
    )


def _bad_fields(rng: random.Random) -> list[bytes]:
    msgid = b"bf-%d" % rng.randrange(10**9)
    return rng.choice(
        [
            [b"", P, b"REQUEST", msgid, b"q", b"retry-count:-%d" % rng.randrange(1, 9), BODY],
            [b"", P, b"REQUEST", msgid, b"q", b"timeout:soon", BODY],
            [b"", P, b"REQUEST", msgid, b"", b"", BODY],
            [b"", P, b"INFORM", msgid, b"{not json", b"worker"],
            [b"", P, b"INFORM", msgid, b'[[true, "x"]]', b"worker"],
            [b"", P, b"INFORM", msgid, b"", b"toaster"],
            [b"", P, b"INFORM", msgid, b"", b"worker", b"[1, 2]"],
            [b"", P, b"SCHEDULE", msgid, b"q", b"", b"-9", BODY, b""],
            [b"", P, b"SCHEDULE", msgid, b"q", b"", b"often", BODY, b""],
            [b"", P, b"HEARTBEAT", msgid, b"noon"],
            [b"", P, b"REPLY", msgid, b"{}", b"x#1", b"s" * 100],
            [b"", P, b"READY", b""],
            [b"", P, b"READY", b"m" * 300],
            [b"", b"eMQP/0.9", b"READY", msgid],
            [b"not-empty", P, b"READY", msgid],
        ]
    )


def _non_utf8(rng: random.Random) -> list[bytes]:
    junk = b"\xff\xfe" + rng.randbytes(rng.randrange(1, 12))
    msgid = b"nu-%d" % rng.randrange(10**9)
    return rng.choice(
        [
            [b"", P, b"REQUEST", msgid, junk, b"", BODY],
            [b"", P, b"REQUEST", msgid, b"q", junk, BODY],
            [b"", P, b"INFORM", msgid, junk, b"worker"],
            [b"", P, b"INFORM", msgid, b"", junk],
            [b"", P, b"SCHEDULE", msgid, b"q", b"", b"-1", BODY, junk],
            [b"", P, b"ERROR", msgid, b"r", b"c", junk],
            [junk, junk, junk, junk],
        ]
    )


def fuzz_message(rng: random.Random, huge_left: list[int]) -> list[bytes]:
    kind = rng.random()
    if huge_left[0] and rng.random() < 0.001:
        huge_left[0] -= 1
        big = b"\xab" * HUGE
        return rng.choice(
            [
                [big],
                [b"", P, b"REQUEST", big, b"q", b"", BODY],
                [b"", P, b"REQUEST", b"h", big, b"", BODY],
                [b"", P, big, b"m"],
            ]
        )
    if kind < 0.20:  # random binary frames
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 10))]
    if kind < 0.35:  # a valid command cut short
        frames = _valid(rng)
        return frames[: rng.randrange(1, len(frames))]
    if kind < 0.47:  # a valid command with frames added or dropped
        frames = _valid(rng)
        if rng.random() < 0.5:
            return [*frames, *(rng.randbytes(4) for _ in range(rng.randrange(1, 4)))]
        if len(frames) > 4:
            del frames[rng.randrange(4, len(frames))]
        else:
            frames.append(b"x")
        return frames
    if kind < 0.57:
        return _non_utf8(rng)
    if kind < 0.72:
        return _bad_fields(rng)
    if kind < 0.80:  # unknown commands
        return [b"", P, rng.choice([b"HELLO", b"request", b"PING", rng.randbytes(6)]), b"u1"]
    if kind < 0.85:  # empty message: one empty frame (ZeroMQ has no zero-part message)
        return [b""]
    if kind < 0.90:  # a frame list built from protocol words
        words = [b"", P, *COMMANDS, b"worker", b"-1", b"default", b"\xff"]
        return [rng.choice(words) for _ in range(rng.randrange(1, 10))]
    return _valid(rng)


def rejected_by_decode(frames: list[bytes]) -> bool:
    try:
        decode(frames)
    except ProtocolError:
        return True
    return False


# ---- valid peers -----------------------------------------------------------------


class JobManager(threading.Thread):
    """A DEALER job manager on its own thread: heartbeats, answers every REQUEST."""

    def __init__(self, context: zmq.Context[Any], url: str) -> None:
        super().__init__(name="fuzz-job-manager", daemon=True)
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.identity = b"fuzz-job-manager"
        self.sock.connect(url)
        self.stop = threading.Event()
        self.received: list[bytes] = []
        self.goodbyes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _run(self) -> None:
        sock = self.sock
        sock.send_multipart([b"", P, b"INFORM", b"jm-inform", b'[[10, "fuzz-valid"]]', b"worker"])
        acked = False
        next_beat = 0.0
        n = 0
        while not self.stop.is_set():
            now = time.monotonic()
            if acked and now >= next_beat:
                n += 1
                sock.send_multipart([b"", P, b"HEARTBEAT", b"jm-hb-%d" % n, b"%f" % time.time()])
                next_beat = now + 0.1
            if not sock.poll(50):
                continue
            cmd = decode(sock.recv_multipart())
            if isinstance(cmd, Ack) and not acked:
                acked = True
                sock.send_multipart([b"", P, b"READY", b"jm-ready"])
            elif isinstance(cmd, Request):
                self.received.append(cmd.msgid)
                sock.send_multipart(
                    [
                        b"",
                        P,
                        b"REPLY",
                        b"jm-r-%d" % len(self.received),
                        b'{"value": "done"}',
                        cmd.msgid,
                        b"ok,ready",
                    ]
                )
            elif not isinstance(cmd, Heartbeat):
                self.goodbyes += 1  # a KBYE: the broker dropped us


class Client:
    def __init__(self, context: zmq.Context[Any], url: str) -> None:
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.identity = b"fuzz-valid-client"
        self.sock.connect(url)
        self.sent: list[bytes] = []
        self.acked: set[bytes] = set()
        self.replied: set[bytes] = set()

    def request(self) -> None:
        msgid = b"valid-%d" % len(self.sent)
        self.sent.append(msgid)
        self.sock.send_multipart([b"", P, b"REQUEST", msgid, VALID_QUEUE, b"reply-requested", BODY])

    def collect(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.replied) < len(self.sent) or len(self.acked) < len(self.sent):
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                return
            cmd = decode(self.sock.recv_multipart())
            if isinstance(cmd, Ack):
                self.acked.add(cmd.ack_msgid)
            elif isinstance(cmd, Reply):
                self.replied.add(cmd.request_msgid)


# ---- the test ----------------------------------------------------------------------


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def monitor_json(context: zmq.Context[Any], url: str, timeout: float = 2.0) -> dict[str, Any]:
    req = context.socket(zmq.REQ)
    req.linger = 0
    try:
        req.connect(url)
        req.send(b"MONITOR JSON")
        assert req.poll(int(timeout * 1000)), f"no MONITOR JSON answer within {timeout} s"
        doc: dict[str, Any] = json.loads(req.recv())
        return doc
    finally:
        req.close(linger=0)


def wait_for(check: Callable[[], bool], what: str, timeout: float, proc: ManagedProcess) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.alive(), f"the broker died while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


def test_broker_survives_10000_malformed_messages(
    emq_processes: EmqProcesses, emq_env: dict[str, str], zmq_context: zmq.Context[Any]
) -> None:
    broker = emq_processes.start("emq_broker", name="broker")
    for key in ("EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND", "EMQ_MONITOR_BIND"):
        emq_processes.wait_for_port(port_of(emq_env[key]), proc=broker)
    urls = {
        "frontend": emq_env["EMQ_FRONTEND_BIND"],
        "backend": emq_env["EMQ_BACKEND_BIND"],
        "monitor": emq_env["EMQ_MONITOR_BIND"],
    }

    job_manager = JobManager(zmq_context, urls["backend"])
    job_manager.start()
    client = Client(zmq_context, urls["frontend"])
    client.request()
    client.collect(5.0)
    assert client.acked == {b"valid-0"} and client.replied == {b"valid-0"}, "valid path broken"

    fuzzers: dict[str, list[zmq.Socket[Any]]] = {}
    for port, url in urls.items():
        fuzzers[port] = []
        for n in range(8):
            sock = zmq_context.socket(zmq.DEALER)
            sock.linger = 0
            sock.sndtimeo = 5000  # a broker that stops reading fails the test, not hangs it
            if n % 2:  # the other half keeps libzmq's binary automatic identity
                sock.identity = b"fz-%s-%d" % (port.encode(), n)
            sock.connect(url)
            fuzzers[port].append(sock)

    rng = random.Random(SEED)
    huge_left = [4]
    invalid = 0
    sent = {"frontend": 0, "backend": 0, "monitor": 0}
    for i in range(MESSAGES):
        port = rng.choice(("frontend", "frontend", "backend", "backend", "monitor"))
        frames = fuzz_message(rng, huge_left)
        if port != "monitor" and rejected_by_decode(frames):
            invalid += 1
        rng.choice(fuzzers[port]).send_multipart(frames)
        sent[port] += 1
        if i % 500 == 250:
            client.request()
        if i % 100 == 0:
            for sock in (s for socks in fuzzers.values() for s in socks):
                while sock.poll(0):  # keep the fuzzers' inboxes from filling up
                    sock.recv_multipart()
    assert huge_left == [0], "the seed must send every huge frame"
    assert invalid > MESSAGES // 2  # the mix is mostly malformed

    assert broker.alive()
    wait_for(
        lambda: (
            monitor_json(zmq_context, urls["monitor"])["counters"]["protocol_errors"] >= invalid
        ),
        f"protocol_errors >= {invalid}",
        20.0,
        broker,
    )

    # valid traffic still works: every request of the client was acked and answered
    client.request()
    client.collect(10.0)
    assert client.acked == set(client.sent)
    assert client.replied == set(client.sent)
    assert set(job_manager.received) == {m + b"#1" for m in client.sent}
    job_manager.stop.set()
    job_manager.join(5.0)
    assert job_manager.error is None, repr(job_manager.error)
    assert job_manager.goodbyes == 0, "the valid job manager was dropped during the fuzz"

    assert broker.alive()
    doc = monitor_json(zmq_context, urls["monitor"], timeout=2.0)
    counters = doc["counters"]
    assert counters["protocol_errors"] >= invalid
    assert counters["internal_errors"] == 0
    assert any(m["identity"] == "fuzz-job-manager" for m in doc["job_managers"])
    for socks in fuzzers.values():
        for sock in socks:
            sock.close(linger=0)
    job_manager.sock.close(linger=0)
    client.sock.close(linger=0)
    print(f"sent {sent}, {invalid} rejected by decode(); broker counters {counters}")
