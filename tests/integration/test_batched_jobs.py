"""Several jobs per REQUEST and several answers per REPLY (eMQP's "batch"
extension, docs/eventmq-wire.md §7), on real loopback sockets.

The broker is driven turn by turn from the test (no thread); the worker side is
a real ``SlotWorker`` in a forked process, talking to a ROUTER played by the test.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import emq_django as emq
from emq_django.broker.ports.emqp_clients import EmqpClientPort
from emq_django.broker.ports.emqp_workers import EmqpWorkerPort
from emq_django.broker.server import BrokerServer
from emq_django.protocol import frames as F
from emq_django.protocol.batch import (
    REPLIES,
    REQUESTS,
    decode_replies,
    encode_replies,
    encode_requests,
    unpack_requests,
)
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import format_headers
from emq_django.worker.slots import SlotTable
from tests.support import private_broker_settings

BODY = b'["run",{"callable":"add","path":"pkg.tasks","args":[2,3],"kwargs":{}}]'
WAIT_MS = 5000


@emq.task(queue="batch")
def add(a: int, b: int) -> int:
    return a + b


@emq.task(queue="batch")
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


@emq.task(queue="batch")
def nap2(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


# ---- the broker's side --------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BrokerServer]:
    settings = private_broker_settings(tmp_path)
    context: zmq.Context[Any] = zmq.Context()
    srv = BrokerServer(settings, context=context, shutdown_grace=1.0)
    srv.bind()
    srv.test_context = context  # type: ignore[attr-defined]
    srv.test_sockets = []  # type: ignore[attr-defined]
    yield srv
    for sock in srv.test_sockets:  # type: ignore[attr-defined]
        sock.close(linger=0)
    srv.close()
    context.destroy(linger=0)


def port_of(srv: BrokerServer, kind: type) -> Any:
    return next(p for p in srv.ports if isinstance(p, kind))


def dealer(srv: BrokerServer, port: Any, identity: bytes) -> zmq.Socket[Any]:
    sock = srv.test_context.socket(zmq.DEALER)  # type: ignore[attr-defined]
    sock.linger = 0
    srv.test_sockets.append(sock)  # type: ignore[attr-defined]
    sock.identity = identity
    sock.connect(port.address)
    return sock


def read_turn(srv: BrokerServer, port: Any, count: int) -> None:
    """The broker reads ``count`` messages on ``port`` in one turn, then flushes."""
    sock = srv.sockets[port]
    now = time.monotonic()
    for _ in range(count):
        assert sock.poll(WAIT_MS), "the broker got nothing"
        frames = sock.recv_multipart()
        port.handle(frames[0], frames[1:], now)
    srv._flush()


def messages(sock: zmq.Socket[Any], first_wait: int = WAIT_MS) -> list[list[bytes]]:
    assert sock.poll(first_wait), "nothing came"
    out = [sock.recv_multipart()]
    while sock.poll(200):
        out.append(sock.recv_multipart())
    return out


def worker_joins(srv: BrokerServer, identity: bytes, meta: dict[str, Any], credit: int) -> Any:
    """A worker DEALER that INFORMed with ``meta`` and gave ``credit`` READYs."""
    port = port_of(srv, EmqpWorkerPort)
    sock = dealer(srv, port, identity)
    sock.send_multipart(F.Inform(b"inform-1", ((10, "default"),), "worker", meta).encode())
    read_turn(srv, port, 1)
    for m in messages(sock):  # its ACK and first heartbeat
        assert m[2] in (F.ACK, F.HEARTBEAT)
    for i in range(credit):
        sock.send_multipart(F.encode_ready(b"ready-%d" % i))
    read_turn(srv, port, credit)
    return sock


def send_jobs(srv: BrokerServer, count: int) -> list[bytes]:
    port = port_of(srv, EmqpClientPort)
    client = dealer(srv, port, b"client-1")
    ids = [b"job-%d" % i for i in range(count)]
    for msgid in ids:
        client.send_multipart(F.encode_request(msgid, b"default", b"", BODY))
    read_turn(srv, port, count)
    return ids


def test_a_worker_that_asks_gets_several_jobs_in_one_request(server: BrokerServer) -> None:
    worker = worker_joins(server, b"w-batch", {"batch": 4}, credit=6)
    ids = send_jobs(server, 6)
    got = messages(worker)
    # one turn, six jobs, at most four per message: 4 + 2
    assert [len(m) for m in got] == [3 + 4 * 4, 3 + 4 * 2]
    jobs = [job for m in got for job in F.split_batch(m) or []]
    assert all(F.decode(j).queue == "default" and F.decode(j).body == BODY for j in jobs)  # type: ignore[union-attr]
    attempt_ids = [F.decode(j).msgid for j in jobs]
    assert attempt_ids == [b"%s#1" % i for i in ids]


def test_a_worker_that_asks_for_packed_jobs_gets_one_frame_of_records(
    server: BrokerServer,
) -> None:
    """``"packed": true`` with a batch: the jobs of a message as one REQUESTS (a record
    per job in one frame, protocol/batch.py), each what its REQUEST's frames would
    carry; a lone job is still the document's REQUEST."""
    worker = worker_joins(server, b"w-packed", {"batch": 4, "packed": True}, credit=7)
    ids = send_jobs(server, 7)
    got = messages(worker)
    assert [(len(m), m[2]) for m in got] == [(5, REQUESTS), (5, REQUESTS)]  # 4 + 3
    jobs = [job for m in got for job in unpack_requests(m)]
    assert [F.decode(j).msgid for j in jobs] == [b"%s#1" % i for i in ids]
    assert all(F.decode(j).body == BODY for j in jobs)  # type: ignore[union-attr]


