"""The PostgreSQL journal's tables and statements (broker/journal_pg.py).

The same tables as the SQLite journal's (broker/journal.py), prefixed ``emq_`` since
the database may be the Django project's own, and with PostgreSQL's types: ids and
bodies are ``bytea``, wall-clock times ``double precision`` seconds as the broker
gives them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from emq_django.broker.pgarrays import (
    PgArray,
    bytea_array,
    float8_array,
    int4_array,
    text_array,
)

if TYPE_CHECKING:
    import psycopg

    from emq_django.broker.topics import Event

# emq_jobs: ``seq`` orders the jobs (``load`` sorts by it, the spilled jobs' index
# holds it) but has no index of its own: each row version of a guaranteed job (its
# put; its done too, before emq_done) is an entry in every index of the table, and
# an index on seq that nothing searched cost PostgreSQL 2-7 µs per job
# (bench/README.md, Guaranteed jobs). A journal made before keeps its index on seq.
SCHEMA = """
CREATE TABLE IF NOT EXISTS emq_jobs (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    id bytea PRIMARY KEY,
    queue text NOT NULL,
    headers bytea NOT NULL,
    body bytea,
    state text NOT NULL,            -- ready, delayed, spilled, dead, done
    attempts integer NOT NULL DEFAULT 0,
    run_after double precision NOT NULL DEFAULT 0,
    enqueued_at double precision NOT NULL,
    error text NOT NULL DEFAULT '',
    updated_at double precision NOT NULL,
    last_attempt integer NOT NULL DEFAULT 0  -- broker/journal.py: SetState
);
CREATE INDEX IF NOT EXISTS emq_jobs_spilled ON emq_jobs (queue, seq) WHERE state = 'spilled';
CREATE INDEX IF NOT EXISTS emq_jobs_done ON emq_jobs (updated_at) WHERE state = 'done';
CREATE TABLE IF NOT EXISTS emq_events (
    seq bigint PRIMARY KEY,         -- the broker's one event sequence
    topic text NOT NULL,
    rule text NOT NULL,             -- the retention rule's prefix when written
    producer text NOT NULL,
    uuid bytea NOT NULL,
    ts double precision NOT NULL,   -- the producer's wall-clock time
    content_type text NOT NULL,
    headers text NOT NULL,          -- JSON list of [name, value]
    data bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS emq_events_topic ON emq_events (topic, seq);
CREATE INDEX IF NOT EXISTS emq_events_rule_other ON emq_events (rule, seq) WHERE rule <> '';
CREATE TABLE IF NOT EXISTS emq_topic_meta (key text PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE IF NOT EXISTS emq_done (id bytea NOT NULL, at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS emq_done_at ON emq_done USING brin (at);
"""
# emq_done: the ids of the guaranteed jobs that ended, for de-duplication only (kept
# ``EMQ_DEDUPE_WINDOW``, pruned by age through its BRIN index, a few pages for the
# whole table). A done deletes its job's row and appends its id here: an UPDATE to a
# 'done' row wrote a new row version and an entry in two indexes, and its pruning
# deleted the row later; the DELETE and an append to a table whose only index is a
# BRIN cost PostgreSQL about 4 µs less per job (bench/README.md, Guaranteed jobs).
# A done that keeps its job's reply (``KeepReply``) still makes the row a 'done' one
# with the reply as its body, and the rows of a journal from before this table are
# read and pruned as ever.
TABLES = ("emq_jobs", "emq_events", "emq_topic_meta", "emq_done")
# columns added to emq_jobs since it was first made, with their definitions: a
# journal made before them gets them when a broker opens it (``add_missing_columns``),
# their default standing for what it did not record
ADDED_COLUMNS = (("last_attempt", "integer NOT NULL DEFAULT 0"),)
HAS_COLUMN = (
    "SELECT 1 FROM pg_attribute WHERE attrelid = 'emq_jobs'::regclass AND attname = %s"
    " AND NOT attisdropped"
)

# the fence (``PgJournal.fence``): extend the lease if it is still ours, else fail
# the transaction (1 / 0 rows: division by zero), which then rolls back
FENCE = (
    "WITH f AS (UPDATE emq_lease SET expires_at = clock_timestamp() + make_interval(secs => %s)"
    " WHERE id = 1 AND name = %s AND epoch = %s RETURNING 1)"
    " SELECT 1 / (SELECT COUNT(*)::integer FROM f)"
)

JOB_COLUMNS = (
    "id, queue, headers, COALESCE(body, ''::bytea), state, attempts, run_after,"
    " enqueued_at, error, updated_at, last_attempt"
)
PUT = (
    "INSERT INTO emq_jobs (id, queue, headers, body, state, attempts, run_after, enqueued_at,"
    " updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
    " state = excluded.state, attempts = excluded.attempts, last_attempt = 0,"
    " run_after = excluded.run_after, updated_at = excluded.updated_at"
)
DONE = (
    "WITH d AS (DELETE FROM emq_jobs WHERE id = %s) INSERT INTO emq_done (id, at) VALUES (%s, %s)"
)
# a done row that keeps the job's reply (broker/kept_replies.py)
REPLY = "UPDATE emq_jobs SET state = 'done', body = %s, updated_at = %s WHERE id = %s"
SET_STATE = (
    "UPDATE emq_jobs SET state = %s, attempts = %s, run_after = %s, error = %s,"
    " updated_at = %s, last_attempt = %s WHERE id = %s"
)
INSERT_EVENT = (
    "INSERT INTO emq_events (seq, topic, rule, producer, uuid, ts, content_type, headers, data)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def _put(op: Any) -> tuple[Any, ...]:
    _, job_id, queue, headers, body, state, attempts, run_after, enqueued_at, now = op
    return (job_id, queue, headers, body, state, attempts, run_after, enqueued_at, now)


def _state(op: Any) -> tuple[Any, ...]:
    # (a tuple of the shape without ``last_attempt``, as before it: 0)
    _, job_id, state, attempts, run_after, error, now, *last = op
    return (state, attempts, run_after, error, now, last[0] if last else 0, job_id)


def _done(op: Any) -> tuple[Any, ...]:
    _, job_id, now = op
    return (job_id, job_id, now)


def _reply(op: Any) -> tuple[Any, ...]:
    _, job_id, reply, now = op
    return (reply, now, job_id)


def _event(op: Any) -> tuple[Any, ...]:
    _, e, rule = op
    headers = json.dumps(e.headers) if e.headers else ""
    return (e.seq, e.topic, rule, e.producer, e.uuid, e.ts, e.content_type, headers, e.data)


def _delete(op: Any) -> tuple[Any, ...]:
    _, job_id = op
    return (job_id,)


def _prune_done(op: Any) -> tuple[Any, ...]:
    _, before = op
    return (before, before)


PRUNE_DONE = (
    "WITH j AS (DELETE FROM emq_jobs WHERE state = 'done' AND updated_at < %s)"
    " DELETE FROM emq_done WHERE at < %s"
)
Params = Callable[[Any], tuple[Any, ...]]
# the operations that come in runs: one executemany per run (statement, parameters)
MANY: dict[str, tuple[str, Params]] = {
    "put": (PUT, _put),
    "done": (DONE, _done),
    "reply": (REPLY, _reply),
    "state": (SET_STATE, _state),
    "event": (INSERT_EVENT, _event),
}
# the others, one statement each
ONE: dict[str, tuple[str, Params]] = {
    "delete": ("DELETE FROM emq_jobs WHERE id = %s", _delete),
    "prune_done": (PRUNE_DONE, _prune_done),
}


# a run of puts or dones as one statement over arrays (unnest): one plan and one
# execution for the run instead of one per job, about a third less time for a
# turn of 1,000 jobs than executemany. Not for a run naming one id twice (a job
# put again within its turn, or ended twice): one INSERT cannot upsert a row twice,
# and an UPDATE joined with two rows for one id takes either, as its plan has it,
# so that run goes statement by statement (``MANY``), in order.
PUT_ARRAYS = (
    "INSERT INTO emq_jobs (id, queue, headers, body, state, attempts, run_after, enqueued_at,"
    " updated_at) SELECT * FROM unnest(%b::bytea[], %s::text[], %b::bytea[], %b::bytea[],"
    " %s::text[], %s::integer[], %s::float8[], %s::float8[], %s::float8[])"
    " ON CONFLICT (id) DO UPDATE SET state = excluded.state, attempts = excluded.attempts,"
    " last_attempt = 0, run_after = excluded.run_after, updated_at = excluded.updated_at"
)
DONE_ARRAYS = (
    "WITH d AS (DELETE FROM emq_jobs WHERE id = ANY(%b::bytea[]))"
    " INSERT INTO emq_done (id, at) SELECT * FROM unnest(%b::bytea[], %s::float8[])"
)
ARRAYS: dict[str, tuple[str, Params]] = {"put": (PUT_ARRAYS, _put), "done": (DONE_ARRAYS, _done)}


def as_arrays(kind: str, run: list[Any]) -> tuple[str, list[list[Any]]] | None:
    """The run as one statement over columns, when it can be (``ARRAYS``)."""
    found = ARRAYS.get(kind)
    if found is None or len(run) < 2:
        return None
    sql, params = found
    rows = [params(op) for op in run]
    if kind == "put":
        columns = [list(column) for column in zip(*rows, strict=True)]
        if len(set(columns[0])) != len(rows):
            return None  # one id twice: statement by statement
        return sql, columns
    ids, _, at = zip(*rows, strict=True)
    if len(set(ids)) != len(ids):
        return None  # (a job ended twice: statement by statement, as before)
    return sql, [list(ids), list(ids), list(at)]


def in_rule(prefix: str) -> tuple[str, tuple[str, ...]]:
    """The condition for the events filed under the rule ``prefix`` (naming
    ``rule <> ''`` for the others, so their partial index serves)."""
    if not prefix:
        return "rule = ''", ()
    return "rule = %s AND rule <> ''", (prefix,)


def row_event(row: tuple[Any, ...]) -> Event:
    from emq_django.broker.topics import Event

    seq, topic, data, producer, uuid, ts, ctype, headers = row
    pairs = tuple((str(k), str(v)) for k, v in json.loads(headers)) if headers else ()
    return Event(seq, topic, bytes(data), producer, bytes(uuid), ts, ctype, pairs)


# the turn of a broker that only takes and ends guaranteed jobs (the hot path),
# as ONE statement: its puts, its dones and the fence as data-modifying CTEs, in
# autocommit (a statement is its own transaction): one round trip, one statement
# to parse, plan (prepared: always the same text) and execute, instead of BEGIN,
# a statement per kind, the fence and COMMIT. A job put and ended within the
# turn is one put of a 'done' row (``fold_jobs``): the CTEs of one statement
# must not touch a row twice. The fence's division by zero fails the statement,
# so nothing of it is written (``PgJournal.apply`` raises LeaseLost).
_INSERT_PUTS = (
    "p AS (INSERT INTO emq_jobs (id, queue, headers, body, state, attempts, run_after,"
    " enqueued_at, updated_at) SELECT * FROM unnest(%b::bytea[], %b::text[], %b::bytea[],"
    " %b::bytea[], %b::text[], %b::integer[], %b::float8[], %b::float8[], %b::float8[])"
)
_FOLDED_PUT = (
    f"{_INSERT_PUTS}"
    " ON CONFLICT (id) DO UPDATE SET state = excluded.state, attempts = excluded.attempts,"
    " last_attempt = 0, run_after = excluded.run_after, updated_at = excluded.updated_at,"
    " body = CASE WHEN excluded.state = 'done' THEN excluded.body ELSE emq_jobs.body END)"
)
_FOLDED_DONE = (
    "d AS (DELETE FROM emq_jobs WHERE id = ANY(%b::bytea[])),"
    " e AS (INSERT INTO emq_done (id, at) SELECT * FROM unnest(%b::bytea[], %b::float8[]))"
)
# the done rows that keep their job's reply (``KeepReply``, broker/kept_replies.py)
_FOLDED_REPLY = (
    "r AS (UPDATE emq_jobs AS j SET state = 'done', body = r.reply, updated_at = r.at"
    " FROM unnest(%b::bytea[], %b::float8[], %b::bytea[]) AS r(id, at, reply) WHERE j.id = r.id)"
)
_FENCE_CTE = (
    "f AS (UPDATE emq_lease SET expires_at = clock_timestamp() + make_interval(secs => %b::float8)"
    " WHERE id = 1 AND name = %b::text AND epoch = %b::bigint RETURNING 1)"
    " SELECT 1 / (SELECT COUNT(*)::integer FROM f)"
)
JOBS_ONLY = f"WITH {_FOLDED_PUT}, {_FOLDED_DONE}, {_FOLDED_REPLY} SELECT 1"
JOBS_FENCED = f"WITH {_FOLDED_PUT}, {_FOLDED_DONE}, {_FOLDED_REPLY}, {_FENCE_CTE}"
# the same, for puts of new ids only (the hot path: a guaranteed job is put once):
# a plain INSERT, without ON CONFLICT's speculative insertion (a look into the id's
# index before each row and a second WAL record after it: a sixth of PostgreSQL's
# samples; its CPU per job 22 -> 20 µs, bench/README.md). A put of an id with a row
# already (a job resent once its de-duplication window was over, a put again)
# fails it with a unique violation: the turn is then written again with the
# statement above (``PgJournal.apply``), nothing of the first having been written.
NEW_JOBS_ONLY = f"WITH {_INSERT_PUTS}), {_FOLDED_DONE}, {_FOLDED_REPLY} SELECT 1"
NEW_JOBS_FENCED = f"WITH {_INSERT_PUTS}), {_FOLDED_DONE}, {_FOLDED_REPLY}, {_FENCE_CTE}"
# both by "unfenced" (``PgJournal.fence`` not set)
NEW_JOBS = {True: NEW_JOBS_ONLY, False: NEW_JOBS_FENCED}
JOBS = {True: JOBS_ONLY, False: JOBS_FENCED}


def fold_jobs(ops: list[Any]) -> list[PgArray] | None:
    """A turn of puts and dones only, as the parameters of ``JOBS_ONLY``: the puts'
    columns, the dones' ids (the rows to delete), their ids and times again (for
    emq_done), then the replies' (ids, times, replies), each made into its binary
    array at once (``broker/pgarrays.py``); a job both put and ended here is no put,
    only a done (its delete finds no row, or the one an earlier put left), or, with
    a reply (``KeepReply``), one put in state 'done' with the reply as its body.
    None: the turn has other operations, or names a job twice otherwise (the
    statement-by-statement path writes it)."""
    puts: dict[bytes, int] = {}  # a job's put: its index in ``rows``
    rows: list[tuple[Any, ...] | None] = []  # the put operations, as they are
    dones: dict[bytes, float] = {}
    replies: dict[bytes, tuple[float, bytes]] = {}
    ended = 0  # puts dropped: their jobs ended in the turn
    for op in ops:
        kind = op[0]
        if kind == "put":
            job_id = op[1]
            if job_id in puts or job_id in dones:
                return None
            puts[job_id] = len(rows)
            rows.append(op)
        elif kind == "done" or kind == "reply":
            job_id, at = op[1], op[-1]
            i = puts.get(job_id)
            row = None if i is None else rows[i]
            if job_id in dones or job_id in replies or (row is not None and row[5] == "done"):
                return None
            if i is not None and row is not None and kind == "reply":  # (kind, id, queue, ...)
                rows[i] = (*row[:4], op[2], "done", *row[6:9], at)
            elif kind == "done":
                if i is not None:
                    rows[i] = None
                    ended += 1
                dones[job_id] = at
            else:
                replies[job_id] = (at, op[2])
        else:
            return None
    put = [row for row in rows if row is not None] if ended else rows
    _, ids, queues, headers, bodies, states, attempts, run_after, enqueued, updated = (
        zip(*put, strict=True) if put else [()] * 10
    )
    return [
        bytea_array(ids),
        text_array(queues),
        bytea_array(headers),
        bytea_array(bodies),
        text_array(states),
        int4_array(attempts),
        float8_array(run_after),
        float8_array(enqueued),
        float8_array(updated),
        (done := bytea_array(list(dones))),
        done,
        float8_array(list(dones.values())),
        bytea_array(list(replies)),
        float8_array([r[0] for r in replies.values()]),
        bytea_array([r[1] for r in replies.values()]),
    ]


def size_of(conn: psycopg.Connection[Any]) -> int:
    """The journal's tables' size in bytes, their indexes included."""
    total = 0
    for table in TABLES:
        row = conn.execute("SELECT pg_total_relation_size(to_regclass(%s))", (table,)).fetchone()
        total += int(row[0] or 0) if row else 0
    return total


def indexes_of(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))
    return [name for (name,) in rows.fetchall()]
