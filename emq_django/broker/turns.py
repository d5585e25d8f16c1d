"""Slow loop turns: how often the broker's loop was held, and by what.

A subscriber waits for the broker's loop: an event read in a turn that takes
200 ms reaches nobody for 200 ms. ``TurnWatch`` times every turn of the loop
(from the moment ``poll`` returns until the loop asks it again) and, for a turn
that took ``SLOW_TURN`` or more, keeps what the turn did: the journal's commit
(and within it a WAL restart or the retention rules), spilled jobs read back,
memory given back, trace lines written, the cyclic garbage collector, and the
messages and events it handled. The rest of such a turn is the ports' work and
the sends, or time the loop spent waiting for a CPU (the turn's wall time minus
``cpu_ms``, the loop thread's CPU time in it: on a loaded machine the usual
cause). It was the whole process' CPU time, which counted the journal writer's
and libzmq's threads as the loop's. The loop's clock is read at most once per
``CPU_EVERY`` (a system call, about 0.4 µs, at every turn otherwise), so
``cpu_ms`` may hold up to 1 ms of the turns just before. The figures are in ``MONITOR JSON``
(``loop``), and slow turns are logged, at most one line every ``LOG_INTERVAL``
seconds.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque
from typing import Any

log = logging.getLogger(__name__)

SLOW_TURN = 0.02  # seconds
CPU_EVERY = 0.001  # seconds between readings of the loop thread's CPU clock
LOG_INTERVAL = 5.0  # seconds between log lines about slow turns
KEPT = 8  # the slowest turns kept for MONITOR JSON
RECENT = 64  # and the latest slow ones


class TurnWatch:
    def __init__(self) -> None:
        self.turns = 0
        self.slow = 0  # turns of SLOW_TURN or more
        self.slowest: list[dict[str, Any]] = []  # the KEPT slowest, slowest first
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)  # the latest slow ones
        self.parts: dict[str, float] = {}  # seconds per kind of work, this turn
        self.counts: dict[str, int] = {}  # messages, events, collections, this turn
        self.gc_seconds = 0.0  # all collections since start
        self.gc_collections = 0
        self._started = time.perf_counter()
        self._cpu, self._cpu_at = 0.0, float("-inf")  # (the first turn reads the clock)
        self._gc_started = 0.0
        self._logged_at = float("-inf")
        self._unlogged = 0  # slow turns since the last log line
        self._unlogged_max = 0.0

    # ---- the loop's calls ------------------------------------------------------------

    def begin(self) -> None:
        """``poll`` returned: a turn starts."""
        self._started = started = time.perf_counter()
        if started - self._cpu_at >= CPU_EVERY:
            self._cpu, self._cpu_at = time.thread_time(), started
        if self.parts:
            self.parts = {}
        if self.counts:
            self.counts = {}

    def add(self, what: str, seconds: float) -> None:
        self.parts[what] = self.parts.get(what, 0.0) + seconds

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def end(self) -> None:
        """The loop is about to sleep in ``poll``: the turn is over."""
        self.turns += 1
        took = time.perf_counter() - self._started
        if took < SLOW_TURN:
            return
        cpu = time.thread_time() - self._cpu
        self.slow += 1
        turn: dict[str, Any] = {
            "at": round(time.time(), 3),
            "ms": round(took * 1000, 1),
            "cpu_ms": round(cpu * 1000, 1),  # the loop's thread (see CPU_EVERY)
            **{f"{k}_ms": round(v * 1000, 1) for k, v in self.parts.items()},
            **self.counts,
        }
        self.recent.append(turn)
        slowest = self.slowest
        if len(slowest) < KEPT or took * 1000 > slowest[-1]["ms"]:
            slowest.append(turn)
            slowest.sort(key=lambda t: -t["ms"])
            del slowest[KEPT:]
        self._unlogged += 1
        self._unlogged_max = max(self._unlogged_max, took)
        now = time.monotonic()
        if now - self._logged_at >= LOG_INTERVAL:
            log.info(
                "slow loop turns: %d of %.0f ms or more in the last %.0f s (slowest %.0f ms); "
                "this one: %s",
                self._unlogged,
                SLOW_TURN * 1000,
                min(now - self._logged_at, 1e9),
                self._unlogged_max * 1000,
                turn,
            )
            self._logged_at = now
            self._unlogged = 0
            self._unlogged_max = 0.0

    # ---- the garbage collector -------------------------------------------------------

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` hook: each collection's time goes to the turn."""
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        self.gc_seconds += took
        self.gc_collections += 1
        self.add("gc", took)
        self.count(f"gc_gen{info.get('generation', 0)}")

    def watch_gc(self) -> None:
        if self.on_gc not in gc.callbacks:
            gc.callbacks.append(self.on_gc)

    def unwatch_gc(self) -> None:
        if self.on_gc in gc.callbacks:
            gc.callbacks.remove(self.on_gc)

    def stats(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "slow_turns": self.slow,
            "slow_turn_ms": SLOW_TURN * 1000,
            "gc_collections": self.gc_collections,
            "gc_ms": round(self.gc_seconds * 1000, 1),
            "slowest": list(self.slowest),
            "recent": list(self.recent),
        }
