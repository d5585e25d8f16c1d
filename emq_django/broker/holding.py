"""Where the broker keeps jobs that are in no queue: delayed, dead, or done.

Pure data structures, no clock of their own: callers pass ``now``.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass

from emq_django.broker.state import Job


class DelayedJobs:
    """A timer heap of jobs waiting for their ``run_after`` or their retry."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, job: Job, due: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, job))

    def next_due(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def pop_due(self, now: float) -> list[Job]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due

    def remove(self, job_id: bytes) -> Job | None:
        for i, (_, _, job) in enumerate(self._heap):
            if job.id == job_id:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                return job
        return None

    def jobs(self) -> list[Job]:
        return [job for _, _, job in sorted(self._heap)]


@dataclass(slots=True)
class DeadLetter:
    job: Job
    error: str
    died_at: float  # wall clock


class DeadLetters:
    """Jobs that used up their retries, oldest first, at most ``limit`` kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: OrderedDict[bytes, DeadLetter] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, letter: DeadLetter) -> DeadLetter | None:
        """Keep ``letter``; returns the oldest one evicted to make room, if any."""
        self.items[letter.job.id] = letter
        if len(self.items) > self.limit:
            self.evicted += 1
            return self.items.popitem(last=False)[1]
        return None

    def take(self, job_ids: list[bytes] | None) -> list[DeadLetter]:
        """Remove and return these letters (all when ``job_ids`` is None)."""
        if job_ids is None:
            taken = list(self.items.values())
            self.items.clear()
            return taken
        return [self.items.pop(i) for i in job_ids if i in self.items]

    def compact(self) -> None:
        """Rebuild the index at its present size (see ``emq_django.broker.memory``)."""
        self.items = OrderedDict(self.items)


class RecentIds:
    """Ids of finished jobs, remembered for ``window`` seconds (at most ``limit``),
    so that a client resending a job it got no ACK for does not run it twice.

    A dict (id -> when) and a deque of the ids in the order they came: about 50
    bytes an id besides the id itself, where an OrderedDict took about 100."""

    def __init__(self, window: float, limit: int = 200_000) -> None:
        self.window = window
        self.limit = limit
        self._ids: dict[bytes, float] = {}
        self._order: deque[bytes] = deque()

    def __contains__(self, job_id: bytes) -> bool:
        return job_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, job_id: bytes, now: float) -> None:
        """Remember ``job_id``; one remembered already keeps its place, with ``now``."""
        ids = self._ids
        if job_id not in ids:
            self._order.append(job_id)
        ids[job_id] = now
        if len(ids) > self.limit:
            del ids[self._order.popleft()]

    def expire(self, now: float) -> None:
        ids, order = self._ids, self._order
        while order and now - ids[order[0]] > self.window:
            del ids[order.popleft()]

    def compact(self) -> None:
        """Rebuild the index at its present size, with fresh copies of the ids. The
        ones it keeps were allocated with their jobs, among objects long freed, and
        keep whole allocator arenas of those alive (pymalloc returns an arena only
        once it is empty). So the ids and their times are first packed into one
        buffer each (outside pymalloc's arenas), the old ones freed, and only then
        made again: the copies then fill the arenas that something else keeps
        alive anyway, instead of landing beside the old ids (copying them while
        the old ones were still there left a drained guaranteed backlog's 200,000
        ids spread over about 90 arenas, a third full)."""
        order = self._order
        stamps = self._ids
        sizes = array("I", map(len, order))
        packed = b"".join(order)
        times = array("d", map(stamps.__getitem__, order))
        self._ids = {}
        self._order = deque()
        del order, stamps  # the old ids go now, before their copies are made
        ids: dict[bytes, float] = {}
        at = 0
        last = fresh = -1.0
        for size, when in zip(sizes, times, strict=True):
            if when != last:  # the ids of a loop turn share one float: keep that
                last = fresh = when
            ids[packed[at : at + size]] = fresh
            at += size
        self._ids = ids
        self._order = deque(ids)
