"""The recorder process: one per job manager, it writes the job history for all
of that job manager's worker processes.

Why a process of its own, and not each worker process writing its records:
measured with ``bench/trace_overhead.py`` on no-op jobs, two worker processes
each writing their own batches into one SQLite database spent 25-40 µs of CPU
per job on it (two writers taking turns on one file: each transaction starts
with a cold page cache, and one waits for the other's lock), about a fifth of
everything a job costs. Here a worker process only keeps the job's request and
REPLY bodies as they are, with a tuple of its other fields (``RecordBatch``),
and, every ``EMQ_RECORD_INTERVAL`` seconds, sends them as one message over a
ZeroMQ PUSH socket (about a µs per job: the arguments and the result are not
decoded or encoded again in the worker process). The recorder process, the only
writer, loads ``EMQ_RECORDER`` and hands it everything that arrived since its
last write. By default it runs under Linux's SCHED_IDLE policy
(``EMQ_RECORDER_PRIORITY = "idle"``): it gets only the CPU time that no job,
broker or client wants, so recording does not slow the jobs down, and the
history catches up in the gaps (a 2-core machine draining no-op jobs as fast as
it can still has them; a recorder that falls behind keeps its records, see
below). ``"normal"`` or a nice value (1-19) make it compete for the CPU instead.
Even at SCHED_IDLE its work costs the jobs something (it takes the CPU caches
from them, and it writes in the gaps processes that pass jobs to each other
leave), so while the machine is more than half busy it only collects
(``RecorderProcess``, ``BUSY_THRESHOLD``).

Nothing here can lose or delay a job. A worker process never blocks on the
recorder: when the recorder process is down or far behind, a worker keeps its
records (up to ``EMQ_RECORD_BUFFER``, then drops the oldest, counted and
logged); the job manager restarts a recorder process that died.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from typing import Any

import zmq

from emq_django import transport
from emq_django.settings_registry import parse_priority
from emq_django.worker.record_batch import RecordBatch, decode_batch
from emq_django.worker.record_forwarder import ERROR_LOG_INTERVAL, SEND_HWM, RecordForwarder
from emq_django.worker.recording import (
    JobRecorder,
    close_recorder,
    load_recorder,
)

log = logging.getLogger(__name__)
__all__ = [
    "BUSY_THRESHOLD",
    "ERROR_LOG_INTERVAL",
    "SEND_HWM",
    "MachineBusy",
    "RecordBatch",
    "RecordForwarder",
    "RecorderProcess",
    "SeenAttempts",
    "decode_batch",
    "lower_priority",
    "parse_priority",
    "recorder_endpoint",
]

# The machine's CPU busy fraction above which writing waits. Not near 1: processes
# that pass jobs to each other (client, broker, workers) leave gaps even when the
# machine is as busy as they can make it: draining no-op jobs as fast as they
# could, they used about 1.75 of a 2-core machine's cores (bench/run.py's CPU per
# task times the rate). With 0.85 here the recorder process wrote in those gaps,
# used 3 µs of CPU per job while the jobs ran, and their throughput fell by about
# 6% more than with 0.5 (bench/trace_overhead.py, 8 pairs each).
BUSY_THRESHOLD = 0.5
BUSY_SAMPLE = 0.25  # seconds between looks at /proc/stat while records wait


def lower_priority(priority: str) -> None:
    """Apply ``EMQ_RECORDER_PRIORITY`` to this process; failures are logged."""
    nice = parse_priority(priority)
    try:
        if nice is None:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        elif nice:
            os.nice(nice)
    except (OSError, AttributeError) as exc:  # AttributeError: not Linux
        log.warning("could not lower the recorder process's priority (%s): %s", priority, exc)


def recorder_endpoint() -> str:
    """A fresh ``ipc://`` address for one job manager's recorder process."""
    name = f"emq-rec-{os.getpid()}-{os.urandom(3).hex()}.sock"
    return "ipc://" + os.path.join(tempfile.gettempdir(), name)


class MachineBusy:
    """How busy all the machine's CPUs were between two calls (Linux /proc/stat)."""

    def __init__(self, interval: float = BUSY_SAMPLE) -> None:
        self.interval = interval  # the shortest period measured (ticks are 10 ms)
        self._last = self._read()
        self._last_at = time.monotonic()
        self._fraction = 0.0

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", "rb") as f:
                fields = f.readline().split()
            values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        except (OSError, ValueError):
            return None
        return sum(values), values[3] + values[4]

    def fraction(self) -> float:
        """Busy share over the last ``interval`` or more, 0.0 when unknown."""
        at = time.monotonic()
        if at - self._last_at < self.interval:
            return self._fraction
        now = self._read()
        last, self._last, self._last_at = self._last, now, at
        if now is None or last is None or now[0] <= last[0]:
            self._fraction = 0.0
        else:
            self._fraction = 1.0 - (now[1] - last[1]) / (now[0] - last[0])
        return self._fraction


