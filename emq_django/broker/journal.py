"""The journal of guaranteed jobs: SQLite in WAL mode, one transaction per loop turn.

A guaranteed job is written before the broker sends anything about it (its ACK,
its dispatch), and leaves the journal on its final outcome: it is then kept as
``done`` (without its body) for the de-duplication window, so that a client that
resends a job after a broker crash does not run it twice. At start-up the broker
reloads what is left.

A commit is durable once it is in the WAL (``synchronous=NORMAL``: survives a
broker crash; ``FULL``: also a power cut). Copying the WAL back into the database
(a checkpoint, with its fsyncs) is not needed for that, so it runs on a thread of
its own, with its own connection, instead of inside a loop turn's commit: the
broker keeps reading and answering while the disk catches up (SQLite releases
the GIL while it works). Once the WAL is past ``WAL_RESTART_BYTES`` and a checkpoint
has nearly caught up, the next commit copies the rest and restarts the WAL (the
checkpointer cannot: it would wait for the writer); only if the WAL still
outgrows ``WAL_LIMIT_BYTES`` does a commit wait for a whole checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

from emq_django.exceptions import JournalError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

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
    updated_at REAL NOT NULL,
    last_attempt INTEGER NOT NULL DEFAULT 0  -- see SetState
);
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
-- the events of the rules other than the catch-all "" (those of "" are read in
-- sequence order, by the primary key): an index of every event was one more page
-- written per commit, and at 1,000 events/s a commit is one event
DROP INDEX IF EXISTS events_rule;
CREATE INDEX IF NOT EXISTS events_rule_other ON events (rule, seq) WHERE rule != '';
CREATE TABLE IF NOT EXISTS topic_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
-- partial indexes: a message that is put and then done touches neither the
-- spilled one nor, until it is done, the done one
CREATE INDEX IF NOT EXISTS jobs_spilled ON jobs (queue, seq) WHERE state = 'spilled';
CREATE INDEX IF NOT EXISTS jobs_done ON jobs (updated_at) WHERE state = 'done';
DROP INDEX IF EXISTS jobs_state;
"""

# topic_meta's key prefix for each retention rule's highest deleted event number
EXPIRED_KEY = "expired:"

# ---- the operations the broker core queues (``JobLifecycle.journal_ops``) -------------
# Typed and named, and tuples still: their kind first, then the statement's values,
# so that a run of them goes to ``executemany`` without a conversion per operation
# (two are made per guaranteed job). ``Journal.apply`` takes any tuple of that shape.


class PutJob(NamedTuple):
    """A guaranteed job, written whole (new, or again in a new state)."""

    kind: Literal["put"]
    job_id: bytes
    queue: str
    headers: bytes
    body: bytes
    state: str
    attempts: int
    run_after: float  # wall clock; 0.0: none
    enqueued_at: float  # wall clock
    updated_at: float  # wall clock


class SetState(NamedTuple):
    """A job's new state (delayed for a retry, dead, ready again)."""

    kind: Literal["state"]
    job_id: bytes
    state: str
    attempts: int  # its failed attempts so far (the count its retries are against)
    run_after: float
    error: str
    updated_at: float
    # the number of the attempt whose outcome this state follows (``Job.attempt``):
    # attempts given back unstarted take numbers without counting, so it may be
    # past ``attempts``. A broker that takes over numbers its attempts after it and
    # knows an outcome handed over under a number up to it as had already.
    last_attempt: int = 0


class JobDone(NamedTuple):
    """The job is over: its body is dropped, its id kept for de-duplication."""

    kind: Literal["done"]
    job_id: bytes
    updated_at: float


class KeepReply(NamedTuple):
    """The job is over and its client wants its reply: a done row that keeps the
    reply (``broker/kept_replies.py``) in place of the body, so that a broker that
    takes over answers the client that sends the job again (a failover)."""

    kind: Literal["reply"]
    job_id: bytes
    reply: bytes
    updated_at: float


class DeleteJob(NamedTuple):
    kind: Literal["delete"]
    job_id: bytes


