"""A job manager's configuration (``JobManagerConfig``, built by the
``emq_jobmanager`` command) and its ``--queues`` option."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobManagerConfig:
    broker_url: str
    queues: tuple[tuple[int, str], ...]
    concurrency: int
    # the most worker processes a RESIZE may ask for (0: resizing.DEFAULT_MAX_CONCURRENCY)
    max_concurrency: int = 0
    heartbeat_interval: float = 1.0
    heartbeat_liveness: int = 3
    prefetch: int = 1
    name: str = ""
    kill_grace: float = 3.0
    max_jobs_per_worker: int = 0
    max_memory_mb: int = 0
    recorder: str = ""  # EMQ_RECORDER
    record_interval: float = 0.2  # EMQ_RECORD_INTERVAL
    record_batch: int = 2000  # EMQ_RECORD_BATCH
    record_buffer: int = 50_000  # EMQ_RECORD_BUFFER
    recorder_priority: str = "idle"  # EMQ_RECORDER_PRIORITY
    recorder_max_delay: float = 10.0  # EMQ_RECORDER_MAX_DELAY


def parse_queue_option(text: str) -> tuple[tuple[int, str], ...]:
    """``email:40,default:10`` -> ((40, 'email'), (10, 'default')); raises ValueError."""
    result = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, weight = item.partition(":")
        if not name:
            raise ValueError(f"empty queue name in {text!r}")
        try:
            result.append((int(weight) if weight else 10, name))
        except ValueError:
            raise ValueError(f"queue weight must be an integer in {item!r}") from None
    if not result:
        raise ValueError("give at least one queue, e.g. --queues default:10")
    return tuple(sorted(result, key=lambda p: -p[0]))