class SeenAttempts:
    """The attempts recorded lately (at least the last ``size``): a job manager
    sends the records of a worker process that ended, which may have reached
    this process already (kept_records.py)."""

    def __init__(self, size: int = 50_000) -> None:
        self.size = size
        self._new: set[tuple[str, int]] = set()
        self._old: set[tuple[str, int]] = set()

    def check(self, key: tuple[str, int]) -> bool:
        """Whether ``key`` was seen; it is remembered either way."""
        if key in self._new or key in self._old:
            return True
        if len(self._new) >= self.size:
            self._old, self._new = self._new, set()
        self._new.add(key)
        return False


class RecorderProcess:
    """The loop of the recorder process (``run`` in the forked child).

    Messages are only received while the machine's CPUs are busy (over
    ``BUSY_THRESHOLD``): decoding and writing them waits until they are not, or
    until the oldest has waited ``max_delay`` seconds. A burst of jobs thus runs
    without the history's work in between, which even at SCHED_IDLE costs the
    jobs CPU time (it evicts their data from the CPU caches); under a load that
    does not let up, the history is written every ``max_delay`` seconds anyway.
    """

    def __init__(
        self,
        endpoint: str,
        recorder_path: str,
        priority: str = "idle",
        max_delay: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.recorder_path = recorder_path
        self.priority = priority
        self.max_delay = max_delay
        self.stopping = False
        self.received = 0
        self.bad_messages = 0
        self.deferred = 0  # times writing waited for a busy machine
        self._waiting: list[list[bytes]] = []
        self._oldest = 0.0  # monotonic: when the oldest waiting message came
        self.seen = SeenAttempts()
        self.duplicates = 0  # records sent twice (kept_records.py), written once

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self, idle_wait: float = 1.0) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job manager handles Ctrl-C
        lower_priority(self.priority)
        recorder = load_recorder(self.recorder_path)
        context: zmq.Context[Any] = zmq.Context()
        pull = transport.bind(context, zmq.PULL, self.endpoint)
        busy = MachineBusy()
        try:
            while not self.stopping:
                wait = BUSY_SAMPLE if self._waiting else idle_wait
                if pull.poll(int(wait * 1000)):
                    self._receive(pull)
                if not self._waiting:
                    self._flush(recorder)  # nothing to write: the recorder may prune
                elif (
                    time.monotonic() - self._oldest >= self.max_delay
                    or busy.fraction() < BUSY_THRESHOLD
                ):
                    self._write(recorder)
                else:
                    self.deferred += 1
            # The job manager stops us after its worker processes have exited:
            # take what they sent on their way out.
            while pull.poll(200):
                self._receive(pull)
            self._write(recorder)
        finally:
            close_recorder(recorder)
            pull.close(linger=0)
            context.term()
            _unlink_ipc(self.endpoint)
        log.info(
            "recorder process: %d job records received (%d of them twice), %d bad messages "
            "dropped, writing waited %d times for a busy machine",
            self.received,
            self.duplicates,
            self.bad_messages,
            self.deferred,
        )
        return 0

    def _receive(self, pull: zmq.Socket[Any]) -> None:
        while True:
            try:
                message = pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not self._waiting:
                self._oldest = time.monotonic()
            self._waiting.append(message)

    def _write(self, recorder: JobRecorder | None) -> None:
        waiting, self._waiting = self._waiting, []
        for message in waiting:
            self._take(message, recorder)
        self._flush(recorder)

    def _take(self, message: list[bytes], recorder: JobRecorder | None) -> None:
        try:
            records = decode_batch(message)
        except (ValueError, TypeError, UnicodeError) as exc:
            self.bad_messages += 1
            log.error("recorder process: dropped a malformed message (%s)", exc)
            return
        self.received += len(records)
        if recorder is None:
            return
        seen = self.seen
        for record in records:
            if seen.check((record.job_id, record.attempt)):
                self.duplicates += 1
                continue
            try:
                recorder.record(record)
            except Exception:
                log.exception(
                    "the job recorder failed on job %s",
                    record.job_id,
                    extra={
                        "job_id": record.job_id,
                        "attempt": record.attempt,
                        "queue": record.queue,
                        "task": record.task,
                    },
                )

    @staticmethod
    def _flush(recorder: JobRecorder | None) -> None:
        if recorder is None:
            return
        try:
            recorder.flush()
        except Exception:
            log.exception("the job recorder failed to flush")


def _unlink_ipc(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        try:
            os.unlink(endpoint[len("ipc://") :])
        except OSError:
            pass
