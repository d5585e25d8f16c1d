"""The job manager: supervises a pool of worker processes (slots).

It holds a control connection to the broker (INFORM with ``role: manager``,
heartbeats), forks one process per slot (as many as the broker's RESIZE says
from then on: resizing.py), restarts those that die, kills those
that overrun their time limit, and answers for a job whose process it lost. The
first SIGTERM lets running jobs finish and says goodbye; a second stops at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket as pysocket
import time
from typing import Any

import zmq

from emq_django.exceptions import HandshakeRefused
from emq_django.link import REFUSED_EXIT, BrokerLink
from emq_django.logconfig import job_fields
from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_failure
from emq_django.protocol.limits import GUARANTEED_DEATH_RETRIES
from emq_django.worker.child_processes import describe_status, die_with_parent, kill_quietly
from emq_django.worker.jobmanager_config import JobManagerConfig, parse_queue_option
from emq_django.worker.kept_records import KeptRecords
from emq_django.worker.memory import MemoryReport
from emq_django.worker.process import SlotWorker
from emq_django.worker.record_forwarder import RecordForwarder
from emq_django.worker.recorder_process import RecorderProcess, recorder_endpoint
from emq_django.worker.recording import load_recorder
from emq_django.worker.resizing import capacity, to_start, to_stop
from emq_django.worker.slot_config import BATCH, SlotConfig
from emq_django.worker.slots import SlotTable, answers_again

log = logging.getLogger(__name__)
__all__ = ["JobManager", "JobManagerConfig", "parse_queue_option"]
WORKER_LOST = "emq_django.exceptions.WorkerLost"
CANCELLED = "emq_django.exceptions.Cancelled"

RECORDER_RESPAWN_DELAY = 1.0  # seconds between restarts of a recorder process that died
RECORDER_STOP_WAIT = 30.0  # seconds a stopping recorder process gets to write its backlog


class JobManager:
    def __init__(self, config: JobManagerConfig) -> None:
        self.config = config
        self.name = config.name or f"{pysocket.gethostname()}:{os.getpid()}"
        self.incarnation = os.urandom(4).hex()  # this run, as opposed to its name
        # each process keeps the answers it sent last: more than it can have in
        # flight (its credit and a batch), which its job manager sends again
        # the processes it runs: --concurrency, then the broker's RESIZE (resizing.py)
        self.concurrency = config.concurrency
        self.slots = capacity(config.concurrency, config.max_concurrency)
        self.table = SlotTable(self.slots, recent=2 * (config.prefetch + BATCH) + 8)
        self.children: dict[int, int] = {}  # pid -> slot
        self.retiring: set[int] = set()  # processes a shrink stopped: not replaced
        self.kill_deadlines: dict[int, float] = {}  # pid -> when to SIGKILL
        self.signals = 0
        self.context: zmq.Context[Any] | None = None
        self.link: BrokerLink | None = None
        # The recorder process writes the job history for every slot (recorder_process.py).
        self.recorder_endpoint = recorder_endpoint() if config.recorder else ""
        self.recorder_pid = 0
        self._recorder_respawn_at = 0.0
        self.recorder: RecordForwarder | None = None  # lost jobs' records; made in run()
        # the records each worker process has not handed over: they outlive it
        self.kept = KeptRecords(self.slots) if config.recorder else None

    # ---- lifecycle ----------------------------------------------------------

    def run(self) -> int:
        from django.db import connections

        connections.close_all()  # children must not share the parent's connections
        load_recorder(self.config.recorder)  # a wrong EMQ_RECORDER fails here, once
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.recorder_endpoint:
            self._spawn_recorder()
        for slot in range(self.config.concurrency):
            self._spawn(slot)
        self.context = zmq.Context()
        if self.recorder_endpoint:
            self.recorder = RecordForwarder(
                self.context, self.recorder_endpoint, self.config.record_buffer, self.name
            )
        meta = {
            "role": "manager",
            "manager": self.name,
            "incarnation": self.incarnation,
            "host": pysocket.gethostname(),
            "pid": os.getpid(),
            "concurrency": self.config.concurrency,
            "max_concurrency": self.slots,
        }
        self.link = BrokerLink(
            self.context,
            self.config.broker_url,
            self.config.queues,
            F.PEER_WORKER,
            meta,
            heartbeat_interval=self.config.heartbeat_interval,
            heartbeat_liveness=self.config.heartbeat_liveness,
            report=MemoryReport(lambda: list(self.children)),  # its memory, now and then
        )
        log.info(
            "job manager %s: %d worker processes on queues %s, broker %s",
            self.name,
            self.config.concurrency,
            ",".join(f"{n}:{w}" for w, n in self.config.queues),
            self.config.broker_url,
        )
        try:
            # connect() too: a refusal may come before its INFORM could be queued
            self.link.connect()
            return self._loop()
        except HandshakeRefused as exc:
            return self._refused(exc)
        finally:
            # stopping at once (a second signal): the history gets a moment, not more
            at_once = self.signals > 1
            if self.recorder is not None:  # sends the lost jobs' records not yet sent
                self.recorder.close(linger=0.5 if at_once else 5.0)
            self._stop_recorder(2.0 if at_once else RECORDER_STOP_WAIT)
            self.link.close(linger=200)
            self.context.term()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("stopping: letting running jobs finish (send the signal again to stop now)")
            for pid in list(self.children):
                kill_quietly(pid, signal.SIGTERM)
        else:
            log.warning("stopping now: killing %d worker processes", len(self.children))
            for pid in list(self.children):
                kill_quietly(pid, signal.SIGKILL)

    def _loop(self) -> int:
        assert self.link is not None
        while True:
            if self.link.poll(self._poll_timeout()):
                self._drain()
            self._reap()
            if self.signals and not self.children:
                self._goodbye()
                return 0
            if self.signals > 1:
                return 1
            if self.recorder_endpoint and not self.recorder_pid:
                if time.monotonic() >= self._recorder_respawn_at:
                    self._spawn_recorder()
            self._enforce_time_limits(time.monotonic())
            self.link.tick()

    def _refused(self, exc: HandshakeRefused) -> int:
        """The broker refused this job manager's handshake: it will never get work
        on that key. Say why, stop the worker processes (SIGTERM, SIGKILL after the
        grace) and exit with ``REFUSED_EXIT`` for the supervisor to see."""
        log.error(
            "job manager %s: %s. Stopping (exit code %d): register this process's key with "
            "the worker role (manage.py emq_keys), or correct EMQ_CURVE_SECRET_KEY / "
            "EMQ_CURVE_SERVER_KEY, and start it again",
            self.name,
            exc,
            REFUSED_EXIT,
        )
        self.signals = max(self.signals, 1)  # no respawns while the children go
        for pid in list(self.children):
            kill_quietly(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.kill_grace
        while self.children and time.monotonic() < deadline:
            self._reap_quietly()
            time.sleep(0.02)
        for pid in list(self.children):
            kill_quietly(pid, signal.SIGKILL)
        while self.children:
            self._reap_quietly(block=True)
        return REFUSED_EXIT

    def _reap_quietly(self, block: bool = False) -> None:
        """Reap worker processes without answering for their jobs (no broker takes
        the answers: it refused us)."""
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.children.clear()
            return
        if pid == self.recorder_pid:
            self.recorder_pid = 0
        self.children.pop(pid, None)

    def _poll_timeout(self) -> float:
        timeout = self.config.heartbeat_interval
        if self.kill_deadlines:  # a process is being killed: reap it, answer for it
            return min(timeout, 0.02)
        if self.signals:
            return min(timeout, 0.1)
        now = time.monotonic()
        for slot in self.children.values():
            _, started, limit = self.table.read(slot)
            if limit:
                timeout = min(timeout, max(0.01, started + limit - now))
        return timeout

    # ---- broker connection --------------------------------------------------

    def _drain(self) -> None:
        assert self.link is not None
        for cmd in self.link.messages():
            if type(cmd) is F.Kill:
                self._kill_attempt(cmd.attempt_id, cmd.reason)
            elif type(cmd) is F.Stop and not self.signals:
                log.info("the broker asks to stop (%s)", cmd.reason)
                self._on_signal(signal.SIGTERM, None)  # as on the first SIGTERM
            elif type(cmd) is F.Resize and not self.signals:
                self._resize(min(cmd.concurrency, self.slots))
            elif type(cmd) is F.Kbye and not self.signals:
                log.info("the broker said goodbye; connecting again")
                self.link.connect()
                return

    def _resize(self, wanted: int) -> None:
        """Run ``wanted`` worker processes: stop idle ones first, or start more."""
        stopping = to_stop(self.children, self.retiring, self.table, wanted)
        log.info("resize: %d -> %d worker processes", self.concurrency, wanted)
        self.concurrency = wanted
        if self.link is not None:  # what its INFORM says from now on (a reconnect)
            self.link.meta["concurrency"] = wanted
        for pid in stopping:
            self.retiring.add(pid)
            kill_quietly(pid, signal.SIGTERM)  # its running job finishes first
        for slot in to_start(self.children, self.retiring, self.slots, wanted):
            self._spawn(slot)

    def _kill_attempt(self, attempt_id: bytes, reason: str) -> None:
        """The broker's KILL (a job cancelled while it runs): stop the process that
        runs ``attempt_id`` as for a time limit, SIGTERM then SIGKILL after the grace.
        The broker may have sent the job ahead to a process busy with another: it is
        noted in the slot table first, and that process gives it back unstarted
        (the broker then ends it cancelled)."""
        self.table.cancel_unstarted(attempt_id)
        for pid, slot in self.children.items():
            if self.table.read(slot)[0] != attempt_id:
                continue
            self.table.mark_cancelled(slot)
            log.warning(
                "slot %d: job %s %s; stopping process %d",
                slot,
                attempt_id.decode(errors="replace"),
                reason,
                pid,
            )
            if pid not in self.kill_deadlines:
                kill_quietly(pid, signal.SIGTERM)
                self.kill_deadlines[pid] = time.monotonic() + self.config.kill_grace
            return
        log.info(
            "asked to stop job %s, which no worker process runs: it will not start",
            attempt_id.decode(errors="replace"),
        )

    def _goodbye(self) -> None:
        assert self.link is not None
        for _ in self.link.goodbye(wait=0.5):
            pass
        log.info("job manager %s stopped", self.name)

    # ---- worker processes ---------------------------------------------------

    def _spawn(self, slot: int) -> None:
        c = self.config
        cfg = SlotConfig(
            broker_url=c.broker_url,
            queues=c.queues,
            manager=self.name,
            incarnation=self.incarnation,
            slot=slot,
            heartbeat_interval=c.heartbeat_interval,
            heartbeat_liveness=c.heartbeat_liveness,
            prefetch=c.prefetch,
            max_jobs=c.max_jobs_per_worker,
            max_memory_mb=c.max_memory_mb,
            record_interval=c.record_interval,
            record_batch=c.record_batch,
            record_buffer=c.record_buffer,
            recorder_endpoint=self.recorder_endpoint,
        )
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                die_with_parent()
                kept = self.kept.writer(slot) if self.kept is not None else None
                code = SlotWorker(cfg, self.table, kept).run()
            except BaseException:
                log.exception("worker process for slot %d crashed", slot)
            finally:
                os._exit(code)
        self.children[pid] = slot

    def _spawn_recorder(self) -> None:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                die_with_parent()
                code = RecorderProcess(
                    self.recorder_endpoint,
                    self.config.recorder,
                    self.config.recorder_priority,
                    self.config.recorder_max_delay,
                ).run()
            except BaseException:
                log.exception("the recorder process crashed")
            finally:
                os._exit(code)
        self.recorder_pid = pid
        self._recorder_respawn_at = time.monotonic() + RECORDER_RESPAWN_DELAY

    def _stop_recorder(self, wait: float) -> None:
        """After the worker processes: SIGTERM, and ``wait`` seconds to write the backlog."""
        if not self.recorder_pid:
            return
        pid, self.recorder_pid = self.recorder_pid, 0
        kill_quietly(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            time.sleep(0.02)
        log.warning(
            "the recorder process did not finish writing the job history within %g s; killing it",
            RECORDER_STOP_WAIT,
        )
        kill_quietly(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.recorder_pid:
                self.recorder_pid = 0
                log.error(
                    "the recorder process died (%s); starting another (job history only: "
                    "no job is affected)",
                    describe_status(status),
                )
                continue
            slot = self.children.pop(pid, None)
            self.kill_deadlines.pop(pid, None)
            if slot is None:
                continue
            self._answer_for_lost_job(slot, pid, status)
            self.retiring.discard(pid)
            if not self.signals:
                for free in to_start(self.children, self.retiring, self.slots, self.concurrency):
                    self._spawn(free)

    def _answer_for_lost_job(self, slot: int, pid: int, status: int) -> None:
        """Answer for a worker process that ended: first the answers of the jobs it
        finished that may not have reached the broker (those it sent last and
        those it held back: sent as the process would have, so the broker never
        gives them to another process; it drops those it has), then the REPLY of
        the job it was running, if any (Cancelled, TimeoutError or WorkerLost, with
        how the process ended: ``lost:exit code 1``), then ENDED: its other jobs
        in flight never started."""
        how = describe_status(status)
        self._forward_kept_records(slot)
        answered = self._send_held(slot)
        self._answer_running(slot, pid, how, answered)
        assert self.link is not None
        self.link.send(F.Ended(self.link.new_id(), pid, how[:120]).encode())

    def _answer_running(self, slot: int, pid: int, how: str, answered: set[bytes]) -> None:
        """The lost REPLY of the job the process was running, unless it had
        finished it (``answered``: it died before it said it runs nothing)."""
        job = self.table.running(slot)
        if job is None:
            return
        self.table.clear(slot)
        if job.attempt_id in answered:
            return
        elapsed = time.monotonic() - job.started
        retries = job.retries
        if job.cancelled:
            error = CANCELLED
            message = f"the job was cancelled while it ran; its worker process was {how}"
        elif job.timeout and elapsed >= job.timeout:
            error = "TimeoutError"
            message = (
                f"job ran longer than its time limit of {job.timeout:g} s "
                "and its worker process was killed"
            )
        else:
            error = WORKER_LOST
            message = f"worker process {pid} died mid-job ({how})"
            if job.guaranteed:  # the broker's rule (limits.GUARANTEED_DEATH_RETRIES)
                retries = max(retries, GUARANTEED_DEATH_RETRIES)
        attempt_id = job.attempt_id
        log.warning(
            "slot %d: job %s: %s",
            slot,
            attempt_id.decode(errors="replace"),
            message,
            extra=job_fields(attempt_id, job.queue, job.task),
        )
        body = encode_failure(error, message, "")
        assert self.link is not None
        status_frame = F.lost_status(error, how)
        self.link.send(F.encode_reply(self.link.new_id(), body, attempt_id, status_frame))
        if self.recorder is not None:
            now = time.time_ns() // 1000
            try:
                self.recorder.add(
                    attempt_id,
                    job.task if job.body else "",  # '': keep an earlier attempt's row
                    job.queue,
                    now - int(elapsed * 1e6),
                    now,
                    True,
                    error,
                    retries,
                    job.body,
                    body,
                    lost=True,
                )
                self.recorder.flush()
            except Exception:
                log.exception(
                    "the job recorder failed on lost job %r",
                    attempt_id,
                    extra=job_fields(attempt_id, job.queue, job.task),
                )

    def _forward_kept_records(self, slot: int) -> None:
        """The records of the jobs the ended process finished, which it may not have
        handed over: to the recorder process (it drops those it has)."""
        if self.kept is None or self.recorder is None:
            return
        rows = self.kept.take(slot)
        if not rows:
            return
        try:
            for row in rows:
                self.recorder.add(*row)
            self.recorder.flush()
        except Exception:
            log.exception("slot %d: could not forward the job records of its process", slot)
            return
        log.info("slot %d: forwarded the %d job records its process kept", slot, len(rows))

    def _send_held(self, slot: int) -> set[bytes]:
        """The REPLYs of the jobs a dead process finished: those it sent last (they
        may have died in its socket's queue) and those it had not sent (it held
        them to send several in one message), without the credit they gave back:
        that credit was the dead process's. Returns their attempt ids."""
        recent = answers_again(self.table, slot)
        held = self.table.held(slot)
        self.table.forget_recent(slot)
        self.table.release(slot)
        assert self.link is not None
        for ref, status, body in recent:
            self.link.send(F.encode_reply(self.link.new_id(), body, ref, status))
        for ref, status, body in held:
            self.link.send(F.encode_reply(self.link.new_id(), body, ref, F.without_ready(status)))
        if held:
            log.info("slot %d: sent %d answers its worker process had held", slot, len(held))
        return {ref for ref, _, _ in recent} | {ref for ref, _, _ in held}

    def _enforce_time_limits(self, now: float) -> None:
        for pid, slot in list(self.children.items()):
            deadline = self.kill_deadlines.get(pid)
            if deadline is not None:
                if now >= deadline:
                    kill_quietly(pid, signal.SIGKILL)
                continue
            _, started, limit = self.table.read(slot)
            if limit and now - started >= limit:
                log.warning(
                    "slot %d: job over its %g s time limit; killing process %d", slot, limit, pid
                )
                # at once: the limit is the limit (a task cleans up at its soft_timeout);
                # the loop reaps it within a poll and answers TimeoutError
                kill_quietly(pid, signal.SIGKILL)
                self.kill_deadlines[pid] = now
