"""Synthetic trace logs in the broker's format (docs/trace-format.md), no Spark.

Jobs arrive as a Poisson stream over several queues and tasks; run times are
log-normal per task; some attempts fail (a few error types per task) or run into
the task's time limit (``timed_out``, ``TimeoutError``); failed attempts of tasks
with retries are ``retried`` after an exponential backoff, and dead-lettered once
the retries are spent; a few attempts are ``requeued`` (``PeerLost``) when their
job manager vanishes. Events come out in time order and go to hourly files named
as the broker names them.

The lines are the broker's, field for field (tests/unit/test_trace_synth.py runs the
broker's core through the same stories): a retried attempt ends with ``retried``
alone, and the line that ends a job carries ``final`` and its counts. ``legacy``
writes traces as brokers before ``final`` did, and as this generator did then: a
``failed`` line before each ``retried``, no ``final``, ``retries`` or
``requeues``, and no times on ``dead_lettered``.
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from emq_django.broker.trace import end_fields, trace_file_name

US = 1_000_000


@dataclass(frozen=True)
class TaskProfile:
    task: str | None  # None: a client that sends no task name (EventMQ's)
    queue: str
    weight: float  # share of the arrivals
    run_median: float  # seconds
    run_sigma: float  # log-normal shape
    fail_rate: float
    errors: tuple[str, ...] = ("ValueError",)
    retries: int = 0
    timeout: float = 0.0  # seconds; 0 = none
    backoff: float = 1.0  # first retry delay, then doubling


DEFAULT_PROFILES: tuple[TaskProfile, ...] = (
    TaskProfile("project.demo.tasks.add", "default", 30, 0.0005, 0.5, 0.001),
    TaskProfile("project.demo.tasks.noop", "default", 20, 0.0002, 0.4, 0.0),
    TaskProfile(
        "project.demo.tasks.send_email",
        "email",
        25,
        0.04,
        0.7,
        0.03,
        ("smtplib.SMTPServerDisconnected", "ConnectionError"),
        retries=2,
        timeout=30,
        backoff=1.0,
    ),
    TaskProfile(
        "app.webhooks.deliver",
        "webhooks",
        12,
        0.25,
        1.1,
        0.08,
        ("app.webhooks.DeliveryError", "ConnectionError", "ssl.SSLError"),
        retries=3,
        timeout=5,
        backoff=2.0,
    ),
    TaskProfile(
        "app.reports.render",
        "reports",
        4,
        1.5,
        0.9,
        0.02,
        ("KeyError", "MemoryError"),
        retries=1,
        timeout=8,
        backoff=5.0,
    ),
    TaskProfile("app.images.thumbnail", "default", 6, 0.12, 0.6, 0.01, ("OSError",), timeout=3),
    TaskProfile(None, "legacy", 3, 0.05, 0.5, 0.02, ("Exception",)),
)

DEFAULT_MANAGERS: dict[str, tuple[str, ...]] = {
    "default": ("web-1:4101", "web-2:4102", "batch-1:4201"),
    "email": ("web-1:4101", "web-2:4102"),
    "webhooks": ("hooks-1:4301",),
    "reports": ("batch-1:4201",),
    "legacy": ("vm:28008",),
}


@dataclass(frozen=True)
class SynthConfig:
    jobs: int
    start: float  # seconds since the epoch of the first arrival
    rate: float = 50.0  # jobs per second, on average
    seed: int = 0
    profiles: tuple[TaskProfile, ...] = DEFAULT_PROFILES
    managers: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_MANAGERS))
    requeue_rate: float = 0.002  # attempts lost with their job manager
    drop_rate: float = 0.0  # events left out (a crashed broker's last loop turn)
    wait_median: float = 0.003  # seconds from enqueue (or retry) to dispatch
    legacy: bool = False  # the trace format before ``final`` (see the module's doc)


def _q(value: str | None) -> str:
    return "null" if value is None else json.dumps(value)


class _Job:
    """Builds one job's event lines, attempt by attempt."""

    def __init__(self, cfg: SynthConfig, rng: random.Random, p: TaskProfile, job_id: str) -> None:
        self.cfg, self.rng, self.p = cfg, rng, p
        self.head = f'"job":"{job_id}",'
        self.tail = f'"task":{_q(p.task)},"queue":{_q(p.queue)}'
        self.lines: list[tuple[int, str]] = []

    def emit(self, ts: int, event: str, attempt: int, jm: str | None, extra: str = "") -> None:
        line = (
            f'{{"ts":{ts},"event":"{event}",{self.head}"attempt":{attempt},{self.tail},'
            f'"jm":{_q(jm)}{extra}}}'
        )
        self.lines.append((ts, line))

    def build(self, enqueued: int) -> list[tuple[int, str]]:
        cfg, rng, p = self.cfg, self.rng, self.p
        legacy = cfg.legacy
        self.emit(enqueued, "enqueued", 0, None)
        ready = enqueued
        attempt = retries = requeues = failures = 0
        while True:
            attempt += 1
            dispatched = ready + int(rng.lognormvariate(math.log(cfg.wait_median), 1.0) * US)
            jm = rng.choice(cfg.managers[p.queue])
            self.emit(dispatched, "dispatched", attempt, jm, f',"wait_us":{dispatched - enqueued}')
            run = rng.lognormvariate(math.log(p.run_median), p.run_sigma)
            if rng.random() < cfg.requeue_rate:
                lost = dispatched + int(min(run, 3.0) * US) + 1
                self.emit(lost, "requeued", attempt, jm, ',"error":"PeerLost"')
                ready = lost
                requeues += 1
                continue
            if p.timeout and run > p.timeout:
                event, error, run = "timed_out", "TimeoutError", p.timeout
            elif rng.random() < p.fail_rate:
                event, error = "failed", rng.choice(p.errors)
            else:
                event, error = "succeeded", ""
            done = dispatched + max(1, int(run * US))
            times = f',"run_us":{done - dispatched},"total_us":{done - enqueued}'
            quoted = f',"error":"{error}"' if error else ""
            # the broker counts failures against the retries (a requeue is none)
            failures += bool(error)
            retry = bool(error) and failures <= p.retries
            if legacy:
                self.emit(done, event, attempt, jm, times + quoted)
            elif not retry:
                # the broker writes no line for a failure it retries (only ``retried``)
                final = not (error and p.retries)  # else a dead letter follows
                tail = times + end_fields(final, retries, requeues)
                self.emit(done, event, attempt, jm, tail + quoted)
            if not error:
                return self.lines
            if retry:
                delay = int(p.backoff * 2 ** (failures - 1) * US)
                if legacy:
                    legacy_tail = f',"error":"{error}","delay_us":{delay}'
                    self.emit(done, "retried", attempt, jm, legacy_tail)
                else:
                    self.emit(done, "retried", attempt, jm, f',"delay_us":{delay}{quoted}')
                ready = done + delay
                retries += 1
                continue
            if p.retries:
                tail = "" if legacy else times + end_fields(True, retries, requeues)
                self.emit(done, "dead_lettered", attempt, jm, tail + quoted)
            return self.lines


