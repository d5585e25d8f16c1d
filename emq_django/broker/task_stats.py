"""Per task and queue: jobs succeeded, failed, retried and dead-lettered, and a
histogram of their attempts' run times (issue 35), for Prometheus (``/emq/metrics``
asks the monitor channel's ``TASKS``).

Counted where the broker settles an attempt (``JobLifecycle.settle``), so every
protocol's jobs are counted, whoever ran them. Off unless ``EMQ_TASK_METRICS=true``:
then the cost per job is one test of ``None``; on, about 1 µs per attempt (a
microbenchmark of ``attempt``, 0.9-1.9 µs on a loaded 2-core VM).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emq_django.broker.state import Job

# upper bounds (seconds) of the run-time histogram's buckets; +Inf is the count
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
SUCCEEDED, FAILED, RETRIED, DEAD_LETTERED = 0, 1, 2, 3
OUTCOMES = ("succeeded", "failed", "retried", "dead_lettered")
# the fields of one entry: the four counts, then the run-time sum, then the buckets
_SUM = len(OUTCOMES)
_FIRST_BUCKET = _SUM + 1
MAX_KEYS = 10_000  # (task, queue) pairs kept; others are counted under task "(other)"


class TaskStats:
    __slots__ = ("by_task", "keys")

    def __init__(self) -> None:
        # task -> queue -> [succeeded, failed, retried, dead_lettered, run_sum, *buckets]
        # where bucket i counts the attempts that ran at most BUCKETS[i] (not cumulative);
        # two lookups by str, no key tuple made per job
        self.by_task: dict[str, dict[str, list[float]]] = {}
        self.keys = 0

    def _entry(self, job: Job) -> list[float]:
        task = job.headers.task
        if self.keys >= MAX_KEYS and job.queue not in self.by_task.get(task, ()):
            task = "(other)"
        by_queue = self.by_task.setdefault(task, {})
        entry = by_queue.get(job.queue)
        if entry is None:
            entry = by_queue[job.queue] = [0.0] * (_FIRST_BUCKET + len(BUCKETS) + 1)
            self.keys += 1
        return entry

    def attempt(self, job: Job, outcome: int, now: float) -> None:
        """An attempt ended (succeeded, failed for good, or failed and retried)."""
        by_queue = self.by_task.get(job.headers.task)
        entry = by_queue.get(job.queue) if by_queue is not None else None
        if entry is None:
            entry = self._entry(job)
        entry[outcome] += 1
        seconds = now - job.dispatched_at  # (settled: it was dispatched)
        entry[_SUM] += seconds
        entry[_FIRST_BUCKET + bisect_left(BUCKETS, seconds)] += 1

    def dead_lettered(self, job: Job) -> None:
        self._entry(job)[DEAD_LETTERED] += 1

    def doc(self) -> dict[str, Any]:
        """For ``TASKS``: each (task, queue) with its counts and cumulative buckets."""
        tasks = []
        entries = ((t, q, e) for t, by_queue in self.by_task.items() for q, e in by_queue.items())
        for task, queue, entry in sorted(entries, key=lambda x: (x[0], x[1])):
            cumulative, running = [], 0
            for count in entry[_FIRST_BUCKET:]:
                running += int(count)
                cumulative.append(running)
            tasks.append(
                {
                    "task": task,
                    "queue": queue,
                    **{name: int(entry[i]) for i, name in enumerate(OUTCOMES)},
                    "run_sum": round(entry[_SUM], 6),
                    "run_count": running,
                    "run_buckets": cumulative[:-1],  # the last one (+Inf) is run_count
                }
            )
        return {"buckets": list(BUCKETS), "tasks": tasks}
