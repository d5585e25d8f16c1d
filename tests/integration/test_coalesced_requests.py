"""REQUESTS, several jobs in one message (docs/eventmq-wire.md §7), on real sockets.

The broker side runs a real BrokerServer thread (tests/integration/test_broker_server.py's
fixture); the client side talks either to it or to a ROUTER played by the test, which
sees exactly what the client sends and when.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from emq_django.client import Client
from emq_django.client import sending as client_module
from emq_django.exceptions import BrokerUnavailable, QueueFull
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F
from emq_django.protocol.frames import PROTOCOL as P
from emq_django.protocol.frames import Error, Request
from tests.integration import test_broker_server as base
from tests.integration.test_broker_server import WAIT, Broker, recv_command, recv_frames
from tests.support import REPO_ROOT, free_tcp_ports, wait_until

start_broker = base.start_broker  # the fixtures: a BrokerServer in a thread
broker = base.broker

BODY = b'["run",{"callable":"add","path":"pkg.tasks","args":[2,3],"kwargs":{}}]'
WAIT_MS = int(WAIT * 1000)


def requests(batch_id: bytes, msgids: list[bytes], queue: bytes = b"nobody") -> list[bytes]:
    return B.encode_requests(batch_id, [(m, queue, b"acks", BODY) for m in msgids])


def acked(sock: zmq.Socket[Any], want: set[bytes]) -> tuple[set[bytes], list[Error], list[bytes]]:
    """Read ACKs (of one frame or several, packed or not) and ERRORs until every
    msgid of ``want`` was answered; returns (ACKed, the ERRORs, the ACKs' own msgids)."""
    got: set[bytes] = set()
    errors: list[Error] = []
    ack_ids: list[bytes] = []
    while not want <= got | {e.ref_msgid for e in errors}:
        frames = recv_frames(sock)
        if frames[2] == F.ACK:
            ack_ids.append(frames[3])
            for frame in frames[4:]:
                got.update(frame.split(B.PACK_SEPARATOR))
        elif frames[2] == F.ERROR:
            errors.append(F.decode(frames))  # type: ignore[arg-type]
    return got, errors, ack_ids


def drained_in_order(broker: Broker, queue: bytes, count: int) -> list[bytes]:
    """The job ids a worker of ``queue`` is given, one credit at a time."""
    worker = broker.worker(b"w-" + queue, b'[[10, "%s"]]' % queue)
    ids = []
    for i in range(count):
        worker.send_multipart([b"", P, b"READY", b"r%d" % i])
        job = recv_command(worker, Request)
        ids.append(job.msgid.split(b"#")[0])
        worker.send_multipart([b"", P, b"REPLY", b"x%d" % i, b'{"value": 1}', job.msgid, b"ok"])
    return ids


# ---- the broker ------------------------------------------------------------------


def test_the_jobs_of_requests_are_queued_in_order_and_acked_in_one_frame(broker: Broker) -> None:
    client = broker.client()
    ids = [b"job-%d" % i for i in range(5)]
    client.send_multipart(requests(b"batch-1", ids, b"ordered"))
    got, errors, ack_ids = acked(client, set(ids))
    assert got == set(ids) and not errors
    assert all(a.startswith(B.MARK) for a in ack_ids)  # the broker says it reads REQUESTS
    assert len(ack_ids) == 1  # one turn took them: one ACK, its msgids in one frame
    assert drained_in_order(broker, b"ordered", 5) == ids


def test_a_bad_job_in_requests_is_refused_alone(broker: Broker) -> None:
    client = broker.client()
    jobs = [
        (b"good-1", b"nobody", b"acks", BODY),
        (b"bad-1", b"\xff\xfe", b"acks", BODY),  # a queue name that is not UTF-8
        (b"good-2", b"nobody", b"acks", BODY),
    ]
    client.send_multipart(B.encode_requests(b"batch-2", jobs))
    got, errors, _ = acked(client, {b"good-1", b"bad-1", b"good-2"})
    assert got == {b"good-1", b"good-2"}
    assert [(e.ref_msgid, e.code) for e in errors] == [(b"bad-1", "bad-queue-name")]


GARBAGE: list[list[bytes]] = [
    [b"", P, B.REQUESTS, b"g-1", b"\x05\x03\x00\x00\x00\x00\x00\x09shortqqq"],  # overruns
    [b"", P, B.REQUESTS, b"g-2", b""],  # no job
    [b"", P, B.REQUESTS, b"g-3", b"\x00" * 7],  # a head cut short
    [b"", P, B.REQUESTS, b"g-4", requests(b"x", [b"a"])[4] + b"junk"],  # bytes left over
    [b"", P, B.REQUESTS, b"g-5"],  # four frames
    [b"", P, B.REQUESTS, b"g-6", b"", b""],  # six frames
    [b"oops", P, B.REQUESTS, b"g-7", requests(b"x", [b"b"])[4]],  # not eMQP
]


def test_garbage_requests_are_counted_drops_and_no_accepted_job_is_lost(broker: Broker) -> None:
    client = broker.client()
    before = [b"before-%d" % i for i in range(3)]
    after = [b"after-%d" % i for i in range(3)]
    client.send_multipart(requests(b"batch-a", before, b"kept"))
    for frames in GARBAGE:
        client.send_multipart(frames)
    client.send_multipart(requests(b"batch-b", after, b"kept"))
    named = {frames[3] for frames in GARBAGE if not frames[0]}
    got, errors, _ = acked(client, set(before + after) | named)
    assert got == set(before + after)
    assert {e.ref_msgid for e in errors} == named  # a malformed one naming a msgid is answered
    by_msgid = {e.ref_msgid: e for e in errors}
    for msgid in (b"g-5", b"g-6"):  # a REQUESTS of the wrong length is malformed, and says so
        assert by_msgid[msgid].code == "malformed", by_msgid[msgid]
        assert "REQUESTS needs 5 frames" in by_msgid[msgid].reason, by_msgid[msgid]
    wait_until(
        lambda: broker.status()["counters"]["protocol_errors"] == len(GARBAGE),
        "protocol_errors to count every garbage message",
    )
    assert drained_in_order(broker, b"kept", 6) == before + after


def test_random_mutations_of_requests_never_take_the_broker_down(broker: Broker) -> None:
    import random

    rng = random.Random(18)
    client = broker.client()
    good = requests(b"batch-f", [b"f-%d" % i for i in range(4)], b"fuzz")
    for _ in range(300):
        data = bytearray(good[4])
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        client.send_multipart([*good[:4], bytes(data[: rng.randint(0, len(data))])])
    client.send_multipart(requests(b"batch-last", [b"last"], b"fuzz"))
    got: set[bytes] = set()
    while b"last" not in got:  # everything before it was handled (one connection: in order)
        frames = recv_frames(client)
        if frames[2] == F.ACK:
            for frame in frames[4:]:
                got.update(frame.split(B.PACK_SEPARATOR))
    assert broker.server.internal_errors == 0


# ---- the client, against a ROUTER played by the test --------------------------------


class FakeBroker:
    def __init__(self) -> None:
        (port,) = free_tcp_ports(1)
        self.url = f"tcp://127.0.0.1:{port}"
        self.context: zmq.Context[Any] = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind(self.url)
        self.identity = b""

    def client(self, mark: bool = True) -> Client:
        """A client whose first message this broker ACKed (with MARK: as ours does)."""
        client = Client(self.url, ack_timeout=5.0, context=self.context, curve=None)
        helper = threading.Thread(target=self.answer_one, args=(mark,))
        helper.start()
        client.send("default", b"", BODY)
        helper.join()
        return client

    def answer_one(self, mark: bool = True) -> list[bytes]:
        frames = self.next()
        msgid = (B.MARK if mark else b"") + b"a-1"
        self.router.send_multipart([self.identity, *F.encode_ack(msgid, frames[3])])
        return frames

    def next(self) -> list[bytes]:
        assert self.router.poll(WAIT_MS), "the client sent nothing"
        identity, *frames = self.router.recv_multipart()
        self.identity = identity
        return frames

    def nothing_waits(self) -> bool:
        return not self.router.poll(0)

    def close(self) -> None:
        self.router.close()
        self.context.destroy(linger=0)


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    fb = FakeBroker()
    yield fb
    fb.close()


def test_a_send_with_nothing_in_flight_goes_at_once_as_a_request(fake: FakeBroker) -> None:
    client = fake.client()
    try:
        msgid = client.send_request(b"default", b"", BODY)
        frames = fake.next()  # already sent: not held for company
        assert frames[2] == F.REQUEST and frames[3] == msgid
        assert client._coalesce and not client._buf
    finally:
        client.close()


def test_sends_while_one_is_unacknowledged_leave_as_one_requests(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "BURST_GAP", 60.0)  # a loop of sends, however slow
    client = fake.client()
    try:
        first = client.send_request(b"default", b"", BODY)
        assert fake.next()[3] == first
        later = [client.send_request(b"default", b"", BODY) for _ in range(3)]
        frames = fake.next()  # the flusher sends them after COALESCE_WAIT, as one
        assert frames[2] == B.REQUESTS
        assert [job[0] for job in B.decode_jobs(frames)] == later
        assert all(job[2] == b"acks" for job in B.decode_jobs(frames))
    finally:
        client.close()


def test_a_send_after_a_pause_goes_at_once_though_an_ack_is_out(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our broker holds the ACK of a job with a reply for 1-2 ms (to go with its
    REPLY): a send made after a pause (over BURST_GAP) while that ACK is out is not
    held for company, unless the ACK is overdue (over ACK_GRACE: the broker is
    behind), which buffers it as before."""
    monkeypatch.setattr(client_module, "BURST_GAP", 0.0)
    client = fake.client()
    try:
        first = client.send_request(b"default", b"", BODY)
        assert fake.next()[3] == first  # not acknowledged
        second = client.send_request(b"default", b"", BODY)
        frames = fake.next()
        assert frames[2] == F.REQUEST and frames[3] == second and not client._buf
        monkeypatch.setattr(client_module, "ACK_GRACE", 0.01)
        threading.Event().wait(0.05)  # both ACKs overdue now
        third = client.send_request(b"default", b"", BODY)
        assert client._buf  # buffered: the flusher sends it as REQUESTS
        frames = fake.next()
        assert frames[2] == B.REQUESTS and [j[0] for j in B.decode_jobs(frames)] == [third]
    finally:
        client.close()


def test_a_get_whose_job_was_never_acknowledged_says_the_broker_is_gone(
    fake: FakeBroker,
) -> None:
    """Our broker holds a reply job's ACK for 1-2 ms: a broker killed meanwhile
    never sends it. The job's ``get()`` then raises ``BrokerUnavailable`` once the
    ACK is ``ack_timeout`` late, with the reason, not ``ResultTimeout`` at the end
    of its own (longer) time-out."""
    client = fake.client()
    client.ack_timeout = 0.5
    try:
        msgid = client.send_request(b"default", b"reply-requested", BODY)
        assert fake.next()[3] == msgid  # taken, never acknowledged: the broker died
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="did not acknowledge within 0.5 s"):
            client.wait_reply(msgid, 30.0)
        assert time.monotonic() - started < 10.0
    finally:
        client.close()


def test_a_broker_without_the_mark_always_gets_plain_requests(fake: FakeBroker) -> None:
    client = fake.client(mark=False)  # EventMQ's router, say
    try:
        sent = [client.send_request(b"default", b"", BODY) for _ in range(5)]
        got = [fake.next() for _ in sent]
        assert [f[2] for f in got] == [F.REQUEST] * 5 and [f[3] for f in got] == sent
        assert not client._coalesce
    finally:
        client.close()


def test_order_is_kept_between_buffered_jobs_and_other_sends(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "COALESCE_WAIT", 60.0)  # only the order sends them
    monkeypatch.setattr(client_module, "BURST_GAP", 60.0)  # sends in a loop
    client = fake.client()
    try:
        first = client.send_request(b"default", b"", BODY)
        assert fake.next()[3] == first  # nothing in flight before it: sent at once
        buffered = [client.send_request(b"default", b"", BODY) for _ in range(2)]
        assert fake.nothing_waits()
        client.send_frames(F.encode_heartbeat(b"sched-1", 0.0), b"sched-1", confirm=False)
        client.send_batch("default", b"", [BODY, BODY], ["map-1", "map-2"])
        commands: list[list[bytes]] = []

        def broker_side() -> None:  # a guaranteed send waits for its ACK: given here
            while True:
                frames = fake.next()
                commands.append(frames)
                if frames[3] == b"guaranteed":
                    ack = F.encode_ack(B.MARK + b"a-2", frames[3])
                    fake.router.send_multipart([fake.identity, *ack])
                    return

        answer = threading.Thread(target=broker_side)
        answer.start()
        client.send_request(b"default", b"", BODY, confirm=True, msgid=b"guaranteed")
        answer.join()
        assert commands[0][2] == B.REQUESTS
        assert [job[0] for job in B.decode_jobs(commands[0])] == buffered
        assert [f[2] for f in commands[1:]] == [F.HEARTBEAT, B.REQUESTS, F.REQUEST]
        assert commands[1][3] == b"sched-1" and commands[3][3] == b"guaranteed"
        # a map() goes as REQUESTS too, once the broker's ACKs said it reads them
        assert [job[0] for job in B.decode_jobs(commands[2])] == [b"map-1", b"map-2"]
    finally:
        client.close()


def _ack(fake: FakeBroker, n: int, *msgids: bytes) -> None:
    packed = B.PACK_SEPARATOR.join(msgids)
    fake.router.send_multipart([fake.identity, *F.encode_ack(B.MARK + b"p-%d" % n, packed)])


def test_acks_naming_parts_of_coalesced_messages_acknowledge_each_job(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client keeps a coalesced message's jobs as one entry while ACKs name whole
    # messages; an ACK of a part, of one job or of an unknown id must still count.
    monkeypatch.setattr(client_module, "COALESCE_WAIT", 60.0)
    monkeypatch.setattr(client_module, "BURST_GAP", 60.0)  # sends in a loop
    client = fake.client()
    try:
        first = client.send_request(b"default", b"", BODY)
        assert fake.next()[3] == first
        jobs = [client.send_request(b"default", b"", BODY) for _ in range(6)]
        more: list[bytes] = []

        def broker_side() -> None:
            frames = fake.next()  # flush() sends the buffer
            assert [job[0] for job in B.decode_jobs(frames)] == jobs
            _ack(fake, 1, first, jobs[0], jobs[1])  # a REQUEST and part of a REQUESTS
            _ack(fake, 2, jobs[2])  # one job of it, in a frame of its own
            _ack(fake, 3, jobs[3], jobs[4], jobs[5], b"unknown")

        answer = threading.Thread(target=broker_side)
        answer.start()
        client.flush(timeout=WAIT)
        answer.join()
        assert client._unacked() == 0 and not client._pending
        # and the next messages are acknowledged whole again
        more = [client.send_request(b"default", b"", BODY) for _ in range(2)]
        assert fake.next()[3] == more[0]  # nothing in flight: a REQUEST
        later = [client.send_request(b"default", b"", BODY) for _ in range(3)]
        answer = threading.Thread(
            target=lambda: (fake.next(), _ack(fake, 4, *more), _ack(fake, 5, *later))
        )
        answer.start()
        client.flush(timeout=WAIT)
        answer.join()
        assert client._unacked() == 0
    finally:
        client.close()


def test_a_coalesced_job_never_acknowledged_is_reported(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emq_django.exceptions import BrokerUnavailable

    monkeypatch.setattr(client_module, "COALESCE_WAIT", 60.0)

    monkeypatch.setattr(client_module, "BURST_GAP", 60.0)  # sends in a loop
    client = fake.client()
    client.ack_timeout = 0.5
    try:
        first = client.send_request(b"default", b"", BODY)
        assert fake.next()[3] == first
        jobs = [client.send_request(b"default", b"", BODY) for _ in range(4)]
        answer = threading.Thread(
            target=lambda: (fake.next(), _ack(fake, 1, first, *jobs[:3]))  # not jobs[3]
        )
        answer.start()
        with pytest.raises(BrokerUnavailable, match="1 message"):
            client.flush(timeout=1.0)
        answer.join()
    finally:
        client.close()


# ---- the client, against the real broker ---------------------------------------------


def test_a_refusal_of_a_coalesced_job_reaches_its_get(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(MAX_PENDING=3)
    client = Client(broker.frontend, ack_timeout=5.0, curve=None)
    try:
        ids = [client.send_request(b"nobody", b"", BODY) for _ in range(8)]
        client.flush(timeout=WAIT)
        assert client._coalesce  # the broker's ACKs said so: some went as REQUESTS
        for msgid in ids[3:]:
            with pytest.raises(QueueFull):
                client.wait_reply(msgid, timeout=WAIT)
        assert broker.status()["counters"]["refused"] == 5
    finally:
        client.close()


def test_threads_sharing_the_client_get_every_job_to_the_broker_once(broker: Broker) -> None:
    client = Client(broker.frontend, ack_timeout=5.0, curve=None)
    sent: list[bytes] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            ids = [client.send_request(b"threads", b"", BODY) for _ in range(2000)]
            sent.extend(ids)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=produce) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        client.flush(timeout=WAIT)  # every job ACKed
        assert client._coalesce and not client._unacked() and len(set(sent)) == 8000
        status = broker.status()
        assert status["counters"]["received"] == 8000
        (queue,) = [q for q in status["queues"] if q["name"] == "threads"]
        assert queue["depth"] == 8000
    finally:
        client.close()


def test_cancel_of_a_buffered_job_finds_it_at_the_broker(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emq_django.conf import reset_cached_settings

    monkeypatch.setenv("EMQ_MONITOR_URL", broker.monitor)
    reset_cached_settings()
    monkeypatch.setattr(client_module, "COALESCE_WAIT", 60.0)  # only cancel() sends it
    monkeypatch.setattr(client_module, "BURST_GAP", 60.0)  # sends in a loop
    client = Client(broker.frontend, ack_timeout=5.0, curve=None)
    try:
        client.send_request(b"nobody", b"", BODY)  # waits for its ACK (the first)
        for _ in range(100):  # until one waits in the buffer behind one in flight
            job = client.send_request(b"nobody", b"", BODY)
            if client._buf:
                break
        assert client._buf, "no job waits in the buffer: the test proves nothing"
        assert client.cancel(job.decode()) is True
    finally:
        client.close()


def test_a_forked_child_never_sends_its_parents_buffer(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "COALESCE_WAIT", 60.0)
    monkeypatch.setattr(client_module, "BURST_GAP", 60.0)  # sends in a loop
    client = fake.client()
    try:
        client.send_request(b"default", b"", BODY)
        client.send_request(b"default", b"", BODY)
        assert client._buf
        pid = os.fork()
        if pid == 0:  # the child: its copy of the client holds nothing to send
            ok = not client._buf and client._flusher is None and not client._buf_jobs
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client._buf  # the parent still has its jobs, and sends them
    finally:
        client.close()


EXIT_SCRIPT = """
import sys
from emq_django.client import sending as C, Client
C.COALESCE_WAIT = 3600.0  # only the exit can send the buffer
c = Client(sys.argv[1], ack_timeout=5.0, curve=None)
for _ in range(100):
    c.send_request(b"at-exit", b"", b'["run",{}]')
assert c._buf, "nothing buffered: the test proves nothing"
"""


def test_jobs_buffered_when_the_interpreter_ends_are_sent(broker: Broker) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, broker.frontend],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    wait_until(
        lambda: broker.status()["counters"]["received"] == 100,
        "the broker to receive all 100 jobs",
    )
