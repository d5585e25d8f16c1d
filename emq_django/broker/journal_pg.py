"""The journal in PostgreSQL (``EMQ_JOURNAL_URL``): what the SQLite journal holds, on
a server that several brokers share, one active at a time (``broker/lease.py``).

The same interface and semantics as ``Journal`` (broker/journal.py): the broker's
loop hands ``apply`` its turn's typed operations, written in one transaction; a
guaranteed job is acknowledged only after that commit. The transaction goes to the
server in one round trip: psycopg's pipeline mode sends BEGIN, each run of
operations of one kind as one ``executemany``, the fence and COMMIT together, and
reads the results once.

Fencing: once ``fence(epoch, ttl)`` is set, every transaction also extends the
lease row, on condition that it still holds ``epoch``; when another broker took
the lease (a higher epoch), the statement fails (a division by the zero rows it
updated), the transaction rolls back and ``apply`` raises ``LeaseLost``: a broker
that lost the lease cannot commit, so it cannot acknowledge guaranteed work. The
fence is the transaction's last statement, so the lease row stays locked only
for the commit itself. Each commit thus renews the lease too.

PostgreSQL unreachable: ``apply`` raises ``JournalError`` with the reason at once
(``broker/pglink.py`` replaces the connection in the background), so the broker
refuses guaranteed jobs and keeps serving plain ones; it writes again by itself
once PostgreSQL is back.
"""

from __future__ import annotations

import logging
import time
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

from emq_django.broker import journal as sqlite_journal
from emq_django.broker import pgarrays
from emq_django.broker.journal import EXPIRED_KEY, JournalOp, PruneEvents, StoredJob
from emq_django.broker.journal_sql import (
    ADDED_COLUMNS,
    FENCE,
    HAS_COLUMN,
    JOB_COLUMNS,
    JOBS,
    MANY,
    NEW_JOBS,
    ONE,
    SCHEMA,
    TABLES,
    as_arrays,
    fold_jobs,
    in_rule,
    indexes_of,
    row_event,
    size_of,
)
from emq_django.broker.lease import LEASE_SCHEMA, SCHEMA_LOCK, default_name, ensure_schema
from emq_django.broker.pglink import PgLink, import_psycopg, redact
from emq_django.exceptions import JournalError, LeaseLost

if TYPE_CHECKING:
    from collections.abc import Sequence

    import psycopg

    from emq_django.broker.topics import Event

log = logging.getLogger(__name__)

# the journal's session: a lock on the lease row (a standby taking it) is waited
# for briefly; a transaction left open by a broker that stopped mid-way (SIGSTOP)
# is ended by the server, so that it cannot hold the lease row for ever. The
# turn's one statement is prepared and planned once (a generic plan, kept): planning
# it at each run (a custom plan) cost PostgreSQL about 150 µs per commit, as much as
# the rows of a turn of ten jobs. A generic plan made while emq_jobs was small (a
# fresh journal: no statistics yet) joined the dones with a sequential scan of the
# whole table, its cost growing with the table; with sequential scans disabled in
# the session, the plan finds a done by its id whatever the table's size when it
# was made. The reads of whole tables (``load``, the counts, retention) enable them
# again for their own transaction (``SCAN``).
SESSION = {
    "lock_timeout": "1s",
    "idle_in_transaction_session_timeout": "5s",
    "plan_cache_mode": "force_generic_plan",
    "enable_seqscan": "off",
}
SCAN = "SET LOCAL enable_seqscan = on"
# ``stats``: a count of the jobs by state that took longer than this is made again
# only every RECOUNT_SECONDS (a scan of the table on the broker's loop)
COUNT_INLINE_SECONDS = 0.05
RECOUNT_SECONDS = 10.0

_kind = itemgetter(0)