def test_packed_is_only_for_a_worker_that_announced_a_batch_and_fits_a_record(
    server: BrokerServer,
) -> None:
    """``"packed"`` without a batch, or not ``true``: the document's REQUESTs. A
    message holding a job whose attempt id does not fit a record's length byte (a
    msgid of 255 bytes and its ``#1``) goes as a REQUEST of four frames per job."""
    alone = worker_joins(server, b"w-alone", {"packed": True}, credit=2)
    send_jobs(server, 2)
    assert [len(m) for m in messages(alone)] == [7, 7]
    port = port_of(server, EmqpWorkerPort)
    assert not port.peers[b"w-alone"].packed
    assert not F.packs({"batch": 4, "packed": "yes"}) and F.packs({"batch": 4, "packed": True})
    alone.close(linger=0)
    packed = worker_joins(server, b"w-packed", {"batch": 4, "packed": True}, credit=2)
    client = dealer(server, port_of(server, EmqpClientPort), b"client-2")
    for msgid in (b"short", b"x" * 255):
        client.send_multipart(F.encode_request(msgid, b"default", b"", BODY))
    read_turn(server, port_of(server, EmqpClientPort), 2)
    (got,) = messages(packed)
    assert got[2] == F.REQUEST and len(got) == 3 + 4 * 2
    assert [j[3] for j in F.split_batch(got) or []] == [b"short#1", b"x" * 255 + b"#1"]


def test_a_worker_that_did_not_ask_gets_the_documents_request_per_job(
    server: BrokerServer,
) -> None:
    worker = worker_joins(server, b"w-plain", {}, credit=3)
    send_jobs(server, 3)
    got = messages(worker)
    assert [len(m) for m in got] == [7, 7, 7]
    assert [F.decode(m).msgid for m in got] == [b"job-0#1", b"job-1#1", b"job-2#1"]


