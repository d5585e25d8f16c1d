"""The broker's ERROR line for guaranteed jobs refused because the journal could
not save them, at most once per interval.

Why: while PostgreSQL is down (or restarting) every loop turn's commit fails, and
a turn often holds one job: one ERROR line per turn was about 600 lines in 3 s,
which buries the one line that says why. Now the first failure logs at once, the
next ones are counted, and at most one line per ``interval`` says how many jobs
(and failed commits) it stands for, with the latest reason; the count held back
when the journal works again is logged then (``flush``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

INTERVAL = 1.0  # seconds between two lines


class RefusalLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger
        self.interval = interval
        self.clock = clock
        self.held = 0  # jobs refused since the last line
        self._commits = 0  # failed commits since the last line
        self._reason = ""
        self._last = -float("inf")  # when the last line was written

    def refused(self, reason: object, jobs: int) -> None:
        """A commit failed for ``reason`` and its ``jobs`` guaranteed jobs are refused."""
        self.held += jobs
        self._commits += 1
        self._reason = str(reason)
        if self.clock() - self._last >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Write the line for what is held back, if anything (the journal works
        again: the last refusals are not left unsaid)."""
        if not self._commits:
            return
        if self._commits == 1:
            self.log.error("%s: refusing %d guaranteed jobs", self._reason, self.held)
        else:
            self.log.error(
                "%s: refusing %d guaranteed jobs (%d failed commits since the last line)",
                self._reason,
                self.held,
                self._commits,
            )
        self.held = self._commits = 0
        self._last = self.clock()