class PruneDone(NamedTuple):
    """Forget the done jobs last updated before ``before`` (wall clock)."""

    kind: Literal["prune_done"]
    before: float


class SaveEvent(NamedTuple):
    """A numbered topic event, filed under its retention rule's prefix."""

    kind: Literal["event"]
    event: Event
    rule: str


class PruneEvents(NamedTuple):
    """Apply the retention rules at ``wall``; ``last_seq``: the sequence so far."""

    kind: Literal["prune_events"]
    rules: Any  # the TopicSpace's retention rules
    wall: float
    last_seq: int


JournalOp = (
    PutJob | SetState | JobDone | KeepReply | DeleteJob | PruneDone | SaveEvent | PruneEvents
)

CHECKPOINT_PAGES = 1000  # WAL pages left to copy under which the WAL may restart
WAL_RESTART_BYTES = 32 * 1024 * 1024  # a WAL holding this much is restarted once caught up with
WAL_LIMIT_BYTES = 256 * 1024 * 1024  # past this a commit waits for a full checkpoint
# retention by age, at each prune (``_prune_age``): the oldest events of a rule (by
# number) are deleted while they are past its max_age, at most AGE_HEAD_ROWS of
# them a prune; and AGE_SWEEP_ROWS further events are looked at, in turn, for one
# older than those before it (a producer's clock behind the others')
AGE_HEAD_ROWS = 5_000
AGE_SWEEP_ROWS = 500
# ``stats``: a count of the jobs by state that took longer than this is made on the
# checkpointer's thread from then on (a scan of the whole table: 2.5 s with a
# million jobs at load 20, on the broker's loop at each MONITOR JSON)
COUNT_INLINE_SECONDS = 0.05


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
    last_attempt: int = 0  # ``SetState.last_attempt``; 0 in a journal that predates it


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
            self.db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer thread does it
            # a WAL that grew past this (a burst the checkpointer fell behind in) is
            # cut back to it when restarted, so its file size says how much it holds
            self.db.execute(f"PRAGMA journal_size_limit={WAL_RESTART_BYTES}")
            (self._page_size,) = self.db.execute("PRAGMA page_size").fetchone()
            self.db.executescript(SCHEMA)
            _add_missing_columns(self.db)
        except (OSError, sqlite3.Error) as exc:
            raise JournalError(f"cannot open the journal {self.path}: {exc}{_hint(exc)}") from exc
        self._cur: sqlite3.Cursor | None = None  # see _cursor
        self._cur_db: sqlite3.Connection | None = None
        self.commits = 0
        self.errors = 0
        self.checkpoints = 0
        # ``stats``: the last count of jobs by state and of events, when it was made
        # (monotonic), how long it took, and whether the checkpointer should count
        self._counts: tuple[dict[str, int], int, float] | None = None
        self._count_took = 0.0
        self._count_wanted = False
        self._counting = False  # the checkpointer's thread is counting (a read, maybe long)
        self._wal = Path(f"{self.path}-wal")
        self._due = threading.Event()
        self._stop = False
        self._restart = False  # set by the checkpointer: restart the WAL after a commit
        # retention (``_prune_events``): the rules the stored events were last filed
        # under, each rule's stored events (counted once, then kept up to date) and
        # when the age sweep is due next (monotonic clock)
        self._filed_rules: tuple[Any, ...] | None = None
        self._rule_counts: dict[str, int] | None = None
        self._age_cursor: dict[str, int] = {}  # per rule: where the sweep goes on from
        self._expired: dict[str, int] | None = None  # ``expired_upto``
        # the last ``apply``: seconds its WAL restart and its retention rules took
        self.last_restart_s = 0.0
        self.last_prune_s = 0.0
        self.restarts = 0  # WAL restarts on the writer's connection (``_checkpoint_now``)
        self.restart_s = 0.0  # and the time they held the broker's loop in all
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, args=(sync,), name="emq-journal-checkpoint", daemon=True
        )
        self._checkpointer.start()

    def apply(self, ops: list[JournalOp]) -> None:
        """Write ``ops`` in one transaction; raises ``JournalError`` and rolls back."""
        counts = self._rule_counts
        self.last_restart_s = self.last_prune_s = 0.0
        try:
            db = self._cursor()
            if len(ops) == 1 and ops[0][0] in _MANY:
                # one statement (an event alone in its loop turn, at a steady
                # 1,000/s every one): in autocommit it is its own transaction,
                # without a BEGIN and a COMMIT to run around it
                op = ops[0]
                sql, params = _MANY[op[0]]
                db.execute(sql, params(op))
                if op[0] == "event" and counts is not None:
                    counts[op[2]] = counts.get(op[2], 0) + 1
            else:
                db.execute("BEGIN")
                counts = self._apply_all(db, ops, counts)
                db.execute("COMMIT")
            self.commits += 1
        except (sqlite3.Error, KeyError, ValueError, TypeError) as exc:
            self.errors += 1
            self._filed_rules = self._rule_counts = None  # read again from the file
            self._expired = None
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise JournalError(f"journal {self.path}: {exc}") from exc
        self._due.set()
        if self._counting:  # a checkpoint would wait for that read: at a later commit
            return
        if self._restart or (self.commits % 64 == 0 and _size(self._wal) > WAL_LIMIT_BYTES):
            self._restart = False
            self._checkpoint_now()

    def _apply_all(
        self, db: sqlite3.Cursor, ops: list[JournalOp], counts: dict[str, int] | None
    ) -> dict[str, int] | None:
        """``ops`` inside the open transaction; returns the rules' counts after them."""
        # ops of one kind each run, or tuples of their shape (``JournalOp``)
        for kind, group in groupby(cast("list[Any]", ops), key=_kind):
            many = _MANY.get(kind)
            run: Iterable[Any]
            if kind == "event" and counts is not None:
                run = list(group)
                for op in run:
                    counts[op[2]] = counts.get(op[2], 0) + 1
            else:
                run = group
            if many is not None:  # a run of puts or dones: one call for them all
                db.executemany(many[0], map(many[1], run))
            elif kind == "prune_events":
                started = time.perf_counter()
                for op in run:
                    self._prune_events(op)
                counts = self._rule_counts
                self.last_prune_s += time.perf_counter() - started
            else:
                for op in run:
                    _APPLY[kind](db, op)
        return counts

    def _cursor(self) -> sqlite3.Cursor:
        """The one cursor the broker's statements run on (made again if ``db`` is
        swapped). ``Connection.execute`` makes a new cursor each time, and the
        connection keeps a weak reference to every cursor until it sweeps the dead
        ones, every 200 cursors: those weak references, made all along a drain,
        sat among the ids kept for de-duplication and kept dozens of otherwise
        empty pymalloc arenas (1 MB each) alive after a backlog of guaranteed jobs
        drained (``broker/memory.py``). Each statement's rows are read in full
        before the next one runs, so one cursor serves them all."""
        if self._cur is None or self._cur_db is not self.db:
            self._cur = self.db.cursor()
            self._cur_db = self.db
        return self._cur

    def _prune_events(self, op: PruneEvents) -> None:
        """Retention: each rule's events beyond its age and count. The highest number
        given is kept in ``topic_meta`` first, so the sequence survives deleting the
        newest events.

        This runs every few seconds inside a loop turn's transaction, so it must not
        read the whole store: whether the rules changed since the events were filed
        is asked once per set of rules (a full scan), each rule's count is read once
        and then kept up to date here (so the count limit costs nothing until it is
        passed), and the age limit reads a bounded number of rows (``_prune_age``).
        With 100,000 kept 1 KB events these reads took tens of milliseconds every
        5 s: a stall of the broker's loop each time (the p99 of events at 1,000/s);
        and the age limit, applied by a scan of the rule's events every 60 s
        (``ts`` has no index), held the loop 157 ms with 55,000 kept (a bench
        round at load 20)."""
        db = self._cursor()
        _, rules, wall, last_seq = op
        rules = tuple(rules)
        db.execute(
            "INSERT INTO topic_meta (key, value) VALUES ('last_seq', ?) ON CONFLICT (key)"
            " DO UPDATE SET value = MAX(value, excluded.value)",
            (last_seq,),
        )
        if rules != self._filed_rules:
            _refile_events(db, rules)
            self._filed_rules = rules
            self._rule_counts = None
        counts = self._rule_counts
        if counts is None:
            counts = self._rule_counts = dict(
                db.execute(
                    "SELECT rule, COUNT(*) FROM events WHERE rule != '' GROUP BY rule"
                ).fetchall()
            )
            (total,) = db.execute("SELECT COUNT(*) FROM events").fetchone()
            counts[""] = total - sum(counts.values())
        for rule in rules:
            prefix = rule.prefix
            if rule.max_age and counts.get(prefix, 0):
                gone = self._prune_age(db, prefix, wall - rule.max_age)
                counts[prefix] = counts.get(prefix, 0) - gone
            excess = counts.get(prefix, 0) - rule.max_count
            if rule.max_count and excess > 0:  # the oldest of the rule's events go
                where, params = _in_rule(prefix)
                (top,) = db.execute(
                    f"SELECT MAX(seq) FROM (SELECT seq FROM events WHERE {where}"
                    " ORDER BY seq LIMIT ?)",
                    (*params, excess),
                ).fetchone()
                self._note_expired(db, prefix, top)
                gone = db.execute(
                    f"DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE {where}"
                    " ORDER BY seq LIMIT ?)",
                    (*params, excess),
                ).rowcount
                counts[prefix] = counts.get(prefix, 0) - max(gone, 0)

    def _prune_age(self, db: sqlite3.Cursor, prefix: str, cutoff: float) -> int:
        """The events of rule ``prefix`` older than ``cutoff``, without reading them
        all (``ts`` has no index: another index would be another page written per
        commit). Events come in about in time order, so the oldest by number are
        the old ones: they are deleted from the start while the first is past the
        cutoff (``AGE_HEAD_ROWS`` a prune at most, the rest at the next). An event
        whose producer's clock was behind (older than events numbered before it)
        is found by a sweep that reads ``AGE_SWEEP_ROWS`` further events a prune,
        going round the rule's events. Returns how many were deleted."""
        gone = 0
        where, params = _in_rule(prefix)
        first = db.execute(
            f"SELECT ts FROM events WHERE {where} ORDER BY seq LIMIT 1", params
        ).fetchone()
        if first is not None and first[0] < cutoff:
            (top,) = db.execute(
                f"SELECT MAX(seq) FROM (SELECT seq, ts FROM events WHERE {where}"
                " ORDER BY seq LIMIT ?) WHERE ts < ?",
                (*params, AGE_HEAD_ROWS, cutoff),
            ).fetchone()
            self._note_expired(db, prefix, top)
            gone += max(
                db.execute(
                    f"DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE {where}"
                    " ORDER BY seq LIMIT ?) AND ts < ?",
                    (*params, AGE_HEAD_ROWS, cutoff),
                ).rowcount,
                0,
            )
        after = self._age_cursor.get(prefix, 0)
        (upto,) = db.execute(
            f"SELECT MAX(seq) FROM (SELECT seq FROM events WHERE {where} AND seq > ?"
            " ORDER BY seq LIMIT ?)",
            (*params, after, AGE_SWEEP_ROWS),
        ).fetchone()
        if upto is None:  # went round: from the start at the next prune
            self._age_cursor.pop(prefix, None)
            return gone
        (top,) = db.execute(
            f"SELECT MAX(seq) FROM events WHERE {where} AND seq > ? AND seq <= ? AND ts < ?",
            (*params, after, upto, cutoff),
        ).fetchone()
        self._note_expired(db, prefix, top)
        gone += max(
            db.execute(
                f"DELETE FROM events WHERE {where} AND seq > ? AND seq <= ? AND ts < ?",
                (*params, after, upto, cutoff),
            ).rowcount,
            0,
        )
        self._age_cursor[prefix] = upto
        return gone

    def _note_expired(self, db: sqlite3.Cursor, prefix: str, top: int | None) -> None:
        """Retention is deleting rule ``prefix``'s events up to ``top``: kept in
        ``topic_meta`` (and here), so a subscriber asking from below is told."""
        if top is None:
            return
        expired = self.expired_upto()
        expired[prefix] = max(expired.get(prefix, 0), int(top))
        db.execute(
            "INSERT INTO topic_meta (key, value) VALUES (?, ?) ON CONFLICT (key)"
            " DO UPDATE SET value = MAX(value, excluded.value)",
            (EXPIRED_KEY + prefix, int(top)),
        )

    def expired_upto(self) -> dict[str, int]:
        """Per retention rule (its prefix), the highest event number retention
        deleted (read from ``topic_meta`` once, then kept up to date)."""
        if self._expired is None:
            rows = self._cursor().execute(
                "SELECT key, value FROM topic_meta WHERE substr(key, 1, ?) = ?",
                (len(EXPIRED_KEY), EXPIRED_KEY),
            )
            self._expired = {key[len(EXPIRED_KEY) :]: int(value) for key, value in rows}
        return self._expired

    def _checkpoint_loop(self, sync: str) -> None:
        """Checkpoint after each burst of commits, on a connection of this thread:
        PASSIVE never blocks the broker's writes; the WAL is reused from its start
        once a checkpoint has caught up with it."""
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA synchronous={sync.upper()}")
            cur = db.cursor()  # one for every checkpoint (see _cursor)
        except sqlite3.Error as exc:
            log.error("journal %s: no checkpointer (%s); the WAL will grow", self.path, exc)
            return
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stop:
                    return
                if self._count_wanted:
                    # meanwhile the writer restarts no WAL: that would wait for this reader
                    self._count_wanted = False
                    self._counting = True
                    try:
                        self._count(cur)
                    except sqlite3.Error as exc:
                        log.warning("journal %s: could not count its jobs: %s", self.path, exc)
                    finally:
                        self._counting = False
                try:
                    _, wal_pages, copied = cur.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.checkpoints += 1
                except sqlite3.Error as exc:
                    log.warning("journal %s: checkpoint failed: %s", self.path, exc)
                    time.sleep(1.0)
                    continue
                # what the WAL holds (its frames), not its file's size: the file keeps
                # its size when the WAL restarts, so once past WAL_RESTART_BYTES it
                # asked for a restart after every checkpoint, five a second at a
                # steady 1,000 commits/s, each holding the broker's loop for the
                # rest of the copy and two fsyncs (26 ms on average here)
                held = wal_pages * self._page_size
                if wal_pages - copied < CHECKPOINT_PAGES and held > WAL_RESTART_BYTES:
                    self._restart = True  # nearly all copied: the writer restarts the WAL
                time.sleep(0.2)  # let commits gather: a page rewritten often is copied once
        finally:
            db.close()

    def _checkpoint_now(self) -> None:
        """Copy what is left of the WAL back and write it from its start again: on
        the writer's connection, between two commits, so that no writer is waited
        for (the checkpointer has copied nearly all of it already, unless the WAL
        is past its limit)."""
        started = time.monotonic()
        try:
            self._cursor().execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            self.checkpoints += 1
        except sqlite3.Error as exc:
            log.warning("journal %s: checkpoint failed: %s", self.path, exc)
        took = time.monotonic() - started
        self.last_restart_s += took
        self.restarts += 1
        self.restart_s += took
        if took >= 1.0:  # the broker's loop waited that long (a slow fsync, a reader)
            log.warning("journal %s: restarting the WAL held the broker %.1f s", self.path, took)

    def load(self) -> list[StoredJob]:
        """Every job not done, oldest first, and the done ones (for de-duplication)."""
        return self._query(
            "SELECT id, queue, headers, COALESCE(body, x''), state, attempts, run_after,"
            " enqueued_at, error, updated_at, last_attempt FROM jobs ORDER BY seq",
            (),
        )

    def load_spilled(self, queue: str, limit: int) -> list[StoredJob]:
        return self._query(
            "SELECT id, queue, headers, COALESCE(body, x''), state, attempts, run_after,"
            " enqueued_at, error, updated_at, last_attempt FROM jobs"
            " WHERE state = 'spilled' AND queue = ? ORDER BY seq LIMIT ?",
            (queue, limit),
        )

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[StoredJob]:
        try:
            return [StoredJob(*row) for row in self._cursor().execute(sql, params).fetchall()]
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}{_hint(exc)}") from exc

    # ---- the topic space's events (broker/topics.py) -------------------------------

    def topic_state(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """The highest event number ever given, and each kept topic's last number
        and count."""
        try:
            db = self._cursor()
            (top,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
            row = db.execute("SELECT value FROM topic_meta WHERE key = 'last_seq'").fetchone()
            topics = {
                t: (int(seq), int(n))
                for t, seq, n in db.execute(
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
            rows = self._cursor().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc
        return [
            Event(seq, topic, data, producer, uuid, ts, ctype, _headers(headers))
            for seq, topic, data, producer, uuid, ts, ctype, headers in rows
        ]

    def _count(self, db: sqlite3.Cursor) -> None:
        """Count the jobs by state and the events (scans of whole tables)."""
        started = time.monotonic()
        counts = dict(db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
        (events,) = db.execute("SELECT COUNT(*) FROM events").fetchone()
        now = time.monotonic()
        self._counts = (counts, int(events), now)
        self._count_took = now - started

    def stats(self) -> dict[str, Any]:
        """The journal's counts and sizes. The jobs by state are counted here while
        that is quick (``COUNT_INLINE_SECONDS``); past that (a backlog of
        guaranteed jobs), the broker's loop must not wait for a scan of the table,
        so the count is made on the checkpointer's thread (SQLite lets the loop go
        on meanwhile) and this returns the last one, ``counted_s_ago`` seconds old."""
        try:
            if self._counts is None or self._count_took <= COUNT_INLINE_SECONDS:
                self._count(self._cursor())
            else:
                self._count_wanted = True
                self._due.set()
        except sqlite3.Error as exc:
            return {
                "path": str(self.path),
                "error": str(exc),
                "commits": self.commits,
                "errors": self.errors,
            }
        assert self._counts is not None
        counts, events, counted_at = self._counts
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        return {
            "path": str(self.path),
            "size_bytes": size,
            "jobs": dict(counts),
            "events": events,
            "counted_s_ago": round(time.monotonic() - counted_at, 1),
            "commits": self.commits,
            "checkpoints": self.checkpoints,
            "wal_restarts": self.restarts,
            "wal_restart_ms": round(self.restart_s * 1000, 1),
            "errors": self.errors,
        }

    def close(self) -> None:
        self._stop = True
        self._due.set()
        self._checkpointer.join(timeout=10)
        self.db.close()  # the last connection to close checkpoints what is left


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


PUT = (
    "INSERT INTO jobs (id, queue, headers, body, state, attempts, run_after, enqueued_at,"
    " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
    " state = excluded.state, attempts = excluded.attempts, last_attempt = 0,"
    " run_after = excluded.run_after, updated_at = excluded.updated_at"
)
DONE = "UPDATE jobs SET state = 'done', body = NULL, updated_at = ? WHERE id = ?"
REPLY = "UPDATE jobs SET state = 'done', body = ?, updated_at = ? WHERE id = ?"


def _put(db: sqlite3.Cursor, op: PutJob) -> None:
    db.execute(PUT, _put_params(op))


def _put_params(op: PutJob) -> tuple[Any, ...]:
    _, job_id, queue, headers, body, state, attempts, run_after, enqueued_at, now = op
    return (job_id, queue, headers, body, state, attempts, run_after, enqueued_at, now)


SET_STATE = (
    "UPDATE jobs SET state = ?, attempts = ?, run_after = ?, error = ?, updated_at = ?,"
    " last_attempt = ? WHERE id = ?"
)


def _set_state(db: sqlite3.Cursor, op: SetState) -> None:
    db.execute(SET_STATE, _state_params(op))


def _state_params(op: SetState) -> tuple[Any, ...]:
    # (a tuple of the shape without ``last_attempt``, as before it: 0)
    _, job_id, state, attempts, run_after, error, now, *last = op
    return (state, attempts, run_after, error, now, last[0] if last else 0, job_id)


def _done(db: sqlite3.Cursor, op: JobDone) -> None:
    db.execute(DONE, _done_params(op))


def _done_params(op: JobDone) -> tuple[Any, ...]:
    _, job_id, now = op
    return (now, job_id)


def _reply(db: sqlite3.Cursor, op: KeepReply) -> None:
    db.execute(REPLY, _reply_params(op))


def _reply_params(op: KeepReply) -> tuple[Any, ...]:
    _, job_id, reply, now = op
    return (reply, now, job_id)


def _delete(db: sqlite3.Cursor, op: DeleteJob) -> None:
    db.execute("DELETE FROM jobs WHERE id = ?", (op[1],))


def _prune_done(db: sqlite3.Cursor, op: PruneDone) -> None:
    db.execute("DELETE FROM jobs WHERE state = 'done' AND updated_at < ?", (op[1],))


INSERT_EVENT = (
    "INSERT INTO events (seq, topic, rule, producer, uuid, ts, content_type, headers, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _event_row(op: SaveEvent) -> tuple[Any, ...]:
    _, e, rule = op
    headers = json.dumps(e.headers) if e.headers else ""
    return (e.seq, e.topic, rule, e.producer, e.uuid, e.ts, e.content_type, headers, e.data)


def _event(db: sqlite3.Cursor, op: SaveEvent) -> None:
    db.execute(INSERT_EVENT, _event_row(op))


def _refile_events(db: sqlite3.Cursor, rules: tuple[Any, ...]) -> None:
    """The rules changed since the events were written (or this is the first
    prune since the journal was opened): file every event under today's."""
    known = [r.prefix for r in rules]
    marks = ",".join("?" * len(known))
    # with "" among the rules (always: parse_retention adds it), only the events
    # of the other rules can be filed wrong, and their index has them all
    other = "rule != '' AND " if "" in known else ""
    stale = db.execute(f"SELECT 1 FROM events WHERE {other}rule NOT IN ({marks}) LIMIT 1", known)
    if stale.fetchone():
        for rule in sorted(rules, key=lambda r: len(r.prefix)):
            db.execute(
                "UPDATE events SET rule = ? WHERE substr(topic, 1, ?) = ?",
                (rule.prefix, len(rule.prefix), rule.prefix),
            )


def _in_rule(prefix: str) -> tuple[str, tuple[str, ...]]:
    """The condition for the events filed under the rule ``prefix``: for any rule but
    the catch-all it names ``rule != ''`` too, so that SQLite reads them from their
    (partial) index; those of "" are read in sequence order, from the table."""
    if not prefix:
        return "rule = ''", ()
    return "rule = ? AND rule != ''", (prefix,)


def _headers(raw: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in json.loads(raw)) if raw else ()


_kind = itemgetter(0)

# the operations that come in runs, run by executemany (statement, parameters): the
# two every message makes, and the new state of spilled jobs read back together
_MANY: dict[str, tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    "put": (PUT, _put_params),
    "done": (DONE, _done_params),
    "reply": (REPLY, _reply_params),
    "state": (SET_STATE, _state_params),
    "event": (INSERT_EVENT, _event_row),
}

_APPLY: dict[str, Callable[[sqlite3.Cursor, Any], None]] = {
    "event": _event,
    "put": _put,
    "state": _set_state,
    "done": _done,
    "reply": _reply,
    "delete": _delete,
    "prune_done": _prune_done,
}


def _hint(exc: BaseException) -> str:
    """What to do about a damaged journal file ('' for other errors)."""
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text):
        return (
            "; the file is damaged: restore it from a backup, or start with --new-journal "
            "(the file is moved aside; the guaranteed jobs in it are not run)"
        )
    return ""


# columns added to ``jobs`` since it was first made, with their definitions: a
# journal made before them gets them when opened (their default stands for what
# it did not record)
ADDED_COLUMNS = (("last_attempt", "INTEGER NOT NULL DEFAULT 0"),)


def _add_missing_columns(db: sqlite3.Connection) -> None:
    have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    for name, definition in ADDED_COLUMNS:
        if name not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")


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