def test_one_reply_answers_several_jobs_and_returns_their_credit(server: BrokerServer) -> None:
    worker = worker_joins(server, b"w-batch", {"batch": 8}, credit=3)
    send_jobs(server, 3)
    (request,) = messages(worker)
    attempt_ids = [j[3] for j in F.split_batch(request) or []]
    core = server.core
    peer = port_of(server, EmqpWorkerPort).peers[b"w-batch"]
    assert peer.credit == 0 and len(core.inflight) == 3
    answers = [(b'{"value": 5}', aid, b"ok,ready") for aid in attempt_ids[:2]]
    answers.append((b'{"error": "x"}', attempt_ids[2], b"failed,ready,error:ValueError"))
    worker.send_multipart(F.join_replies(b"reply-1", answers))
    read_turn(server, port_of(server, EmqpWorkerPort), 1)
    assert not core.inflight
    assert core.counters["succeeded"] == 2
    assert core.counters["failed"] == 1
    assert peer.credit == 3


def test_the_ack_of_the_inform_says_batch_only_to_a_worker_that_asked(
    server: BrokerServer,
) -> None:
    port = port_of(server, EmqpWorkerPort)
    for identity, meta, frame in ((b"w-batch", {"batch": 4}, [b"batch:4"]), (b"w-plain", {}, [])):
        sock = dealer(server, port, identity)
        sock.send_multipart(F.Inform(b"inform-1", ((10, "default"),), "worker", meta).encode())
        read_turn(server, port, 1)
        (ack,) = [m for m in messages(sock) if m[2] == F.ACK]
        assert ack[4:] == [b"inform-1", *frame]


def test_one_ready_gives_several_credits_to_a_worker_that_asked(server: BrokerServer) -> None:
    port = port_of(server, EmqpWorkerPort)
    worker = worker_joins(server, b"w-batch", {"batch": 4}, credit=0)
    worker.send_multipart(F.encode_readies(b"ready-9", 5))
    read_turn(server, port, 1)
    assert port.peers[b"w-batch"].credit == 5
    plain = worker_joins(server, b"w-plain", {}, credit=0)
    plain.send_multipart(F.encode_readies(b"ready-9", 5))
    read_turn(server, port, 1)
    assert port.peers[b"w-plain"].credit == 0  # a 5-frame READY is malformed from it
    assert server.core.counters["dropped_malformed"] == 1


def test_a_reply_of_several_from_a_worker_that_did_not_ask_is_refused(
    server: BrokerServer,
) -> None:
    worker = worker_joins(server, b"w-plain", {}, credit=2)
    send_jobs(server, 2)
    got = messages(worker)
    answers = [(b'{"value": 5}', m[3], b"ok,ready") for m in got]
    worker.send_multipart(F.join_replies(b"reply-1", answers))
    read_turn(server, port_of(server, EmqpWorkerPort), 1)
    assert len(server.core.inflight) == 2  # nothing settled
    assert server.core.counters["succeeded"] == 0
    assert server.core.counters["dropped_malformed"] == 1  # as any REPLY of 10 frames


def test_the_ack_of_the_inform_says_replies_are_read_packed_only_to_a_worker_that_asked(
    server: BrokerServer,
) -> None:
    """``"packed_replies": true`` with a batch: the ACK of the INFORM has one frame
    more, after the batch's; without a batch, or not ``true``, it has not."""
    port = port_of(server, EmqpWorkerPort)
    cases = (
        (b"w-packed", {"batch": 4, "packed_replies": True}, [b"batch:4", F.PACKED_REPLIES_ACK]),
        (b"w-batch", {"batch": 4, "packed_replies": "yes"}, [b"batch:4"]),
        (b"w-alone", {"packed_replies": True}, []),
    )
    for identity, meta, frames in cases:
        sock = dealer(server, port, identity)
        sock.send_multipart(F.Inform(b"inform-1", ((10, "default"),), "worker", meta).encode())
        read_turn(server, port, 1)
        (ack,) = [m for m in messages(sock) if m[2] == F.ACK]
        assert ack[4:] == [b"inform-1", *frames]
        assert port.peers[identity].packed_replies is (identity == b"w-packed")


