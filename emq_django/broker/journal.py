"""The journal of guaranteed jobs: SQLite in WAL mode, one transaction per loop turn.

A guaranteed job is written before the broker sends anything about it (its ACK,
its dispatch), and leaves the journal on its final outcome: it is then kept as
``done`` (without its body) for the de-duplication window, so that a client that
resends a job after a broker crash does not run it twice. At start-up the broker
reloads what is left.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from emq_django.broker.topics import Event

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
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,        -- the broker's one event sequence
    topic TEXT NOT NULL,
    rule TEXT NOT NULL,             -- the retention rule's prefix when written
    producer TEXT NOT NULL,
    uuid BLOB NOT NULL,
    ts REAL NOT NULL,               -- the producer's wall-clock time
    content_type TEXT NOT NULL,
    headers TEXT NOT NULL,          -- JSON list of [name, value]
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_topic ON events (topic, seq);
CREATE INDEX IF NOT EXISTS events_rule ON events (rule, seq);
CREATE TABLE IF NOT EXISTS topic_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
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

    # ---- the topic space's events (broker/topics.py) -------------------------------

    def topic_state(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """The highest event number ever given, and each kept topic's last number
        and count."""
        try:
            (top,) = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
            row = self.db.execute("SELECT value FROM topic_meta WHERE key = 'last_seq'").fetchone()
            topics = {
                t: (int(seq), int(n))
                for t, seq, n in self.db.execute(
                    "SELECT topic, MAX(seq), COUNT(*) FROM events GROUP BY topic"
                )
            }
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc
        return max(int(top), int(row[0]) if row else 0), topics

    def events_since(self, prefixes: Sequence[str], seq: int, upto: int, limit: int) -> list[Event]:
        """Kept events with ``seq < n <= upto`` under ``prefixes`` (prefix match; none:
        all), in order, at most ``limit``."""
        where = "seq > ? AND seq <= ?"
        params: list[Any] = [seq, upto]
        if prefixes:
            where += " AND (" + " OR ".join("substr(topic, 1, ?) = ?" for _ in prefixes) + ")"
            for prefix in prefixes:
                params += [len(prefix), prefix]
        return self._events(f"{where} ORDER BY seq LIMIT ?", (*params, limit))

    def latest_events(self, topic: str, n: int) -> list[Event]:
        rows = self._events("topic = ? ORDER BY seq DESC LIMIT ?", (topic, n))
        return rows[::-1]

    def _events(self, where: str, params: tuple[Any, ...]) -> list[Event]:
        from emq_django.broker.topics import Event

        sql = (
            "SELECT seq, topic, data, producer, uuid, ts, content_type, headers FROM events"
            f" WHERE {where}"
        )
        try:
            rows = self.db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc
        return [
            Event(seq, topic, data, producer, uuid, ts, ctype, _headers(headers))
            for seq, topic, data, producer, uuid, ts, ctype, headers in rows
        ]

    def stats(self) -> dict[str, Any]:
        try:
            counts = dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
            (events,) = self.db.execute("SELECT COUNT(*) FROM events").fetchone()
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
            "events": events,
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


def _event(db: sqlite3.Connection, op: JournalOp) -> None:
    _, e, rule = op
    db.execute(
        "INSERT INTO events (seq, topic, rule, producer, uuid, ts, content_type, headers, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            e.seq,
            e.topic,
            rule,
            e.producer,
            e.uuid,
            e.ts,
            e.content_type,
            json.dumps(e.headers) if e.headers else "",
            e.data,
        ),
    )


def _prune_events(db: sqlite3.Connection, op: JournalOp) -> None:
    """Retention: each rule's events beyond its age and count. The highest number
    given is kept in ``topic_meta`` first, so the sequence survives deleting the
    newest events."""
    _, rules, wall, last_seq = op
    db.execute(
        "INSERT INTO topic_meta (key, value) VALUES ('last_seq', ?) ON CONFLICT (key)"
        " DO UPDATE SET value = MAX(value, excluded.value)",
        (last_seq,),
    )
    known = [r.prefix for r in rules]
    marks = ",".join("?" * len(known))
    stale = db.execute(f"SELECT 1 FROM events WHERE rule NOT IN ({marks}) LIMIT 1", known)
    if stale.fetchone():  # the rules changed since: file every event under today's
        for rule in sorted(rules, key=lambda r: len(r.prefix)):
            db.execute(
                "UPDATE events SET rule = ? WHERE substr(topic, 1, ?) = ?",
                (rule.prefix, len(rule.prefix), rule.prefix),
            )
    for rule in rules:
        if rule.max_age:
            db.execute(
                "DELETE FROM events WHERE rule = ? AND ts < ?", (rule.prefix, wall - rule.max_age)
            )
        if rule.max_count:
            db.execute(
                "DELETE FROM events WHERE rule = ? AND seq <= (SELECT seq FROM events WHERE"
                " rule = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (rule.prefix, rule.prefix, rule.max_count),
            )


def _headers(raw: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in json.loads(raw)) if raw else ()


_APPLY = {
    "event": _event,
    "prune_events": _prune_events,
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
