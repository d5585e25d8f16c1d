"""The journal of guaranteed jobs: SQLite in WAL mode, one transaction per loop turn.

A guaranteed job is written before the broker sends anything about it (its ACK,
its dispatch), and leaves the journal on its final outcome: it is then kept as
``done`` (without its body) for the de-duplication window, so that a client that
resends a job after a broker crash does not run it twice. At start-up the broker
reloads what is left.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY,
    id BLOB NOT NULL UNIQUE,
    queue TEXT NOT NULL,
    headers BLOB NOT NULL,
    body BLOB,
    state TEXT NOT NULL,            -- ready, delayed, spilled, dead, done
    attempts INTEGER NOT NULL DEFAULT 0,
    run_after REAL NOT NULL DEFAULT 0,
    enqueued_at REAL NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, queue, seq);
"""

# (op, args...) tuples the broker core queues; see Journal.apply
JournalOp = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class StoredJob:
    id: bytes
    queue: str
    headers: bytes
    body: bytes
    state: str
    attempts: int
    run_after: float
    enqueued_at: float
    error: str
    updated_at: float


class JournalError(Exception):
    """The journal could not be written (a full disk, a broken file)."""


class Journal:
    def __init__(
        self, path: str | os.PathLike[str], sync: str = "normal", new: bool = False
    ) -> None:
        """Open (or create) the journal. An existing file that is empty or not a
        journal raises ``JournalError``: guaranteed jobs must not vanish silently.
        ``new``: start an empty journal on purpose, moving an existing file aside."""
        if sync not in ("normal", "full"):
            raise ValueError(f"EMQ_JOURNAL_SYNC must be 'normal' or 'full', not {sync!r}")
        self.path = Path(path)
        if new:
            _move_aside(self.path)
        elif self.path.exists():
            _check_existing(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={sync.upper()}")
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise JournalError(f"cannot open the journal {self.path}: {exc}") from exc
        self.commits = 0
        self.errors = 0

    def apply(self, ops: list[JournalOp]) -> None:
        """Write ``ops`` in one transaction; raises ``JournalError`` and rolls back."""
        db = self.db
        try:
            db.execute("BEGIN")
            for op in ops:
                _APPLY[op[0]](db, op)
            db.execute("COMMIT")
            self.commits += 1
        except (sqlite3.Error, KeyError, ValueError, TypeError) as exc:
            self.errors += 1
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise JournalError(f"journal {self.path}: {exc}") from exc

    def load(self) -> list[StoredJob]:
        """Every job not done, oldest first, and the done ones (for de-duplication)."""
        return self._query(
            "SELECT id, queue, headers, COALESCE(body, x''), state, attempts, run_after,"
            " enqueued_at, error, updated_at FROM jobs ORDER BY seq",
            (),
        )

    def load_spilled(self, queue: str, limit: int) -> list[StoredJob]:
        return self._query(
            "SELECT id, queue, headers, COALESCE(body, x''), state, attempts, run_after,"
            " enqueued_at, error, updated_at FROM jobs WHERE state = 'spilled' AND queue = ?"
            " ORDER BY seq LIMIT ?",
            (queue, limit),
        )

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[StoredJob]:
        try:
            return [StoredJob(*row) for row in self.db.execute(sql, params).fetchall()]
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc

    def stats(self) -> dict[str, Any]:
        try:
            counts = dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
        except sqlite3.Error as exc:
            return {
                "path": str(self.path),
                "error": str(exc),
                "commits": self.commits,
                "errors": self.errors,
            }
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        return {
            "path": str(self.path),
            "size_bytes": size,
            "jobs": counts,
            "commits": self.commits,
            "errors": self.errors,
        }

    def close(self) -> None:
        self.db.close()


def _put(db: sqlite3.Connection, op: JournalOp) -> None:
    _, job_id, queue, headers, body, state, attempts, run_after, enqueued_at, now = op
    db.execute(
        "INSERT INTO jobs (id, queue, headers, body, state, attempts, run_after, enqueued_at,"
        " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
        " state = excluded.state, attempts = excluded.attempts,"
        " run_after = excluded.run_after, updated_at = excluded.updated_at",
        (job_id, queue, headers, body, state, attempts, run_after, enqueued_at, now),
    )


def _set_state(db: sqlite3.Connection, op: JournalOp) -> None:
    _, job_id, state, attempts, run_after, error, now = op
    db.execute(
        "UPDATE jobs SET state = ?, attempts = ?, run_after = ?, error = ?, updated_at = ?"
        " WHERE id = ?",
        (state, attempts, run_after, error, now, job_id),
    )


def _done(db: sqlite3.Connection, op: JournalOp) -> None:
    _, job_id, now = op
    db.execute(
        "UPDATE jobs SET state = 'done', body = NULL, updated_at = ? WHERE id = ?", (now, job_id)
    )


def _delete(db: sqlite3.Connection, op: JournalOp) -> None:
    db.execute("DELETE FROM jobs WHERE id = ?", (op[1],))


def _prune_done(db: sqlite3.Connection, op: JournalOp) -> None:
    db.execute("DELETE FROM jobs WHERE state = 'done' AND updated_at < ?", (op[1],))


_APPLY = {
    "put": _put,
    "state": _set_state,
    "done": _done,
    "delete": _delete,
    "prune_done": _prune_done,
}


def _check_existing(path: Path) -> None:
    """Raises ``JournalError`` unless ``path`` is a readable journal."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise JournalError(
                f"the journal {path} is an empty file, not a journal; if its guaranteed "
                "jobs are lost anyway, start with --new-journal (the file is moved aside)"
            )
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise JournalError(f"cannot read the journal {path}: {exc}") from exc
    if head != b"SQLite format 3\x00":
        raise JournalError(
            f"the journal {path} is not a journal (not an SQLite file); check "
            "EMQ_JOURNAL_PATH, or start with --new-journal (the file is moved aside)"
        )


def _move_aside(path: Path) -> None:
    if not path.exists():
        return
    aside = path.with_name(f"{path.name}.old-{int(time.time())}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            part.rename(Path(f"{aside}{suffix}"))
    log.warning("--new-journal: moved the journal %s aside to %s", path, aside)
