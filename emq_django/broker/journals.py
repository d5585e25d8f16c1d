"""Which journal the broker keeps: ``open_journal(settings)``.

- ``EMQ_JOURNAL_URL`` set: the journal in PostgreSQL (``PgJournal``), shared by
  active and standby brokers (broker/journal_pg.py, broker/lease.py).
- else ``EMQ_JOURNAL_PATH`` set: the SQLite file, for one broker on one machine.
  Two brokers writing one SQLite journal would each restore and run the other's
  guaranteed jobs, and SQLite's locks do not keep a second process out (each
  waits its turn to write), so the file gets an exclusive lock of its own
  (``flock`` on ``<journal>.lock``, holding the broker's pid): a second broker
  is refused at start, naming the one that holds it. The kernel drops the lock
  when its process dies (kill -9 too), so a broker restarted on the file after
  a crash is not refused.
- neither: no journal (guaranteed jobs are refused).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING

from emq_django.broker.journal import Journal
from emq_django.exceptions import JournalError

if TYPE_CHECKING:
    from emq_django.broker.journal_pg import PgJournal
    from emq_django.conf import EmqSettings


def open_journal(settings: EmqSettings, new: bool = False) -> Journal | PgJournal | None:
    """The broker's journal as the settings choose it (see the module's docstring);
    ``new``: start an empty one on purpose (the old one is moved aside).
    ``JournalError``: it cannot be opened (the broker stops at start with it)."""
    if settings.JOURNAL_URL:
        from emq_django.broker.journal_pg import PgJournal
        from emq_django.broker.lease import default_name

        return PgJournal(settings.JOURNAL_URL, name=settings.BROKER_NAME or default_name(), new=new)
    if settings.JOURNAL_PATH:
        return LockedJournal(settings.JOURNAL_PATH, settings.JOURNAL_SYNC, new=new)
    return None


class LockedJournal(Journal):
    """The SQLite journal, held by this process alone while it is open."""

    def __init__(self, path: str | os.PathLike[str], sync: str = "normal", new: bool = False):
        self.lock_path = Path(f"{path}.lock")
        self._locked = lock_journal(Path(path), self.lock_path)
        try:
            super().__init__(path, sync, new=new)
        except BaseException:
            unlock_journal(self._locked)
            self._locked = ""
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._locked:
                unlock_journal(self._locked)
                self._locked = ""


# the lock files this process holds: key -> [descriptor, journals open on it]. The
# lock keeps other processes out; within one process (a test restarting a broker
# before the first one's journal is closed) the journals share it
_held: dict[str, list[int]] = {}


def lock_journal(path: Path, lock_path: Path) -> str:
    """An exclusive ``flock`` on ``lock_path`` holding this process's pid; returns
    the key ``unlock_journal`` takes. ``JournalError`` naming the holder's pid when
    another process has it."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(lock_path)
        if key in _held:
            _held[key][1] += 1
            return key
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise JournalError(f"cannot open the journal's lock file {lock_path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        raise JournalError(
            f"the journal {path} is in use by another broker ({holder}; lock file "
            f"{lock_path}): an SQLite journal serves one broker at a time. To run a "
            "standby broker, share a PostgreSQL journal instead: set EMQ_JOURNAL_URL "
            "on every broker"
        ) from exc
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[key] = [fd, 1]
    return key


def unlock_journal(key: str) -> None:
    held = _held.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _held[key]
        os.close(held[0])  # closing the file releases the flock


def _holder(fd: int) -> str:
    """The pid written in the lock file, as the error names it."""
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"
