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

import json
import logging
import os
import signal
import tempfile
import time
from typing import Any

import zmq

from emq_django import transport
from emq_django.settings_registry import parse_priority
from emq_django.transport import SocketOptions
from emq_django.worker.kept_records import SlotRecords
from emq_django.worker.recording import (
    JobRecord,
    JobRecorder,
    close_recorder,
    load_recorder,
    split_attempt,
)

log = logging.getLogger(__name__)

_encode = json.JSONEncoder(separators=(",", ":")).encode
SEND_HWM = 1000  # batches queued for the recorder process before a worker keeps them
# The machine's CPU busy fraction above which writing waits. Not near 1: processes
# that pass jobs to each other (client, broker, workers) leave gaps even when the
# machine is as busy as they can make it: draining no-op jobs as fast as they
# could, they used about 1.75 of a 2-core machine's cores (bench/run.py's CPU per
# task times the rate). With 0.85 here the recorder process wrote in those gaps,
# used 3 µs of CPU per job while the jobs ran, and their throughput fell by about
# 6% more than with 0.5 (bench/trace_overhead.py, 8 pairs each).
BUSY_THRESHOLD = 0.5
BUSY_SAMPLE = 0.25  # seconds between looks at /proc/stat while records wait
ERROR_LOG_INTERVAL = 60.0


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


class RecordBatch:
    """The records a worker process has not handed over yet, kept as it got them.

    A job's record costs the worker process next to nothing: its request body
    (with the args and kwargs) and its REPLY body stay the bytes that came and
    went over the wire, and the other fields are strings and numbers in a tuple
    (no container the garbage collector must walk while thousands wait), the
    times in integer microseconds (JSON writes them faster than floats). The
    recorder process decodes them (``decode_batch``), at its own pace.

    The message is two frames: a JSON header ``{"manager": ..., "rows": [...]}``,
    a row per record, and the bytes of every record's attempt id, request body
    and REPLY body one after the other, whose lengths end each row.
    """

    __slots__ = ("manager", "rows", "parts")

    def __init__(self, manager: str) -> None:
        self.manager = manager
        self.rows: list[tuple[Any, ...]] = []
        self.parts: list[bytes] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(
        self,
        attempt_id: bytes,
        task: str,
        queue: str,
        started_us: int,
        finished_us: int,
        failed: bool,
        error_type: str,
        retry_count: int,
        request: bytes,
        reply: bytes,
        lost: bool = False,
        partials: int = 0,
    ) -> None:
        self.rows.append(
            (task, queue, started_us, finished_us, failed, error_type, retry_count, lost,
             len(attempt_id), len(request), len(reply), partials)
        )  # fmt: skip
        self.parts += (attempt_id, request, reply)

    def encode(self) -> list[bytes]:
        header = _encode({"manager": self.manager, "rows": self.rows}).encode()
        return [header, b"".join(self.parts)]

    def clear(self) -> None:
        self.rows.clear()
        self.parts.clear()

    def drop_oldest(self, count: int) -> None:
        del self.rows[:count]
        del self.parts[: 3 * count]


def decode_batch(frames: list[bytes]) -> list[JobRecord]:
    """``RecordBatch.encode``'s frames -> records; raises ValueError on anything else."""
    if len(frames) != 2:
        raise ValueError(f"a batch has 2 frames, not {len(frames)}")
    header, blob = frames
    doc = json.loads(header)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError("the header is not {manager, rows}")
    manager = doc.get("manager")
    if not isinstance(manager, str):
        raise ValueError("the header names no manager")
    records = []
    at = 0
    for row in doc["rows"]:
        if type(row) is not list or len(row) not in (11, 12):
            raise ValueError(f"not a record: {str(row)[:100]}")
        task, queue, started, finished, failed, error, retries, lost, n_id, n_req, n_rep = row[:11]
        partials = row[11] if len(row) == 12 else 0  # 11: from a worker before streaming
        if not (
            type(partials) is int
            and partials >= 0
            and type(n_id) is int
            and type(n_req) is int
            and type(n_rep) is int
            and type(started) is int
            and type(finished) is int
            and type(retries) is int
            and n_id >= 0
            and n_req >= 0
            and n_rep >= 0
        ):
            raise ValueError(f"bad numbers in {str(row)[:100]}")
        attempt_id = blob[at : at + n_id]
        at += n_id
        request = blob[at : at + n_req]
        at += n_req
        reply = blob[at : at + n_rep]
        at += n_rep
        job_id, attempt = split_attempt(attempt_id)
        args, kwargs = _arguments(request)
        records.append(
            JobRecord(
                job_id, attempt, str(task), str(queue), args, kwargs, started / 1e6,
                finished / 1e6, failed is True, str(error), reply, manager, lost is True,
                retries, partials,
            )
        )  # fmt: skip
    if at != len(blob):
        raise ValueError(f"the bodies are {len(blob)} bytes, the rows account for {at}")
    return records


