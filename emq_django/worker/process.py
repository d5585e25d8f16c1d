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
from typing import Any

import zmq

from emq_django import otel, signals, wire
from emq_django.exceptions import (
    Cancelled,
    HandshakeRefused,
    ProtocolError,
)
from emq_django.link import REFUSED_EXIT, BrokerLink
from emq_django.logconfig import job_fields
from emq_django.protocol import frames as F
from emq_django.protocol.batch import REQUESTS, answers_frames, unpack_requests
from emq_django.protocol.body import encode_failure
from emq_django.protocol.headers import Headers
from emq_django.task import SOFT_TIMEOUT_HEADER
from emq_django.worker import observing
from emq_django.worker.credit import CreditPolicy
from emq_django.worker.execution import (
    Outcome,
    execute_counting,
    note_open_connections,
)
from emq_django.worker.kept_records import SlotRecords
from emq_django.worker.partial_sender import PARTIAL_SEND_WAIT, PartialOut, PartialSender
from emq_django.worker.ranked import RANK, LocalOrder, run_ranked
from emq_django.worker.slot_config import (
    BATCH,
    HOLD_LIMIT,
    LAST_RUN_TASKS,
    MAX_CANCELLED_KEPT,
    READY_BATCH_DIVISOR,
    SlotConfig,
)
from emq_django.worker.slot_limits import SoftLimit
from emq_django.worker.slot_recording import SlotRecording
from emq_django.worker.slots import SlotTable, answers_again

log = logging.getLogger(__name__)

# (the loop's configuration and constants live in slot_config.py; named here too)
__all__ = [
    "BATCH",
    "HOLD_LIMIT",
    "LAST_RUN_TASKS",
    "MAX_CANCELLED_KEPT",
    "PARTIAL_SEND_WAIT",
    "READY_BATCH_DIVISOR",
    "SlotConfig",
    "SlotWorker",
]
CANCELLED = Cancelled.TYPE
_monotonic = time.monotonic
_REQUEUE_READY = F.REQUEUE_STATUS + b"," + F.FLAG_READY
_PROTOCOL_ERROR = "emq_django.exceptions.ProtocolError"  # as execution.py names it
_NEVER_RAN = float("inf")  # tasks whose last run time is kept (then forgotten, all at once)