def test_one_replies_message_answers_several_jobs_and_a_malformed_one_is_dropped_whole(
    server: BrokerServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A REPLIES (protocol/batch.py): each answer settles its job and returns its
    credit, as in a REPLY of its own. One cut short (a poison message) settles
    nothing, is dropped with its reason in the log and counted, as a malformed
    REPLY is (a worker's answers get no answer), and the next one is read."""
    port = port_of(server, EmqpWorkerPort)
    worker = worker_joins(server, b"w-packed", {"batch": 8, "packed_replies": True}, credit=3)
    send_jobs(server, 3)
    (request,) = messages(worker)
    attempt_ids = [j[3] for j in F.split_batch(request) or []]
    answers = [(b'{"value": 5}', aid, b"ok,ready") for aid in attempt_ids[:2]]
    answers.append((b'{"error": "x"}', attempt_ids[2], b"failed,ready,error:ValueError"))
    good = encode_replies(b"replies-1", answers)
    worker.send_multipart([*good[:4], good[4][:-1]])
    read_turn(server, port, 1)
    core = server.core
    assert len(core.inflight) == 3 and core.counters["dropped_malformed"] == 1
    assert "REPLIES: answer 3 overruns the frame" in caplog.text
    worker.send_multipart(good)
    read_turn(server, port, 1)
    assert not core.inflight
    assert (core.counters["succeeded"], core.counters["failed"]) == (2, 1)
    assert port.peers[b"w-packed"].credit == 3


def test_a_replies_message_from_a_worker_that_did_not_ask_is_refused(
    server: BrokerServer,
) -> None:
    worker = worker_joins(server, b"w-batch", {"batch": 8}, credit=2)
    send_jobs(server, 2)
    (request,) = messages(worker)
    answers = [(b'{"value": 5}', j[3], b"ok,ready") for j in F.split_batch(request) or []]
    worker.send_multipart(encode_replies(b"replies-1", answers))
    read_turn(server, port_of(server, EmqpWorkerPort), 1)
    assert len(server.core.inflight) == 2  # nothing settled
    assert server.core.counters["dropped_malformed"] == 1


# ---- the worker process's side ------------------------------------------------------


def job(msgid: bytes, name: str, *args: Any) -> list[bytes]:
    """A REQUEST as our client sends it (with the task's name in its headers)."""
    body = encode_run_body(__name__, name, args)
    headers = format_headers(reply_requested=True, task=f"{__name__}.{name}")
    return F.encode_request(msgid, b"batch", headers, body)


class FakeBroker:
    """A ROUTER in the test's process, and a real SlotWorker forked to it."""

    def __init__(
        self,
        table: SlotTable,
        prefetch: int = 8,
        acks_batch: bool = True,
        reply_hold: float = 60.0,  # no timing in the tests: held answers wait for the batch
        reads_packed_replies: bool = False,
    ) -> None:
        from emq_django.worker.process import SlotConfig, SlotWorker

        self.ctx: zmq.Context[Any] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.url = f"tcp://127.0.0.1:{port}"
        config = SlotConfig(
            broker_url=self.url,
            queues=((10, "batch"),),
            manager="batch-test",
            slot=0,
            heartbeat_interval=1.0,
            heartbeat_liveness=5,
            prefetch=prefetch,
            reply_hold=reply_hold,
        )
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                code = SlotWorker(config, table).run()
            finally:
                os._exit(code)
        self.peer = b""
        self.inform: list[bytes] = []
        self.acks_batch = acks_batch  # ACK the INFORM as our broker does, or as an older one
        self.reads_packed_replies = reads_packed_replies  # ... and say it reads REPLIES
        self.reaped = False  # the test killed and reaped the worker itself

    def recv(self, wait_ms: int = WAIT_MS) -> list[bytes]:
        """The next message other than a HEARTBEAT or READY, without the identity."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            assert left > 0 and self.router.poll(left), "the worker sent nothing"
            frames = self.router.recv_multipart()
            self.peer = frames[0]
            if frames[3] == F.INFORM:
                self.inform = frames[1:]
                self.ack(frames)
                continue
            if frames[3] not in (F.HEARTBEAT, F.READY):
                return frames[1:]

    def wait_connected(self) -> None:
        deadline = time.monotonic() + WAIT_MS / 1000
        while not self.inform:
            assert time.monotonic() < deadline, "no INFORM"
            if self.router.poll(100):
                frames = self.router.recv_multipart()
                self.peer = frames[0]
                if frames[3] == F.INFORM:
                    self.inform = frames[1:]
                    self.ack(frames)

    def ack(self, frames: list[bytes]) -> None:
        ack = F.encode_ack(b"ack-1", frames[4])
        if self.acks_batch and b'"batch"' in frames[-1]:
            ack.append(F.batch_ack_frame(8))
            if self.reads_packed_replies:
                ack.append(F.PACKED_REPLIES_ACK)
        self.router.send_multipart([self.peer, *ack])

    def send(self, frames: list[bytes]) -> None:
        self.router.send_multipart([self.peer, *frames])

    def close(self) -> None:
        if not self.reaped:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        self.router.close(0)
        self.ctx.destroy(linger=0)


@pytest.fixture
def table() -> SlotTable:
    return SlotTable(1)


@pytest.fixture
def unblocked(django_db_blocker: Any) -> Iterator[None]:
    """Database access allowed, in this process and the forked worker: once an
    earlier test opened a connection, the worker closes old connections after
    each job, as in production, and pytest-django would refuse that."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def broker(table: SlotTable, unblocked: None) -> Iterator[FakeBroker]:
    b = FakeBroker(table)
    try:
        b.wait_connected()
        yield b
    finally:
        b.close()


def answers_of(reply: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """(body, ref, status) of each answer a REPLY (or a REPLIES) carries."""
    if reply[2] == REPLIES:
        return [(body, ref, status) for ref, status, body in decode_replies(reply)]
    assert reply[2] == F.REPLY
    parts = F.split_batch(reply) or [reply]
    return [(p[4], p[5], p[6]) for p in parts]


def test_the_worker_announces_how_many_jobs_it_takes(broker: FakeBroker) -> None:
    meta = json.loads(broker.inform[6])
    assert meta["batch"] == 8  # its prefetch, under the most it ever asks for


def test_jobs_run_back_to_back_are_answered_in_one_reply(broker: FakeBroker) -> None:
    jobs = [job(b"a#1", "add", 1, 2), job(b"b#1", "add", 3, 4), job(b"c#1", "add", 5, 6)]
    broker.send(F.join_requests(jobs[0], jobs[1:]))
    reply = broker.recv()
    assert len(reply) == 4 + 3 * 3
    got = answers_of(reply)
    assert [ref for _, ref, _ in got] == [b"a#1", b"b#1", b"c#1"]
    assert [json.loads(body)["value"] for body, _, _ in got] == [3, 7, 11]
    assert all(status.split(b",")[0] == b"ok" for _, _, status in got)


def test_a_worker_whose_broker_did_not_say_batch_answers_each_job_alone(
    table: SlotTable, unblocked: None
) -> None:
    """A broker from before the extension ACKs the INFORM with the document's 5
    frames: the process takes a batched REQUEST (that broker never sends one) but
    sends only the document's REPLYs and READYs."""
    broker = FakeBroker(table, acks_batch=False)
    try:
        broker.wait_connected()
        jobs = [job(b"a#1", "add", 1, 2), job(b"b#1", "add", 3, 4)]
        broker.send(F.join_requests(jobs[0], jobs[1:]))
        got = [broker.recv(), broker.recv()]
        assert [len(m) for m in got] == [7, 7]
        assert [m[5] for m in got] == [b"a#1", b"b#1"]
    finally:
        broker.close()


def test_packed_jobs_run_and_a_malformed_packing_is_dropped_whole(broker: FakeBroker) -> None:
    """The worker announces ``"packed"`` and runs a REQUESTS' jobs as a batched
    REQUEST's; a REQUESTS cut short (a poison message) is dropped whole, and the
    process serves the next one."""
    assert json.loads(broker.inform[6])["packed"] is True
    jobs = [job(b"a#1", "add", 1, 2), job(b"b#1", "add", 3, 4)]
    packed = encode_requests(b"m-1", [tuple(j[3:]) for j in jobs])  # type: ignore[misc]
    broker.send([*packed[:4], packed[4][:-3]])
    broker.send(packed)
    got = answers_of(broker.recv())
    assert [(ref, json.loads(body)["value"]) for body, ref, _ in got] == [(b"a#1", 3), (b"b#1", 7)]


def test_a_worker_whose_broker_reads_packed_replies_answers_in_one_frame(
    table: SlotTable, unblocked: None
) -> None:
    """The process announces ``"packed_replies"``; once the broker's ACK says it reads
    them, the answers to a batch go as one REPLIES (a record each, one frame), and
    a lone job's still as the document's REPLY."""
    broker = FakeBroker(table, reads_packed_replies=True)
    try:
        broker.wait_connected()
        assert json.loads(broker.inform[6])["packed_replies"] is True
        jobs = [job(b"a#1", "add", 1, 2), job(b"b#1", "add", 3, 4), job(b"c#1", "add", 5, 6)]
        broker.send(F.join_requests(jobs[0], jobs[1:]))
        reply = broker.recv()
        assert reply[2] == REPLIES and len(reply) == 5
        got = answers_of(reply)
        assert [(ref, json.loads(body)["value"]) for body, ref, _ in got] == [
            (b"a#1", 3),
            (b"b#1", 7),
            (b"c#1", 11),
        ]
        assert all(status.split(b",")[0] == b"ok" for _, _, status in got)
        broker.send(job(b"solo#1", "add", 2, 2))
        alone = broker.recv()
        assert alone[2] == F.REPLY and len(alone) == 7
    finally:
        broker.close()


def test_a_lone_job_is_answered_at_once_with_the_documents_reply(broker: FakeBroker) -> None:
    broker.send(job(b"solo#1", "add", 2, 2))
    reply = broker.recv()
    assert len(reply) == 7 and reply[5] == b"solo#1"
    assert json.loads(reply[4])["value"] == 4


def test_answers_held_while_a_job_runs_are_in_the_slot_table(
    broker: FakeBroker, table: SlotTable
) -> None:
    """The answers to the jobs before one whose task ran fast last time wait for it
    (they go in one message); when that job takes long after all, the slot table
    holds them meanwhile, so that the job manager can send them if the process
    dies; killed, its job manager sends them without the credit, after the answer
    the process sent last (it may have died in its socket's queue) and before the
    lost job's answer, then ENDED naming the process."""
    from emq_django.link import BrokerLink
    from emq_django.worker.jobmanager import JobManager, JobManagerConfig

    broker.send(job(b"n#0", "nap", 0))  # nap's last run: fast
    assert broker.recv()[5] == b"n#0"
    jobs = [job(b"a#1", "add", 1, 1), job(b"b#1", "add", 2, 2), job(b"n#1", "nap", 60)]
    broker.send(F.join_requests(jobs[0], jobs[1:]))
    deadline = time.monotonic() + WAIT_MS / 1000
    while table.read(0)[0] != b"n#1":
        assert time.monotonic() < deadline, "the long job never started"
        time.sleep(0.01)
    held = table.held(0)
    assert [ref for ref, _, _ in held] == [b"a#1", b"b#1"]
    assert [json.loads(body)["value"] for _, _, body in held] == [2, 4]
    os.kill(broker.pid, signal.SIGKILL)
    os.waitpid(broker.pid, 0)
    broker.reaped = True

    manager = JobManager(
        JobManagerConfig(broker_url=broker.url, queues=((10, "batch"),), concurrency=1)
    )
    manager.table = table
    manager.context = broker.ctx
    manager.link = BrokerLink(
        broker.ctx,
        broker.url,
        ((10, "batch"),),
        F.PEER_WORKER,
        {},
        heartbeat_interval=1.0,
        heartbeat_liveness=5,
    )
    manager.link.connect()
    try:
        manager._answer_for_lost_job(0, 12345, 9)  # as the reaper calls it: killed by signal 9
        got = [broker.recv() for _ in range(5)]
    finally:
        manager.link.close()
    replies, ended = got[:4], got[4]
    assert [m[5] for m in replies] == [b"n#0", b"a#1", b"b#1", b"n#1"]
    assert [m[6] for m in replies[:3]] == [b"ok"] * 3  # no "ready": the credit died with it
    assert [json.loads(m[4])["value"] for m in replies[1:3]] == [2, 4]
    assert F.reply_lost(replies[3][6]) is not None
    assert F.decode(ended) == F.Ended(ended[3], 12345, "killed by signal 9")
    assert not table.held(0) and not table.recent(0)


def test_answers_go_before_a_job_of_a_task_not_known_to_be_fast(
    table: SlotTable, unblocked: None
) -> None:
    """A job of a task that never ran here (or ran slower than the hold limit last
    time) may take long: the answers held go before it starts, not after it."""
    from emq_django.worker.process import HOLD_LIMIT

    broker = FakeBroker(table, reply_hold=HOLD_LIMIT)
    try:
        broker.wait_connected()
        _answers_go_first(broker)
    finally:
        broker.close()


def _answers_go_first(broker: FakeBroker) -> None:
    broker.send(job(b"n#0", "nap", 0.3))  # nap's last run: 0.3 s, slow
    assert broker.recv()[5] == b"n#0"
    for first, slow in ((b"a#1", "nap"), (b"b#1", "never")):
        if slow == "never":  # a task this process has not run yet
            jobs = [job(first, "add", 1, 1), job(b"s#1", "nap2", 0.3)]
        else:
            jobs = [job(first, "add", 1, 1), job(b"s#1", "nap", 0.3)]
        broker.send(F.join_requests(jobs[0], jobs[1:]))
        reply = broker.recv()
        assert [ref for _, ref, _ in answers_of(reply)] == [first]  # alone, at once
        assert [ref for _, ref, _ in answers_of(broker.recv())] == [b"s#1"]


def test_the_slot_table_keeps_held_answers_until_released() -> None:
    table = SlotTable(2)
    assert table.hold(1, b"x#1", b"ok,ready", b'{"value": 1}')
    assert table.hold(1, b"y#2", b"failed,error:E", b"{}")
    assert table.held(0) == []
    assert table.held(1) == [
        (b"x#1", b"ok,ready", b'{"value": 1}'),
        (b"y#2", b"failed,error:E", b"{}"),
    ]
    assert not table.hold(1, b"z#1", b"ok", b"x" * 20000)  # does not fit: not kept
    assert len(table.held(1)) == 2
    table.release(1)
    assert table.held(1) == []


def test_the_slot_table_keeps_the_answers_sent_last() -> None:
    """A ring of the last answers each process sent (a message in its socket's
    queue dies with it): the newest ``recent - 1``, oldest first, those sent since a
    time; a body too large for its record is not kept, its job's id is."""
    from emq_django.worker.slots import RECENT_RECORD

    table = SlotTable(2, recent=4)
    for n in range(6):
        table.sent(1, b"a#%d" % n, b"ok,ready", b'{"value": %d}' % n, 10.0 + n)
    assert table.recent(0) == []
    assert table.recent(1) == [(b"a#%d" % n, b"ok,ready", b'{"value": %d}' % n) for n in (3, 4, 5)]
    assert [ref for ref, _, _ in table.recent(1, since=14.0)] == [b"a#4", b"a#5"]
    table.sent(1, b"big#1", b"ok", b"x" * RECENT_RECORD, 20.0)
    assert table.recent(1)[-1] == (b"big#1", b"ok", None)
    table.forget_recent(1)
    assert table.recent(1) == []
