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
    from emq_django.broker.topics import Event

# emq_jobs: ``seq`` orders the jobs (``load`` sorts by it, the spilled jobs' index
# holds it) but has no index of its own: a guaranteed job writes two row versions
# (its put, its done), each an entry in every index of the table, and an index on
# seq that nothing searched cost PostgreSQL 2-7 µs per job (bench/README.md,
# Guaranteed jobs). A journal made before keeps its index on seq (it works alike).
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
"""
TABLES = ("emq_jobs", "emq_events", "emq_topic_meta")
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
DONE = "UPDATE emq_jobs SET state = 'done', body = NULL, updated_at = %s WHERE id = %s"
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
    return (now, job_id)


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
    return (before,)


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
    "prune_done": ("DELETE FROM emq_jobs WHERE state = 'done' AND updated_at < %s", _prune_done),
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
    "UPDATE emq_jobs AS j SET state = 'done', body = NULL, updated_at = d.at"
    " FROM unnest(%b::bytea[], %s::float8[]) AS d(id, at) WHERE j.id = d.id"
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
    at, ids = zip(*rows, strict=True)
    if len(set(ids)) != len(ids):
        return None  # which of an UPDATE's two rows for one id wins is the plan's choice
    return sql, [list(ids), list(at)]


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
_FOLDED_PUT = (
    "p AS (INSERT INTO emq_jobs (id, queue, headers, body, state, attempts, run_after,"
    " enqueued_at, updated_at) SELECT * FROM unnest(%b::bytea[], %b::text[], %b::bytea[],"
    " %b::bytea[], %b::text[], %b::integer[], %b::float8[], %b::float8[], %b::float8[])"
    " ON CONFLICT (id) DO UPDATE SET state = excluded.state, attempts = excluded.attempts,"
    " last_attempt = 0, run_after = excluded.run_after, updated_at = excluded.updated_at,"
    " body = CASE WHEN excluded.state = 'done' THEN excluded.body ELSE emq_jobs.body END)"
)
_FOLDED_DONE = (
    "d AS (UPDATE emq_jobs AS j SET state = 'done', body = NULL, updated_at = d.at"
    " FROM unnest(%b::bytea[], %b::float8[]) AS d(id, at) WHERE j.id = d.id)"
)
# the done rows that keep their job's reply (``KeepReply``, broker/kept_replies.py)
_FOLDED_REPLY = (
    "r AS (UPDATE emq_jobs AS j SET state = 'done', body = r.reply, updated_at = r.at"
    " FROM unnest(%b::bytea[], %b::float8[], %b::bytea[]) AS r(id, at, reply) WHERE j.id = r.id)"
)
JOBS_ONLY = f"WITH {_FOLDED_PUT}, {_FOLDED_DONE}, {_FOLDED_REPLY} SELECT 1"
JOBS_FENCED = (
    f"WITH {_FOLDED_PUT}, {_FOLDED_DONE}, {_FOLDED_REPLY}, f AS (UPDATE emq_lease SET expires_at ="
    " clock_timestamp() + make_interval(secs => %b::float8)"
    " WHERE id = 1 AND name = %b::text AND epoch = %b::bigint RETURNING 1)"
    " SELECT 1 / (SELECT COUNT(*)::integer FROM f)"
)


def fold_jobs(ops: list[Any]) -> list[PgArray] | None:
    """A turn of puts and dones only, as the parameters of ``JOBS_ONLY``: the puts'
    columns, the dones' (ids, times), then the replies' (ids, times, replies), each
    made into its binary array at once (``broker/pgarrays.py``); a job both put and
    ended here is one put in state 'done' without a body (with its reply as the
    body, for a ``KeepReply``). None: the turn has other operations, or names a job
    twice otherwise (the statement-by-statement path writes it)."""
    puts: dict[bytes, int] = {}  # a job's put: its index in ``rows``
    rows: list[tuple[Any, ...]] = []  # the put operations, as they are
    dones: dict[bytes, float] = {}
    replies: dict[bytes, tuple[float, bytes]] = {}
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
            if job_id in dones or job_id in replies or (i is not None and rows[i][5] == "done"):
                return None
            if i is not None:  # (kind, id, queue, headers, body, state, ..., updated)
                row = rows[i]
                reply = op[2] if kind == "reply" else None
                rows[i] = (*row[:4], reply, "done", *row[6:9], at)
            elif kind == "done":
                dones[job_id] = at
            else:
                replies[job_id] = (at, op[2])
        else:
            return None
    _, ids, queues, headers, bodies, states, attempts, run_after, enqueued, updated = (
        zip(*rows, strict=True) if rows else [()] * 10
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
        bytea_array(list(dones)),
        float8_array(list(dones.values())),
        bytea_array(list(replies)),
        float8_array([r[0] for r in replies.values()]),
        bytea_array([r[1] for r in replies.values()]),
    ]
