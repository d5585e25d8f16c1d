"""Unique jobs: the keys the broker holds (docs/features/unique-jobs.md).

A job sent with the header ``unique:<key>`` holds its key from the moment the broker
accepts it until it ends (its final outcome: done, failed past its retries,
cancelled), and ``unique-for:<seconds>`` longer after that. While the key is held,
another job with the same key is not made: the broker answers it with ERROR
``duplicate`` and the reason ``duplicate of <job id>``, which our client turns into
the existing job's handle (``Result.duplicate``).

Exact, not best effort: the broker sees every send in one thread, so the check and
the hold are one step. A guaranteed job's key comes back with the job when the
broker restores its journal (the key is in the job's headers): it holds across a
restart or kill -9 while the job waits or runs; and its ``unique-for`` time after
it ended too, from its done row, for as long as the journal keeps done rows
(``EMQ_DEDUPE_WINDOW``). A plain job's key lives in the broker's memory only.

Pure: no sockets, no clock (``now`` is passed in).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol.headers import parse_stored_headers


class UniqueKeys:
    """Held keys: ``key -> (job id, queue)`` while the job lives, and, once it
    ended, ``key -> (job id, queue, until)`` for its ``unique-for``."""

    __slots__ = ("live", "ended", "spilled", "_expiry")

    def __init__(self) -> None:
        self.live: dict[str, tuple[bytes, str]] = {}
        self.ended: dict[str, tuple[bytes, str, float]] = {}
        self._expiry: list[tuple[float, str]] = []  # a heap of (until, key)
        # the jobs that hold a key while they wait on disk (their headers are not in
        # memory): job id -> (key, unique-for), for ``end_spilled``
        self.spilled: dict[bytes, tuple[str, float]] = {}

    def holder(self, key: str, now: float) -> bytes | None:
        """The id of the job that holds ``key``, or None when it is free."""
        live = self.live.get(key)
        if live is not None:
            return live[0]
        self.expire(now)
        ended = self.ended.get(key)
        return ended[0] if ended is not None else None

    def hold(self, key: str, job_id: bytes, queue: str, spilled_for: float | None = None) -> None:
        """``job_id`` (accepted, or restored from the journal) holds ``key``;
        ``spilled_for``: it waits on disk, with this unique-for."""
        self.live[key] = (job_id, queue)
        self.ended.pop(key, None)
        if spilled_for is not None:
            self.spilled[job_id] = (key, spilled_for)

    def end_spilled(self, job_id: bytes, now: float) -> bool:
        """A job that waited on disk was cancelled: its key is released as any
        ended job's (``release``); True when it is kept for a unique-for."""
        held = self.spilled.pop(job_id, None)
        if held is None:
            return False
        key, keep_for = held
        self.release(key, job_id, keep_for, now)
        return keep_for > 0

    def release(self, key: str, job_id: bytes, keep_for: float, now: float) -> None:
        """The job ended: its key is free, or kept ``keep_for`` seconds more."""
        if self.spilled:
            self.spilled.pop(job_id, None)
        live = self.live.get(key)
        if live is None or live[0] != job_id:
            return
        del self.live[key]
        if keep_for > 0:
            until = now + keep_for
            self.ended[key] = (job_id, live[1], until)
            heapq.heappush(self._expiry, (until, key))

    def restore_ended(self, rows: Iterable[Any], now: float, wall: float) -> None:
        """The journal's rows (``StoredJob``) at start-up: a spilled job (waiting on
        disk) holds its key; one that ended (a done row) less than its
        ``unique-for`` ago keeps its key the rest of it (the restored jobs in memory
        hold theirs: ``BrokerCore.restore``).
        ``wall``: the wall clock at ``now`` (rows have wall-clock times)."""
        for row in rows:
            if row.state not in ("done", "spilled") or b"unique" not in row.headers:
                continue
            try:
                headers = parse_stored_headers(row.headers)
            except ProtocolError:
                continue
            if row.state == "spilled":  # waiting on disk: it holds its key
                if headers.unique:
                    self.hold(headers.unique, row.id, row.queue, headers.unique_for)
                continue
            left = row.updated_at + headers.unique_for - wall
            if headers.unique and left > 0 and headers.unique not in self.live:
                self.ended[headers.unique] = (row.id, row.queue, now + left)
                heapq.heappush(self._expiry, (now + left, headers.unique))

    def forget(self, job_ids: set[bytes]) -> None:
        """The journal could not save these new jobs: they never were, and their
        keys are free (a scan: only on a failed commit)."""
        for key in [k for k, (job_id, _) in self.live.items() if job_id in job_ids]:
            del self.live[key]
        for job_id in job_ids:
            self.spilled.pop(job_id, None)

    def expire(self, now: float) -> None:
        """Drop the ended keys whose time is up."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            until, key = heapq.heappop(expiry)
            ended = self.ended.get(key)
            if ended is not None and ended[2] <= now:
                del self.ended[key]

    def __len__(self) -> int:
        return len(self.live) + len(self.ended)

    def by_queue(self, now: float) -> dict[str, int]:
        """Keys held per queue, for the monitor (live and kept after the end)."""
        self.expire(now)
        counts: dict[str, int] = {}
        for _, queue in self.live.values():
            counts[queue] = counts.get(queue, 0) + 1
        for _, queue, _ in self.ended.values():
            counts[queue] = counts.get(queue, 0) + 1
        return counts