class SlotWorker:
    def __init__(
        self, config: SlotConfig, table: SlotTable, kept: SlotRecords | None = None
    ) -> None:
        self.config = config
        self.table = table
        self.context: zmq.Context[Any] = zmq.Context()
        meta = {
            "role": "slot",
            "manager": config.manager,
            "incarnation": config.incarnation,
            "slot": config.slot,
            "pid": os.getpid(),
        }
        if config.prefetch > 1:  # with one job at a time there is nothing to batch
            meta["batch"] = min(config.prefetch, BATCH)
            meta[F.PACKED_META] = True  # ... in one frame (a REQUESTS): fewer libzmq calls
            meta[F.PACKED_REPLIES_META] = True  # ... and our answers (a REPLIES), if it reads them
        self.link = BrokerLink(
            self.context,
            config.broker_url,
            config.queues,
            F.PEER_WORKER,
            meta,
            heartbeat_interval=config.heartbeat_interval,
            heartbeat_liveness=config.heartbeat_liveness,
            on_connect=self._on_connect,
            more_meta=self._answered,
        )
        self.stopping = False
        # a job overran its time limit or was cancelled: this process is being killed;
        # it reports that job as failed and gives the jobs it holds back unstarted
        self.abandoning = False
        self.jobs_done = 0
        self.policy = CreditPolicy(config.prefetch)
        self.retiring = False
        self.recording: SlotRecording | None = None
        if config.recorder_endpoint:
            self.recording = SlotRecording(
                self.context,
                config.recorder_endpoint,
                config.record_buffer,
                config.manager,
                kept,
                config.record_interval,
                config.record_batch,
            )
        self.partials = PartialOut(self.link)
        self.credit = 0
        self._timed_sock: zmq.Socket[Any] | None = None  # the socket whose RCVTIMEO is set
        self._timeout = 0  # ... to this many ms
        # answers not sent yet, (body, ref, status), also in the slot table
        self._held: list[tuple[bytes, bytes, bytes]] = []
        self._held_since = 0.0  # monotonic: when the oldest of them was finished
        self._last_run: dict[str | None, float] = {}  # task -> its last run, seconds
        self._queued = 0  # jobs of the REQUEST being run that have not started yet
        # attempts its job manager said were cancelled (slots.cancel_unstarted), as
        # far as this process has read them: it gives such a job back unstarted
        self._cancels_seen = 0
        self._cancelled: set[bytes] = set()
        # the broker said (in its ACK of our INFORM) that it takes REPLYs of several
        # answers and READYs of several credits (and reads REPLIES: ``packed_replies``);
        # until then, the document's only
        self.batching = self.packed_replies = False
        self.soft_limit = SoftLimit()
        self.order = LocalOrder()  # ranked queues' jobs held (worker/ranked.py)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGALRM, self.soft_limit.on_alarm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job manager handles Ctrl-C
        note_open_connections()
        try:
            self.link.connect()  # (a refusal may come before its INFORM is queued)
            self._loop()
        except HandshakeRefused as exc:
            # the job manager, on the same key, is refused too and stops
            log.error("worker process for slot %d: %s", self.config.slot, exc)
            return REFUSED_EXIT
        finally:
            if self.recording is not None:
                self.recording.close()
            self.link.close(linger=500)
            self.context.term()
        return 0

    def _answered(self) -> dict[str, Any]:
        """For an INFORM: the jobs whose answers this process sent last or holds
        (``answered``). Connecting again (the broker was silent: a stall, a cut),
        it sends them again on the new connection: the broker keeps those jobs in
        flight at it, and gives the others back to their queue (they died unread
        with the old socket)."""
        refs = [ref for ref, _, _ in answers_again(self.table, self.config.slot)]
        refs += [ref for _, ref, _ in self._held]
        return {"answered": [r.decode("utf-8", "surrogateescape") for r in refs]} if refs else {}

    def _on_connect(self) -> None:
        self.credit = 0  # a fresh connection: the broker owes us nothing
        self.batching = self.packed_replies = False  # until this broker's ACK says otherwise
        for ref, status, body in answers_again(self.table, self.config.slot):
            self.link.send(F.encode_reply(self.link.new_id(), body, ref, status))
        # answers held for the old connection go out on the new one (the broker
        # takes them from a peer of the same job manager), without their credit:
        # that was the old connection's
        self._send_held(credit=False)
        self._grant(self._wanted())

    def _loop(self) -> None:
        while not self.stopping and not self.retiring and not self.abandoning:
            wait = self.config.heartbeat_interval
            if self.recording is not None:
                wait = self.recording.turn(wait)
            frames = self._next(wait)
            if frames is not None:
                self._handle(frames)
            if self.stopping or self.retiring or self.abandoning:
                break
            self.link.tick()
        self._send_held()
        self._goodbye()

    def _next(self, wait: float) -> list[bytes] | None:
        """The next message from the broker, waiting up to ``wait`` seconds; None if
        none came. One blocking receive (the socket's RCVTIMEO), not a poll followed
        by a receive: a job that arrives while the process waits costs one call."""
        sock = self.link.sock
        assert sock is not None
        if self._held:
            # answers wait: they go now unless another message is already here
            # (then they go with the answers to its jobs)
            if _monotonic() - self._held_since < self.config.reply_hold and wire.readable(sock):
                frames = wire.recv(sock)
                self.link.last_recv = time.monotonic()
                return frames
            self._send_held()
        timeout = max(int(wait * 1000), 0) + 1
        if sock is not self._timed_sock or timeout != self._timeout:
            sock.setsockopt(zmq.RCVTIMEO, timeout)
            self._timed_sock, self._timeout = sock, timeout
        try:
            frames = wire.recv(sock, nonblocking=False)
        except zmq.Again:
            return None
        self.link.last_recv = time.monotonic()
        return frames

    def _handle(self, frames: list[bytes]) -> None:
        try:
            # a REQUEST, most likely: its fields without a Request object (a frozen
            # dataclass costs several µs to build); anything else through decode()
            n = len(frames)
            if 6 <= n <= 7 and frames[2] == F.ACK and F.acked_batch(frames):
                self.batching = True  # the ACK of our INFORM: batches welcome
                self.packed_replies = frames[-1] == F.PACKED_REPLIES_ACK
                return
            if n > 7:
                jobs = F.split_batch(frames)
                if jobs is not None and frames[2] == F.REQUEST:
                    self._run_batch(jobs)
                    return
            elif n == 5 and frames[2] == REQUESTS:  # the batch packed: one frame of records
                self._run_batch(unpack_requests(frames))
                return
            if n == 7 and RANK in frames[5] and frames[2] == F.REQUEST:
                self._run_ranked([frames])  # a ranked queue's job (worker/ranked.py)
                return
            fields = F.request_fields(frames) if n == 7 else None
            if fields is not None:
                if self.abandoning:
                    self._give_back(frames[3])
                else:
                    self._run(frames[3], fields[0], fields[1], frames[6])
                return
            cmd = F.decode(frames)
        except ProtocolError as exc:
            if len(frames) == 7 and frames[2] == F.REQUEST and frames[3]:
                self._fail_unstarted(frames[3], _PROTOCOL_ERROR, exc.reason)
            else:
                log.warning(
                    "dropped a malformed message from the broker at %s: %s", self.link.url, exc
                )
            return
        if type(cmd) is F.Request:
            if self.abandoning:
                self._give_back(cmd.msgid)
            else:
                self._run(cmd.msgid, cmd.queue, cmd.headers, cmd.body)
        elif type(cmd) is F.Kbye:
            log.info("the broker said goodbye; connecting again")
            self.link.connect()

    def _run_batch(self, jobs: list[list[bytes]]) -> None:
        """The jobs of one REQUEST (the "batch" extension), one by one."""
        self._queued = len(jobs)
        for i, frames in enumerate(jobs):
            self._queued -= 1
            if RANK in frames[5]:  # a ranked queue's job, and those after it
                self._run_ranked(jobs[i:])
                break
            try:
                fields = F.request_fields(frames)
            except ProtocolError as exc:
                self._fail_unstarted(frames[3], _PROTOCOL_ERROR, exc.reason)
                continue
            if fields is None:
                continue
            if self.abandoning:
                self._give_back(frames[3])
            else:
                self._run(frames[3], fields[0], fields[1], frames[6])
        self._queued = 0

    def _run_ranked(self, jobs: list[list[bytes]]) -> None:
        """Jobs of a ranked queue (a ``rank`` header), and what comes after them, the
        best-ranked first (worker/ranked.py)."""
        run_ranked(self, jobs)

    def _run(self, msgid: bytes, queue: str, h: Headers, body: bytes) -> None:
        if self._held and (
            _monotonic() - self._held_since >= self.config.reply_hold
            or self._last_run.get(h.task or None, _NEVER_RAN) >= self.config.reply_hold
        ):
            self._send_held()  # this job may take long: the answers held go first
        self.credit -= 1
        started = _monotonic()
        slot = self.config.slot
        try:
            self.table.start(
                slot, msgid, started, h.timeout, queue, h.task, h.retry_count, h.guarantee, body
            )
        except Exception as exc:  # the job never started: a failed attempt, not a death
            log.exception(
                "slot %d: could not start job %r",
                slot,
                msgid,
                extra=job_fields(msgid, queue, h.task),
            )
            self.table.clear(slot)
            self.credit += 1  # back: _fail_unstarted counts it as _give_back does
            self._fail_unstarted(msgid, type(exc).__name__, f"the job could not start: {exc}")
            return
        # (after start: see SlotTable.cancel_unstarted)
        if self._was_cancelled(msgid):
            self.table.clear(slot)
            self._skip_cancelled(msgid)
            return
        observed = signals.worker_listened or otel.api._TRACER_PROVIDER is not None
        view = observing.started(msgid, queue, h, body) if observed else None
        if h.extra and h.get(SOFT_TIMEOUT_HEADER):
            outcome = self.soft_limit.execute(body, msgid, h, PartialSender(self.partials, msgid))
        else:
            outcome = execute_counting(body, msgid, PartialSender(self.partials, msgid))
        self.jobs_done += 1
        elapsed = _monotonic() - started
        if h.timeout or self.table.cancelled(slot):
            outcome = self._overruled(outcome, elapsed, h.timeout)
        if view is not None:
            observing.finished(view, outcome)
        self.policy.observe(elapsed)
        last_run = self._last_run
        if h.task:  # (a job without a task header, EventMQ's, is never known fast)
            if len(last_run) >= LAST_RUN_TASKS and h.task not in last_run:
                last_run.clear()
            last_run[h.task] = elapsed
        if self.recording is not None:
            self.recording.add(msgid, queue, h, body, outcome, elapsed)
        wanted = self._wanted()
        if self.stopping or self.abandoning or self._should_retire():
            wanted = 0  # no more credit from this process
        # The REPLY gives one credit back ("ready") while the process holds less than
        # it wants, or a little more (a quarter; never past the policy's maximum or
        # --max-jobs-per-worker): the wish is an average of job times and moves up
        # and down by a few; following each step would cost a READY (a message, and a
        # wake of the socket's I/O thread) after every few jobs.
        give_back = self.credit < wanted or self.credit < self._ceiling(wanted)
        status = outcome.status(ready=give_back)
        if (
            (self._queued or self._held)
            and self.batching
            and not self.abandoning
            and len(self._held) < BATCH
            and self.table.hold(slot, msgid, status, outcome.body)
        ):
            # more jobs here to run (or answers held already): this answer goes with
            # theirs; held in the slot table first, so that its job manager sends it
            # if this process dies
            if not self._held:
                self._held_since = _monotonic()
            self._held.append((outcome.body, msgid, status))
            self.table.clear(slot)
            if not self._queued and not (
                _monotonic() - self._held_since < self.config.reply_hold
                and self.link.sock is not None
                and wire.readable(self.link.sock)
            ):
                self._send_held()
        else:
            self._send_held()
            # kept before it leaves (it may die in the socket's queue with this
            # process) and cleared after: killed in between, its job manager sends
            # this answer again, not a lost one
            self.table.sent(slot, msgid, status, outcome.body, started + elapsed)
            self.link.send(F.encode_reply(self.link.new_id(), outcome.body, msgid, status))
            self.table.clear(slot)
        if give_back:
            self.credit += 1
            # more credit than the REPLY returned: READYs, once the shortfall is at
            # least an eighth of the wish (at once for a wish under 8)
            deficit = wanted - self.credit
            if deficit > 0 and deficit * READY_BATCH_DIVISOR >= wanted:
                self._grant(deficit)

    def _send_held(self, credit: bool = True) -> None:
        """The answers held back, in one REPLY (one alone, or each alone until the
        broker said it takes several, as the document's); without ``credit``,
        their ``ready`` flags are dropped."""
        held = self._held
        if not held:
            return
        if not credit:
            held = [(body, ref, F.without_ready(status)) for body, ref, status in held]
        if self.link.sock is not None:
            slot, at, sent = self.config.slot, _monotonic(), self.table.sent
            for body, ref, status in held:
                sent(slot, ref, status, body, at)
            if len(held) > 1 and self.batching:
                self.link.send(answers_frames(self.link.new_id(), held, self.packed_replies))
            else:  # (a new connection's broker has not said it takes several yet)
                for body, ref, status in held:
                    self.link.send(F.encode_reply(self.link.new_id(), body, ref, status))
        self._held = []
        self.table.release(self.config.slot)

    def _overruled(self, outcome: Outcome, elapsed: float, timeout: float) -> Outcome:
        """A job cancelled while it ran, or that ran past its time limit, failed,
        whatever it returned during the kill grace (its job manager is killing this
        process)."""
        if self.table.cancelled(self.config.slot):
            self.abandoning = True
            body = encode_failure(CANCELLED, "the job was cancelled while it ran", "")
            return Outcome(body, True, CANCELLED, outcome.spec)
        if timeout and elapsed >= timeout:
            self.abandoning = True
            message = f"job ran {elapsed:.3f} s, longer than its time limit of {timeout:g} s"
            return Outcome(
                encode_failure("TimeoutError", message, ""), True, "TimeoutError", outcome.spec
            )
        return outcome

    def _was_cancelled(self, msgid: bytes) -> bool:
        """Whether its job manager has noted ``msgid`` as cancelled (read now, or at
        an earlier job's start: the job may have waited in the socket since)."""
        if self.table.cancel_count() != self._cancels_seen:
            self._cancels_seen, ids = self.table.cancels_since(self._cancels_seen)
            if len(self._cancelled) > MAX_CANCELLED_KEPT:
                self._cancelled.clear()  # (their jobs were given back long ago)
            self._cancelled.update(ids)
        return msgid in self._cancelled

    def _skip_cancelled(self, msgid: bytes) -> None:
        """A job cancelled before it started: given back unstarted with its credit
        (the broker ends it as cancelled: it never ran)."""
        log.info(
            "job %s was cancelled before it started",
            msgid.decode(errors="replace"),
            extra=job_fields(msgid),
        )
        self._cancelled.discard(msgid)
        self.credit += 1  # back: _run counted the job against it
        self._give_back(msgid, ready=True)

    def _fail_unstarted(self, msgid: bytes, error: str, reason: str) -> None:
        """A job this process cannot start (its headers do not parse, its slot
        cannot hold it): a failed attempt with the reason, which the broker counts
        against its retries, never a death and an uncounted requeue."""
        log.warning(
            "failed job %s without starting it: %s",
            msgid.decode(errors="replace"),
            reason,
            extra=job_fields(msgid),
        )
        self._send_held()
        ready = not (self.stopping or self.abandoning)
        if not ready:
            self.credit -= 1  # the job took a credit; with ready, its REPLY returns it
        outcome = Outcome(encode_failure(error, reason, ""), True, error)
        self.link.send(
            F.encode_reply(self.link.new_id(), outcome.body, msgid, outcome.status(ready))
        )

    def _give_back(self, msgid: bytes, ready: bool = False) -> None:
        """A job this process will not start: back to the broker, uncounted;
        ``ready``: with its credit (this process goes on)."""
        self._send_held()
        if not ready:
            self.credit -= 1  # the job took a credit; with ready, its REPLY returns it
        status = _REQUEUE_READY if ready else F.REQUEUE_STATUS
        self.link.send(F.encode_reply(self.link.new_id(), b"{}", msgid, status))

    def _wanted(self) -> int:
        """The credit to hold: the policy's, but never more jobs than this process
        has left before --max-jobs-per-worker retires it."""
        wanted = self.policy.wanted()
        if self.config.max_jobs:
            wanted = min(wanted, self.config.max_jobs - self.jobs_done)
        return max(wanted, 0)

    def _ceiling(self, wanted: int) -> int:
        """The most credit the process keeps when it holds more than it wants."""
        if not wanted:
            return 0
        ceiling = min(wanted + wanted // 4, self.policy.maximum)
        if self.config.max_jobs:
            ceiling = min(ceiling, self.config.max_jobs - self.jobs_done)
        return ceiling

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
        """Send ``count`` READYs: one credit each (one READY naming the count when
        the broker takes several per READY)."""
        if count > 1 and self.batching:
            for start in range(0, count, F.MAX_READY_COUNT):
                n = min(count - start, F.MAX_READY_COUNT)
                self.link.send(F.encode_readies(self.link.new_id(), n))
        else:
            for _ in range(count):
                self.link.send(F.encode_ready(self.link.new_id()))
        self.credit += max(count, 0)

    def _goodbye(self) -> None:
        """DISCONNECT, then run whatever the broker had already sent until its KBYE."""
        if self.link.sock is None:
            return
        for cmd in self.link.goodbye(wait=self.config.heartbeat_interval * 2):
            if type(cmd) is F.Request:
                if self.abandoning:
                    self._give_back(cmd.msgid)
                else:
                    self._run(cmd.msgid, cmd.queue, cmd.headers, cmd.body)
        self._send_held()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
