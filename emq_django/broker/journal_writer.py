"""The PostgreSQL journal's commits on a thread of their own, one at a time.

A commit waits for PostgreSQL's fsync (5-25 ms on a loaded machine) and, with the
commit on the loop, the broker read nothing meanwhile: the results and new jobs
that arrived during a commit were handled only after it, each round trip paying
the loop's work and the commit one after the other. With this writer the loop
hands a turn's operations over (``submit``) and goes on reading and handling
messages; what those turns produce waits (the server holds every effect until
the commit it depends on is over: ACKs are still sent only after their commit),
and their operations go together in the next commit, started as soon as this one
is done. One commit at a time, in the loop's order: a job's done never overtakes
its put.

The journal is used by the loop too (reads: spilled jobs, topic history, stats):
psycopg's connection serialises the calls (a read waits for the commit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from emq_django.exceptions import JournalError


class JournalWriter:
    def __init__(self, journal: Any, wake: Callable[[], None]) -> None:
        """``wake``: called from the writer's thread when a commit is over (the
        loop's wake-up pipe), so a sleeping loop sends what waited for it."""
        self.journal = journal
        self._wake = wake
        self._cond = threading.Condition()
        self._ops: list[Any] | None = None
        self._busy = False
        self._error: JournalError | None = None
        self._closed = False
        self._running = False
        self.took = 0.0  # the last commit's seconds
        self._thread = threading.Thread(target=self._run, name="emq-journal-writer", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A commit is submitted and not over (its outcome not taken by ``wait``)."""
        return self._busy

    def done(self) -> bool:
        """The submitted commit is over (``wait`` returns at once)."""
        with self._cond:
            return self._busy and self._ops is None and not self._running

    def submit(self, ops: list[Any]) -> None:
        with self._cond:
            if self._busy:
                raise RuntimeError("a journal commit is in flight already")
            self._ops, self._busy, self._error = ops, True, None
            self._cond.notify_all()

    def wait(self) -> JournalError | None:
        """Wait for the submitted commit; its error (None: committed). The writer is
        free for the next one afterwards."""
        with self._cond:
            while self._ops is not None or self._running:
                self._cond.wait()
            self._busy = False
            error, self._error = self._error, None
            return error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._ops is None and not self._closed:
                    self._cond.wait()
                if self._ops is None:
                    return
                ops, self._ops, self._running = self._ops, None, True
            started = time.perf_counter()
            error: JournalError | None = None
            try:
                self.journal.apply(ops)
            except JournalError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a bug: refuse, do not hang the loop
                error = JournalError(f"journal {getattr(self.journal, 'path', '')}: {exc!r}")
            with self._cond:
                self.took = time.perf_counter() - started
                self._error, self._running = error, False
                self._cond.notify_all()
            self._wake()

    def close(self) -> None:
        """Let the commit in flight end, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