def generate(cfg: SynthConfig) -> Iterator[tuple[int, str]]:
    """(ts in µs, JSON line) for every event of ``cfg.jobs`` jobs, in time order."""
    rng = random.Random(cfg.seed)
    weights = [p.weight for p in cfg.profiles]
    prefix = f"{rng.getrandbits(48):012x}"
    pending: list[tuple[int, int, str]] = []
    seq = 0
    now = cfg.start
    for i in range(cfg.jobs):
        now += rng.expovariate(cfg.rate)
        enqueued = int(now * US)
        # Every later event is at or after this arrival: what is older can go out.
        while pending and pending[0][0] < enqueued:
            ts, _, line = heapq.heappop(pending)
            yield ts, line
        profile = rng.choices(cfg.profiles, weights)[0]
        for ts, line in _Job(cfg, rng, profile, f"{prefix}{i:08x}").build(enqueued):
            if cfg.drop_rate and rng.random() < cfg.drop_rate:
                continue
            seq += 1
            heapq.heappush(pending, (ts, seq, line))
    while pending:
        ts, _, line = heapq.heappop(pending)
        yield ts, line


def write_trace(events: Iterator[tuple[int, str]], directory: Path) -> dict[str, int]:
    """Append the lines to ``directory/trace-YYYYMMDD-HH.jsonl`` by their UTC hour;
    returns lines written per file name."""
    directory.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    name, out = "", None
    buffer: list[str] = []
    hour_end = -1

    def flush(f: IO[str] | None) -> None:
        if f is not None and buffer:
            f.write("\n".join(buffer) + "\n")
            buffer.clear()

    try:
        for ts, line in events:
            if ts >= hour_end or ts < hour_end - 3600 * US:
                flush(out)
                if out is not None:
                    out.close()
                name = trace_file_name(ts / US)
                hour_end = (ts // (3600 * US) + 1) * 3600 * US
                out = open(directory / name, "a", encoding="utf-8")  # noqa: SIM115
            buffer.append(line)
            counts[name] = counts.get(name, 0) + 1
            if len(buffer) >= 10_000:
                flush(out)
    finally:
        flush(out)
        if out is not None:
            out.close()
    return counts
