"""The jobs of ranked queues that a worker process holds, in the broker's order
(issue 33).

The broker sends a ranked queue's jobs with their rank (the ``rank`` header,
broker/priority.py ``wire_rank``; lower first), and lets the queue prefetch: the
rank does not change while a job waits, so the process orders what it holds as
the broker would order it. Before each job it starts, the process reads what
already waits in its socket into this order (``SlotWorker._run_ranked``; not
again within ``LOOK_EVERY`` of reading it to its end: a job that came in that
0.1 ms may run after one lower job held, as if it had reached the broker 0.1 ms
later), and
runs, at the turn of a queue (the order the broker dispatched in, across queues),
that queue's best-ranked job: first in, first out within a rank. A job without a
rank here (sent before its queue was ranked) goes before the ranked ones of its
queue. Jobs without a rank never come here: they run as they arrive.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable, Iterable
from time import monotonic
from typing import Any

from emq_django import wire
from emq_django.exceptions import ProtocolError
from emq_django.protocol import frames as F
from emq_django.protocol.batch import REQUESTS, unpack_requests
from emq_django.protocol.headers import Headers

log = logging.getLogger(__name__)

_PROTOCOL_ERROR = "emq_django.exceptions.ProtocolError"  # as execution.py names it
_FIRST = float("-inf")
RANK = b",rank:"  # how a ranked job's headers end (broker/ports/emqp_workers.py)
# a socket read to its end less than this ago (seconds) is not looked at again
# before the next job: the look is a system call (libzmq's getsockopt(EVENTS) polls
# the socket's mailbox), 1.5 µs, as much as the rest of a no-op job's ranked
# handling; a job of 0.1 ms or more is always followed by a look
LOOK_EVERY = 0.0001

Job = tuple[bytes, str, Headers, bytes]  # msgid (the attempt), queue, headers, body


class LocalOrder:
    """Per queue a heap of ``(rank, seq, job)`` (kept when empty: one per queue the
    process serves), and the queues' turns in arrival order (``turns``: one entry
    per job held)."""

    __slots__ = ("_heaps", "turns", "_seq")

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[float, int, Job]]] = {}
        self.turns: deque[str] = deque()
        self._seq = 0

    def take(self, jobs: Iterable[list[bytes]], fail: Callable[[bytes, str, str], None]) -> None:
        """The 7-frame REQUESTs ``jobs``; one whose queue or headers do not parse
        fails unstarted (``fail(msgid, error, reason)``), as ``_run_batch`` does.
        The rank (the broker puts it last) is cut off first (in place: the frames
        are this process's own): the rest of the headers repeat from job to job,
        and ``parse_headers`` has them cached. Unranked jobs go first in their queue."""
        heaps, turns = self._heaps, self.turns
        for frames in jobs:
            base, cut, text = frames[5].rpartition(RANK)
            try:
                rank = float(text) if cut else _FIRST
                if cut:
                    frames[5] = base
                fields = F.request_fields(frames)
            except ValueError:
                fail(frames[3], _PROTOCOL_ERROR, f"header 'rank' is not a number: {text[:40]!r}")
                continue
            except ProtocolError as exc:
                fail(frames[3], _PROTOCOL_ERROR, exc.reason)
                continue
            if fields is not None:
                queue = fields[0]
                self._seq = seq = self._seq + 1
                heap = heaps.get(queue)
                if heap is None:
                    heap = heaps[queue] = []
                heapq.heappush(heap, (rank, seq, (frames[3], queue, fields[1], frames[6])))
                turns.append(queue)

    def pop(self) -> Job:
        """The next job to run: the best-ranked of the queue whose turn it is."""
        return heapq.heappop(self._heaps[self.turns.popleft()])[2]

    def clear(self) -> list[bytes]:
        """Forget every job (their connection is gone); returns their msgids."""
        dropped = [item[2][0] for heap in self._heaps.values() for item in heap]
        self._heaps.clear()
        self.turns.clear()
        return dropped

    def __len__(self) -> int:
        return len(self.turns)


def run_ranked(worker: Any, jobs: list[list[bytes]]) -> None:
    """``SlotWorker._run_ranked`` (``worker``: not imported, process.py imports this
    module): ``jobs`` (7-frame REQUESTs of which the first has a rank) join the
    order; then, before each job starts, what already waits in the socket joins it
    (non-blocking reads; skipped when the socket was read to its end less than
    ``LOOK_EVERY`` ago), and the order's next job runs, until none is held. A job
    given back or cancelled unstarted, the held answers, the time limits: as ever
    (``SlotWorker._run``)."""
    order, link, fail = worker.order, worker.link, worker._fail_unstarted
    order.take(jobs, fail)
    held = order.turns  # one entry per job held (its len: C-level, per job)
    looked = 0.0  # when the socket was last read to its end (the first job: now)
    while held:
        sock = link.sock
        now = monotonic()
        if now - looked >= LOOK_EVERY:
            looked = now
            while sock is not None and wire.readable(sock):
                frames = wire.recv(sock)
                link.last_recv = now
                n = len(frames)
                batch = F.split_batch(frames) if n > 7 else None
                if batch is not None and frames[2] == F.REQUEST:
                    order.take(batch, fail)
                elif n == 5 and frames[2] == REQUESTS:
                    try:
                        order.take(unpack_requests(frames), fail)
                    except ProtocolError as exc:
                        log.warning("dropped a malformed REQUESTS from the broker: %s", exc)
                elif n == 7 and frames[2] == F.REQUEST:
                    order.take([frames], fail)
                else:
                    worker._handle(frames)  # an ACK, a KBYE, a heartbeat: as ever
        if link.sock is not sock or not held:
            break  # connected again: the broker took back what the old connection held
        msgid, queue, headers, body = order.pop()
        worker._queued = len(held)  # more to run: answers may wait for theirs
        if worker.abandoning:
            worker._give_back(msgid)
        else:
            worker._run(msgid, queue, headers, body)
        if held and link.tick():  # (none held: the loop it returns to ticks)
            break
    worker._queued = 0
    if held:
        dropped = order.clear()
        log.info("connected again: %d jobs held here went back to the broker", len(dropped))
