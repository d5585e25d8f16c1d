"""The waiting jobs of a queue that uses priorities: higher first, FIFO within one
priority, with aging.

A queue keeps its plain ``deque`` until a job with a priority other than 0 waits
in it; from then on its ``pending`` is a ``RankedPending`` (``Queue.push``), so a
queue that never sees a priority pays nothing for the feature.

Aging: a job's effective priority rises by one for every ``aging`` seconds it has
waited. Job *a* (priority ``pa``, enqueued at ``ta``) goes before job *b* when
``pa + (now - ta) / aging > pb + (now - tb) / aging``, that is when
``ta - pa * aging < tb - pb * aging``: the order does not depend on ``now``, so
each job gets its rank once, on the way in, and the heap never needs resorting.
The promise that follows: a job is overtaken only by jobs that arrived less than
``(their priority - its priority) * aging`` seconds after it. ``aging`` 0: strict
priority (a job can wait for ever behind a steady stream of higher ones).

A ranked queue's jobs go to our worker processes with their rank (the ``rank``
header, ``wire_rank``): the rank never changes, so a worker process orders what it
holds as the broker would (emq_django/worker/ranked.py), and the broker lets a
ranked queue prefetch. A job that outranks one a worker process holds unstarted
goes to it beyond its credit when nobody can take it (``BrokerCore._overtake``).

Pure: no sockets, no clock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Generic, Protocol, TypeVar

from emq_django.protocol.headers import Headers


class _Waiting(Protocol):
    """What a job must have to be ranked (``state.Job``; not imported: state imports
    this module)."""

    @property
    def headers(self) -> Headers: ...

    @property
    def enqueued_at(self) -> float: ...


Job = TypeVar("Job", bound=_Waiting)


# with aging 0 a priority level outweighs any wall-clock time (about 1.8e9 s now) on
# the wire: the float it is worked out in (then in whole µs) still tells enqueue
# times 0.2 ms apart at priority 100
_LEVEL = 1e10
_FIRST = float("-inf")


def rank_key(job: _Waiting, aging: float) -> tuple[float, float]:
    """A job's place in its ranked queue: lower first (``RankedPending``'s heap)."""
    priority = job.headers.priority
    if aging:
        return (job.enqueued_at - priority * aging, 0.0)
    return (-priority, job.enqueued_at)


def wire_rank(job: _Waiting, aging: float, wall_offset: float) -> int:
    """The job's rank as the ``rank`` header carries it: ordered as ``rank_key``,
    on the wall clock (so ranks from a broker that took over compare too), in whole
    microseconds (``%d`` formats in a quarter of the time ``%r`` takes a float)."""
    return on_wire(rank_key(job, aging), aging, wall_offset)


def on_wire(key: tuple[float, float], aging: float, wall_offset: float) -> int:
    """``wire_rank`` from the job's ``rank_key``."""
    if aging:
        return int((key[0] + wall_offset) * 1e6)
    return int((key[1] + wall_offset + key[0] * _LEVEL) * 1e6)


class RankedPending(Generic[Job]):
    """The waiting jobs, lower ``rank_key`` first, FIFO among equals, with the part
    of ``deque``'s interface that the core uses on ``Queue.pending`` (``append``,
    ``appendleft``, ``popleft``, ``[0]``, ``remove``, ``in``, ``len``, iteration in
    no particular order).

    Items are ``(*rank_key, seq, job)``. A job ranked at or after the last one of
    ``_run`` (the common case: jobs of one priority, as they come) joins that
    deque, which stays in order; any other goes to the heap ``_heap``; the head is
    the lower of their heads. So a queue whose jobs come in rank order pays a
    deque's append and popleft per job, not a heap's O(log n) push and pop."""

    __slots__ = ("aging", "_run", "_tail", "_heap", "_seq", "_front")

    def __init__(self, aging: float, jobs: Iterable[Job] = ()) -> None:
        self.aging = aging
        self._run: deque[tuple[float, float, int, Job]] = deque()
        self._tail: tuple[float, float] = (_FIRST, _FIRST)  # the rank of _run's last
        self._heap: list[tuple[float, float, int, Job]] = []
        self._seq = 0
        self._front = 0  # appendleft: a job given back goes before its equals
        for job in jobs:
            self.append(job)

    def append(self, job: Job) -> None:
        seq = self._seq = self._seq + 1
        aging = self.aging
        if aging:  # rank_key, inline: once per job
            key = (job.enqueued_at - job.headers.priority * aging, 0.0)
        else:
            key = (-job.headers.priority, job.enqueued_at)
        if key >= self._tail:
            self._run.append((key[0], key[1], seq, job))
            self._tail = key
        else:
            heapq.heappush(self._heap, (key[0], key[1], seq, job))

    def appendleft(self, job: Job) -> None:
        """Back at the head of its equals (a job requeued unstarted)."""
        self._front -= 1
        key = rank_key(job, self.aging)
        heapq.heappush(self._heap, (key[0], key[1], self._front, job))

    def _first(self) -> tuple[float, float, int, Job]:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0]

    def popleft(self) -> Job:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)[3]
        if not run:
            raise IndexError("pop from an empty queue")
        item = run.popleft()
        if not run:
            self._tail = (_FIRST, _FIRST)
        return item[3]

    def __getitem__(self, index: int) -> Job:
        if index != 0:
            raise IndexError("a ranked queue only shows its head ([0])")
        if not self._run and not self._heap:
            raise IndexError("an empty queue has no head")
        return self._first()[3]

    def remove(self, job: Job) -> None:
        for i, item in enumerate(self._run):
            if item[3] is job:
                del self._run[i]  # the rest stays in order (_tail: a bound still)
                if not self._run:
                    self._tail = (_FIRST, _FIRST)
                return
        for i, item in enumerate(self._heap):
            if item[3] is job:
                last = self._heap.pop()
                if i < len(self._heap):
                    self._heap[i] = last
                    heapq.heapify(self._heap)
                return
        raise ValueError("job not waiting in this queue")

    def __contains__(self, job: object) -> bool:
        return any(item[3] is job for item in self._items())

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._run) or bool(self._heap)

    def _items(self) -> Iterator[tuple[float, float, int, Job]]:
        return chain(self._run, self._heap)

    def __iter__(self) -> Iterator[Job]:
        return (item[3] for item in self._items())

    def page(self, offset: int, limit: int) -> list[Job]:
        """Jobs ``offset`` to ``offset + limit`` in dispatch order (the monitor's
        waiting list): O(n log(offset + limit)), never a sort of the whole queue."""
        return [item[3] for item in heapq.nsmallest(offset + limit, self._items())[offset:]]

    def by_priority(self) -> dict[int, int]:
        """Waiting jobs per (declared) priority, for the monitor."""
        counts: dict[int, int] = {}
        for item in self._items():
            priority = item[3].headers.priority
            counts[priority] = counts.get(priority, 0) + 1
        return counts
