"""A worker process (a slot of a job manager): its own DEALER to the broker.

Jobs come straight from the broker to the process that runs them, with no hop
through the job manager: one READY per free slot, and the REPLY carries the
slot's credit back (status ``ok,ready``). The job manager watches over the
process through the shared ``SlotTable`` and vouches for it while it is busy.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import time
from dataclasses import dataclass
from typing import Any

import zmq

from emq_django import wire
from emq_django.exceptions import ProtocolError
from emq_django.protocol import frames as F
from emq_django.protocol.frames import PROTOCOL, decode
from emq_django.worker.credit import CreditPolicy
from emq_django.worker.execution import Outcome, execute
from emq_django.worker.recording import JobRecord, JobRecorder, load_recorder, split_attempt
from emq_django.worker.slots import SlotTable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SlotConfig:
    broker_url: str
    queues: tuple[tuple[int, str], ...]
    manager: str
    slot: int
    heartbeat_interval: float
    heartbeat_liveness: int
    prefetch: int = 1
    max_jobs: int = 0  # 0: no limit; else exit after this many (the manager respawns)
    max_memory_mb: int = 0  # 0: no limit; else exit once the process has grown past it
    recorder: str = ""  # EMQ_RECORDER: dotted path of a JobRecorder class
    incarnation: str = ""  # the job manager's run: tells it apart from an earlier one


class SlotWorker:
    def __init__(self, config: SlotConfig, table: SlotTable) -> None:
        self.config = config
        self.table = table
        self.context: zmq.Context[Any] = zmq.Context()
        self.sock: zmq.Socket[Any] | None = None
        self.stopping = False
        self.jobs_done = 0
        self._n = 0
        self._prefix = f"{os.getpid():x}-{config.slot}-".encode()
        self.last_recv = self.last_send = 0.0
        self.policy = CreditPolicy(config.prefetch)
        self.retiring = False
        self.recorder: JobRecorder | None = load_recorder(config.recorder)
        self.credit = 0

    def _id(self) -> bytes:
        self._n += 1
        return self._prefix + b"%x" % self._n

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job manager handles Ctrl-C
        self._connect()
        try:
            self._loop()
        finally:
            self._flush_recorder()
            if self.sock is not None:
                self.sock.close(linger=500)
            self.context.term()
        return 0

    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
        c = self.config
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(c.broker_url)
        meta = {
            "role": "slot",
            "manager": c.manager,
            "incarnation": c.incarnation,
            "slot": c.slot,
            "pid": os.getpid(),
        }
        sock.send_multipart(F.Inform(self._id(), c.queues, F.PEER_WORKER, meta).encode())
        self.sock = sock
        self.credit = 0  # jobs the broker may still send us
        self._grant(self._wanted())
        self.last_recv = self.last_send = time.monotonic()

    def _loop(self) -> None:
        c = self.config
        silence_limit = c.heartbeat_interval * c.heartbeat_liveness
        while not self.stopping:
            assert self.sock is not None
            self._flush_recorder()
            if self.sock.poll(int(c.heartbeat_interval * 1000)):
                self._drain()
            now = time.monotonic()
            if self.stopping:
                break
            if now - self.last_recv > silence_limit:
                log.info("broker silent for %.1f s; connecting again", now - self.last_recv)
                self._connect()
            elif now - self.last_send >= c.heartbeat_interval:
                self._send([b"", PROTOCOL, F.HEARTBEAT, self._id(), b"%f" % time.time()])
            if self.retiring:
                break
        self._goodbye()

    def _drain(self) -> None:
        sock = self.sock
        assert sock is not None
        while wire.readable(sock):
            frames = wire.recv(sock)
            self.last_recv = time.monotonic()
            try:
                cmd = decode(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            kind = type(cmd)
            if kind is F.Request:
                self._run(cmd)  # type: ignore[arg-type]
            elif kind is F.Kbye:
                log.info("the broker said goodbye; connecting again")
                self._connect()
                return

    def _run(self, req: F.Request) -> None:
        self.credit -= 1
        started = time.monotonic()
        self.table.start(self.config.slot, req.msgid, started, req.headers.timeout)
        outcome = execute(req.body, req.msgid)
        self.table.clear(self.config.slot)
        self.jobs_done += 1
        elapsed = time.monotonic() - started
        self.policy.observe(elapsed)
        if self.recorder is not None:
            self._record(req, outcome, elapsed)
        wanted = self._wanted()
        if self.stopping or self._should_retire():
            wanted = 0  # no more credit from this process
        # the REPLY gives one credit back ("ready") when we want more than we hold
        give_back = self.credit < wanted
        status = outcome.status(ready=give_back)
        self._send([b"", PROTOCOL, F.REPLY, self._id(), outcome.body, req.msgid, status])
        if give_back:
            self.credit += 1
            self._grant(wanted - self.credit)

    def _record(self, req: F.Request, outcome: Outcome, elapsed: float) -> None:
        assert self.recorder is not None
        job_id, attempt = split_attempt(req.msgid)
        spec = outcome.spec
        finished = time.time()
        record = JobRecord(
            job_id,
            attempt,
            req.headers.task or (spec.task_name if spec else ""),
            req.queue,
            spec.args if spec else [],
            spec.kwargs if spec else {},
            finished - elapsed,
            finished,
            outcome.failed,
            outcome.error_type,
            outcome.body,
            self.config.manager,
        )
        try:
            self.recorder.record(record)
        except Exception:
            log.exception("the job recorder failed on job %s", job_id)

    def _flush_recorder(self) -> None:
        if self.recorder is not None:
            try:
                self.recorder.flush()
            except Exception:
                log.exception("the job recorder failed to flush")

    def _wanted(self) -> int:
        """The credit to hold: the policy's, but never more jobs than this process
        has left before --max-jobs-per-worker retires it."""
        wanted = self.policy.wanted()
        if self.config.max_jobs:
            wanted = min(wanted, self.config.max_jobs - self.jobs_done)
        return max(wanted, 0)

    def _should_retire(self) -> bool:
        """After too many jobs or too much memory, finish and let the manager
        start a fresh process."""
        c = self.config
        if c.max_jobs and self.jobs_done >= c.max_jobs:
            self.retiring = True
        elif c.max_memory_mb and _peak_rss_mb() > c.max_memory_mb:
            log.info(
                "worker process %d grew past %d MB; it will be replaced",
                os.getpid(),
                c.max_memory_mb,
            )
            self.retiring = True
        return self.retiring

    def _grant(self, count: int) -> None:
        """Send ``count`` READYs: one credit each."""
        for _ in range(count):
            self._send([b"", PROTOCOL, F.READY, self._id()])
        self.credit += max(count, 0)

    def _send(self, frames: list[bytes]) -> None:
        assert self.sock is not None
        wire.send(self.sock, frames, nonblocking=False)
        self.last_send = time.monotonic()

    def _goodbye(self) -> None:
        """DISCONNECT, then run whatever the broker had already sent until its KBYE."""
        if self.sock is None:
            return
        self._send([b"", PROTOCOL, F.DISCONNECT, self._id()])
        deadline = time.monotonic() + self.config.heartbeat_interval * 2
        while time.monotonic() < deadline and self.sock.poll(100):
            frames = self.sock.recv_multipart()
            try:
                cmd = decode(frames)
            except ProtocolError:
                continue
            if type(cmd) is F.Request:
                self._run(cmd)
            elif type(cmd) is F.Kbye:
                return


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