class PgJournal:
    # the server commits its turns of puts and dones on a thread (journal_writer.py)
    commits_off_loop = True

    def __init__(self, url: str, name: str = "", new: bool = False) -> None:
        """Connect and create the tables if missing. A wrong URL, a missing database or
        role, a refused permission or PostgreSQL down raise ``JournalError`` here: the
        broker stops at start with it. ``new``: an empty journal, the old one renamed."""
        self.url = url
        self.path = redact(url)  # what errors and the monitor name the journal by
        self.name = name or default_name()
        pgarrays.register(import_psycopg().adapters)  # before the link's connections
        self.link = PgLink(url, f"emq-broker journal {self.name}", SESSION)
        self._epoch: int | None = None
        self._ttl = 1.0
        self.commits = 0
        self.errors = 0
        self.one_statement = 0  # commits written as one statement (``fold_jobs``)
        self.upserts = 0  # of those, written again as an upsert (a put of a known id)
        self.ops_written = 0  # operations in the commits (per commit: how batched)
        self.checkpoints = 0  # the SQLite journal's; PostgreSQL checkpoints by itself
        self.last_restart_s = 0.0
        self.last_prune_s = 0.0
        self._filed_rules: tuple[Any, ...] | None = None
        self._rule_counts: dict[str, int] | None = None
        self._age_cursor: dict[str, int] = {}
        self._expired: dict[str, int] | None = None
        self._counts: tuple[dict[str, int], int, float] | None = None
        self._count_took = 0.0
        try:
            self._read(self._create if not new else self._start_new)
        except JournalError:
            self.link.close()
            raise

    def _create(self, conn: psycopg.Connection[Any]) -> None:
        ensure_schema(conn, LEASE_SCHEMA + SCHEMA)
        missing = [c for c in ADDED_COLUMNS if not conn.execute(HAS_COLUMN, (c[0],)).fetchone()]
        if missing:  # a journal made before them: once, one broker at a time
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                for name, definition in missing:
                    conn.execute(
                        f"ALTER TABLE emq_jobs ADD COLUMN IF NOT EXISTS {name} {definition}"
                    )

    def _start_new(self, conn: psycopg.Connection[Any]) -> None:
        suffix = f"_old_{int(time.time())}"
        with conn.transaction():
            for table in TABLES:
                if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,):
                    conn.execute(f"ALTER TABLE {table} RENAME TO {table}{suffix}")
                    for index in indexes_of(conn, table + suffix):
                        conn.execute(f"ALTER INDEX {index} RENAME TO {index}{suffix}")
        ensure_schema(conn, LEASE_SCHEMA + SCHEMA)

    def fence(self, epoch: int | None, ttl: float) -> None:
        """Make every write conditional on holding the lease at ``epoch`` (None: no
        condition), extending it by ``ttl`` seconds at each commit."""
        self._epoch = epoch
        self._ttl = float(ttl)

    # ---- writing ---------------------------------------------------------------

    def apply(self, ops: list[JournalOp]) -> None:
        """Write ``ops`` in one transaction (with the fence); raises ``JournalError``
        (``LeaseLost``: the lease is another broker's) and writes nothing."""
        pg = import_psycopg()
        self.last_prune_s = 0.0
        counts = self._rule_counts  # kept up to date in place; None again on failure
        try:
            conn = self._get()
        except JournalError:
            self.errors += 1
            raise
        epoch = self._epoch
        try:
            cur = conn.cursor()
            folded = fold_jobs(ops)
            if folded is not None:  # puts and dones only: one statement (journal_sql)
                fence: list[Any] = [] if epoch is None else [self._ttl, self.name, epoch]
                try:
                    cur.execute(NEW_JOBS[epoch is None], folded + fence, prepare=True)
                except pg.errors.UniqueViolation:  # a put of an id in the table already
                    self.upserts += 1
                    cur.execute(JOBS[epoch is None], folded + fence, prepare=True)
            elif any(op[0] == "prune_events" for op in ops):
                # retention reads counts as it goes: statement by statement
                with conn.transaction():
                    cur.execute(SCAN)
                    counts = self._apply_all(cur, ops, counts)
                    if epoch is not None:
                        cur.execute(FENCE, (self._ttl, self.name, epoch))
            else:
                with conn.pipeline(), conn.transaction():
                    counts = self._apply_all(cur, ops, counts)
                    if epoch is not None:
                        cur.execute(FENCE, (self._ttl, self.name, epoch))
            self.commits += 1
            self.ops_written += len(ops)
            self.one_statement += folded is not None
        except pg.errors.DivisionByZero as exc:
            self._failed()
            raise LeaseLost(
                f"journal {self.path}: the lease is no longer ours (epoch {epoch}): "
                "another broker took over; nothing of this turn was written"
            ) from exc
        except pg.Error as exc:
            self._failed()
            raise self.link.failed(exc) from exc
        except (KeyError, ValueError, TypeError) as exc:
            self._failed()
            raise JournalError(f"journal {self.path}: {exc!r}") from exc

    def _failed(self) -> None:
        self.errors += 1
        self._filed_rules = self._rule_counts = None  # read again from the tables
        self._expired = None

    def _apply_all(
        self, cur: psycopg.Cursor[Any], ops: list[JournalOp], counts: dict[str, int] | None
    ) -> dict[str, int] | None:
        for kind, group in groupby(cast("list[Any]", ops), key=_kind):
            run = list(group)
            if kind == "event" and counts is not None:
                for op in run:
                    counts[op[2]] = counts.get(op[2], 0) + 1
            many = MANY.get(kind)
            arrays = as_arrays(kind, run)
            if arrays is not None:
                cur.execute(*arrays)
            elif many is not None:
                cur.executemany(many[0], [many[1](op) for op in run])
            elif kind == "prune_events":
                started = time.perf_counter()
                for op in run:
                    self._prune_events(cur, op)
                counts = self._rule_counts
                self.last_prune_s += time.perf_counter() - started
            else:
                sql, params = ONE[kind]
                for op in run:
                    cur.execute(sql, params(op))
        return counts

    def _prune_events(self, cur: psycopg.Cursor[Any], op: PruneEvents) -> None:
        """Retention, as the SQLite journal's ``_prune_events`` (its docstring says
        why it reads so little): the highest number given is kept first, the rules'
        counts are read once and then kept up to date, age is pruned in bounded
        steps."""
        _, rules, wall, last_seq = op
        rules = tuple(rules)
        cur.execute(
            "INSERT INTO emq_topic_meta (key, value) VALUES ('last_seq', %s) ON CONFLICT (key)"
            " DO UPDATE SET value = GREATEST(emq_topic_meta.value, excluded.value)",
            (last_seq,),
        )
        if rules != self._filed_rules:
            _refile_events(cur, rules)
            self._filed_rules = rules
            self._rule_counts = None
        counts = self._rule_counts
        if counts is None:
            cur.execute("SELECT rule, COUNT(*) FROM emq_events WHERE rule <> '' GROUP BY rule")
            counts = self._rule_counts = {r: int(n) for r, n in cur.fetchall()}
            total = _one(cur, "SELECT COUNT(*) FROM emq_events")
            counts[""] = int(total) - sum(counts.values())
        for rule in rules:
            prefix = rule.prefix
            if rule.max_age and counts.get(prefix, 0):
                gone = self._prune_age(cur, prefix, wall - rule.max_age)
                counts[prefix] = counts.get(prefix, 0) - gone
            excess = counts.get(prefix, 0) - rule.max_count
            if rule.max_count and excess > 0:
                where, params = in_rule(prefix)
                oldest = f"SELECT seq FROM emq_events WHERE {where} ORDER BY seq LIMIT %s"
                top = _one(cur, f"SELECT MAX(seq) FROM ({oldest}) AS o", (*params, excess))
                self._note_expired(cur, prefix, top)
                cur.execute(f"DELETE FROM emq_events WHERE seq IN ({oldest})", (*params, excess))
                counts[prefix] = counts.get(prefix, 0) - max(cur.rowcount, 0)

    def _prune_age(self, cur: psycopg.Cursor[Any], prefix: str, cutoff: float) -> int:
        """The events of rule ``prefix`` older than ``cutoff``, read in bounded steps
        (the SQLite journal's ``_prune_age``, with its ``AGE_*_ROWS``). Returns how
        many were deleted."""
        gone = 0
        where, params = in_rule(prefix)
        first = _one(cur, f"SELECT ts FROM emq_events WHERE {where} ORDER BY seq LIMIT 1", params)
        if first is not None and first < cutoff:
            head = f"SELECT seq, ts FROM emq_events WHERE {where} ORDER BY seq LIMIT %s"
            args = (*params, sqlite_journal.AGE_HEAD_ROWS, cutoff)
            top = _one(cur, f"SELECT MAX(seq) FROM ({head}) AS h WHERE ts < %s", args)
            self._note_expired(cur, prefix, top)
            cur.execute(
                f"DELETE FROM emq_events WHERE seq IN (SELECT seq FROM ({head}) AS h"
                " WHERE ts < %s)",
                args,
            )
            gone += max(cur.rowcount, 0)
        after = self._age_cursor.get(prefix, 0)
        upto = _one(
            cur,
            f"SELECT MAX(seq) FROM (SELECT seq FROM emq_events WHERE {where} AND seq > %s"
            " ORDER BY seq LIMIT %s) AS s",
            (*params, after, sqlite_journal.AGE_SWEEP_ROWS),
        )
        if upto is None:  # went round: from the start at the next prune
            self._age_cursor.pop(prefix, None)
            return gone
        span = f"{where} AND seq > %s AND seq <= %s AND ts < %s"
        args = (*params, after, upto, cutoff)
        top = _one(cur, f"SELECT MAX(seq) FROM emq_events WHERE {span}", args)
        self._note_expired(cur, prefix, top)
        cur.execute(f"DELETE FROM emq_events WHERE {span}", args)
        gone += max(cur.rowcount, 0)
        self._age_cursor[prefix] = upto
        return gone

    def _note_expired(self, cur: psycopg.Cursor[Any], prefix: str, top: int | None) -> None:
        if top is None:
            return
        expired = self.expired_upto()
        expired[prefix] = max(expired.get(prefix, 0), int(top))
        cur.execute(
            "INSERT INTO emq_topic_meta (key, value) VALUES (%s, %s) ON CONFLICT (key)"
            " DO UPDATE SET value = GREATEST(emq_topic_meta.value, excluded.value)",
            (EXPIRED_KEY + prefix, int(top)),
        )

    # ---- reading ---------------------------------------------------------------

    def _get(self) -> psycopg.Connection[Any]:
        try:
            return self.link.get()
        except JournalError as exc:
            raise JournalError(f"journal {exc}") from exc

    def _read(self, call: Any) -> Any:
        """``call(connection)``, its errors as ``JournalError``."""
        pg = import_psycopg()
        conn = self._get()
        try:
            return call(conn)
        except pg.Error as exc:
            raise self.link.failed(exc) from exc

    def expired_upto(self) -> dict[str, int]:
        """Per retention rule (its prefix), the highest event number retention
        deleted (read once, then kept up to date)."""
        if self._expired is None:
            rows = self._read(
                lambda c: c.execute(
                    "SELECT key, value FROM emq_topic_meta WHERE starts_with(key, %s)",
                    (EXPIRED_KEY,),
                ).fetchall()
            )
            self._expired = {key[len(EXPIRED_KEY) :]: int(value) for key, value in rows}
        return self._expired

    def load(self) -> list[StoredJob]:
        """The ended jobs' ids (for de-duplication), then every job not done, oldest
        first (the done rows of a journal from before emq_done among them)."""
        ended = self._read(lambda c: _scanning(c, "SELECT id, at FROM emq_done", ()))
        jobs = self._jobs(f"SELECT {JOB_COLUMNS} FROM emq_jobs ORDER BY seq", (), scan=True)
        return [
            *(StoredJob(bytes(i), "", b"", b"", "done", 0, 0.0, at, "", at) for i, at in ended),
            *jobs,
        ]

    def load_spilled(self, queue: str, limit: int) -> list[StoredJob]:
        return self._jobs(
            f"SELECT {JOB_COLUMNS} FROM emq_jobs WHERE state = 'spilled' AND queue = %s"
            " ORDER BY seq LIMIT %s",
            (queue, limit),
        )

    def _jobs(self, sql: str, params: tuple[Any, ...], scan: bool = False) -> list[StoredJob]:
        if scan:
            rows = self._read(lambda c: _scanning(c, sql, params))
        else:
            rows = self._read(lambda c: c.execute(sql, params).fetchall())
        return [StoredJob(*row) for row in rows]

    def topic_state(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """The highest event number ever given, and each kept topic's last number
        and count."""

        def read(conn: psycopg.Connection[Any]) -> tuple[int, dict[str, tuple[int, int]]]:
            with conn.transaction():
                return _topic_state(conn.cursor())

        result: tuple[int, dict[str, tuple[int, int]]] = self._read(read)
        return result

    def events_since(self, prefixes: Sequence[str], seq: int, upto: int, limit: int) -> list[Event]:
        """Kept events with ``seq < n <= upto`` under ``prefixes`` (prefix match; none:
        all), in order, at most ``limit``."""
        where = "seq > %s AND seq <= %s"
        params: list[Any] = [seq, upto]
        if prefixes:
            where += " AND (" + " OR ".join("starts_with(topic, %s)" for _ in prefixes) + ")"
            params += list(prefixes)
        return self._events(f"{where} ORDER BY seq LIMIT %s", (*params, limit))

    def latest_events(self, topic: str, n: int) -> list[Event]:
        return self._events("topic = %s ORDER BY seq DESC LIMIT %s", (topic, n))[::-1]

    def _events(self, where: str, params: tuple[Any, ...]) -> list[Event]:
        sql = (
            "SELECT seq, topic, data, producer, uuid, ts, content_type, headers"
            f" FROM emq_events WHERE {where}"
        )
        return [row_event(row) for row in self._read(lambda c: c.execute(sql, params).fetchall())]

    def stats(self) -> dict[str, Any]:
        """The journal's counts and size. The count of jobs by state is a scan: made
        at each call while it is quick, every ``RECOUNT_SECONDS`` past that."""
        base = {
            "path": self.path,
            "backend": "postgresql",
            "commits": self.commits,
            "one_statement_commits": self.one_statement,
            "operations": self.ops_written,
            "errors": self.errors,
            "epoch": self._epoch,
        }
        now = time.monotonic()
        due = (
            self._counts is None
            or self._count_took <= COUNT_INLINE_SECONDS
            or now - self._counts[2] > RECOUNT_SECONDS
        )
        try:
            if due:
                self._counts = self._read(_count)
                self._count_took = time.monotonic() - now
            size = self._read(size_of)
        except JournalError as exc:
            return {**base, "error": str(exc)}
        assert self._counts is not None
        counts, events, counted_at = self._counts
        return {
            **base,
            "size_bytes": size,
            "jobs": dict(counts),
            "events": events,
            "counted_s_ago": round(time.monotonic() - counted_at, 1),
            "reconnects": self.link.reconnects,
        }

    def close(self) -> None:
        if self.commits:
            log.info(
                "journal %s: %d commits (%d as one statement), %.1f operations per commit",
                self.path,
                self.commits,
                self.one_statement,
                self.ops_written / self.commits,
            )
        self.link.close()


def _one(cur: psycopg.Cursor[Any], sql: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the first row (None: no row)."""
    row = cur.execute(sql, params).fetchone()
    return None if row is None else row[0]


def _scanning(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of a read of a whole table, sequential scans enabled (``SCAN``)."""
    with conn.transaction():
        cur = conn.cursor()
        cur.execute(SCAN)
        return cur.execute(sql, params).fetchall()


def _topic_state(cur: psycopg.Cursor[Any]) -> tuple[int, dict[str, tuple[int, int]]]:
    cur.execute(SCAN)
    top = _one(cur, "SELECT COALESCE(MAX(seq), 0) FROM emq_events")
    meta = _one(cur, "SELECT value FROM emq_topic_meta WHERE key = 'last_seq'")
    cur.execute("SELECT topic, MAX(seq), COUNT(*) FROM emq_events GROUP BY topic")
    topics = {t: (int(seq), int(n)) for t, seq, n in cur.fetchall()}
    return max(int(top), int(meta or 0)), topics


def _count(conn: psycopg.Connection[Any]) -> tuple[dict[str, int], int, float]:
    with conn.transaction():
        cur = conn.cursor()
        cur.execute(SCAN)
        cur.execute("SELECT state, COUNT(*) FROM emq_jobs GROUP BY state")
        counts = {state: int(n) for state, n in cur.fetchall()}
        if ended := int(_one(cur, "SELECT COUNT(*) FROM emq_done")):
            counts["done"] = counts.get("done", 0) + ended
        events = _one(cur, "SELECT COUNT(*) FROM emq_events")
    return counts, int(events), time.monotonic()


def _refile_events(cur: psycopg.Cursor[Any], rules: tuple[Any, ...]) -> None:
    """The rules changed since the events were written (or this is the first prune
    since the journal was opened): file every event under today's."""
    known = [r.prefix for r in rules]
    other = "rule <> '' AND " if "" in known else ""
    if _one(cur, f"SELECT 1 FROM emq_events WHERE {other}rule <> ALL(%s) LIMIT 1", (known,)):
        for rule in sorted(rules, key=lambda r: len(r.prefix)):
            cur.execute(
                "UPDATE emq_events SET rule = %s WHERE starts_with(topic, %s)",
                (rule.prefix, rule.prefix),
            )
