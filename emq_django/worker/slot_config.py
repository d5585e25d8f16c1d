"""A worker process's configuration (``SlotConfig``, from its job manager) and
the constants of its loop: credit, batches, held answers."""

from __future__ import annotations

from dataclasses import dataclass

# Extra credit goes out (READYs) once it is at least 1/READY_BATCH_DIVISOR of what
# the process wants to hold (at once for a credit under this number).
READY_BATCH_DIVISOR = 8
# eMQP's "batch" extension (docs/eventmq-wire.md §7): the most jobs this process
# takes in one REQUEST, announced in its INFORM; its answers to jobs that run back
# to back go out together, held at most HOLD_LIMIT seconds (checked between jobs)
# and never while nothing else waits to run; held across the next job only when
# that job's task last ran in under HOLD_LIMIT (a slow or new task would keep them
# for its whole run: they go before it starts)
BATCH = 32
HOLD_LIMIT = 0.002
LAST_RUN_TASKS = 1024
MAX_CANCELLED_KEPT = 4096  # cancelled attempt ids a process remembers (then forgets all)


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
    # the job manager's recorder process (recorder_process.py), '' = nothing recorded
    recorder_endpoint: str = ""
    record_interval: float = 0.2  # EMQ_RECORD_INTERVAL: hand records over at least this often
    record_batch: int = 2000  # EMQ_RECORD_BATCH: ... or once it holds this many
    record_buffer: int = 50_000  # EMQ_RECORD_BUFFER: kept while the recorder process lags
    incarnation: str = ""  # the job manager's run: tells it apart from an earlier one
    reply_hold: float = HOLD_LIMIT  # answers held back at most this long (between jobs)