def _arguments(request: bytes) -> tuple[list[Any], dict[str, Any]]:
    """The args and kwargs of a request body (``["run", {...}]``); none when it
    is not one (the job was refused as malformed, or the job manager does not
    know it)."""
    if not request:
        return [], {}
    try:
        data = json.loads(request.decode())  # str: json need not guess the encoding
    except RecursionError:  # nested too deep: the worker refused it (protocol/limits.py)
        return [], {}
    except ValueError:  # UnicodeDecodeError too: not UTF-8 (it may be UTF-16 JSON)
        try:
            data = json.loads(request)
        except (ValueError, RecursionError):
            return [], {}
    spec = data[1] if isinstance(data, list) and len(data) == 2 else None
    if not isinstance(spec, dict):
        return [], {}
    args, kwargs = spec.get("args") or [], spec.get("kwargs") or {}
    return (args if isinstance(args, list) else []), (kwargs if isinstance(kwargs, dict) else {})


class RecordForwarder:
    """How a worker process (or the job manager) hands its records to the recorder
    process. ``add`` is all a job costs; ``flush`` sends them as one message and
    never blocks: what cannot be sent is kept for the next one."""

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        max_buffer: int,
        manager: str,
        kept: SlotRecords | None = None,
    ) -> None:
        self.sock = transport.connect(
            context, zmq.PUSH, endpoint, SocketOptions(linger=-1, sndhwm=SEND_HWM)
        )
        self.max_buffer = max_buffer
        self.batch = RecordBatch(manager)
        # a worker process's records are kept in shared memory too (kept_records.py)
        self.kept = kept
        self.add = self.batch.add if kept is None else self._add_kept  # no extra call
        self._next_error_log = 0.0
        self.sent = 0
        self.dropped = 0
        self.not_kept = 0  # records too large for the shared memory (lost if it dies)

    def _add_kept(
        self,
        attempt_id: bytes,
        task: str,
        queue: str,
        started_us: int,
        finished_us: int,
        failed: bool,
        error_type: str,
        retry_count: int,
        request: bytes,
        reply: bytes,
        lost: bool = False,
        partials: int = 0,
    ) -> None:
        """``RecordBatch.add``, and the record kept in shared memory too."""
        row = (attempt_id, task, queue, started_us, finished_us, failed, error_type,
               retry_count, request, reply, lost, partials)  # fmt: skip
        self.batch.add(*row)
        kept = self.kept
        assert kept is not None
        if kept.add(*row):
            return
        self.flush()  # the area is full: hand the records over, then keep this one
        if kept.add(*row):
            return
        self.not_kept += 1
        if self.not_kept == 1 or self.not_kept % 1000 == 0:
            log.warning(
                "%d job records could not be kept in shared memory (too large, or the "
                "recorder process is not taking records): they are lost if this worker "
                "process dies before it hands them over",
                self.not_kept,
            )

    def __len__(self) -> int:
        return len(self.batch)

    def flush(self) -> None:
        if not self.batch.rows:
            return
        try:
            self.sock.send_multipart(self.batch.encode(), zmq.NOBLOCK)
        except zmq.Again:
            self._keep()
            return
        self.sent += len(self.batch)
        self.batch.clear()
        if self.kept is not None:
            self.kept.handed_over()

    def _keep(self) -> None:
        excess = len(self.batch) - self.max_buffer
        if excess > 0:
            self.batch.drop_oldest(excess)
            self.dropped += excess
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + ERROR_LOG_INTERVAL
            log.warning(
                "the recorder process is not taking job records; %d kept, %d dropped so far",
                len(self.batch),
                self.dropped,
            )

    def close(self, linger: float = 5.0) -> None:
        """Send what is left; wait up to ``linger`` seconds for it to be taken."""
        if self.sock.closed:
            return
        self.flush()
        if self.batch.rows:
            log.warning(
                "%d job records not recorded: the recorder process is gone", len(self.batch)
            )
        self.sock.close(linger=int(linger * 1000))


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
